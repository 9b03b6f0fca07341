"""A table as data, printed by rich on a terminal and, when piped and it fits, without rich.

rich takes ~80 ms to import, a fifth of an ``audit`` of one host. A table whose rows fit the
width needs none of its layout work: rich would print every cell on its own lines, columns padded
to their widest line and two spaces apart (``box=None``, ``pad_edge=False``), with no colour in a
pipe. ``plain_lines`` prints exactly that and declines (None) whenever rich could print anything
else: a row that must wrap, a character whose width rich may count otherwise, text rich reads as
markup or emoji codes. ``rich_table`` is the same table for rich, for the terminal and for what
``plain_lines`` declines.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.table import Table

GAP = "  "  # rich's padding (0, 1): one space right of a cell, one left of the next
# Beyond printable ASCII, the characters this project writes into cells (diff arrows, ellipses):
# one terminal cell each, for rich as for a terminal.
_ONE_CELL = frozenset("→…")


@dataclass(frozen=True)
class Column:
    """rich's column options (same defaults); they only matter when rich prints the table."""

    header: str
    no_wrap: bool = False
    overflow: Literal["fold", "crop", "ellipsis", "ignore"] = "ellipsis"
    justify: Literal["left", "right"] = "left"  # right: figures line up on their last digit


@dataclass(frozen=True)
class Cell:
    """``markup``: given to rich as a plain string (read as console markup, as the host names
    always were), not as a Text."""

    text: str
    style: str = ""
    markup: bool = False


@dataclass(frozen=True)
class TableSpec:
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]


def plain_lines(table: TableSpec, width: int) -> list[str] | None:
    """The table's lines as rich prints them into a pipe ``width`` columns wide (each line's
    trailing blanks cut), or None when rich might print it otherwise."""
    header = tuple(Cell(c.header, markup=True) for c in table.columns)
    rows = [header, *table.rows]
    if not all(_same_in_rich(cell) for row in rows for cell in row):
        return None
    split = [[cell.text.split("\n") for cell in row] for row in rows]
    widths = [max(len(line) for row in split for line in row[i]) for i in range(len(header))]
    if sum(widths) + len(GAP) * (len(widths) - 1) > width:
        return None  # rich would wrap or fold some cell
    lines: list[str] = []
    for row in split:
        for k in range(max(len(cell) for cell in row)):
            cells = zip(row, widths, table.columns, strict=True)
            parts = [_pad(cell[k] if k < len(cell) else "", w, c) for cell, w, c in cells]
            lines.append(GAP.join(parts).rstrip())
    return lines


def needs_stacking(table: TableSpec, width: int) -> bool:
    """Whether the last column, beside the others, would be narrower than its longest word:
    rich would then fold a word (a path, a sha256) in the middle. ``stacked_lines`` then."""
    head = _head_widths(table)
    room = width - sum(head) - len(GAP) * len(head)
    words = [w for row in table.rows for w in row[-1].text.split()]
    return bool(words) and room < max(len(w) for w in words)


def stacked_lines(
    table: TableSpec, width: int, paint: Callable[[str, str], str] | None = None
) -> list[str]:
    """The table with its last column under each row, indented and wrapped between words to
    ``width`` (journalctl's continuation lines): no word is cut, whatever the width. ``paint``
    colours a cell's text by its style (on a terminal)."""
    head = _head_widths(table)
    headers = zip(table.columns[:-1], head, strict=True)
    lines = [GAP.join(_pad(c.header, w, c) for c, w in headers).rstrip()]
    for row in table.rows:
        parts = []
        for cell, w, column in zip(row[:-1], head, table.columns[:-1], strict=True):
            text = paint(cell.text, cell.style) if paint and cell.style else cell.text
            padding = " " * (w - len(cell.text))
            parts.append(padding + text if column.justify == "right" else text + padding)
        lines.append(GAP.join(parts).rstrip())
        for line in row[-1].text.split("\n"):
            wrapped = textwrap.wrap(
                line, max(width - 4, 20), break_long_words=False, break_on_hyphens=False
            )
            lines.extend("    " + part for part in wrapped)
    return lines


def _pad(text: str, width: int, column: Column) -> str:
    return text.rjust(width) if column.justify == "right" else text.ljust(width)


def _head_widths(table: TableSpec) -> list[int]:
    """The widths of every column but the last (one-line cells)."""
    count = len(table.columns) - 1
    return [
        max(len(table.columns[i].header), *(len(row[i].text) for row in table.rows))
        for i in range(count)
    ]


def _same_in_rich(cell: Cell) -> bool:
    text = cell.text
    if not all(" " <= ch <= "~" or ch in _ONE_CELL or ch == "\n" for ch in text):
        return False  # tabs, control and wide characters: rich's measure decides
    # A markup string: "[" may open a tag, ":name:" may be an emoji code.
    return not cell.markup or ("[" not in text and text.count(":") < 2)


def rich_table(table: TableSpec) -> Table:
    """The same table for rich: header in bold, no box, no outer padding."""
    from rich.table import Table
    from rich.text import Text

    result = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in table.columns:
        result.add_column(
            column.header, no_wrap=column.no_wrap, overflow=column.overflow, justify=column.justify
        )
    for row in table.rows:
        result.add_row(
            *(cell.text if cell.markup else Text(cell.text, style=cell.style) for cell in row)
        )
    return result
