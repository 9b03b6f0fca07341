"""``dflash-provision launch``: pre-flight, then start vLLM with the drafter, detached."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dflash_provision.cli._connect import (
    authority_options,
    runtime_connection_options,
)
from dflash_provision.cli._env import parse_env
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._runtime import emit_report, fix_command, port_option, rehash_files_option
from dflash_provision.errors import ExitCode, UsageError
from dflash_provision.source.authority import SourceSpec
from dflash_provision.source.lockfile import DEFAULT_LOCK_PATH
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.server.launch import LaunchResult
    from dflash_provision.server.preflight import LaunchRequest, Preflight
    from dflash_provision.server.records import LaunchRecord
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport
    from dflash_provision.verify.runtime_check import CheckReport

F = TypeVar("F", bound=Callable[..., Any])


@click.command(
    "launch",
    help=(
        "Start `vllm serve MODEL` with TARGET's drafter (--speculative-config method dflash) "
        "detached on the target, after a pre-flight: the drafter file equals the authoritative "
        "config (same_values, the same values in other bytes, passes with a warning), "
        "validates (with MODEL's config.json when MODEL is a directory on the target), "
        "num_speculative_tokens <= block_size - 1, vLLM answers --version; a mixed "
        "sliding/full drafter gets VLLM_USE_V2_MODEL_RUNNER=1. Waits for /health (reached "
        "through the SSH connection, or inside the container), then runs runtime-check. The "
        "same launch again reports 'already running'; a different one needs --restart. "
        "`launch TARGET --restart` with no --model restarts the recorded launch as it was (its "
        "command line; its env values read from the running server, --env overriding; "
        "--num-speculative-tokens and --vllm may change) with the drafter file on disk, and "
        "proves it: the old process gone, a new one running that command line, its engine "
        "start-up record naming the drafter and N. "
        "Arguments after `--` go to `vllm serve`. TARGET as for push: root@gpu1:/models/X, "
        "gpu1/lxc:c1:/models/X, /local/dir."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@click.option(
    "--model",
    help="The target model, as `vllm serve` takes it (required unless --restart alone).",
)
@authority_options
@click.option(
    "--num-speculative-tokens",
    type=click.IntRange(min=1),
    help="Drafts per step (default: the drafter's block_size - 1).",
)
@port_option
@click.option(
    "--vllm",
    "vllm_cmd",
    help="The vLLM command on the target (split like a shell would: 'venv/bin/python -m X'). "
    "Default: vllm.",
)
@click.option(
    "--python",
    help="The target's Python for requests made inside a container (default python3).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="Environment for the server (repeatable). Only NAMES are recorded.",
)
@click.option(
    "--speculative-config",
    "speculative_extra",
    metavar="JSON",
    help="More --speculative-config keys for vLLM, as a JSON object (launch sets method, model "
    "and num_speculative_tokens; keys the target's vLLM would reject are refused).",
)
@click.option(
    "--restart",
    is_flag=True,
    help="Replace the server running on the port (proved, or exit 20); alone: restart its "
    "recorded launch.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start even when the drafter fails validation or N > block_size - 1 (vLLM decides).",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=1),
    default=900.0,
    show_default=True,
    help="Seconds to wait for /health.",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between TERM and KILL when --restart stops the old server.",
)
@rehash_files_option
@click.option(
    "--per-request-spec-decode-metrics",
    "per_request_metrics",
    type=click.Choice(["none", "summary", "detailed"]),
    help="Passed to vLLM where the target's vLLM takes it (0.29+; asked before anything "
    "starts): each reply then carries its own acceptance, which runtime-check judges instead "
    "of the server's counters. Default: summary where vLLM takes it, else not passed.",
)
@click.option("--no-check", is_flag=True, help="Do not run runtime-check after a launch.")
@click.option(
    "--docker",
    "docker_image",
    metavar="IMAGE",
    help="Start the server in a new Docker container of IMAGE (e.g. vllm/vllm-openai:v0.32.0) "
    "on TARGET's machine, TARGET the drafter directory there, mounted read-only; --restart "
    "replaces the container (docs/containers.md).",
)
@click.option(
    "--container-name",
    metavar="NAME",
    help="With --docker: the container's name (default dflash-vllm-PORT).",
)
@click.option(
    "--docker-args",
    metavar="ARGS",
    help="With --docker: more `docker run` options, split like a shell would "
    "('--gpus all -v /srv/models/base:/models/base').",
)
@click.option(
    "--drafter-mount",
    metavar="PATH",
    help="With --docker: where the drafter directory shows inside (default: its host path).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@runtime_connection_options
@click.argument("extra_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- VLLM_ARGS...]")
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    model: str | None,
    authority_spec: SourceSpec,
    num_speculative_tokens: int | None,
    port: int | None,
    vllm_cmd: str | None,
    python: str | None,
    env_items: tuple[str, ...],
    speculative_extra: str | None,
    restart: bool,
    force: bool,
    ready_timeout: float,
    stop_timeout: float,
    rehash_files: bool,
    per_request_metrics: str | None,
    no_check: bool,
    docker_image: str | None,
    container_name: str | None,
    docker_args: str | None,
    drafter_mount: str | None,
    as_json: bool,
    connection: Connector,
    extra_args: tuple[str, ...],
) -> None:
    from dflash_provision.server.launch import ReadinessInterrupted, launch
    from dflash_provision.server.preflight import LaunchRequest

    target = parse_target(target_spec)
    if model is None:
        if not restart:
            raise UsageError("--model is required (`launch TARGET --restart` alone restarts the "
                             "recorded launch)")  # fmt: skip
        if extra_args or python or force or speculative_extra or per_request_metrics:
            raise UsageError(
                "`launch TARGET --restart` without --model reuses the recorded command line: "
                "give --model to change the arguments after --, --python, --force, "
                "--speculative-config or --per-request-spec-decode-metrics"
            )
        _restart_recorded(
            ctx, connection, target, port, parse_env(env_items),
            num_speculative_tokens, None if vllm_cmd is None else _split_command(vllm_cmd),
            ready_timeout, stop_timeout, authority_spec, no_check=no_check, as_json=as_json,
            rehash_files=rehash_files, fix=fix_command(target_spec, authority_spec),
        )  # fmt: skip
        return
    port = 8000 if port is None else port
    authority = authority_spec.load()
    request = LaunchRequest(
        model=model,
        port=port,
        num_speculative_tokens=num_speculative_tokens,
        vllm_cmd=tuple(_split_command(vllm_cmd or "vllm")),
        python=python,
        env=parse_env(env_items),
        extra_args=extra_args,
        restart=restart,
        force=force,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        command_timeout=connection.ssh.command_timeout,
        fix_command=fix_command(target_spec, authority_spec),
        speculative_extra=_speculative_extra(speculative_extra),
        rehash_files=rehash_files,
        per_request_metrics=per_request_metrics,
    )
    docker_only = (container_name, docker_args, drafter_mount)
    if docker_image is None and any(v is not None for v in docker_only):
        raise UsageError("--container-name, --docker-args and --drafter-mount need --docker")
    if docker_image is not None:
        from dflash_provision.cli._docker_launch import launch_docker

        ctx.exit(launch_docker(
            connection, target, authority, request, docker_image,
            container_name or f"dflash-vllm-{port}", docker_args or "",
            drafter_mount, no_check=no_check, as_json=as_json,
        ))  # fmt: skip
    with connection.open(target) as transport:
        try:
            result = launch(
                transport,
                target,
                authority,
                request,
                progress=_Progress(),
                preflight_passed=None if as_json else _render_preflight(str(target), port),
            )
        except ReadinessInterrupted as stopped_waiting:
            click.echo(stopped_waiting.message, err=True)
            ctx.exit(int(ExitCode.INTERRUPTED))
        for warning in result.preflight.warnings:
            click.echo(f"warning: {warning}", err=True)
        check = None
        if not as_json:
            _render(result)
        if result.ok and not no_check:
            check = _runtime_check(transport, target, authority, request, as_json=as_json)
    if as_json:
        data = {"launch": result.to_dict(), "runtime_check": check.to_dict() if check else None}
        echo_document(data)
    if not result.ok:
        ctx.exit(int(result.exit_code))
    if check is not None:
        ctx.exit(int(check.exit_code))


def _restart_recorded(
    ctx: click.Context,
    connection: Connector,
    target: Target,
    port: int | None,
    env: dict[str, str],
    num_speculative_tokens: int | None,
    vllm_cmd: list[str] | None,
    ready_timeout: float,
    stop_timeout: float,
    authority_spec: SourceSpec,
    *,
    no_check: bool,
    as_json: bool,
    rehash_files: bool,
    fix: str,
) -> None:
    """``launch TARGET --restart`` alone (server/restart.py restart_launch), then
    runtime-check when an authority is named (--from/--repo/--lock, or ./dflash.lock). A lock
    that pins the drafter's other files has them checked first: wrong ones refuse the restart
    before the server is stopped."""
    from dflash_provision.server.restart import Overrides, restart_launch

    overrides = Overrides(num_speculative_tokens, None if vllm_cmd is None else tuple(vllm_cmd))
    timeout = connection.ssh.command_timeout
    named = authority_spec.is_set or DEFAULT_LOCK_PATH.is_file()
    authority = authority_spec.load() if named else None
    with connection.open(target) as transport:
        if authority is not None:
            _refuse_wrong_files(transport, target, authority, rehash_files, timeout, fix)
        done, record = restart_launch(
            transport, target, port, env, overrides, ready_timeout=ready_timeout,
            stop_timeout=stop_timeout, timeout=timeout,
        )  # fmt: skip
        message = f"restarted with its recorded launch on port {record.port}, proved: "
        message += done.evidence
        check = None
        if not as_json:
            click.echo(message)
            click.echo(f"  command     {shlex.join(record.argv)}")
            if not named and not no_check:
                click.echo("  runtime-check skipped: no authority named (--from, --repo, --lock)")
        if authority is not None and not no_check:
            from dflash_provision.server.preflight import LaunchRequest

            request = LaunchRequest(
                model=record.model, port=record.port, python=record.python,
                command_timeout=timeout,
            )  # fmt: skip
            check = _runtime_check(transport, target, authority, request, as_json=as_json)
    if as_json:
        data = {
            "launch": {"status": "restarted", "message": message, "record": record.to_dict()},
            "runtime_check": check.to_dict() if check else None,
        }
        echo_document(data)
    if check is not None:
        ctx.exit(int(check.exit_code))


def _refuse_wrong_files(
    transport: Transport,
    target: Target,
    authority: Authority,
    rehash: bool,
    timeout: float,
    fix: str,
) -> None:
    """The lock's pinned files checked before the recorded restart stops anything (launch's
    refusal, server/drafter_files.py); nothing when the lock pins none."""
    from dflash_provision.server.drafter_files import check_drafter_files, refusal

    files = check_drafter_files(transport, target, authority, rehash=rehash, timeout=timeout)
    refused = refusal(files, transport.description, fix) if files is not None else None
    if refused is not None:
        refused.message += "; --restart stopped nothing"
        raise refused


def _split_command(text: str) -> list[str]:
    try:
        parts = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--vllm {text!r}: {exc}") from None
    if not parts:
        raise UsageError("--vllm: empty command")
    return parts


class _Progress:
    """Progress lines on stderr while waiting: when the news changes, at most every 5 s."""

    def __init__(self) -> None:
        self.last_print = 0.0
        self.last_message = ""

    def __call__(self, elapsed: float, message: str) -> None:
        now = time.monotonic()
        if message == self.last_message and now - self.last_print < 15.0:
            return
        if now - self.last_print < 5.0:
            return
        self.last_print, self.last_message = now, message
        click.echo(f"waiting for the server ({elapsed:.0f} s): {message}", err=True)
        sys.stderr.flush()


def _render_preflight(target: str, port: int) -> Callable[[Preflight, LaunchRecord], None]:
    """The pre-flight summary, printed as soon as it passed: before the server starts and the
    wait for readiness (minutes for a real vLLM) begins."""

    def show(pre: Preflight, record: LaunchRecord) -> None:
        click.echo(f"launch {target} port {port}")
        _render_summary(pre, record)
        sys.stdout.flush()

    return show


def _render_summary(pre: Preflight, record: LaunchRecord) -> None:
    sha = pre.drafter_sha256[:12]
    if pre.file_status == "in_sync":
        click.echo(f"  pre-flight  drafter {pre.drafter_dir} sha256 {sha} matches")
    else:  # let through by launch's row of file_status.EXIT_CODE: the warning says why
        click.echo(
            f"  pre-flight  drafter {pre.drafter_dir} {pre.file_status}: the values of sha256 "
            f"{sha} in other bytes"
        )
    layers = ", ".join(f"{k} {v}" for k, v in pre.validation.layers.items())
    click.echo(f"  validation  {'ok' if pre.validation.ok else 'FAILED'} ({layers})")
    block = f" (block_size {pre.block_size})" if pre.block_size else ""
    click.echo(f"  drafts      num_speculative_tokens {pre.num_speculative_tokens}{block}")
    click.echo(f"  vllm        {pre.vllm_version}")
    if pre.env_added:
        click.echo(f"  env added   {', '.join(pre.env_added)} (mixed sliding/full layers)")
    for note in pre.notes:
        click.echo(f"  note        {note}")
    click.echo(f"  command     {shlex.join(record.argv)}")
    click.echo(f"  log         {record.log_path}")


def _render(result: LaunchResult) -> None:
    """What the launch came to (the pre-flight summary was shown before the wait)."""
    ready = result.ready
    if result.ok:
        took = f" in {ready.elapsed_s:.1f} s" if ready else ""
        click.echo(f"{result.message}{took}")
        return
    click.echo(f"FAILED: {result.message}")
    if ready is not None:
        for line in ready.fatal_lines[:10]:
            click.echo(f"  ! {line}")
        if ready.tail:
            click.echo("  last log lines:")
            for line in ready.tail:
                click.echo(f"    {line}")
    if result.stopped_after_failure:
        click.echo("  (what was left of the server was stopped)")


def _runtime_check(
    transport: Transport,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    *,
    as_json: bool,
) -> CheckReport | None:
    """runtime-check (CHECKS' stages a-e) on the connection launch already has; the report is
    printed here in human mode and returned (None when this build has no runtime-check)."""
    if find_spec("dflash_provision.verify.runtime_check") is None:
        click.echo("runtime-check: not in this build; skipped", err=True)
        return None
    from dflash_provision.verify.runtime_check import CheckSettings, run_check

    settings = CheckSettings(
        port=request.port, python=request.python, timeout=request.command_timeout
    )
    report = run_check(transport, target, authority, settings, push_fix=request.fix_command)
    if not as_json:
        emit_report(report, as_json=False)
    return report


def _speculative_extra(text: str | None) -> dict[str, Any]:
    """--speculative-config: a JSON object, or a usage error naming why not."""

    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--speculative-config: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError("--speculative-config: must be a JSON object")
    return value
