"""``dflash-provision stop``: end the server launch started on a port, and all its processes."""

from __future__ import annotations

import json

import click

from dflash_provision.cli._connect import runtime_connection_options
from dflash_provision.cli._runtime import server_port_option
from dflash_provision.transport.factory import Connector


@click.command(
    "stop",
    help=(
        "Stop the vLLM server that launch started for TARGET's drafter directory (the port its "
        "launch record names; --port to choose): SIGTERM to its process "
        "group, SIGKILL after --timeout seconds, then wait until none of its processes is "
        "left and remove the pidfile (the log and launch record stay). Only a server launch "
        "started is signalled. Exit 21 when none runs there."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@server_port_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    port: int | None,
    timeout: float,
    as_json: bool,
    connection: Connector,
) -> None:
    from dflash_provision.errors import ExitCode
    from dflash_provision.runtime.locate import choose_port
    from dflash_provision.runtime.process import probe_port, stop_server
    from dflash_provision.target import parse_target

    target = parse_target(target_spec)
    with connection.open(target) as transport:
        port = choose_port(transport, target, port, timeout=connection.ssh.command_timeout).port
        outcome = stop_server(
            transport, port, timeout=timeout, command_timeout=connection.ssh.command_timeout
        )
        foreign, listening = None, False
        if outcome.status == "not-running":
            state = probe_port(transport, port, timeout=connection.ssh.command_timeout)
            foreign = state.listener_pid if state.listening else None
            listening = state.listening
        where = f"port {port} on {transport.description}"
    if as_json:
        data = {"target": where, "port": port, **outcome.__dict__}
        click.echo(json.dumps(data, indent=2))
    elif outcome.status == "stopped":
        how = "SIGTERM" if outcome.signal == "TERM" else "SIGKILL (SIGTERM was not enough)"
        click.echo(f"stopped: {where}: pid {outcome.pid} and its process group, by {how}")
    else:
        click.echo(f"not running: no server of dflash-provision on {where}")
        if outcome.status == "not-running" and listening:
            who = f"pid {foreign}" if foreign else "a process this login cannot see"
            click.echo(f"  (the port is held by {who}, which launch did not start: left alone)")
    if outcome.status == "not-running":
        ctx.exit(int(ExitCode.NOT_RUNNING))
