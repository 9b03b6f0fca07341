"""Wait for a starting server: /health with a deadline and progress, and stop waiting as soon as
the process exits or its log says start-up failed, with the log lines that say why.

What counts as fatal while the process still runs (vLLM's API server can outlive its engine for
a while): vLLM's DFlash refusals, NotImplementedError, an engine that failed to start, and
ERROR-level lines carrying an exception or a traceback; it then gets a few seconds to exit on
its own. Other ERROR lines and a bare traceback only count once the process is gone (libraries
print tracebacks of optional imports that fail harmlessly). See ``_rank``.

vLLM (0.20-0.34) prefixes every line its API server and engine write, logged or not, with
``(APIServer pid=N) `` (``decorate_logs``): a traceback Python prints as the API server dies
carries that prefix and no level. A configuration vLLM refuses ends as a pydantic
ValidationError whose reason is on the indented line below its header, e.g. on 0.20.1::

    (APIServer pid=8249) pydantic_core._pydantic_core.ValidationError: 1 validation error ...
    (APIServer pid=8249)   Value error, VLLM_USE_V2_MODEL_RUNNER does not yet support: ...

so that header and its reasons are reported as one line (see ``_validation_error``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from dflash_provision.errors import RemoteStepFailed, UnreachableError
from dflash_provision.server.access import ServerAccess
from dflash_provision.server.process import read_log
from dflash_provision.transport.base import Transport

ReadyOutcome = Literal["ready", "exited", "fatal", "timeout"]
Progress = Callable[[float, str], None]

# vLLM's line prefix: "(EngineCore_DP0 pid=53) ERROR 12-01 06:04:17 [core.py:843] message".
# vLLM logs a failing engine's traceback with that prefix on every line, so lines are judged
# by their level and their message, the prefix taken off. The process part comes alone on what
# Python itself prints (a traceback), coloured when VLLM_LOGGING_COLOR=1.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROCESS = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([^()]*\bpid=\d+\)(?:\x1b\[[0-9;]*m)? ")
_PREFIX = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ?"
)
_SPECIFIC = re.compile(r"DFlash sliding attention requires a window size|\bNotImplementedError\b")
_EXCEPTION = re.compile(r"^[\w.]+(?:Error|Exception|Interrupt)\b:")  # closes a traceback
_GENERIC_ENGINE = re.compile(
    r"Engine ?core (?:initialization|proc \S+) failed|EngineCore failed to start|"
    r"See root cause above",
    re.I,
)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
# pydantic's ValidationError: "N validation error(s) for Model", then per error an optional
# location line and an indented "  Message [type=..., input_value=..., input_type=...]" line.
_VALIDATION = re.compile(r"^[\w.]*ValidationError: \d+ validation errors? for (?P<model>\w+)")
_VALIDATION_REASON = re.compile(r"^ {2}(?P<reason>\S.*?) \[type=[\w.]+")
_PYDANTIC_KIND = re.compile(r"^(?:Value|Assertion) error, ")
#: Lines read below a ValidationError's header for its reasons (pydantic prints 2-3 per error).
_VALIDATION_LINES = 12
# The command itself could not run (shell and busybox wording).
_NOT_EXECUTED = re.compile(r"can't execute|: not found$|No such file or directory$")


def _split(line: str) -> tuple[str | None, str]:
    """A line's level (None when it is not a log record) and its message, prefixes taken off."""
    process = _PROCESS.match(line)
    rest = line[process.end() :] if process else line
    prefix = _PREFIX.match(rest)
    if prefix is None:
        return None, rest
    return prefix.group("level"), rest[prefix.end() :]


def _validation_error(model: str, below: list[str]) -> str | None:
    """A ValidationError's header with the reasons pydantic printed below it, as one line:
    "ValidationError for VllmConfig: Model Runner V2 requires Triton." (``below``: the
    messages of the lines that follow, prefixes taken off); None when none is found."""
    reasons: list[str] = []
    location = ""
    for message in below:
        if not message.startswith(" ") and location:
            break  # past this error's lines (a location line comes before its reason only)
        reason = _VALIDATION_REASON.match(message)
        if reason is not None:
            text = _PYDANTIC_KIND.sub("", reason.group("reason"))
            reasons.append(f"{location}: {text}" if location else text)
            location = ""
        elif message.strip() and not message.startswith(" "):
            location = message.strip()
        elif not message.strip():
            break
    return f"ValidationError for {model}: {'; '.join(reasons)}" if reasons else None


def _rank(line: str, *, exited: bool) -> int | None:
    """How telling ``line`` is about a failed start-up (lower first), None when it is not.

    0 vLLM's own DFlash refusals; 1 an exception's line, a command that could not run; 2 any
    other ERROR message; 3 "engine failed, see root cause above"; 4 a traceback's header.
    While the server still runs, only the DFlash refusals and ERROR-level lines that carry an
    exception, an engine failure or a traceback count (libraries print harmless tracebacks of
    optional imports, and not every ERROR line is fatal).
    """
    level, message = _split(line)
    if _SPECIFIC.search(message):
        return 0
    if level is None and not exited:
        return None
    if level is not None and level not in ("ERROR", "CRITICAL"):
        return None
    if not message.strip() or message[:1].isspace():
        return None  # a traceback's frame lines: context, not the cause
    if _GENERIC_ENGINE.search(message):
        return 3
    if _TRACEBACK.search(message):
        return 4
    if _EXCEPTION.search(message) or (level is None and _NOT_EXECUTED.search(message)):
        return 1
    # Any other ERROR message: only once the server has exited. vLLM logs some harmless ERROR
    # lines while starting, and its engine's real failures say so in the lines above.
    return 2 if level is not None and exited else None


#: After a fatal line, how long a still-running server gets to exit on its own (vLLM's API
#: server follows its engine down within a few seconds), so the report has the whole story.
EXIT_GRACE_S = 8.0
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
    """The log lines that say start-up failed, each once, the most telling first."""
    found: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    lines = text.splitlines()
    for position, line in enumerate(lines):
        stripped = line.rstrip()
        if not stripped.strip() or stripped in seen:
            continue
        rank = _rank(stripped, exited=exited)
        if rank is not None:
            seen.add(stripped)
            shown = _ANSI.sub("", stripped).strip()  # reported as text, colours off
            validation = _VALIDATION.match(_split(stripped)[1])
            if validation is not None:
                after = lines[position + 1 : position + 1 + _VALIDATION_LINES]
                below = [_split(later.rstrip())[1] for later in after]
                shown = _validation_error(validation.group("model"), below) or shown
            found.append((rank, position, shown))
    return [line for _, _, line in sorted(found)]


def probe_health(access: ServerAccess, *, timeout: float) -> int | None:
    """/health's status, or None when nothing answers yet (refused, reset, no reply)."""
    try:
        return access.request("GET", "/health", timeout=timeout, max_bytes=4096).status
    except UnreachableError:
        return None
    except RemoteStepFailed as exc:
        if exc.step == "access":  # no way to ask at all: waiting would not help
            raise
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
    command_timeout: float | None = None,  # each log read; None: the transport's
) -> ReadyResult:
    """Poll until /health is 200, the server exits, its log shows a fatal line, or ``timeout``
    seconds pass. ``log_offset``: where this launch's log lines start."""
    started = time.monotonic()
    deadline = started + timeout
    last_line = ""
    fatal_seen: float | None = None
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
        if fatal and not exited and fatal_seen is None:
            fatal_seen = time.monotonic()
        grace_over = fatal_seen is not None and time.monotonic() - fatal_seen >= EXIT_GRACE_S
        if exited or grace_over:
            # Exited: say why, or at least show how it ended. A fatal line and still alive
            # after the grace: done waiting; the caller stops what is left.
            outcome: ReadyOutcome = "exited" if exited else "fatal"
            return ReadyResult(outcome, elapsed, fatal, lines[-TAIL_LINES:], status)
        if time.monotonic() >= deadline:
            return ReadyResult("timeout", elapsed, [], lines[-TAIL_LINES:], status)
        if progress is not None:
            newest = next((line for line in reversed(lines) if line.strip()), last_line)
            last_line = newest
            health = "no answer" if status is None else f"HTTP {status}"
            said = f"; log: {newest.strip()[:160]}" if newest.strip() else ""
            progress(elapsed, f"/health: {health}{said}")
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
