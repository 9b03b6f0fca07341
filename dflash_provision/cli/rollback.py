"""``dflash-provision rollback``: list a target's config backups, or restore one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dflash_provision.cli._connect import authority_options, connection_options
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import emit_push_result
from dflash_provision.errors import DflashProvisionError
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.place.push import PushResult
    from dflash_provision.source.authority import Authority


@click.command(
    "rollback",
    help=(
        "Restore TARGET's config from a backup kept by push, through the same atomic write "
        "protocol (the current file becomes a backup too) and read-back. Without --to, the "
        "newest backup whose bytes differ from the current file. --list shows the backups; "
        "--dry-run shows which backup would be restored and the diff, and touches nothing. "
        "The restored bytes are compared with the authoritative config (--repo/--from/--lock, "
        "default ./dflash.lock when present) and a note says when they are not it."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@click.option("--to", "to", metavar="BACKUP", help="Backup name (or its timestamp) to restore.")
@click.option("--list", "list_only", is_flag=True, help="List backups; change nothing.")
@click.option(
    "--dry-run", is_flag=True, help="Show what would be restored (backup, diff); write nothing."
)
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
@authority_options
@connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    to: str | None,
    list_only: bool,
    dry_run: bool,
    follow_symlinks: bool,
    force: bool,
    keep_backups: int,
    as_json: bool,
    authority_spec: SourceSpec,
    connection: Connector,
) -> None:
    from dflash_provision.history.host_key import HostKey
    from dflash_provision.history.store import default_store, journal
    from dflash_provision.place.push import list_backups, rollback_config
    from dflash_provision.remote.proof import WriteOptions

    target = parse_target(target_spec)
    timeout = connection.ssh.command_timeout
    authority = None if list_only else _authority(authority_spec)
    with connection.open(target) as transport:
        if list_only:
            backups = list_backups(transport, target, timeout=timeout)
        else:
            key = HostKey.of_target(target)
            store = None if dry_run else default_store()  # a dry run changes nothing
            with journal(store, "rollback", key, target.config_path) as rec:
                result = rollback_config(
                    transport,
                    target,
                    to=to,
                    write=WriteOptions(keep_backups, follow_symlinks=follow_symlinks),
                    force=force,
                    dry_run=dry_run,
                )
                result.journal_into(rec)
    if not list_only:
        extra, notes = _against_authority(result, authority)
        emit_push_result(ctx, result, as_json=as_json, verb="rollback", extra=extra, notes=notes)
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
        echo_document({"target": str(target), "backups": rows})
        return
    if not backups:
        click.echo(f"{target}: no backups")
        return
    click.echo(f"backups of {target.config_path} (oldest first):")
    for b in backups:
        when = b.backed_up_at.strftime("%Y-%m-%d %H:%M:%S UTC") if b.backed_up_at else "?"
        click.echo(f"  {b.name}  {when}  sha256 {b.sha256[:12]}  {b.size} bytes")


def _authority(spec: SourceSpec) -> Authority | None:
    """The authoritative config to compare the restored bytes with: the one named, else
    ./dflash.lock when present (an error there does not stop a rollback: it is reported in
    the note instead), else None."""
    if spec.is_set:
        return spec.load()  # named on purpose: an error in it is the user's to fix first
    try:
        return spec.load()
    except DflashProvisionError:
        return None  # no default lock here (or a broken one): nothing to compare with


def _against_authority(
    result: PushResult, authority: Authority | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The JSON key and the note that say whether the restored bytes are the authoritative
    config: a rollback restores an older file, which is often exactly what verify and audit
    will then call drift."""
    if authority is None:
        return {"authoritative": None}, ()
    matches = result.new_sha256 == authority.sha256
    extra = {
        "authoritative": {
            "source": authority.label,
            "sha256": authority.sha256,
            "matches": matches,
        }
    }
    from dflash_provision.place.push import PushStatus

    done = "backup to restore" if result.status is PushStatus.DRY_RUN else "restored file"
    if matches:
        return extra, (f"the {done} is the authoritative config ({authority.label})",)
    return extra, (
        f"the {done} is NOT the authoritative config ({authority.label}, sha256 "
        f"{authority.sha256[:12]}): verify and audit will report drift until it is pushed",
    )
