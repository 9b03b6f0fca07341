"""``dflash-provision verify``: read a target's config back and compare it, writing nothing."""

from __future__ import annotations

import click

from dflash_provision.cli._connect import (
    authority_options,
    connection_options,
)
from dflash_provision.cli._json_document import echo_document
from dflash_provision.errors import ExitCode, RemoteStepFailed
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector


@click.command(
    "verify",
    help=(
        "Read TARGET's config (one remote command) and compare it with the authoritative config. "
        "Exit 0 when the bytes match (in_sync), 4 (drift) with the semantic diff when they differ "
        "(same_values: the same JSON in other bytes; drifted, invalid, loader_normalised) or the "
        "file is missing, 7 when it cannot be read. With --all-files also every file the lock "
        "pins (fetch --all-files), checked on TARGET: missing, wrong size, other bytes (hashed "
        "there with sha256sum/sha1sum; a file unchanged since a proof in the history is not "
        "hashed again), symlinks out of the directory, and files vLLM would load that the "
        "commit does not have; exit 4 when one is wrong, 26 when one cannot be told."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@authority_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--all-files",
    is_flag=True,
    help="Also check every file the lock pins, where it lies (see docs/pinned-files.md).",
)
@connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    authority_spec: SourceSpec,
    as_json: bool,
    all_files: bool,
    connection: Connector,
) -> None:
    from dflash_provision.place.push import verify_config

    target = parse_target(target_spec)
    authority = authority_spec.load()
    if all_files:
        from dflash_provision.cli._all_files import verify_all_files

        verify_all_files(ctx, target, authority_spec, authority, connection, as_json)
        return
    with connection.open(target) as transport:
        result = verify_config(transport, target, authority)  # the transport's --command-timeout
    if as_json:
        echo_document(result.to_dict())
        ctx.exit(int(result.exit_code))
    if not result.status.audited:
        raise RemoteStepFailed(f"{result.target}: {result.message}", step="read")
    click.echo(f"{result.status.value}: {result.target}: {result.message}")
    if result.exit_code is ExitCode.OK:
        return
    for line in result.diff.lines if result.diff else []:
        click.echo(f"  {line}")
    ctx.exit(int(result.exit_code))
