"""``dflash-provision stop``: end the server launch started on a port, and all its processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import runtime_connection_options
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._runtime import container_option, server_port_option
from dflash_provision.errors import ExitCode
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerOption
    from dflash_provision.server.process import StopOutcome


@click.command(
    "stop",
    help=(
        "Stop the vLLM server that launch started for TARGET's drafter directory (the port its "
        "launch record names; --port to choose) and every process it started (its process "
        "group and session, their children, and every process carrying its start marker, e.g. "
        "a child that called setsid): SIGTERM, SIGKILL after --timeout seconds, then wait until "
        "none is left and remove the pidfile (the log and launch record stay). Says which "
        "processes it ended. A pidfile whose process is not the launch's server (no start time, "
        "pid <= 1, another start time or command line) is never signalled. Exit 21 when none "
        "runs there."
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
@container_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    port: int | None,
    timeout: float,
    container: ContainerOption | None,
    as_json: bool,
    connection: Connector,
) -> None:
    from dflash_provision.server.locate import choose_port
    from dflash_provision.server.process import stop_server

    target = parse_target(target_spec)
    if container is not None:
        ctx.exit(_in_container(target_spec, container, port, timeout, as_json, connection))
    with connection.open(target) as transport:
        # Each remote command's limit is the transport's --command-timeout (its contract).
        port = choose_port(transport, target, port).port
        outcome = stop_server(transport, port, timeout=timeout)
        where = f"port {port} on {transport.description}"
    if as_json:
        data = {"target": where, "port": port, **outcome.to_dict()}
        echo_document(data)
    else:
        for line in _render(outcome, where):
            click.echo(line)
    if outcome.status != "stopped":
        ctx.exit(int(ExitCode.NOT_RUNNING))


_HOW = {"group": "process group", "session": "session", "marker": "marker", "descendant": "child"}


def _render(outcome: StopOutcome, where: str) -> list[str]:
    """What stop did, in words: which processes it ended and how it found them."""
    state = outcome.state
    lines: list[str] = []
    if outcome.status == "stopped":
        how = "SIGTERM" if outcome.signal == "TERM" else "SIGKILL (SIGTERM was not enough)"
        found = ", ".join(f"{_HOW.get(k, k)} {n}" for k, n in outcome.found_by.items())
        pids = " ".join(str(p) for p in outcome.ended)
        count = len(outcome.ended)
        if outcome.server_had_exited:
            head = f"stopped: {where}: the server (pid {outcome.pid}) had exited; what it left"
        else:
            head = f"stopped: {where}: the server (pid {outcome.pid})"
        lines.append(f"{head}, {count} process{'es' if count != 1 else ''}, by {how}")
        lines.append(f"  ended       {pids} (found by {found or '?'})")
        return lines
    if outcome.status == "refused":
        lines.append(f"not stopped: {where}: {outcome.refused}; nothing was signalled")
    else:
        lines.append(f"not running: no server of dflash-provision on {where}")
    if state is not None and state.listening:
        if state.listener_pid is not None:
            who = f"pid {state.listener_pid}"
        else:
            who = "a process this login cannot see (another user's, or outside this PID namespace)"
        lines.append(f"  (the port is held by {who}, which launch did not start: left alone)")
    return lines


def _in_container(
    target_spec: str,
    option: ContainerOption,
    port: int | None,
    timeout: float,
    as_json: bool,
    connection: Connector,
) -> int:
    """stop --container: ``docker stop`` of the container whose server listens on the port."""
    from dflash_provision.server.container_server import open_container_server, stop_container

    target = parse_target(target_spec)
    with connection.open(target) as transport:
        found = open_container_server(
            transport, option, target, docker_host=connection.docker_host, running=False
        )
        chosen = port if port is not None else found.port()[0]
        outcome = stop_container(
            found, chosen, timeout=timeout, command_timeout=connection.ssh.command_timeout
        )
    if as_json:
        echo_document({"port": chosen, **outcome.to_dict()})
    elif outcome.status == "stopped":
        click.echo(f"stopped: port {chosen} in {outcome.container}: {outcome.message}")
    else:
        click.echo(f"not running: port {chosen} in {outcome.container}: {outcome.message}")
    return 0 if outcome.status == "stopped" else int(ExitCode.NOT_RUNNING)
