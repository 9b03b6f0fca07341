"""Output shared by commands: rich renderables (tables, summary lines) to stdout, terminal or
pipe alike, and a push / rollback result."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from dflash_provision.cli._json_document import echo_document
from dflash_provision.errors import RemoteStepFailed

if TYPE_CHECKING:
    from dflash_provision.place.push import PushResult
    from dflash_provision.plain_table import TableSpec

# Piped output is wide enough that rows do not wrap mid-word; trailing padding is cut so that
# `grep`, `diff` and logs see clean lines. COLUMNS, when set, wins (as for `ls` and rich itself).
_PIPE_WIDTH = 200


def pipe_width() -> int:
    """The width output is laid out for when stdout is not a terminal."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else _PIPE_WIDTH


def echo_table(table: TableSpec, *lines: str) -> None:
    """A table then summary lines; piped, a table that fits is printed without importing rich
    (the same text: plain_table.py)."""
    from dflash_provision.plain_table import (
        needs_stacking,
        plain_lines,
        rich_table,
        stacked_lines,
    )

    tty = sys.stdout.isatty()
    width = _terminal_width() if tty else pipe_width()
    if needs_stacking(table, width):  # a word would be cut: the detail under each row
        for line in [*stacked_lines(table, width, _paint if tty else None), *lines]:
            click.echo(line)
        return
    if not tty:
        plain = plain_lines(table, pipe_width())
        if plain is not None:
            for line in [*plain, *lines]:
                click.echo(line)
            return
    echo_rich(rich_table(table), *lines)


def wrapped(line: str, width: int | None) -> list[str]:
    """``line`` in lines of at most ``width`` columns, its continuation lines indented two more
    than it (as `git log` and `journalctl` wrap a message), never breaking a word: a sha or a
    path stays whole. ``width`` None (piped output): the line as it is, for grep."""
    if width is None or len(line) <= width:
        return [line]
    indent = line[: len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(
        line.strip(),
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    ) or [line]


def echo_wrapped(lines: Sequence[str]) -> None:
    """Report lines (validate, runtime-check, doctor): on a terminal each wrapped to its width
    (see ``wrapped``); piped, unchanged."""
    width = _terminal_width() if sys.stdout.isatty() else None
    for line in lines:
        for part in wrapped(line, width):
            click.echo(part)


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size().columns


def _paint(text: str, style: str) -> str:
    """A rich style of this project's tables ("bold red", "dim", "green") as click's."""
    words = style.split()
    colours = [w for w in words if w not in ("bold", "dim")]
    return click.style(
        text,
        fg=colours[0] if colours else None,
        bold=True if "bold" in words else None,
        dim=True if "dim" in words else None,
    )


def echo_rich(*renderables: Any) -> None:
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console(soft_wrap=False)
        for renderable in renderables:
            console.print(renderable, highlight=False)
        return
    console = Console(width=pipe_width(), soft_wrap=False, no_color=True, highlight=False)
    for renderable in renderables:
        if isinstance(renderable, str):  # a summary line: whole, never wrapped mid-phrase
            click.echo(renderable)
            continue
        with console.capture() as captured:
            console.print(renderable)
        for line in captured.get().splitlines():
            click.echo(line.rstrip())


def emit_push_result(
    ctx: click.Context,
    result: PushResult,
    *,
    as_json: bool,
    verb: str,
    extra: dict[str, Any] | None = None,
    notes: tuple[str, ...] = (),
) -> None:
    """Print a push/rollback result (human or JSON) and end with its exit code. ``extra``
    joins the JSON document; ``notes`` are printed as ``note`` lines after the result."""
    from dflash_provision.place.push import PushStatus

    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        echo_document({**result.to_dict(), **(extra or {})})
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
            f"{result.target}: {result.message}",
            step=result.failed_step or "write",
            exit_code=result.exit_code,
        )
    if result.cut_off:
        click.echo(f"  note        {result.message}")
    for note in notes:
        click.echo(f"  note        {note}")
