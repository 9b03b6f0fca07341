"""`dflash-provision history`: what this controller did to which host, newest first."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._json_document import echo_document

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryEntry


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
        [
            "push",
            "repair",
            "rollback",
            "audit",
            "audit-files",
            "place",
            "verify",
            "runtime-check",
            "rollout",
        ]
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list of records).")
def command(host: str | None, op: str | None, last: int, as_json: bool) -> None:
    """Show the local history of pushes, repairs, rollbacks and audits.

    A write still shown as "started (incomplete)" never recorded its end: the process was
    killed or the controller crashed. Run `dflash-provision verify` on that host.
    """
    from dflash_provision.history.host_key import HostKey
    from dflash_provision.history.store import check_home, default_db_path, default_store

    check_home()  # a DFLASH_PROVISION_HOME that is a file is an error, not "no history yet"
    entries = []
    if default_db_path().exists():
        key = None
        if host is not None:  # a whole TARGET spec (h01:/root/models/X) names its machine
            key = HostKey.of_name(host) if ":/" in host else HostKey.parse(host)
        entries = default_store().query(host=key, op=op, limit=last)
    if as_json:
        echo_document([e.to_dict() for e in entries])
        return
    if entries:
        _echo_table(entries)
        return
    if default_db_path().exists() and default_store().query(limit=1):
        # Rows exist, only none of them match: say what was asked, not that there is nothing.
        asked = [f"--host {host}"] * bool(host) + [f"--op {op}"] * bool(op)
        click.echo(f"no records match {' '.join(asked)} ({default_db_path()})")
        return
    click.echo(f"no history yet ({default_db_path()})")


def _echo_table(entries: list[HistoryEntry]) -> None:
    """One row per record, every cell whole at any width (cli/_history_view.py); on a terminal
    its width and the status in colour, piped the pipe width (COLUMNS, else wide)."""
    import shutil

    from dflash_provision.cli._history_view import history_lines, plain
    from dflash_provision.cli._render import pipe_width

    if sys.stdout.isatty():
        width = shutil.get_terminal_size().columns

        def paint(text: str, colour: str) -> str:
            return click.style(text, fg=colour)

        lines = history_lines(entries, width, paint)
    else:
        lines = history_lines(entries, pipe_width(), plain)
    for line in lines:
        click.echo(line)
