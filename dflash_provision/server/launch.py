"""``launch``: pre-flight checks (``runtime.preflight``), then start ``vllm serve`` detached and
wait until it is ready.

Pre-flight, before anything starts (each refusal names its fix):
1. the drafter config.json on the target is the authoritative config, as file_status.judge
   rules (else DriftFound, with the fields that differ and the push command that fixes it; a
   file with the authoritative values in other bytes, same_values, passes with a warning);
   and when the authority is a lock that pins the commit's other files (``fetch --all-files``),
   each of them is the pinned one where it lies (server/drafter_files.py: sizes always, hashes
   unless a recorded proof's identity is unchanged or ``--rehash-files``): else refused with 4
   (wrong, missing, stray), 7 (unreadable) or 26 (cannot tell), naming each file;
2. it validates, every layer, with the target model's config.json when MODEL is a directory on
   the target that holds one;
3. ``num_speculative_tokens <= block_size - 1`` (default ``block_size - 1``);
4. vLLM answers ``CMD --version`` on the target (the version goes into the record), and the
   port can be reached (in a container: its ``--python`` runs);
5. the target's own vLLM is asked (``runtime.launch_probe``, the probe of runtime-check's stage
   b run with the python of the ``--vllm`` command): a vLLM that would run the drafter otherwise
   than trained (aux ids without the + 1, sliding layers as full attention) is refused; a layout
   that no model runner of that vLLM can serve on this host is refused, naming which vLLM can;
   ``VLLM_USE_V2_MODEL_RUNNER`` is set only where that vLLM needs it to pick the runner that
   serves the layout and knows the variable; ``--speculative-config`` keys that vLLM would
   reject are refused. Where the probe cannot answer (no vLLM for that python), a warning, and
   the layout rule: a mixed drafter gets ``VLLM_USE_V2_MODEL_RUNNER=1``.
``force`` lets 2, 3 and 5's "not as trained" pass with warnings (vLLM's own start-up decides).

Then: the port's state decides. Our server with the same launch → "already-running" (waits for
its readiness too); a different launch of ours → refused unless ``restart``; a process we did not
start holding the port → always refused. Start (process.start_server), wait (readiness).
``restart`` with our server running replaces it whatever it runs, through server/restart.py: its
env values read from it (``--env`` overriding), an absolute model directory and the drafter
directory checked on the target, all before the stop; then stop, start, wait and the proof (a
restart not proved is "failed", exit 20). With nothing of ours on the port it is a plain start.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from dflash_provision.errors import DflashProvisionError, ExitCode, RuntimeFailure, UsageError
from dflash_provision.server.access import open_server
from dflash_provision.server.preflight import V2_RUNNER_ENV, LaunchRequest, Preflight, preflight
from dflash_provision.server.process import (
    PortState,
    check_env,
    probe_port,
    read_log,
    start_server,
    stop_server,
)
from dflash_provision.server.readiness import Progress, ReadyResult, wait_ready
from dflash_provision.server.records import LOGFILE, LaunchRecord
from dflash_provision.server.restart import (
    RestartFailed,
    missing_dirs,
    old_server,
    prove,
    server_env,
    start_new,
    stop_old,
)
from dflash_provision.source.authority import Authority
from dflash_provision.target import Target
from dflash_provision.transport.base import Transport

SERVER_HOST = "127.0.0.1"

LaunchStatus = Literal["started", "restarted", "already-running", "failed"]


class ReadinessInterrupted(KeyboardInterrupt):
    """Ctrl-C during the readiness wait: the server was left starting (``message`` says how
    to stop it). A KeyboardInterrupt, so whatever does not catch it still exits 130."""

    def __init__(self, message: str, *, pid: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.pid = pid


@dataclass
class LaunchResult:
    status: LaunchStatus
    target: str
    port: int
    record: LaunchRecord
    preflight: Preflight
    ready: ReadyResult | None
    message: str = ""
    stopped_after_failure: bool = False

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.ok else ExitCode.LAUNCH_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "target": self.target,
            "port": self.port,
            "message": self.message,
            "record": self.record.to_dict(),
            "preflight": self.preflight.to_dict(),
            "ready": self.ready.to_dict() if self.ready else None,
            "stopped_after_failure": self.stopped_after_failure,
        }


def build_record(
    transport: Transport, request: LaunchRequest, pre: Preflight, state_dir: str
) -> LaunchRecord:
    """The record (and with it the exact argv) of this launch; pid is filled in on read."""
    spec = {
        **request.speculative_extra,
        "method": "dflash",
        "model": pre.drafter_dir,
        "num_speculative_tokens": pre.num_speculative_tokens,
    }
    argv = [
        *request.vllm_cmd,
        "serve",
        request.model,
        "--speculative-config",
        json.dumps(spec, separators=(",", ":")),
        "--host",
        SERVER_HOST,
        "--port",
        str(request.port),
        *pre.vllm_args,
        *request.extra_args,
    ]
    return LaunchRecord(
        port=request.port,
        pid=None,
        argv=argv,
        env_names=sorted(pre.env),
        drafter_dir=pre.drafter_dir,
        drafter_sha256=pre.drafter_sha256,
        file_sha256=pre.file_sha256,
        model=request.model,
        num_speculative_tokens=pre.num_speculative_tokens,
        vllm_cmd=list(request.vllm_cmd),
        python=request.python,
        vllm_version=pre.vllm_version,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        log_path=f"{state_dir}/{LOGFILE}",
        host=transport.description,
    )


def launch(
    transport: Transport,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    *,
    progress: Progress | None = None,
    preflight_passed: Callable[[Preflight, LaunchRecord], None] | None = None,
) -> LaunchResult:
    """Pre-flight, then start (or find already running) and wait for readiness.
    ``preflight_passed`` is told what pre-flight found before anything starts or is waited for
    (the CLI shows its summary then, not after a wait of minutes).

    Everything that can refuse this launch runs before ``--restart`` stops the old server:
    the env values, the whole pre-flight (drafter file, validation, vLLM version, the way to
    the port) and the port's state; a refusal then says that the old server keeps running."""
    timeout = request.command_timeout
    try:
        check_env(request.env)
        if request.restart:
            # vLLM could not start from a directory that is not there: an outage, not a restart
            gone = missing_dirs(transport, [request.model, target.model_dir], timeout=timeout)
            if gone:
                raise UsageError(f"{', '.join(gone)}: no such directory on {transport.description}")
        pre = preflight(transport, target, authority, request)
        state = probe_port(transport, request.port, timeout=timeout)
        record = build_record(transport, request, pre, state.state_dir)
        check_env(pre.env)  # with what pre-flight added
        if state.listener_hidden and not state.ours:
            raise _hidden(state, transport)
        if state.foreign_listener:
            raise _foreign(state, transport)
        if state.untrusted_pid is not None and state.pid_problem is None:
            # That pid runs since the pidfile says, but not the recorded command line: start.sh
            # would take it for ours; no launch can tell what it is.
            raise RuntimeFailure(
                f"port {state.port} on {transport.description}: {state.untrusted_pid}; "
                f"remove {state.state_dir}/pid if that process is not a server of this port",
                exit_code=ExitCode.PORT_TAKEN,
            )
    except DflashProvisionError as exc:
        if request.restart:
            exc.message += _left_running(transport, request.port, timeout)
        raise
    if preflight_passed is not None:
        preflight_passed(pre, record)
    status: LaunchStatus = "started"
    if state.ours and request.restart:
        return _restart(transport, target, request, pre, state, record, progress)
    if state.ours:
        if state.record is not None and state.record.same_launch(record):
            return _await(
                transport, target, request, pre, state.record, "already-running", None, progress
            )
        raise _different(state, record, transport)
    outcome = start_server(transport, record, pre.env, timeout=timeout)
    record = record.with_pid(outcome.pid)
    if outcome.status == "running":  # another launch won the race: judge it as ours above
        return _await(transport, target, request, pre, record, "already-running", None, progress)
    return _await(transport, target, request, pre, record, status, outcome.log_offset, progress)


def _restart(
    transport: Transport,
    target: Target,
    request: LaunchRequest,
    pre: Preflight,
    state: PortState,
    record: LaunchRecord,
    progress: Progress | None,
) -> LaunchResult:
    """``--restart`` of our running server (server/restart.py): its env values read from it
    (``--env`` overriding) before anything stops, stop (anything but "stopped" fails), start
    ("already running" is never a start), wait, prove; a restart not proved is "failed"."""
    timeout = request.command_timeout
    old_names = state.record.env_names if state.record is not None else []
    try:
        old_pid = old_server(transport, state)
        skip = frozenset({V2_RUNNER_ENV}) if V2_RUNNER_ENV in pre.env else frozenset()
        env = server_env(transport, state, old_names, pre.env, skip=skip, timeout=timeout)
        check_env(env)
    except DflashProvisionError as exc:
        if not isinstance(exc, RestartFailed):
            exc.message += _left_running(transport, request.port, timeout)
        raise
    record = replace(record, env_names=sorted(env))
    stop_old(transport, state, stop_timeout=request.stop_timeout, command_timeout=timeout)
    try:
        outcome = start_new(transport, record, env, old_pid=old_pid, timeout=timeout)
    except DflashProvisionError as exc:
        if not isinstance(exc, RestartFailed):
            exc.message += f" (--restart had already stopped the previous server, pid {old_pid})"
        raise
    record = record.with_pid(outcome.pid)
    result = _await(
        transport, target, request, pre, record, "restarted", outcome.log_offset, progress
    )
    if not result.ok:
        return result
    try:
        proof = prove(transport, record, state, timeout=timeout)
    except RestartFailed as exc:
        result.status, result.message = "failed", exc.message
        return result
    result.message += f"; proved: {proof.evidence}"
    return result


def _await(
    transport: Transport,
    target: Target,
    request: LaunchRequest,
    pre: Preflight,
    record: LaunchRecord,
    status: LaunchStatus,
    log_offset: int | None,
    progress: Progress | None,
) -> LaunchResult:
    if log_offset is None:  # a server already there: only lines from now on are news
        log_offset = read_log(transport, request.port, 1, max_bytes=1).size or 0
    try:
        with open_server(transport, request.port, python=request.python) as access:
            ready = wait_ready(
                transport,
                access,
                request.port,
                log_offset=log_offset,
                timeout=request.ready_timeout,
                progress=progress,
                command_timeout=request.command_timeout,
            )
    except KeyboardInterrupt:
        # Ctrl-C ends the wait, not the server: stopping it would need the connection that
        # may be what hangs, and a server that is starting is often what was wanted. The
        # message names the exact command that ends it.
        raise ReadinessInterrupted(
            f"interrupted while waiting for the server: it keeps starting (pid {record.pid}, "
            f"port {request.port} on {transport.description}); "
            f"`dflash-provision status {shlex.quote(str(target))} --port {request.port}` shows "
            f"it, `dflash-provision stop {shlex.quote(str(target))} --port {request.port}` "
            "ends it",
            pid=record.pid,
        ) from None
    result = LaunchResult(status, str(target), request.port, record, pre, ready)
    where = f"{SERVER_HOST}:{request.port} on {transport.description}"
    if ready.ready:
        result.message = f"{status}: vLLM {pre.vllm_version} ready on {where} (pid {record.pid})"
        return result
    result.status = "failed"
    if ready.outcome == "timeout":
        result.message = (
            f"not ready within {request.ready_timeout:g} s on {where} (pid {record.pid} is "
            "still starting: `dflash-provision logs` shows it, `launch` again keeps waiting, "
            "`stop` ends it)"
        )
        return result
    if ready.outcome == "fatal":
        stop_server(
            transport,
            request.port,
            timeout=request.stop_timeout,
            command_timeout=request.command_timeout,
        )
        result.stopped_after_failure = True
    why = ready.fatal_lines[0] if ready.fatal_lines else "no error line in its log"
    verb = "exited during start-up" if ready.outcome == "exited" else "failed during start-up"
    result.message = f"vLLM {verb} on {where}: {why}"
    return result


def _left_running(transport: Transport, port: int, timeout: float) -> str:
    """What a refused ``--restart`` left: the message's tail (one more look at the port)."""
    try:
        state = probe_port(transport, port, timeout=timeout)
    except DflashProvisionError:
        return "; --restart stopped nothing"
    if state.ours:
        return f"; --restart stopped nothing: the running server (pid {state.pid}) keeps running"
    return "; --restart stopped nothing"


def _hidden(state: PortState, transport: Transport) -> RuntimeFailure:
    return RuntimeFailure(
        f"port {state.port} on {transport.description} is held by a process this login cannot "
        "see (another user's, or outside this PID namespace: the socket listens, but no "
        "process visible here holds it): stop it there or use another --port",
        exit_code=ExitCode.PORT_TAKEN,
    )


def _foreign(state: PortState, transport: Transport) -> RuntimeFailure:
    who = f"pid {state.listener_pid}" if state.listener_pid else "a process"
    shown = f" ({' '.join(state.argv)[:200]})" if state.argv else ""
    return RuntimeFailure(
        f"port {state.port} on {transport.description} is taken by {who}{shown} that "
        "dflash-provision did not start: stop it yourself or use another --port",
        exit_code=ExitCode.PORT_TAKEN,
    )


def _different(state: PortState, new: LaunchRecord, transport: Transport) -> RuntimeFailure:
    old = state.record
    if old is None:
        what = "a server whose launch record is missing or unreadable"
        if state.record_error:
            what += f" ({state.record_error})"
    else:
        what = "a different launch: " + "; ".join(describe_differences(old, new))
    return RuntimeFailure(
        f"port {state.port} on {transport.description} runs {what} (pid {state.pid}); "
        "--restart replaces it",
        exit_code=ExitCode.PORT_TAKEN,
    )


def describe_differences(old: LaunchRecord, new: LaunchRecord) -> list[str]:
    """Human ``field: running → asked`` items between two launches."""
    items = []
    for name in ("model", "drafter_dir", "num_speculative_tokens", "drafter_sha256"):
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            items.append(f"{name}: {before} → {after}")
    if sorted(old.env_names) != sorted(new.env_names):
        items.append(f"env names: {','.join(old.env_names)} → {','.join(new.env_names)}")
    if not items and old.argv != new.argv:
        items.append(f"command line: {' '.join(old.argv)} → {' '.join(new.argv)}")
    return items
