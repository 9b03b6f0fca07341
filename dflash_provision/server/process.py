"""The server process on the target: find it, start it, stop it, read its log.

Each operation is one exec of a POSIX sh script from ``server/scripts/``, loaded and parsed by
the one script protocol (remote/protocol.py) and ended on the target at its deadline
(server/bounded.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import ExitCode, RemoteStepFailed, RuntimeFailure, UsageError
from dflash_provision.remote.protocol import (  # the one script protocol
    RemoteProtocolError,
    parse_reply,
    script_argv,
    stderr_line,
)
from dflash_provision.server.bounded import run_bounded
from dflash_provision.server.records import LaunchRecord
from dflash_provision.transport.base import Transport
from dflash_provision.vllm.argv import ArgvSpec, read_speculative

#: What ``read_log`` returns at most unless told otherwise.
DEFAULT_LOG_BYTES = 256 * 1024
MAX_LOG_LINES = 100_000


def run_bounded_script(
    transport: Transport,
    name: str,
    args: list[str],
    *,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> tuple[dict[str, str], list[str], bytes | None]:
    """Run a runtime script; its fields, all its lines and its data (None without a data line).

    RemoteProtocolError when the answer is not the script's protocol (no shell, killed, ...).
    The script is ended on the target at its deadline (server/bounded.py).
    """
    result = run_bounded(transport, script_argv(name, *args), stdin=stdin, timeout=timeout)
    parsed = parse_reply(result.stdout, name)
    if not parsed.lines and parsed.data is None:
        raise RemoteProtocolError(
            f"{transport.description}: the {name} script failed: {stderr_line(result)}",
            step=name,
        )
    return parsed.fields, parsed.lines, parsed.data


def check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port} is not between 1 and 65535")
    return port


# --------------------------------------------------------------------------------------------
# What runs on a port


@dataclass(frozen=True)
class PortState:
    """Everything ``state.sh`` saw for one port, as values."""

    port: int
    state_dir: str
    pid: int | None  # the pidfile's
    alive: bool  # the pidfile's process group has live members
    listening: bool  # something listens on the port (in the target's network namespace)
    listener_pid: int | None  # the listening process, when the target shows it
    listener_pgid: int | None  # its process group
    log_path: str | None
    record: LaunchRecord | None
    record_error: str | None
    argv: list[str] = field(default_factory=list)  # of ``argv_pid``
    argv_pid: int | None = None
    pid_problem: str | None = None  # state.sh's check_pid (None: that very process runs)
    pid_stime: str | None = None  # the start time the pidfile records
    pid_stime_now: str | None = None  # the pidfile pid's start time, when it differs
    pid_argv: list[str] = field(default_factory=list)  # the pidfile's process's own argv
    listener_hidden: bool = False  # the port is held by a process this login cannot see

    @property
    def ours(self) -> bool:
        """Our pidfile's server is alive (whether or not it listens yet): the pidfile's pid
        started when the pidfile says and runs the launch record's command line."""
        return self.alive and self.pid is not None and self.untrusted_pid is None

    @property
    def untrusted_pid(self) -> str | None:
        """Why the pidfile's process must never be signalled, or None (no pidfile, the
        server exited, or it is our server)."""
        pid = self.pid
        problem = self.pid_problem
        if pid is None and problem is None:
            return None  # no pidfile
        if problem == "malformed":
            return "the pidfile does not hold a pid"
        if problem == "low":
            return (
                f"the pidfile names pid {pid}, never a server's (0 would signal the stopping "
                "command's own process group, 1 is init)"
            )
        if problem == "no-start-time":
            return f"the pidfile records no start time: pid {pid} cannot be told from a reused pid"
        if problem == "start-time":
            return (
                f"pid {pid} started at tick {self.pid_stime_now}, not at {self.pid_stime} as "
                "the pidfile says: another process has that pid now"
            )
        if problem is not None:
            return None  # "gone": the server exited
        if self.record is None:
            why = f" ({self.record_error})" if self.record_error else ""
            return f"no readable launch record{why} to check pid {pid}'s command line against"
        if not argv_matches(self.record.argv, self.pid_argv):
            shown = shlex.join(self.pid_argv)[:200] if self.pid_argv else "(not visible)"
            return f"pid {pid} runs {shown}, not the command line its launch record holds"
        return None

    @property
    def foreign_listener(self) -> bool:
        """The port is taken by something our pidfile does not name."""
        if not self.listening:
            return False
        if not self.ours:
            return True
        if self.listener_pid is None or self.listener_pid == self.pid:
            return False
        return self.listener_pgid != self.pid  # a child of our server (same group) is ours


def probe_port(transport: Transport, port: int, *, timeout: float | None = None) -> PortState:
    """What runs on ``port``, in one exec."""
    args = [str(check_port(port))]
    fields, lines, _ = run_bounded_script(transport, "state", args, timeout=timeout)
    record: LaunchRecord | None = None
    record_error: str | None = None
    if "record" in fields:
        try:
            record = LaunchRecord.from_json(fields["record"])
        except RemoteStepFailed as exc:
            record_error = exc.message
    pid = _opt_int(fields.get("pid"))
    if record is not None and pid is not None and record.pid is None:
        record = record.with_pid(pid)
    raise_unsafe_dir(fields, transport)
    return PortState(
        port=port,
        state_dir=fields.get("dir", ""),
        pid=pid,
        alive=fields.get("alive") == "1",
        listening=fields.get("listening") == "1",
        listener_pid=_opt_int(fields.get("listener")),
        listener_pgid=_opt_int(fields.get("listener_pgid")),
        log_path=fields.get("log"),
        record=record,
        record_error=record_error,
        argv=[line[4:] for line in lines if line.startswith("arg ")],
        argv_pid=_opt_int(fields.get("cmdpid")),
        pid_problem=fields.get("pid_problem"),
        pid_stime=fields.get("pid_stime"),
        pid_stime_now=fields.get("pid_stime_now"),
        pid_argv=[line[5:] for line in lines if line.startswith("parg ")],
        listener_hidden=fields.get("listener_hidden") == "1",
    )


def argv_matches(recorded: list[str], running: list[str]) -> bool:
    """The running process's argv ends with the recorded arguments (all after the command):
    a ``#!`` script shows its interpreter first (``python3 /venv/bin/vllm serve ...``), and a
    wrapper may exec another program with the same arguments; the exact arguments (model,
    speculative config JSON, host, port, extras) are what make it this launch's server."""
    if not recorded or not running:
        return False
    tail = recorded[1:]
    if not tail:
        return running == recorded
    return len(running) > len(tail) and running[-len(tail) :] == tail


def raise_unsafe_dir(fields: dict[str, str], transport: Transport) -> None:
    """A script refused the state directory (see runtime.sh trust_state_dir): exit 7, as push
    refuses an unsafe ``.dflash-backups``."""
    if fields.get("status") == "unsafe-dir":
        raise RemoteStepFailed(
            f"{transport.description}: {fields.get('error', 'unsafe state directory')}",
            step="state-dir",
        )


def _opt_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class RunningServer:
    """A server found on a port: its own command line says what it runs with."""

    port: int
    pid: int
    argv: list[str]
    speculative_config: dict[str, Any] | None  # parsed from argv; None when absent/unparsable
    record: LaunchRecord | None  # ours when we started it (and its argv still matches)
    listening: bool
    state: PortState
    argv_spec: ArgvSpec | None = None  # how argv was read: repeated options, unknowns

    @property
    def started_by_us(self) -> bool:
        return self.record is not None


def find_server(
    transport: Transport, port: int, *, timeout: float | None = None
) -> RunningServer | None:
    """The server on ``port``: ours (pidfile alive) or any process listening there that the
    target lets us see. None when nothing runs there."""
    return server_from_state(probe_port(transport, port, timeout=timeout))


def server_from_state(state: PortState) -> RunningServer | None:
    """The RunningServer a PortState shows, or None."""
    pid = state.argv_pid
    if pid is None:
        pid = state.pid if state.ours else state.listener_pid
    if pid is None:
        return None
    record = state.record if state.ours and not state.foreign_listener else None
    read = read_speculative(state.argv)
    return RunningServer(
        port=state.port,
        pid=pid,
        argv=state.argv,
        speculative_config=read.config,
        record=record,
        listening=state.listening,
        state=state,
        argv_spec=read,
    )


# --------------------------------------------------------------------------------------------
# Start / stop


def check_env(env: Mapping[str, str]) -> None:
    """UsageError for an env entry start.sh cannot pass (one NAME=VALUE per line on stdin).
    launch calls this before anything else, so a refused value never costs a running server."""
    for name, value in env.items():
        if not name or "=" in name or any(c in name for c in "\n\r\x00"):
            raise UsageError(f"--env {name!r}: not a variable name")
        if "\n" in value or "\r" in value or "\x00" in value:
            raise UsageError(f"--env {name}: the value holds a line break or NUL byte")


@dataclass(frozen=True)
class StartOutcome:
    status: str  # "started" | "running" (ours was already there)
    pid: int
    state_dir: str
    log_path: str
    log_offset: int  # the log's size before this start: this launch's lines come after


def start_server(
    transport: Transport,
    record: LaunchRecord,
    env: dict[str, str],
    *,
    timeout: float | None = None,
) -> StartOutcome:
    """Start ``record.argv`` detached for ``record.port`` with ``env`` added (one exec)."""
    check_env(env)
    stdin = (record.to_json() + "\n" + "".join(f"{k}={v}\n" for k, v in env.items())).encode()
    fields, _, _ = run_bounded_script(
        transport, "start", [str(record.port), *record.argv], stdin=stdin, timeout=timeout
    )
    raise_unsafe_dir(fields, transport)
    status = fields.get("status")
    if status == "busy":
        raise RuntimeFailure(
            f"{transport.description}: port {record.port}: {fields.get('error', 'busy')}",
            exit_code=ExitCode.PORT_TAKEN,
        )
    if status not in ("started", "running") or "pid" not in fields:
        raise RemoteStepFailed(
            f"{transport.description}: cannot start the server: "
            f"{fields.get('error', 'no answer from the start script')}",
            step="start",
        )
    state_dir = fields.get("dir", "")
    return StartOutcome(
        status=status,
        pid=int(fields["pid"]),
        state_dir=state_dir,
        log_path=fields.get("log", state_dir + "/server.log"),
        log_offset=int(fields.get("offset", "0") or 0),
    )


@dataclass(frozen=True)
class StopOutcome:
    status: str  # "stopped" | "not-running" | "refused" (the pidfile's process is not ours)
    pid: int | None  # the pidfile's
    signal: str | None  # "TERM" or "KILL" (something outlived the timeout)
    ended: list[int] = field(default_factory=list)  # every process that was signalled
    found_by: dict[str, int] = field(default_factory=dict)  # group/session/marker/descendant
    server_had_exited: bool = False  # only what the exited server left was ended
    refused: str | None = None  # why nothing was signalled
    state: PortState | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "pid": self.pid,
            "signal": self.signal,
            "ended": self.ended,
            "found_by": self.found_by,
            "server_had_exited": self.server_had_exited,
            "refused": self.refused,
        }


def stop_server(
    transport: Transport,
    port: int,
    *,
    timeout: float = 30.0,
    command_timeout: float | None = None,
    state: PortState | None = None,
) -> StopOutcome:
    """End every process of our server on ``port``: TERM, KILL after ``timeout`` s; remove the
    pidfile. A pidfile whose process is not the launch's server (``PortState.untrusted_pid``) is
    never signalled: the outcome is "refused" with the reason. ``state``: a fresh probe_port."""
    if state is None:
        state = probe_port(transport, port, timeout=command_timeout)
    if state.pid is None and state.pid_problem is None:
        return StopOutcome("not-running", None, None, state=state)
    why = state.untrusted_pid
    if why is not None:
        return StopOutcome("refused", state.pid, None, refused=why, state=state)
    expect = f"{state.pid}:{state.pid_stime}" if state.ours else "gone"
    commands = transport.command_timeout if command_timeout is None else command_timeout
    limit = max(commands, timeout + 15.0)  # TERM wait + KILL wait + the exec itself
    fields, _, _ = run_bounded_script(
        transport,
        "stop",
        [str(check_port(port)), str(max(0, int(timeout))), expect],
        timeout=limit,
    )
    raise_unsafe_dir(fields, transport)
    status = fields.get("status")
    pid = _opt_int(fields.get("pid"))
    if status == "refused":
        why = f"the pidfile changed while stopping ({fields.get('why', '?')})"
        return StopOutcome("refused", pid, None, refused=why, state=state)
    if status not in ("stopped", "not-running"):
        left = fields.get("left", "").strip()
        raise RemoteStepFailed(
            f"{transport.description}: the server on port {port} (pid {fields.get('pid')}) "
            f"did not go away after SIGKILL: still there: {left or '?'}",
            step="stop",
        )
    counts = fields.get("how", "").split()
    found_by = {
        name: int(count)
        for name, count in zip(counts[::2], counts[1::2], strict=False)
        if count.isdigit() and int(count)
    }
    return StopOutcome(
        status=status,
        pid=pid,
        signal=fields.get("signal"),
        ended=[int(p) for p in fields.get("ended", "").split() if p.isdigit()],
        found_by=found_by,
        server_had_exited=fields.get("leader") == "gone",
        state=state,
    )


# --------------------------------------------------------------------------------------------
# Logs


@dataclass(frozen=True)
class LogTail:
    path: str
    present: bool
    text: str  # the last lines (decoded, invalid bytes replaced)
    size: int | None  # the whole log's size
    alive: bool | None  # the port's server, when the log was asked for by port

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def read_log(
    transport: Transport,
    record_or_path: LaunchRecord | str | int,
    lines: int = 200,
    *,
    max_bytes: int = DEFAULT_LOG_BYTES,
    offset: int = 0,
    timeout: float | None = None,
) -> LogTail:
    """The last ``lines`` lines (at most ``max_bytes`` bytes) of a server log: a record's, an
    absolute path, or a port's (``int``). ``offset``: only bytes written after it."""
    if isinstance(record_or_path, LaunchRecord):
        where = record_or_path.log_path or str(record_or_path.port)
    elif isinstance(record_or_path, int):
        where = str(check_port(record_or_path))
    else:
        where = record_or_path
    if not where.isdigit() and not where.startswith("/"):
        raise UsageError(f"log path {where!r} must be absolute")
    lines = max(1, min(lines, MAX_LOG_LINES))
    fields, _, data = run_bounded_script(
        transport,
        "logs",
        [where, str(lines), str(max(1, max_bytes)), str(max(0, offset))],
        timeout=timeout,
    )
    raise_unsafe_dir(fields, transport)
    body = (data or b"")[-max_bytes:]
    return LogTail(
        path=fields.get("log", where),
        present=fields.get("status") == "present",
        text=body.decode("utf-8", errors="replace"),
        size=_opt_int(fields.get("size")),
        alive=None if "alive" not in fields else fields["alive"] == "1",
    )


def read_startup_log(
    transport: Transport,
    record: LaunchRecord,
    *,
    max_bytes: int = DEFAULT_LOG_BYTES,
    timeout: float | None = None,
) -> LogTail:
    """This launch's part of the record's server log from its beginning (its start-up records
    come first), at most ``max_bytes`` bytes; one exec. ``size`` is the whole log's."""
    where = record.log_path
    if not where.startswith("/"):
        raise UsageError(f"log path {where!r} must be absolute")
    fields, _, data = run_bounded_script(
        transport, "startlog", [where, str(max(1, max_bytes))], timeout=timeout
    )
    body = (data or b"")[:max_bytes]
    return LogTail(
        path=fields.get("log", where),
        present=fields.get("status") == "present",
        text=body.decode("utf-8", errors="replace"),
        size=_opt_int(fields.get("size")),
        alive=None,
    )
