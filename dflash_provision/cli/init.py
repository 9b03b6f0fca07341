"""``dflash-provision init DRAFTER_DIR``: the init container's command (see place/prepare.py)."""

from __future__ import annotations

from pathlib import Path

import click

from dflash_provision.cli._connect import authority_options
from dflash_provision.errors import UsageError
from dflash_provision.source.authority import SourceSpec, load_local


@click.command(
    "init",
    help=(
        "Make DRAFTER_DIR (on this machine: a pod's or container's shared volume) hold the "
        "pinned drafter config before vLLM starts: read or fetch the pinned bytes (--lock, "
        "--repo with --revision COMMIT, or --from), validate them against the target model's "
        "config (--target-config), write them atomically and read them back. One line on "
        "success; one 'error:' line and a non-zero exit when anything is wrong, so the server "
        "never starts on a wrong config. Nothing is recorded in the history."
    ),
)
@click.argument("drafter_dir", metavar="DRAFTER_DIR")
@click.option(
    "--target-config",
    "target_source",
    required=True,
    metavar="PATH",
    help="The target model's config.json (or its directory) on the volume: the drafter must "
    "fit it (hidden_size, vocab_size, layers).",
)
@authority_options
@click.option("--mkdir", is_flag=True, help="Create DRAFTER_DIR if it is missing.")
@click.option(
    "--keep-backups",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Backups of the old file to keep in <dir>/.dflash-backups.",
)
@click.option(
    "--no-effective",
    is_flag=True,
    help="Skip loading through transformers (faster; misses loader rewrites).",
)
@click.option(
    "--command-timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds the write (and its read-back) may run.",
)
def command(
    drafter_dir: str,
    target_source: str,
    authority_spec: SourceSpec,
    mkdir: bool,
    keep_backups: int,
    no_effective: bool,
    command_timeout: float,
) -> None:
    from dflash_provision.place.prepare import prepare_drafter, require_pinned
    from dflash_provision.place.push import PushStatus
    from dflash_provision.remote.proof import WriteOptions

    require_pinned(authority_spec)
    target_path = Path(target_source)
    if not target_path.exists():
        raise UsageError(f"--target-config {target_source}: no such file or directory")
    target = load_local(target_path)
    authority = authority_spec.load()
    result = prepare_drafter(
        authority,
        target,
        drafter_dir,
        write=WriteOptions(keep_backups, mkdir),
        effective=not no_effective,
        command_timeout=command_timeout,
    )
    how = "unchanged" if result.status is PushStatus.UNCHANGED else "written, read back and matched"
    click.echo(
        f"ready: {result.path} holds {authority.label} (sha256 {result.new_sha256}; {how}; "
        f"fits {target.label})"
    )


__all__ = ["command"]
