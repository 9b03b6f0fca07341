"""``dflash-provision push``: write the authoritative config to one target and prove it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import (
    AuthoritySpec,
    Connection,
    authority_options,
    connection_options,
)

if TYPE_CHECKING:
    from dflash_provision.history import Recording
    from dflash_provision.push import PushResult
    from dflash_provision.target import Target


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
    from dflash_provision.push import push_config
    from dflash_provision.target import parse_target

    target = parse_target(target_spec)
    authority = authority_spec.load()
    with connection.open(target) as transport, recorded_change("push", target, dry_run) as rec:
        # Connect before validating: an unreachable host fails in the connect time, not after
        # the ~2 s a config this machine has not judged yet costs (transformers).
        transport.connect()
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
        rec.fill(result)
    emit_push_result(ctx, result, as_json=as_json, verb="push")


class _HistoryRow:
    """Adapter from a PushResult to the history row opened for it."""

    def __init__(self, recording: Recording | None) -> None:
        self.recording = recording

    def fill(self, result: PushResult) -> None:
        if self.recording is None:
            return
        self.recording.status = result.status.value
        self.recording.sha256_before = result.old_sha256
        self.recording.sha256_after = result.readback.sha256 if result.readback else None
        self.recording.message = result.message


@contextlib.contextmanager
def recorded_change(op: str, target: Target, dry_run: bool = False) -> Iterator[_HistoryRow]:
    """Journal a change in the local history: the row reads "started" before the remote write,
    so a push that is killed half way stays visible. Dry runs change nothing and are not kept."""
    if dry_run:
        yield _HistoryRow(None)
        return
    from dflash_provision import history

    host = target.machine + (f"/{target.container.display()}" if target.container else "")
    with history.recorded(op, host, target.config_path) as recording:
        yield _HistoryRow(recording)


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


__all__ = ["command", "emit_push_result", "recorded_change"]
