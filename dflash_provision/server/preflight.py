"""``launch``'s pre-flight: every check that must pass before vLLM starts, each refusal naming
its fix (the list is in ``runtime.launch``'s docstring), and the request it checks."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import (
    ConfigInvalid,
    DriftFound,
    ExitCode,
    RemoteStepFailed,
    RuntimeFailure,
    UsageError,
)
from dflash_provision.host_state.file_status import EXIT_CODE, PASSES_WITH_WARNING, Command
from dflash_provision.host_state.weights_check import check_remote, target_hidden_of
from dflash_provision.place.push import compare_read
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.server.access import check_access
from dflash_provision.server.bounded import EndedAtDeadline, run_bounded
from dflash_provision.server.drafter_files import check_drafter_files, refusal
from dflash_provision.server.fix_lines import weights_fix
from dflash_provision.server.launch_probe import describe, plan_runner
from dflash_provision.server.process import check_port
from dflash_provision.source.authority import Authority
from dflash_provision.target import Target
from dflash_provision.transport.base import Transport
from dflash_provision.validation.findings import ValidationReport
from dflash_provision.validation.invariants import block_size_of
from dflash_provision.validation.speculators_layout import (
    is_speculators,
    runtime_view,
    speculative_tokens,
)
from dflash_provision.validation.validate import validate_config
from dflash_provision.vllm.request_acceptance import launch_args

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Options launch sets itself; the same in the extra args would silently fight them.
_OWN_FLAGS = ("--speculative-config", "--speculative_config", "--port", "--host")


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
    #: More --speculative-config keys (launch sets method, model and num_speculative_tokens).
    speculative_extra: Mapping[str, Any] = field(default_factory=dict)
    #: The lock's pinned files: hash every one, whatever proofs the history holds.
    rehash_files: bool = False
    #: --per-request-spec-decode-metrics asked for (None: the default, vllm/request_acceptance)
    per_request_metrics: str | None = None


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
    weights: dict[str, Any] = field(default_factory=dict)  # weights_check.WeightsCheck.to_dict
    file_status: str = "in_sync"  # file_status.judge's word for the drafter file launch passed
    files: dict[str, Any] | None = None  # the lock's pinned files, judged (None: it pins none)
    #: The sha256 of the drafter file as read on the target: the bytes the server loads (the
    #: authority's sha256 differs when launch lets a file with the same values pass).
    file_sha256: str = ""
    vllm_args: list[str] = field(default_factory=list)  # what launch adds to `vllm serve`

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
            "weights": self.weights,
            "file_status": self.file_status,
            "file_sha256": self.file_sha256,
            "vllm_args": self.vllm_args,
        } | ({} if self.files is None else {"files": self.files})


def preflight(
    transport: Transport, target: Target, authority: Authority, request: LaunchRequest
) -> Preflight:
    """Every check that must pass before vLLM starts (module docstring); raises the refusal."""
    _check_request(request)
    timeout = request.command_timeout
    file_status, warnings, file_sha256 = _require_same_file(
        transport, target, authority, request, timeout
    )
    files = _require_pinned_files(transport, target, authority, request)
    doc = json.loads(authority.data)
    block_size, block_path = block_size_of(doc)
    n, token_warnings = _speculative_tokens(request, block_size, block_path)
    warnings += token_warnings
    n = _speculators_default(doc, request, n)
    target_bytes, target_path, notes = target_config(transport, request.model, timeout)
    report = validate_config(authority.data, label=authority.label, target=target_bytes)
    warnings += _judge_validation(report, authority.label, force=request.force)
    weights = _check_weights(transport, target, doc, target_bytes, request)
    warnings += weights.warnings
    version = vllm_version(transport, request.vllm_cmd, timeout=timeout)
    check_access(transport, request.port, python=request.python, timeout=timeout)
    plan = plan_runner(
        transport,
        target.model_dir,
        doc,
        request.model,
        n,
        dict(request.env),
        vllm_cmd=request.vllm_cmd,
        python=request.python,
        speculative_keys=sorted(request.speculative_extra),
        force=request.force,
        timeout=timeout,
    )
    warnings += plan.warnings
    per_request = launch_args(request.per_request_metrics, plan.vllm, version, request.extra_args)
    notes += [per_request.note] if per_request.note else []
    warnings += [per_request.warning] if per_request.warning else []
    if plan.answered:
        env, added = plan.env, plan.added
        notes += [describe(plan), *plan.notes]
    else:  # the target's vLLM could not be asked: the layout rule, and vLLM decides
        env, added = runtime_env(doc, dict(request.env))
    return Preflight(
        drafter_dir=target.model_dir,
        drafter_sha256=authority.sha256,
        num_speculative_tokens=n,
        block_size=block_size,
        vllm_version=version,
        env=env,
        env_added=added,
        validation=report,
        target_config=target_path,
        notes=notes + weights.notes,
        warnings=warnings,
        weights=weights.check.to_dict(),
        file_status=file_status,
        files=files,
        file_sha256=file_sha256,
        vllm_args=list(per_request.args),
    )


def drafter_preflight(
    transport: Transport, target: Target, authority: Authority, request: LaunchRequest
) -> tuple[int, dict[str, str], list[str]]:
    """The drafter's part of the pre-flight (1-3 and 6 of launch's list) for a server that is
    not started on ``transport`` itself (launch --docker: a new container): the file on disk
    equals the authoritative config, it validates, N <= block_size - 1, and the env the layout
    needs. Returns (N, env, warnings); raises the refusal."""
    _check_request(request)
    _, warnings, _sha = _require_same_file(
        transport, target, authority, request, request.command_timeout
    )
    doc = json.loads(authority.data)
    block_size, block_path = block_size_of(doc)
    n, token_warnings = _speculative_tokens(request, block_size, block_path)
    n = _speculators_default(doc, request, n)
    report = validate_config(authority.data, label=authority.label, target=None)
    warnings += token_warnings + _judge_validation(report, authority.label, force=request.force)
    env, _ = runtime_env(doc, dict(request.env))
    return n, env, warnings


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
    own = sorted(set(request.speculative_extra) & {"method", "model", "num_speculative_tokens"})
    if own:
        raise UsageError(
            f"--speculative-config {', '.join(own)}: launch sets it itself "
            "(the drafter is TARGET; use --num-speculative-tokens)"
        )


def _require_same_file(
    transport: Transport,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    timeout: float,
) -> tuple[str, list[str], str]:
    """The drafter file on the target, judged (file_status.judge) and mapped by launch's row of
    EXIT_CODE: the refusal, or the status, the warnings of a file launch lets pass and the
    file's sha256."""
    read = read_remote_config(transport, target.config_path, timeout=timeout, metadata=False)
    verdict = compare_read(str(target), read, authority)
    code = EXIT_CODE[Command.LAUNCH][verdict.status]
    if code is ExitCode.OK:
        if verdict.status not in PASSES_WITH_WARNING[Command.LAUNCH]:
            return verdict.status.value, [], read.sha256 or ""
        # The server loads the same values; only the sha256 proof of the file is lost.
        return (
            verdict.status.value,
            [
                f"{verdict.status.value}: {verdict.message}; the server loads the same values, "
                f"`{request.fix_command}` writes the exact bytes"
            ],
            read.sha256 or "",
        )
    if code is ExitCode.REMOTE_FAILED:
        raise RemoteStepFailed(f"pre-flight: {verdict.message}", step="read")
    lines = verdict.diff.lines if verdict.diff else []
    shown = "; ".join(lines[:6]) + (f"; (+{len(lines) - 6} more)" if len(lines) > 6 else "")
    raise DriftFound(
        f"pre-flight: the drafter config on the target is not the authoritative one: "
        f"{verdict.message}" + (f" [{shown}]" if shown else "") + f"; fix it with: "
        f"{request.fix_command}",
        exit_code=code,
    )


def _require_pinned_files(
    transport: Transport, target: Target, authority: Authority, request: LaunchRequest
) -> dict[str, Any] | None:
    """Every file the lock pins beside config.json, checked where vLLM will read it (sizes
    always, hashes unless a recorded proof's identity is unchanged): the refusal (4, 7, 26 by
    launch's row of files_status.EXIT_CODE), or the verdict's JSON (None: the lock pins none).
    --force does not pass it, as it does not pass a wrong config.json."""
    files = check_drafter_files(
        transport,
        target,
        authority,
        rehash=request.rehash_files,
        timeout=request.command_timeout,
    )
    if files is None:
        return None
    refused = refusal(files, transport.description, request.fix_command)
    if refused is not None:
        raise refused
    return files.to_dict()


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


def _speculators_default(doc: dict[str, Any], request: LaunchRequest, n: int) -> int:
    """A speculators-layout drafter names its own N (``proposal_methods[0].speculative_tokens``,
    what `vllm serve <drafter dir>` would use): launch's default for it. Validation has already
    bounded it by block_size."""
    file_n = speculative_tokens(doc) if is_speculators(doc) else None
    if request.num_speculative_tokens is None and file_n is not None and file_n >= 1:
        return file_n
    return n


def target_config(
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


@dataclass
class _Weights:
    check: Any  # weights_check.WeightsCheck
    notes: list[str]
    warnings: list[str]


def _check_weights(
    transport: Transport,
    target: Target,
    doc: dict[str, Any],
    target_bytes: bytes | None,
    request: LaunchRequest,
) -> _Weights:
    """The drafter's safetensors headers against its config (one exec): a config of one revision
    beside the weights of another is refused before anything starts (--force: a warning)."""
    check = check_remote(
        transport,
        target.model_dir,
        doc,
        target_hidden=target_hidden_of(target_bytes),
        timeout=request.command_timeout,
    )
    notes = [f"weights: {check.detail}", *(f"weights: {n}" for n in check.notes)]
    if not check.failed:
        return _Weights(check, notes, [])
    shown = "; ".join(check.mismatches[:6])
    more = f" (+{len(check.mismatches) - 6} more)" if len(check.mismatches) > 6 else ""
    message = f"the drafter's weights do not fit its config: {shown}{more}"
    if not request.force:
        raise ConfigInvalid(
            f"pre-flight: {message}; fix: {weights_fix(request.fix_command, '', target)} "
            "(--force starts vLLM anyway, and its weight loading decides)"
        )
    return _Weights(check, notes, [f"--force: starting although {message}"])


def vllm_version(transport: Transport, vllm_cmd: tuple[str, ...], *, timeout: float) -> str:
    """``CMD --version`` on the target: the first word of its last output line. It is ended on
    the target at its deadline (and on Ctrl-C): a hung one is VLLM_UNUSABLE, not left running."""
    command = " ".join(vllm_cmd)
    try:
        result = run_bounded(transport, [*vllm_cmd, "--version"], timeout=timeout)
    except EndedAtDeadline as exc:
        raise RuntimeFailure(
            f"pre-flight: `{command} --version` did not answer within {exc.deadline} s on "
            f"{transport.description} and was ended there: vLLM cannot start there as it is "
            "(a hung import, a GPU driver call?); try it by hand on the target",
            exit_code=ExitCode.VLLM_UNUSABLE,
        ) from None
    out = result.stdout.decode("utf-8", "replace").strip().splitlines()
    err = result.stderr.decode("utf-8", "replace").strip().splitlines()
    if result.exit_status != 0 or not out:
        why = err[-1] if err else f"exit status {result.exit_status}"
        hint = "install vLLM there or name it with --vllm" if result.exit_status == 127 else ""
        raise RuntimeFailure(
            f"pre-flight: `{command} --version` failed on {transport.description}: {why[:300]}"
            + (f"; {hint}" if hint else ""),
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    return out[-1].split()[0]


def runtime_env(doc: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    layer_types = runtime_view(doc).get("layer_types")  # either published layout
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
