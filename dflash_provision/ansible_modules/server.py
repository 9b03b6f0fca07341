"""``dflash.provision.server``: restart the vLLM server that ``dflash-provision launch`` started
for a host's drafter directory, with its recorded launch (the same argv and env names; env
values are read from the running server on the host, ``env`` overrides, nothing is stored),
wait until it is ready and prove it (the old process gone, a new one running the recorded
argv, its own engine record naming the drafter and N), as ``rollout`` restarts a host.

Everything that can refuse is checked before the server is stopped (its launch record, the
config on disk, the env values the record names), so a refused restart leaves the old server
running. Check mode reports what would be restarted and touches nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.ansible_modules.common import (
    HOST_OPTIONS,
    HostArgs,
    count,
    failed,
    number,
    open_host,
    parse_host,
    refuse_unknown,
)
from dflash_provision.errors import (
    DflashProvisionError,
    ExitCode,
    RemoteStepFailed,
    RuntimeFailure,
    UsageError,
)
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.rollout.host_ops import StepFailed, restart_checks
from dflash_provision.server.locate import for_drafter, launched
from dflash_provision.server.restart import RestartFailed, restart_recorded
from dflash_provision.transport.callback import ShellRunner

if TYPE_CHECKING:
    from dflash_provision.server.locate import Launched
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

OPTIONS = (*HOST_OPTIONS, "state", "port", "env", "ready_timeout")
STATES = ("restarted",)
DEFAULT_READY_TIMEOUT = 900.0  # as launch's --ready-timeout


@dataclass(frozen=True)
class ServerArgs:
    host: HostArgs
    port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = DEFAULT_READY_TIMEOUT


def parse_args(args: Mapping[str, Any]) -> ServerArgs:
    refuse_unknown(args, OPTIONS)
    host = parse_host(args)
    state = args.get("state", "restarted")
    if state not in STATES:
        raise UsageError(f"state: one of {', '.join(STATES)}, got {state!r}")
    port = None if args.get("port") is None else count(args, "port", 0, low=1, high=65535)
    env = args.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
        raise UsageError(f"env: a mapping of NAME: value, got {env!r}")
    values = {str(k): str(v) for k, v in env.items()}
    ready = number(
        args,
        "ready_timeout",
        DEFAULT_READY_TIMEOUT,
        check=lambda v: v >= 1,
        meaning="seconds >= 1",
    )
    return ServerArgs(host, port, values, ready)


def restart_server(
    runner: ShellRunner, host: str, args: ServerArgs, *, check_mode: bool = False
) -> dict[str, Any]:
    try:
        return _restart(runner, host, args, check_mode)
    except DflashProvisionError as exc:
        return failed(exc)


def _restart(runner: ShellRunner, host: str, args: ServerArgs, check_mode: bool) -> dict[str, Any]:
    transport, target = open_host(runner, host, args.host)
    server = _the_launch(transport, target, args.port)
    timeout = transport.command_timeout
    current = read_remote_config(transport, target.config_path, timeout=timeout)
    if not current.present or current.data is None:
        raise RemoteStepFailed(
            f"{target.config_path}: {current.describe()}; not restarting", step="read"
        )
    try:
        doc = json.loads(current.data)
    except ValueError:
        raise RemoteStepFailed(
            f"{target.config_path} is not JSON; not restarting (dflash.provision.drafter_config "
            "writes the authoritative one)",
            step="read",
        ) from None
    # Before anything stops: the port's server is the launch's, its env values readable from
    # it (or given in env). Check mode checks it too.
    try:
        restart_checks(transport, server.record.env_names, server.port, args.env, timeout)
    except StepFailed as exc:
        raise UsageError(f"{exc.message}; the server was left running") from None
    out: dict[str, Any] = {
        "changed": True,
        "failed": False,
        "port": server.port,
        "was_running": server.alive,
        "drafter_sha256": current.sha256,
        "argv": list(server.record.argv),
    }
    if check_mode:
        return {**out, "msg": f"check mode: would restart the server on port {server.port}"}
    try:
        done = restart_recorded(
            transport,
            server.record.to_dict(),
            server.port,
            doc,
            args.env,
            args.ready_timeout,
            sha256=current.sha256,
        )
    except RestartFailed as exc:
        raise RuntimeFailure(
            f"restart of port {server.port}: {exc.message}", exit_code=ExitCode.LAUNCH_FAILED
        ) from None
    return {
        **out,
        "evidence": done.evidence,
        "msg": f"restarted on port {server.port} with its recorded launch, proved: {done.evidence}",
    }


def _the_launch(transport: Transport, target: Target, port: int | None) -> Launched:
    """The one launch record for the drafter directory (on ``port`` when given)."""
    found = for_drafter(launched(transport, timeout=transport.command_timeout), target.model_dir)
    if port is not None:
        found = [s for s in found if s.port == port]
    if not found:
        where = f" on port {port}" if port is not None else ""
        raise UsageError(
            f"no server launched by dflash-provision launch serves {target.model_dir}{where}: "
            "start one with dflash-provision launch (its record is what a restart repeats)"
        )
    if len(found) > 1:
        ports = ", ".join(str(s.port) for s in found)
        raise UsageError(f"{target.model_dir} is launched on several ports ({ports}): give port")
    return found[0]
