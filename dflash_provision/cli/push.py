"""``dflash-provision push``: write the authoritative config to one target and prove it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import (
    AuthoritySpec,
    Connection,
    authority_options,
    connection_options,
)

if TYPE_CHECKING:
    from dflash_provision.push import PushResult


@click.command(
    "push",
    help=(
        "Write the authoritative config to TARGET atomically (lock, temp file, fsync, backup, "
        "rename, fsync dir) in one remote command, then read it back in another and compare. "
        "Prints the semantic diff applied, or 'unchanged'. TARGET is e.g. root@gpu1:/models/X, "
        "gpu1/lxc:c1:/models/X or /local/dir. A symlinked config.json is refused unless "
        "--follow-symlinks (then the file it points to is replaced and the link kept)."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@authority_options
@click.option("--dry-run", is_flag=True, help="Show the diff; write nothing.")
@click.option("--force", is_flag=True, help="Push even if the config fails validation.")
@click.option("--mkdir", is_flag=True, help="Create the model directory if it is missing.")
@click.option("--follow-symlinks", is_flag=True, help="Replace the file a symlink points to.")
@click.option(
    "--keep-backups",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Backups of the old file to keep in <dir>/.dflash-backups.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    authority_spec: AuthoritySpec,
    dry_run: bool,
    force: bool,
    mkdir: bool,
    follow_symlinks: bool,
    keep_backups: int,
    as_json: bool,
    connection: Connection,
) -> None:
    from dflash_provision.history import HostKey, default_store, journal
    from dflash_provision.push import push_config
    from dflash_provision.target import parse_target

    target = parse_target(target_spec)
    authority = authority_spec.load()
    store = None if dry_run else default_store()  # a dry run changes nothing: nothing to keep
    key = HostKey.of_target(target)
    with (
        connection.open(target) as transport,
        journal(store, "push", key, target.config_path) as rec,
    ):
        result = push_config(
            transport,
            target,
            authority,
            dry_run=dry_run,
            force=force,
            mkdir=mkdir,
            follow_symlinks=follow_symlinks,
            keep_backups=keep_backups,
            timeout=connection.ssh.command_timeout,
        )
        result.journal_into(rec)
    emit_push_result(ctx, result, as_json=as_json, verb="push")


def emit_push_result(ctx: click.Context, result: PushResult, *, as_json: bool, verb: str) -> None:
    """Print a push/rollback result (human or JSON) and end with its exit code."""
    from dflash_provision.errors import RemoteStepFailed
    from dflash_provision.push import PushStatus

    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        if not result.ok:
            ctx.exit(int(result.exit_code))
        return

    click.echo(f"{verb} {result.target}  <-  {result.source}")
    if result.restored_from is not None:
        click.echo(f"  restoring backup {result.restored_from.name}")
    for line in result.diff.lines if result.diff else []:
        click.echo(f"  {line}")
    write = result.write
    if result.status is PushStatus.UNCHANGED:
        click.echo(f"unchanged: {result.path} already has sha256 {result.new_sha256}")
    elif result.status is PushStatus.DRY_RUN:
        click.echo("dry run: nothing written")
    elif result.status is PushStatus.WRITTEN and write is not None:
        click.echo(f"written: {result.path} (sha256 {result.new_sha256}, read back and matched)")
        if write.backup:
            click.echo(f"  backup      .dflash-backups/{write.backup}")
        if write.durability is not None:
            click.echo(f"  durability  {write.durability.describe()}")
    else:
        raise RemoteStepFailed(
            f"{result.target}: {result.message}", step=result.failed_step or "write"
        )


__all__ = ["command", "emit_push_result"]
