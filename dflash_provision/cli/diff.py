"""``dflash-provision diff A B``: semantic differences between two configs."""

from __future__ import annotations

from typing import Any

import click

from dflash_provision.cli._connect import source_connection_options
from dflash_provision.cli._json_document import echo_document, name_target
from dflash_provision.cli._sources import load_source
from dflash_provision.errors import ConfigInvalid, ExitCode
from dflash_provision.source.authority import Authority
from dflash_provision.transport.factory import Connector


def load_side(spec: str, connection: Connector) -> Authority:
    """Load one side of a diff. The single place to teach diff about new kinds of SOURCE
    (remote targets such as ``root@gpu1:/path``, reached with the SSH options)."""
    return load_source(spec, connector=connection)


def _parse(side: Authority) -> Any:
    from dflash_provision.validation.validate import parse_config

    parsed = parse_config(side.data, what=side.label)
    # Any parse problem refuses the diff, a duplicate key too: its file holds two values and
    # loaders keep only the last one, so "identical" would hide the value a reader sees first.
    if parsed.findings:
        more = len(parsed.findings) - 1
        raise ConfigInvalid(parsed.findings[0].message + (f" (+{more} more)" if more else ""))
    return parsed.doc


def _read(ctx: click.Context, spec: str, connection: Connector) -> tuple[Authority, Any]:
    """One side loaded and parsed; a failure's --json document names this side as its target
    (the SOURCE the user gave that could not be read or parsed)."""
    name_target(ctx, spec)
    side = load_side(spec, connection)
    return side, _parse(side)


@click.command(name="diff")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
@source_connection_options
@click.pass_context
def command(ctx: click.Context, a: str, b: str, as_json: bool, connection: Connector) -> None:
    """Show what changes from config A to config B, ignoring key order and whitespace.

    A and B are each a SOURCE: a file, a directory, a Hub repo id or a remote TARGET such as
    root@gpu1:/root/models/X (forms below). Exits 0 when identical, 4 when they differ.
    """
    from dflash_provision.validation.diff import (
        cross_layout_diff,
        layouts_of,
        render_changes,
        semantic_diff,
    )

    (side_a, doc_a), (side_b, doc_b) = _read(ctx, a, connection), _read(ctx, b, connection)
    layouts = layouts_of(doc_a, doc_b)
    crossing = layouts[0] != layouts[1]
    # Two published layouts: compare what vLLM reads, named as B keeps it; they are never
    # "identical" (other bytes, other keys), even when the meaning is the same.
    changes = cross_layout_diff(doc_a, doc_b) if crossing else semantic_diff(doc_a, doc_b)
    if as_json:
        payload = {
            "a": side_a.label,
            "b": side_b.label,
            "identical": not changes and not crossing,
            "layouts": {"a": layouts[0], "b": layouts[1]},
            "changes": [change.to_dict() for change in changes],
        }
        # The parse layer refuses non-finite numbers, so none can reach here; if one ever did,
        # render_document fails loudly rather than print Infinity, which is not JSON.
        echo_document(payload)
    elif changes or crossing:
        click.echo(f"--- {side_a.label}")
        click.echo(f"+++ {side_b.label}")
        if crossing:
            note = "what vLLM reads" + ("" if changes else ": the same")
            click.echo(f"layouts differ ({layouts[0]} → {layouts[1]}); comparing {note}")
        for line in render_changes(changes):
            click.echo(line)
    else:
        click.echo("identical")
    if changes or crossing:
        ctx.exit(int(ExitCode.DRIFT))
