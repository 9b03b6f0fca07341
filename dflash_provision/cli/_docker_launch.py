"""``launch --docker IMAGE``: the CLI side (parse, call runtime.docker_launch, render, then
runtime-check with --container on the same connection)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._runtime import emit_report
from dflash_provision.errors import UsageError
from dflash_provision.server.container_server import open_container_server, parse_container_option
from dflash_provision.server.docker_launch import DockerLaunch, launch_in_container
from dflash_provision.verify.runtime_check import CheckSettings, run_check

if TYPE_CHECKING:
    from dflash_provision.server.preflight import LaunchRequest
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.factory import Connector


def launch_docker(
    connection: Connector,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    image: str,
    name: str,
    docker_args: str,
    mount: str | None,
    *,
    no_check: bool,
    as_json: bool,
) -> int:
    """Start (or with --restart replace) the container, prove it, then runtime-check; the exit
    code (the check's when it ran)."""
    option = parse_container_option(f"docker:{name}")  # the same name rule as --container
    if mount is not None and not mount.startswith("/"):
        raise UsageError(f"--drafter-mount {mount!r} must be an absolute path")
    try:
        extra = tuple(shlex.split(docker_args))
    except ValueError as exc:
        raise UsageError(f"--docker-args {docker_args!r}: {exc}") from None
    spec = DockerLaunch(image, option.name, extra, mount, docker_host=connection.docker_host)
    with connection.open(target) as host:
        result = launch_in_container(
            host, target, authority, request, spec,
            progress=lambda line: None if as_json else click.echo(line, err=True),
        )  # fmt: skip
        for warning in result.warnings:
            click.echo(f"warning: {warning}", err=True)
        if not as_json:
            click.echo(f"{result.status}: {result.container} (id {result.container_id[:12]})")
            click.echo(f"  command     {shlex.join(result.argv)}")
            click.echo(f"  env names   {', '.join(result.env_names) or '(none)'}")
            for line in result.proof:
                click.echo(f"  proved      {line}")
        check = None
        if not no_check:
            found = open_container_server(host, option, target, docker_host=spec.docker_host)
            settings = CheckSettings(
                port=request.port, python=request.python, timeout=request.command_timeout
            )
            check = run_check(host, target, authority, settings,
                              push_fix=request.fix_command, container=found)  # fmt: skip
            if not as_json:
                emit_report(check, as_json=False)
    if as_json:
        data = {"launch": result.to_dict(), "runtime_check": check.to_dict() if check else None}
        echo_document(data)
    return int(check.exit_code) if check is not None else 0
