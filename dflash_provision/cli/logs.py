"""``dflash-provision logs``: the last lines of the server log of a port (bounded)."""

from __future__ import annotations

import click

from dflash_provision.cli._connect import runtime_connection_options
from dflash_provision.cli._runtime import server_port_option
from dflash_provision.errors import ExitCode
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector


@click.command(
    "logs",
    help=(
        "Print the last -n lines (at most --max-bytes bytes) of the log of the server launch "
        "started for TARGET's drafter directory (the port its launch record names; --port to "
        "choose). Exit 21 when that port has no log."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@server_port_option
@click.option(
    "--last",
    "-n",
    "last",
    type=click.IntRange(1, 100_000),
    default=50,
    show_default=True,
    help="How many of the log's newest lines to print, as tail -n.",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=1),
    default=256 * 1024,
    show_default=True,
    help="Upper bound on what is transferred and printed.",
)
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    port: int | None,
    last: int,
    max_bytes: int,
    connection: Connector,
) -> None:
    from dflash_provision.server.locate import choose_port
    from dflash_provision.server.process import read_log

    target = parse_target(target_spec)
    with connection.open(target) as transport:
        # Each remote command's limit is the transport's --command-timeout (its contract).
        port = choose_port(transport, target, port).port
        tail = read_log(transport, port, last, max_bytes=max_bytes)
    if not tail.present:
        click.echo(f"error: no server log for port {port} ({tail.path})", err=True)
        ctx.exit(int(ExitCode.NOT_RUNNING))
    click.echo(tail.text, nl=not tail.text.endswith("\n") and bool(tail.text))
