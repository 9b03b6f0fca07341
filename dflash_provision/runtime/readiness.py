"""Wait for a starting server: /health with a deadline and progress, and stop waiting as soon as
the process exits or its log says start-up failed, with the log lines that say why.

What counts as fatal while the process still runs (vLLM's API server can outlive its engine for
a while): vLLM's DFlash refusals, NotImplementedError, an engine that failed to start, and lines
logged at ERROR level. A bare Traceback only counts once the process is gone (libraries print
tracebacks of optional imports that fail harmlessly).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from dflash_provision.errors import RemoteStepFailed, UnreachableError
from dflash_provision.runtime.access import ServerAccess
from dflash_provision.runtime.process import read_log
from dflash_provision.transport.base import Transport

ReadyOutcome = Literal["ready", "exited", "fatal", "timeout"]
Progress = Callable[[float, str], None]

_FATAL_WHILE_ALIVE = [
    re.compile(r"DFlash sliding attention requires a window size"),
    re.compile(r"\bNotImplementedError\b"),
    re.compile(r"Engine ?core (?:initialization|proc \S+) failed|EngineCore failed to start", re.I),
    re.compile(r"(?:^|\) |\] )ERROR\b"),  # vLLM: "ERROR 12-01 05:00:00 [core.py:1] ..."
]
_FATAL_AFTER_EXIT = [
    *_FATAL_WHILE_ALIVE,
    re.compile(r"^Traceback \(most recent call last\)"),
    re.compile(r"^\w+(?:Error|Exception)\b:"),  # the exception line closing a traceback
]
#: Lines of context reported with a failure, besides the fatal lines themselves.
TAIL_LINES = 20
_LOG_POLL_BYTES = 64 * 1024


@dataclass(frozen=True)
class ReadyResult:
    outcome: ReadyOutcome
    elapsed_s: float
    fatal_lines: list[str] = field(default_factory=list)  # what says why, first
    tail: list[str] = field(default_factory=list)  # the log's last lines for context
    health_status: int | None = None

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"

    def to_dict(self) -> dict[str, object]:
        return {
            "outcome": self.outcome,
            "elapsed_s": round(self.elapsed_s, 3),
            "fatal_lines": self.fatal_lines,
            "tail": self.tail,
            "health_status": self.health_status,
        }


def fatal_lines(text: str, *, exited: bool) -> list[str]:
    """The log lines that say start-up failed (in order, each once)."""
    patterns = _FATAL_AFTER_EXIT if exited else _FATAL_WHILE_ALIVE
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and stripped not in found and any(p.search(stripped) for p in patterns):
            found.append(stripped)
    return found


def probe_health(access: ServerAccess, *, timeout: float) -> int | None:
    """/health's status, or None when nothing answers yet (refused, reset, no reply)."""
    try:
        return access.request("GET", "/health", timeout=timeout, max_bytes=4096).status
    except (UnreachableError, RemoteStepFailed):
        return None


def wait_ready(
    transport: Transport,
    access: ServerAccess,
    port: int,
    *,
    log_offset: int,
    timeout: float,
    progress: Progress | None = None,
    poll_s: float = 1.0,
    request_timeout: float = 5.0,
    command_timeout: float = 60.0,
) -> ReadyResult:
    """Poll until /health is 200, the server exits, its log shows a fatal line, or ``timeout``
    seconds pass. ``log_offset``: where this launch's log lines start."""
    started = time.monotonic()
    deadline = started + timeout
    last_line = ""
    while True:
        status = probe_health(access, timeout=request_timeout)
        elapsed = time.monotonic() - started
        if status == 200:
            return ReadyResult("ready", elapsed, health_status=status)
        log = read_log(
            transport,
            port,
            TAIL_LINES * 50,
            max_bytes=_LOG_POLL_BYTES,
            offset=log_offset,
            timeout=command_timeout,
        )
        lines = log.lines
        exited = log.alive is False
        fatal = fatal_lines(log.text, exited=exited)
        if exited or fatal:
            # Exited: say why, or at least show how it ended. A fatal line while alive: done
            # waiting; the caller stops what is left.
            outcome: ReadyOutcome = "exited" if exited else "fatal"
            return ReadyResult(outcome, elapsed, fatal, lines[-TAIL_LINES:], status)
        if time.monotonic() >= deadline:
            return ReadyResult("timeout", elapsed, [], lines[-TAIL_LINES:], status)
        if progress is not None:
            newest = next((line for line in reversed(lines) if line.strip()), last_line)
            last_line = newest
            health = "no answer" if status is None else f"HTTP {status}"
            progress(elapsed, f"/health: {health}; log: {newest.strip()[:160]}")
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
