"""`dflash-provision history`: what this controller did to which host, newest first."""

from __future__ import annotations

import json

import click

from dflash_provision.cli._flags import deprecated_spelling
from dflash_provision.cli._render import echo_rich


@click.command("history")
@click.option(
    "--host",
    "host",
    metavar="HOST",
    help="Only this machine: an inventory name, SSH host or TARGET (covers every command that "
    "named it, every login, port and container recorded on it; USER@HOST, HOST:PORT or "
    "HOST/lxc:NAME narrow it).",
)
@click.option(
    "--op",
    type=click.Choice(
        ["push", "repair", "rollback", "audit", "audit-files", "verify", "runtime-check", "rollout"]
    ),
    help="Only this kind of operation.",
)
@click.option(
    "--last",
    "-n",
    "last",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    metavar="N",
    help="Show the N newest records.",
)
# --limit was the row count here; everywhere else it is a host pattern (Ansible's --limit).
@click.option(
    "--limit",
    "old_limit",
    type=click.IntRange(min=1),
    hidden=True,
    callback=deprecated_spelling("--limit N", "--last N", "--limit is a host pattern in audit"),
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list of records).")
def command(
    host: str | None, op: str | None, last: int, old_limit: int | None, as_json: bool
) -> None:
    """Show the local history of pushes, repairs, rollbacks and audits.

    A write still shown as "started (incomplete)" never recorded its end: the process was
    killed or the controller crashed. Run `dflash-provision verify` on that host.
    """
    from dflash_provision.history import HostKey, check_home, default_db_path, default_store
    from dflash_provision.report import history_table

    check_home()  # a DFLASH_PROVISION_HOME that is a file is an error, not "no history yet"
    entries = []
    if default_db_path().exists():
        key = None
        if host is not None:  # a whole TARGET spec (h01:/root/models/X) names its machine
            key = HostKey.of_name(host) if ":/" in host else HostKey.parse(host)
        entries = default_store().query(host=key, op=op, limit=old_limit or last)
    if as_json:
        click.echo(json.dumps([e.to_dict() for e in entries], indent=2))
        return
    if entries:
        echo_rich(history_table(entries))
        return
    if default_db_path().exists() and default_store().query(limit=1):
        # Rows exist, only none of them match: say what was asked, not that there is nothing.
        asked = [f"--host {host}"] * bool(host) + [f"--op {op}"] * bool(op)
        click.echo(f"no records match {' '.join(asked)} ({default_db_path()})")
        return
    click.echo(f"no history yet ({default_db_path()})")
