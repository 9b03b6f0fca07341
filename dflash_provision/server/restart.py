"""A restart that is proved or failed: the steps every restart takes (``launch --restart``,
``rollout``'s batches, rollback, ``--resume`` and ``--abort``, the Ansible ``server`` module).

Before anything is stopped (each refusal leaves the old server running):
1. the port's pidfile names OUR server: same pid and start time, running the launch record's
   command line (``PortState.ours``); a pidfile that is not trusted (a site wrapper that
   appends arguments, a reused pid) or no server at all fails the restart here;
2. the environment the server runs with: the values of its launch's env NAMES, read on the host
   from ``/proc/PID/environ`` of that very process (same user or root) at this moment, never
   stored; ``--env`` values override; a name neither readable nor given refuses.

Then: stop (anything but "stopped" fails: nothing starts), start (the start script's "running"
is never a start), wait for /health, and the proof (:func:`prove`): the old pid and start time
are gone, a new process runs the recorded command line, this start's own engine record (after
start.sh's launch line in the log) names the drafter directory and N, the server answers."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode, RemoteStepFailed, RuntimeFailure
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.server.access import open_server
from dflash_provision.server.locate import choose_port, same_path
from dflash_provision.server.preflight import V2_RUNNER_ENV, runtime_env
from dflash_provision.server.process import (
    PortState,
    StartOutcome,
    StopOutcome,
    check_env,
    check_port,
    probe_port,
    raise_unsafe_dir,
    read_startup_log,
    run_bounded_script,
    start_server,
    stop_server,
)
from dflash_provision.server.readiness import wait_ready
from dflash_provision.server.records import LaunchRecord
from dflash_provision.transport.base import Transport
from dflash_provision.vllm.log import parse_startup

if TYPE_CHECKING:
    from dflash_provision.target import Target

#: Set by start.sh for every server: a new one gets its own, never the old one's.
_MARKER_ENV = "DFLASH_PROVISION_SERVER"


class RestartFailed(RuntimeFailure):
    """A restart refused or not proved; ``stopped`` says whether the old server was stopped."""

    def __init__(
        self, message: str, *, exit_code: ExitCode, stopped: bool, reason: str = ""
    ) -> None:
        super().__init__(message, exit_code=exit_code)
        self.stopped = stopped
        self.reason = reason or message  # what was found, without what it left


def refused(message: str, exit_code: ExitCode = ExitCode.PORT_TAKEN) -> RestartFailed:
    return RestartFailed(
        f"{message}; nothing was stopped: the old server keeps running",
        exit_code=exit_code,
        stopped=False,
        reason=message,
    )


def server_down(state: PortState) -> bool:
    """Nothing of the port's server runs: its pidfile names an exited process, or is gone (a
    stop that ran, a start that failed), and nothing listens."""
    return not state.listening and (state.pid_problem == "gone" or state.pid is None)


def old_server(transport: Transport, state: PortState) -> int:
    """The pid of the server a restart would stop, or RestartFailed saying what was found."""
    where = f"port {state.port} on {transport.description}"
    why = state.untrusted_pid
    if why is not None:
        raise refused(f"{where}: stop would be refused: {why}")
    if not state.ours or state.pid is None:
        found = " (its pidfile names an exited server)" if state.pid_problem == "gone" else ""
        raise refused(
            f"{where}: no server started by dflash-provision launch runs there{found}: "
            "a restart needs the running server it replaces",
            ExitCode.NOT_RUNNING,
        )
    return state.pid


def server_env(
    transport: Transport,
    state: PortState,
    names: list[str],
    given: dict[str, str],
    *,
    skip: frozenset[str] = frozenset(),
    timeout: float | None = None,
) -> dict[str, str]:
    """The env a restart passes: each recorded NAME's value read from the running server's
    environment, ``given`` (``--env``) overriding; RestartFailed (nothing stopped) for a name
    neither readable nor given. ``skip``: names the caller sets itself."""
    wanted = [n for n in names if n not in given and n not in skip and n != _MARKER_ENV]
    values = dict(given)
    if not wanted:
        return values
    expect = f"{state.pid}:{state.pid_stime}"
    fields, lines, _ = run_bounded_script(
        transport, "environ", [str(check_port(state.port)), expect, *wanted], timeout=timeout
    )
    raise_unsafe_dir(fields, transport)
    found: dict[str, str] = {}
    for line in lines:
        if line.startswith("env ") and "=" in line:
            name, _, value = line[4:].partition("=")
            if name in wanted and name not in found:
                found[name] = value
    missing = [n for n in wanted if n not in found]
    if missing:
        status = fields.get("status", "?")
        why = fields.get("why", "") if status != "ok" else "not in its environment"
        raise refused(
            f"the env values of the server on port {state.port} (pid {state.pid}) cannot be "
            f"read ({status}: {why}) for {', '.join(missing)}: give them with "
            + " ".join(f"--env {n}=..." for n in missing),
            ExitCode.USAGE,
        )
    return {**found, **given}


def stop_old(
    transport: Transport,
    state: PortState,
    *,
    stop_timeout: float,
    command_timeout: float | None,
) -> StopOutcome:
    """Stop the server ``state`` shows; RestartFailed when stop did not end it (refused, or
    nothing found): then nothing was started."""
    outcome = stop_server(
        transport, state.port, timeout=stop_timeout, command_timeout=command_timeout, state=state
    )
    if outcome.status != "stopped":
        what = outcome.refused or "nothing of the server was found to stop"
        raise RestartFailed(
            f"port {state.port} on {transport.description}: stop {outcome.status} ({what}); "
            "nothing was started",
            exit_code=ExitCode.PORT_TAKEN,
            stopped=False,
        )
    return outcome


def start_new(
    transport: Transport, record: LaunchRecord, env: dict[str, str], *, old_pid: int,
    timeout: float | None,
) -> StartOutcome:  # fmt: skip
    """Start ``record``; RestartFailed when the start script found a server running (then
    nothing was started by this restart, whatever answers on the port)."""
    outcome = start_server(transport, record, env, timeout=timeout)
    if outcome.status != "started":
        raise RestartFailed(
            f"port {record.port} on {transport.description}: after the stop of pid {old_pid} "
            f"the start script found pid {outcome.pid} already running: nothing was started",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    return outcome


@dataclass(frozen=True)
class Proof:
    old_pid: int
    new_pid: int
    evidence: str  # one line: what was found

    def to_dict(self) -> dict[str, object]:
        return {"old_pid": self.old_pid, "new_pid": self.new_pid, "evidence": self.evidence}


def prove(
    transport: Transport,
    record: LaunchRecord,
    old: PortState,
    *,
    timeout: float | None,
) -> Proof:
    """After a start that reported ready: the new server is a new process running ``record``'s
    command line, and its own engine record names the drafter and N. RestartFailed (the
    message says what was found) otherwise."""
    where = f"port {record.port} on {transport.description}"
    now = probe_port(transport, record.port, timeout=timeout)

    def not_proved(what: str) -> RestartFailed:
        return RestartFailed(
            f"{where}: restart not proved: {what}", exit_code=ExitCode.LAUNCH_FAILED, stopped=True
        )

    if now.pid == old.pid and now.pid_stime == old.pid_stime:
        raise not_proved(f"the old server (pid {old.pid}) is still the one running")
    if not now.ours or now.pid is None:
        why = now.untrusted_pid or f"no server runs there (pidfile: {now.pid_problem or 'none'})"
        raise not_proved(why)
    if now.foreign_listener:
        raise not_proved(f"the port is held by pid {now.listener_pid}, not the new server")
    log = read_startup_log(transport, record, timeout=timeout)
    facts = parse_startup(log.text)
    engine = facts.engine
    if facts.launch is None or engine is None:
        raise not_proved(f"no engine start-up record of this start in {log.path}")
    problems = []
    if not same_path(engine.spec_model, record.drafter_dir):
        problems.append(f"drafter {engine.spec_model!r}, not {record.drafter_dir!r}")
    if engine.num_spec_tokens != record.num_speculative_tokens:
        problems.append(
            f"{engine.num_spec_tokens} speculative tokens, not {record.num_speculative_tokens}"
        )
    if problems:
        raise not_proved("its engine start-up record says " + "; ".join(problems))
    return Proof(
        old.pid or 0,
        now.pid,
        f"pid {old.pid} gone, pid {now.pid} runs the recorded command line, its engine "
        f"record: drafter {engine.spec_model}, num_spec_tokens {engine.num_spec_tokens}",
    )


@dataclass(frozen=True)
class RestartDone:
    """A proved restart: what proved it, and the env values it passed (kept in memory only,
    for a rollback of the same run whose new server died; never saved)."""

    evidence: str
    env: dict[str, str]


def restart_recorded(
    transport: Transport,
    launch: dict[str, Any],
    port: int,
    doc: dict[str, Any],
    env: dict[str, str],
    ready_s: float,
    *,
    sha256: str | None,
    may_be_down: bool = False,
    remembered: dict[str, str] | None = None,
    stop_timeout: float = 30.0,
) -> RestartDone:
    """Stop the server on ``port`` and start it again with its recorded launch (same argv, env
    names with the running server's values, ``env`` overriding), wait until it is ready and
    prove it; RestartFailed saying what was found otherwise (``stopped``: the old server was).

    ``may_be_down``: a rollback, whose server (started by this rollout) may have died on the
    bad config: a pidfile naming an exited server is then started again, with ``remembered``
    (the values this run read before) and ``env`` for its environment."""
    # The same command line and env names; the record names the drafter bytes it now reads.
    now = datetime.now(UTC).isoformat(timespec="seconds")
    fields = {"pid": None, "drafter_sha256": sha256 or "", "file_sha256": sha256 or "",
              "started_at": now}  # fmt: skip
    record = LaunchRecord.from_dict({**launch, **fields})
    timeout = transport.command_timeout
    skip = frozenset({V2_RUNNER_ENV})
    state = probe_port(transport, port, timeout=timeout)
    down = may_be_down and server_down(state)
    if down:
        values = {**(remembered or {}), **env}
        missing = [n for n in record.env_names if n not in values and n not in skip]
        if missing:
            raise refused(
                f"the server on port {port} has exited: its env values cannot be read "
                "again; give them with " + " ".join(f"--env {n}=..." for n in missing),
                ExitCode.USAGE,
            )
        old_pid = state.pid or 0
    else:
        old_pid = old_server(transport, state)
        values = server_env(transport, state, record.env_names, env, skip=skip, timeout=timeout)
    given = {n: values[n] for n in record.env_names if n in values}
    full = runtime_env(doc, {k: v for k, v in given.items() if k != V2_RUNNER_ENV})[0]
    check_env(full)
    if down:
        stop_server(transport, port, command_timeout=timeout, state=state)  # leftovers
    else:
        stop_old(transport, state, stop_timeout=stop_timeout, command_timeout=timeout)
    outcome = start_new(transport, record, full, old_pid=old_pid, timeout=timeout)
    with open_server(transport, port, python=record.python) as access:
        ready = wait_ready(
            transport,
            access,
            port,
            log_offset=outcome.log_offset,
            timeout=ready_s,
            command_timeout=timeout,
        )
    if not ready.ready:
        why = ready.fatal_lines[0] if ready.fatal_lines else ready.outcome
        raise RestartFailed(
            f"port {port} on {transport.description}: the server did not come back ready: {why}",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    proof = prove(transport, record.with_pid(outcome.pid), state, timeout=timeout)
    return RestartDone(proof.evidence, given)


def missing_dirs(transport: Transport, paths: list[str], *, timeout: float | None) -> list[str]:
    """The absolute ``paths`` that are not directories on the target (one exec). A model given
    as a Hub id is not a path: only absolute ones are asked about."""
    wanted = [p for p in paths if p.startswith("/")]
    if not wanted:
        return []
    script = 'for d do [ -d "$d" ] || printf "%s\\n" "$d"; done'
    result = transport.run(["sh", "-c", script, "sh", *wanted], timeout=timeout)
    if not result.ok:
        raise RemoteStepFailed(
            f"{transport.description}: cannot look for {', '.join(wanted)}", step="read"
        )
    told = result.stdout.decode("utf-8", "replace").splitlines()
    return [p for p in wanted if p in told]


def refuse_missing_dirs(transport: Transport, model: str, drafter_dir: str, timeout: float) -> None:
    """RestartFailed (nothing stopped) when the model directory (an absolute --model) or the
    drafter directory does not exist on the target: vLLM could not start from them."""
    gone = missing_dirs(transport, [model, drafter_dir], timeout=timeout)
    if gone:
        raise refused(
            f"{', '.join(gone)}: no such directory on {transport.description}", ExitCode.USAGE
        )


@dataclass(frozen=True)
class Overrides:
    """What ``launch TARGET --restart`` may change of the recorded launch."""

    num_speculative_tokens: int | None = None
    vllm_cmd: tuple[str, ...] | None = None


def with_overrides(launch: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    """The recorded launch with a new N (in its --speculative-config JSON too) or vLLM command
    (the argv's first words)."""
    out = dict(launch)
    argv = list(out["argv"])
    old_cmd = list(out.get("vllm_cmd") or [])
    if overrides.vllm_cmd is not None:
        if argv[: len(old_cmd)] != old_cmd or not old_cmd:
            raise refused("the recorded command line does not start with its recorded vLLM command")
        argv = [*overrides.vllm_cmd, *argv[len(old_cmd) :]]
        out["vllm_cmd"] = list(overrides.vllm_cmd)
    n = overrides.num_speculative_tokens
    if n is not None:
        for index, arg in enumerate(argv[:-1]):
            if arg == "--speculative-config":
                spec = json.loads(argv[index + 1])
                spec["num_speculative_tokens"] = n
                argv[index + 1] = json.dumps(spec, separators=(",", ":"))
        out["num_speculative_tokens"] = n
    out["argv"] = argv
    return out


def restart_launch(
    transport: Transport,
    target: Target,
    port: int | None,
    env: dict[str, str],
    overrides: Overrides,
    *,
    ready_timeout: float,
    stop_timeout: float,
    timeout: float,
) -> tuple[RestartDone, LaunchRecord]:
    """``launch TARGET --restart`` with no --model: the launch recorded for the drafter
    directory, restarted as it was (its argv, its env read from the running server, --env
    overriding), with the config on disk; every refusal before anything stops."""
    drafter_dir, config_path = target.model_dir, target.config_path
    chosen = choose_port(transport, target, port, timeout=timeout)
    state = probe_port(transport, chosen.port, timeout=timeout)
    record = state.record
    if record is None:
        why = f" ({state.record_error})" if state.record_error else ""
        raise refused(
            f"port {chosen.port} on {transport.description} has no launch record{why}: "
            "start it with launch --model MODEL",
            ExitCode.NOT_RUNNING,
        )
    if posixpath.normpath(record.drafter_dir) != posixpath.normpath(drafter_dir):
        raise refused(
            f"the server on port {chosen.port} was launched for {record.drafter_dir}, not "
            f"{drafter_dir}"
        )
    refuse_missing_dirs(transport, record.model, drafter_dir, timeout)
    current = read_remote_config(transport, config_path, timeout=timeout)
    if not current.present or current.data is None:
        raise refused(f"{config_path}: {current.describe()}", ExitCode.REMOTE_FAILED)
    try:
        doc = json.loads(current.data)
    except ValueError:
        raise refused(f"{config_path} is not JSON", ExitCode.INVALID) from None
    launch = with_overrides(record.to_dict(), overrides)
    done = restart_recorded(
        transport, launch, chosen.port, doc if isinstance(doc, dict) else {}, env,
        ready_timeout, sha256=current.sha256, stop_timeout=stop_timeout,
    )  # fmt: skip
    now = probe_port(transport, chosen.port, timeout=timeout)
    return done, now.record or LaunchRecord.from_dict(launch)
