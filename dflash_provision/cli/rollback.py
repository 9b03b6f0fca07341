"""``dflash-provision rollback``: list a target's config backups, or restore one."""

from __future__ import annotations

import json

import click

from dflash_provision.cli._connect import connection_options
from dflash_provision.cli._render import emit_push_result
from dflash_provision.transport.factory import Connector


@click.command(
    "rollback",
    help=(
        "Restore TARGET's config from a backup kept by push, through the same atomic write "
        "protocol (the current file becomes a backup too) and read-back. Without --to, the "
        "newest backup whose bytes differ from the current file. --list shows the backups."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@click.option("--to", "to", metavar="BACKUP", help="Backup name (or its timestamp) to restore.")
@click.option("--list", "list_only", is_flag=True, help="List backups; change nothing.")
@click.option("--follow-symlinks", is_flag=True, help="Replace the file a symlink points to.")
@click.option(
    "--force",
    is_flag=True,
    help="Restore the backup even if it fails validation (never one that does not parse).",
)
@click.option(
    "--keep-backups",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Backups to keep after the restore.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    to: str | None,
    list_only: bool,
    follow_symlinks: bool,
    force: bool,
    keep_backups: int,
    as_json: bool,
    connection: Connector,
) -> None:
    from dflash_provision.history import HostKey, default_store, journal
    from dflash_provision.push import list_backups, rollback_config
    from dflash_provision.remote.proof import WriteOptions
    from dflash_provision.target import parse_target

    target = parse_target(target_spec)
    timeout = connection.ssh.command_timeout
    with connection.open(target) as transport:
        if list_only:
            backups = list_backups(transport, target, timeout=timeout)
        else:
            key = HostKey.of_target(target)
            with journal(default_store(), "rollback", key, target.config_path) as rec:
                result = rollback_config(
                    transport,
                    target,
                    to=to,
                    write=WriteOptions(keep_backups, follow_symlinks=follow_symlinks),
                    force=force,
                )
                result.journal_into(rec)
    if not list_only:
        emit_push_result(ctx, result, as_json=as_json, verb="rollback")
        return
    if as_json:
        rows = [
            {
                "name": b.name,
                "path": b.path,
                "backed_up_at": b.backed_up_at.isoformat() if b.backed_up_at else None,
                "modified_at": b.modified_at.isoformat() if b.modified_at else None,
                "sha256": b.sha256,
                "size": b.size,
            }
            for b in backups
        ]
        click.echo(json.dumps({"target": str(target), "backups": rows}, indent=2))
        return
    if not backups:
        click.echo(f"{target}: no backups")
        return
    click.echo(f"backups of {target.config_path} (oldest first):")
    for b in backups:
        when = b.backed_up_at.strftime("%Y-%m-%d %H:%M:%S UTC") if b.backed_up_at else "?"
        click.echo(f"  {b.name}  {when}  sha256 {b.sha256[:12]}  {b.size} bytes")
