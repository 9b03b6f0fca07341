"""``launch``: pre-flight checks, then start ``vllm serve`` detached and wait until it is ready.

Pre-flight, before anything starts (each refusal names its fix):
1. the drafter config.json on the target equals the authoritative config (else DriftFound, with
   the fields that differ and the push command that fixes it);
2. it validates, every layer, with the target model's config.json when MODEL is a directory on
   the target that holds one;
3. ``num_speculative_tokens <= block_size - 1`` (default ``block_size - 1``);
4. vLLM answers ``CMD --version`` on the target (the version goes into the record), and the
   port can be reached (in a container: its ``--python`` runs);
5. a drafter mixing sliding and full attention layers gets ``VLLM_USE_V2_MODEL_RUNNER=1`` (vLLM's
   V1 runner refuses such drafts with NotImplementedError). An explicit ``--env
   VLLM_USE_V2_MODEL_RUNNER=0`` is refused. Whether the V2 runner can run on the target (on CPU it
   needs Triton) only vLLM knows: its start-up error is then reported with its own log line.
``force`` lets 2 and 3 pass with warnings (vLLM's own start-up then decides).

Then: the port's state decides. Our server with the same launch → "already-running" (waits for
its readiness too); a different launch of ours → refused unless ``restart``; a process we did not
start holding the port → always refused. Start (process.start_server), wait (readiness).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from dflash_provision.authority import Authority
from dflash_provision.errors import (
    ConfigInvalid,
    DriftFound,
    ExitCode,
    RemoteStepFailed,
    RuntimeFailure,
    UsageError,
)
from dflash_provision.findings import ValidationReport
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.runtime.access import check_access, open_server
from dflash_provision.runtime.process import (
    PortState,
    check_port,
    probe_port,
    read_log,
    start_server,
    stop_server,
)
from dflash_provision.runtime.readiness import Progress, ReadyResult, wait_ready
from dflash_provision.runtime.records import LOGFILE, LaunchRecord
from dflash_provision.target import Target
from dflash_provision.transport.base import Transport

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
SERVER_HOST = "127.0.0.1"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Options launch sets itself; the same in the extra args would silently fight them.
_OWN_FLAGS = ("--speculative-config", "--speculative_config", "--port", "--host")

LaunchStatus = Literal["started", "restarted", "already-running", "failed"]


@dataclass(frozen=True)
class LaunchRequest:
    """What to run. ``fix_command``: the push command line that fixes a drifted drafter."""

    model: str
    port: int = 8000
    num_speculative_tokens: int | None = None
    vllm_cmd: tuple[str, ...] = ("vllm",)
    python: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    restart: bool = False
    force: bool = False
    ready_timeout: float = 900.0
    stop_timeout: float = 30.0
    command_timeout: float = 60.0
    fix_command: str = "dflash-provision push TARGET"


@dataclass
class Preflight:
    drafter_dir: str
    drafter_sha256: str
    num_speculative_tokens: int
    block_size: int | None
    vllm_version: str
    env: dict[str, str]  # what the server gets: the user's --env plus what launch added
    env_added: list[str]
    validation: ValidationReport
    target_config: str | None  # the target model's config.json used for validation
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafter_dir": self.drafter_dir,
            "drafter_sha256": self.drafter_sha256,
            "num_speculative_tokens": self.num_speculative_tokens,
            "block_size": self.block_size,
            "vllm_version": self.vllm_version,
            "env_names": sorted(self.env),
            "env_added": self.env_added,
            "validation": self.validation.to_dict(),
            "target_config": self.target_config,
            "notes": self.notes,
            "warnings": self.warnings,
        }


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


# --------------------------------------------------------------------------------------------
# pre-flight


def preflight(
    transport: Transport, target: Target, authority: Authority, request: LaunchRequest
) -> Preflight:
    """Every check that must pass before vLLM starts (module docstring); raises the refusal."""
    _check_request(request)
    timeout = request.command_timeout
    _require_same_file(transport, target, authority, request, timeout)
    doc = json.loads(authority.data)
    from dflash_provision.invariants import block_size_of

    block_size, block_path = block_size_of(doc)
    n, warnings = _speculative_tokens(request, block_size, block_path)
    target_bytes, target_path, notes = _target_config(transport, request.model, timeout)
    from dflash_provision.validate import validate_config

    report = validate_config(authority.data, label=authority.label, target=target_bytes)
    warnings += _judge_validation(report, authority.label, force=request.force)
    version = vllm_version(transport, request.vllm_cmd, timeout=timeout)
    check_access(transport, request.port, python=request.python, timeout=timeout)
    env, added = _runtime_env(doc, dict(request.env))
    from dflash_provision.push import _sha  # the one sha256 helper push and verify use

    return Preflight(
        drafter_dir=target.model_dir,
        drafter_sha256=_sha(authority.data) or "",
        num_speculative_tokens=n,
        block_size=block_size,
        vllm_version=version,
        env=env,
        env_added=added,
        validation=report,
        target_config=target_path,
        notes=notes,
        warnings=warnings,
    )


def _check_request(request: LaunchRequest) -> None:
    check_port(request.port)
    for name in request.env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {name!r}: not a valid environment variable name")
    for arg in request.extra_args:
        if arg.split("=", 1)[0] in _OWN_FLAGS:
            raise UsageError(
                f"extra vLLM argument {arg!r}: launch sets it itself "
                "(use --port / --num-speculative-tokens)"
            )
    if not request.vllm_cmd:
        raise UsageError("--vllm: empty command")


def _require_same_file(
    transport: Transport,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    timeout: float,
) -> None:
    from dflash_provision.push import VerifyStatus, compare_read

    read = read_remote_config(transport, target.config_path, timeout=timeout, metadata=False)
    verdict = compare_read(str(target), read, authority)
    if verdict.status is VerifyStatus.MATCH:
        return
    if verdict.status is VerifyStatus.UNREADABLE:
        raise RemoteStepFailed(f"pre-flight: {verdict.message}", step="read")
    lines = verdict.diff.lines if verdict.diff else []
    shown = "; ".join(lines[:6]) + (f"; (+{len(lines) - 6} more)" if len(lines) > 6 else "")
    raise DriftFound(
        f"pre-flight: the drafter config on the target is not the authoritative one: "
        f"{verdict.message}" + (f" [{shown}]" if shown else "") + f"; fix it with: "
        f"{request.fix_command}"
    )


def _speculative_tokens(
    request: LaunchRequest, block_size: int | None, block_path: str
) -> tuple[int, list[str]]:
    n = request.num_speculative_tokens
    if block_size is None or block_size < 2:
        if n is None:
            raise ConfigInvalid(
                f"pre-flight: the drafter has no usable {block_path}: give --num-speculative-tokens"
            )
        return n, []
    if n is None:
        return block_size - 1, []
    if n < 1:
        raise UsageError("--num-speculative-tokens must be at least 1")
    if n <= block_size - 1:
        return n, []
    message = (
        f"num_speculative_tokens {n} exceeds {block_path} - 1 = {block_size - 1}: vLLM would "
        f"reject every draft (0% acceptance); use at most {block_size - 1}"
    )
    if not request.force:
        raise ConfigInvalid(f"pre-flight: {message} (--force starts it anyway)")
    return n, [f"--force: {message}"]


def _target_config(
    transport: Transport, model: str, timeout: float
) -> tuple[bytes | None, str | None, list[str]]:
    """The target model's config.json when MODEL is a directory on the target holding one."""
    if not model.startswith("/"):
        return None, None, [f"target model {model} is not a path on the target: no target check"]
    path = model.rstrip("/") + "/config.json"
    read = read_remote_config(transport, path, timeout=timeout, metadata=False)
    if not read.present:
        return None, None, [f"target config {read.describe()}: no target check"]
    return read.data, path, []


def _judge_validation(report: ValidationReport, label: str, *, force: bool) -> list[str]:
    if report.ok:
        return []
    errors = report.errors
    summary = "; ".join(f"{f.layer}: {f.message}" for f in errors[:3])
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    if not force:
        raise ConfigInvalid(
            f"pre-flight: {label} fails validation: {summary}{more} "
            "(--force starts vLLM anyway, and its start-up decides)"
        )
    return [f"--force: starting although {label} FAILS validation: {summary}{more}"]


def vllm_version(transport: Transport, vllm_cmd: tuple[str, ...], *, timeout: float) -> str:
    """``CMD --version`` on the target: the first word of its last output line."""
    result = transport.run([*vllm_cmd, "--version"], timeout=timeout)
    out = result.stdout.decode("utf-8", "replace").strip().splitlines()
    err = result.stderr.decode("utf-8", "replace").strip().splitlines()
    command = " ".join(vllm_cmd)
    if result.exit_status != 0 or not out:
        why = err[-1] if err else f"exit status {result.exit_status}"
        hint = "install vLLM there or name it with --vllm" if result.exit_status == 127 else ""
        raise RuntimeFailure(
            f"pre-flight: `{command} --version` failed on {transport.description}: {why[:300]}"
            + (f"; {hint}" if hint else ""),
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    return out[-1].split()[0]


def _runtime_env(doc: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    layer_types = doc.get("layer_types")
    kinds = set(layer_types) if isinstance(layer_types, list) else set()
    if not {"sliding_attention", "full_attention"} <= kinds:
        return env, []
    given = env.get(V2_RUNNER_ENV)
    if given is None:
        return {**env, V2_RUNNER_ENV: "1"}, [V2_RUNNER_ENV]
    if given != "1":
        raise RuntimeFailure(
            f"pre-flight: the drafter mixes sliding and full attention layers, which vLLM's V1 "
            f"model runner refuses (NotImplementedError); --env {V2_RUNNER_ENV}={given} asks "
            f"for it: drop that --env (launch then sets {V2_RUNNER_ENV}=1)",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    return env, []


# --------------------------------------------------------------------------------------------
# the launch


def build_record(
    transport: Transport, request: LaunchRequest, pre: Preflight, state_dir: str
) -> LaunchRecord:
    """The record (and with it the exact argv) of this launch; pid is filled in on read."""
    spec = {
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
        *request.extra_args,
    ]
    return LaunchRecord(
        port=request.port,
        pid=None,
        argv=argv,
        env_names=sorted(pre.env),
        drafter_dir=pre.drafter_dir,
        drafter_sha256=pre.drafter_sha256,
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
) -> LaunchResult:
    """Pre-flight, then start (or find already running) and wait for readiness."""
    pre = preflight(transport, target, authority, request)
    timeout = request.command_timeout
    state = probe_port(transport, request.port, timeout=timeout)
    record = build_record(transport, request, pre, state.state_dir)
    status: LaunchStatus = "started"
    if state.foreign_listener:
        raise _foreign(state, transport)
    if state.ours:
        if state.record is not None and state.record.same_launch(record):
            return _await(
                transport, target, request, pre, state.record, "already-running", None, progress
            )
        if not request.restart:
            raise _different(state, record, transport)
        stop_server(transport, request.port, timeout=request.stop_timeout, command_timeout=timeout)
        status = "restarted"
    outcome = start_server(transport, record, pre.env, timeout=timeout)
    record = record.with_pid(outcome.pid)
    if outcome.status == "running":  # another launch won the race: judge it as ours above
        return _await(transport, target, request, pre, record, "already-running", None, progress)
    return _await(transport, target, request, pre, record, status, outcome.log_offset, progress)


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
