"""``dflash-provision status``: what runs on a port of the target, and whether it is ready."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import runtime_connection_options
from dflash_provision.cli._runtime import server_port_option
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.runtime.status import ServerStatus


@click.command(
    "status",
    help=(
        "Show the vLLM server of TARGET (push's grammar): the one launch started for TARGET's "
        "drafter directory (whatever its port), or the one on --port: "
        "running or not, pid, its command line and speculative config, the launch record "
        "(model, drafter sha256, vLLM version, env var names) and /health. Exit 0 when a server "
        "runs, 21 when none does, 22 when the port is held by a process this login cannot see."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@server_port_option
@click.option("--python", help="The target's Python for requests inside a container.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    port: int | None,
    python: str | None,
    as_json: bool,
    connection: Connector,
) -> None:
    from dflash_provision.errors import ExitCode
    from dflash_provision.place.target import parse_target
    from dflash_provision.runtime.locate import choose_port
    from dflash_provision.runtime.status import server_status

    target = parse_target(target_spec)
    with connection.open(target) as transport:
        # Each remote command's limit is the transport's --command-timeout (its contract).
        choice = choose_port(transport, target, port)
        status = server_status(transport, choice.port, python=python, port_from=choice.how)
    if as_json:
        click.echo(json.dumps(status.to_dict(), indent=2, ensure_ascii=False))
    else:
        _render(status)
    if status.held_by_hidden_process:
        ctx.exit(int(ExitCode.PORT_TAKEN))
    if not status.running:
        ctx.exit(int(ExitCode.NOT_RUNNING))


def _render(status: ServerStatus) -> None:
    server, record = status.server, status.last_record
    found = " (TARGET's launch record)" if status.port_from == "launch record" else ""
    where = f"port {status.port}{found} on {status.target}"
    if server is None and status.held_by_hidden_process:
        click.echo(
            f"{where}: held by a process this login cannot see (another user's, or outside "
            "this PID namespace: the socket listens, no visible process holds it)"
        )
    elif server is None:
        click.echo(f"{where}: not running")
    if server is None:
        _pidfile_line(status)
        if record is not None:
            click.echo(f"  last launch {record.started_at}: {shlex.join(record.argv)}")
        click.echo(f"  state dir   {status.state_dir}")
        return
    health = "no answer" if status.health_status is None else f"HTTP {status.health_status}"
    click.echo(f"{where}: {status.state} (GET /health: {health})")
    _pidfile_line(status)
    ours = "started by dflash-provision" if server.started_by_us else "NOT started by us"
    click.echo(f"  pid         {server.pid} ({ours})")
    click.echo(f"  command     {shlex.join(server.argv) if server.argv else '(not visible)'}")
    spec = server.speculative_config
    click.echo(f"  speculative {json.dumps(spec) if spec is not None else '(none on its argv)'}")
    read = server.argv_spec
    if read is not None and len(read.given) > 1:
        click.echo(f"  warning     {len(read.given)} speculative options on its command line:")
        for given in read.given:
            click.echo(f"                {given[:300]}")
        click.echo("              vLLM runs the one above (`vllm serve`'s rules: the last wins)")
    if read is not None and read.unknown:
        click.echo(f"  warning     {read.unknown}")
    if server.started_by_us and record is not None:
        click.echo(f"  started     {record.started_at}")
        click.echo(f"  model       {record.model}")
        click.echo(f"  drafter     {record.drafter_dir} (sha256 {record.drafter_sha256[:12]})")
        click.echo(f"  vllm        {record.vllm_version}")
        click.echo(f"  env names   {', '.join(record.env_names) or '(none)'}")
        click.echo(f"  log         {record.log_path}")
    click.echo(f"  state dir   {status.state_dir}")


def _pidfile_line(status: ServerStatus) -> None:
    if status.pidfile_refused:
        click.echo(f"  pidfile     not trusted, never signalled: {status.pidfile_refused}")
