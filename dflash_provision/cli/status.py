"""``dflash-provision status``: what runs on a port of the target, and whether it is ready."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import runtime_connection_options
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._runtime import container_option, server_port_option
from dflash_provision.errors import ExitCode
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerOption, ContainerServer
    from dflash_provision.server.status import ServerStatus
    from dflash_provision.target import Target


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
@container_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    port: int | None,
    python: str | None,
    container: ContainerOption | None,
    as_json: bool,
    connection: Connector,
) -> None:
    from dflash_provision.server.locate import choose_port
    from dflash_provision.server.status import server_status

    target = parse_target(target_spec)
    if container is not None:
        ctx.exit(_in_container(target, container, port, python, as_json, connection))
    with connection.open(target) as transport:
        # Each remote command's limit is the transport's --command-timeout (its contract).
        choice = choose_port(transport, target, port)
        status = server_status(transport, choice.port, python=python, port_from=choice.how)
    if as_json:
        echo_document(status.to_dict())
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


def _in_container(
    target: Target,
    option: ContainerOption,
    port: int | None,
    python: str | None,
    as_json: bool,
    connection: Connector,
) -> int:
    """status --container: the container's record (its state, the drafter mapped in), then the
    server on the port inside, reached with docker exec."""
    from dflash_provision.server.container_server import open_container_server
    from dflash_provision.server.status import server_status

    with connection.open(target) as transport:
        found = open_container_server(
            transport, option, target, docker_host=connection.docker_host, running=False
        )
        chosen, how = (port, "--port") if port is not None else found.port()
        status = None
        if found.record.running:
            status = server_status(found.transport, chosen, python=python, port_from=how)
    data = (
        status.to_dict()
        if status is not None
        else {"target": found.transport.description, "port": chosen, "state": "not-running",
              "running": False, "port_from": how}
    )  # fmt: skip
    spec = status.server.speculative_config if status and status.server else None
    data["container"] = _container_dict(found, spec)
    if as_json:
        echo_document(data)
    elif status is None:
        click.echo(f"{found.what} on {transport.description}: not running (state "
                   f"{found.record.status})")  # fmt: skip
    else:
        _render(status)
        for line in found.mapping_lines((spec or {}).get("model")):
            click.echo(f"  container   {line}")
        mismatch = found.drafter_mismatch((spec or {}).get("model")) if spec else None
        if mismatch:
            click.echo(f"  warning     {mismatch}")
    if status is not None and status.held_by_hidden_process:
        return int(ExitCode.PORT_TAKEN)
    return 0 if status is not None and status.running else int(ExitCode.NOT_RUNNING)


def _container_dict(found: ContainerServer, spec: dict[str, object] | None) -> dict[str, object]:
    given = (spec or {}).get("model")
    record = found.record
    return {
        "kind": found.option.kind,
        "name": found.option.name,
        "id": record.id,
        "image": record.image,
        "state": record.status,
        "started_at": record.started_at,
        "command": list(record.command),
        "env_names": list(record.env_names),
        "mounts": [
            {"type": m.kind, "source": m.source, "destination": m.destination, "rw": m.read_write}
            for m in record.mounts
        ],
        "published_ports": [
            {
                "container_port": p.container_port,
                "protocol": p.protocol,
                "host_ip": p.host_ip,
                "host_port": p.host_port,
            }
            for p in record.ports
        ],
        "provisioned": found.provisioned,
        "provisioned_in_container": found.inside,
        "server_drafter": given,
        "server_drafter_on_host": record.host_path(given)
        if isinstance(given, str) and given.startswith("/")
        else None,
        "drafter_mismatch": found.drafter_mismatch(given) if spec else None,
    }
