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

_ERROR_LEVEL = re.compile(r"(?:^|\) )ERROR\b")  # vLLM: "(EngineCore pid=9) ERROR 12-01 ..."
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
_EXCEPTION_LINE = re.compile(r"^[\w.]+(?:Error|Exception|Interrupt)\b:")  # closes a traceback
_FATAL_WHILE_ALIVE = [
    re.compile(r"DFlash sliding attention requires a window size"),
    re.compile(r"\bNotImplementedError\b"),
    re.compile(r"Engine ?core (?:initialization|proc \S+) failed|EngineCore failed to start", re.I),
    _ERROR_LEVEL,
]
# The command itself could not run (shell and busybox wording).
_NOT_EXECUTED = re.compile(
    r"can't execute|: not found$|No such file or directory$|Permission denied$"
)
_FATAL_AFTER_EXIT = [*_FATAL_WHILE_ALIVE, _TRACEBACK, _EXCEPTION_LINE, _NOT_EXECUTED]
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
    """The log lines that say start-up failed, each once, the most telling first: the
    exception's own line (``ValueError: DFlash sliding attention ...``), then ERROR lines, then
    a traceback's header."""
    patterns = _FATAL_AFTER_EXIT if exited else _FATAL_WHILE_ALIVE
    found: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    for position, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if not stripped or stripped in seen:
            continue
        ranks = [_rank(p) for p in patterns if p.search(stripped)]
        if ranks:
            seen.add(stripped)
            found.append((min(ranks), position, stripped))
    return [line for _, _, line in sorted(found)]


def _rank(pattern: re.Pattern[str]) -> int:
    """How telling a match of ``pattern`` is (lower first)."""
    if pattern is _TRACEBACK:
        return 3
    if pattern is _ERROR_LEVEL:
        return 2
    if pattern is _EXCEPTION_LINE:
        return 1
    return 0


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
