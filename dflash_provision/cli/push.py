"""``dflash-provision push``: write the authoritative config to one target and prove it."""

from __future__ import annotations

import click

from dflash_provision.cli._connect import (
    authority_options,
    connection_options,
)
from dflash_provision.cli._render import emit_push_result
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector


@click.command(
    "push",
    help=(
        "Write the authoritative config to TARGET atomically in one remote command (lock, temp "
        "file, fsync, backup, rename, fsync dir), which then opens the file again by its path "
        "and sends its bytes back to be compared with those meant (the read-back). "
        "Prints the semantic diff applied, or 'unchanged'. TARGET is e.g. root@gpu1:/models/X, "
        "gpu1/lxc:c1:/models/X or /local/dir. A symlinked config.json is refused unless "
        "--follow-symlinks (then the file it points to is replaced and the link kept)."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@authority_options
@click.option("--dry-run", is_flag=True, help="Show the diff; write nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="Push even if the config fails validation (never one that does not parse).",
)
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
@click.option(
    "--all-files",
    is_flag=True,
    help="Also put every file the lock pins in place: each missing or wrong one streamed from "
    "this machine's Hub cache, written beside its name, fsynced, its hash proved on TARGET, "
    "renamed; an interrupted placement resumes (see docs/pinned-files.md).",
)
@connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    authority_spec: SourceSpec,
    dry_run: bool,
    force: bool,
    mkdir: bool,
    follow_symlinks: bool,
    keep_backups: int,
    as_json: bool,
    all_files: bool,
    connection: Connector,
) -> None:
    from dflash_provision.history.host_key import HostKey
    from dflash_provision.history.store import default_store, journal
    from dflash_provision.place.push import push_config
    from dflash_provision.remote.proof import WriteOptions

    target = parse_target(target_spec)
    authority = authority_spec.load()
    pinned = None
    if all_files:
        from dflash_provision.source.pinned_source import pinned_for

        pinned = pinned_for(authority_spec, authority)  # before any host is touched
    store = None if dry_run else default_store()  # a dry run changes nothing: nothing to keep
    key = HostKey.of_target(target)
    with (
        connection.open(target) as transport,
        journal(store, "push", key, target.config_path) as rec,
    ):
        # Connect before validating: an unreachable host fails in the connect time, not after
        # the ~2 s a config this machine has not judged yet costs (transformers).
        transport.connect()
        result = push_config(
            transport,
            target,
            authority,
            dry_run=dry_run,
            force=force,
            write=WriteOptions(keep_backups, mkdir, follow_symlinks),
        )
        result.journal_into(rec)
        files = None
        if pinned is not None and result.ok and not dry_run:
            from dflash_provision.cli._all_files import push_pinned_files

            files = push_pinned_files(transport, target, pinned, store, as_json)
    extra = {"files": files.to_dict()} if files is not None else None
    emit_push_result(ctx, result, as_json=as_json, verb="push", extra=extra)
    if files is not None:
        from dflash_provision.cli._all_files import echo_files_push

        if not as_json:
            echo_files_push(files)
        ctx.exit(int(files.exit_code))


__all__ = ["command"]
