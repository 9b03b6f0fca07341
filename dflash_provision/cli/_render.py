"""Print rich renderables (tables, summary lines) to stdout, terminal or pipe alike."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

# Piped output is wide enough that rows do not wrap mid-word; trailing padding is cut so that
# `grep`, `diff` and logs see clean lines. COLUMNS, when set, wins (as for `ls` and rich itself).
_PIPE_WIDTH = 200


def _pipe_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else _PIPE_WIDTH


def echo_rich(*renderables: Any) -> None:
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console(soft_wrap=False)
        for renderable in renderables:
            console.print(renderable, highlight=False)
        return
    console = Console(width=_pipe_width(), soft_wrap=False, no_color=True, highlight=False)
    for renderable in renderables:
        if isinstance(renderable, str):  # a summary line: whole, never wrapped mid-phrase
            click.echo(renderable)
            continue
        with console.capture() as captured:
            console.print(renderable)
        for line in captured.get().splitlines():
            click.echo(line.rstrip())
