"""Print rich renderables (tables, summary lines) to stdout, terminal or pipe alike."""

from __future__ import annotations

import sys
from typing import Any

import click

# Piped output is wide enough that rows do not wrap mid-word; trailing padding is cut so that
# `grep`, `diff` and logs see clean lines.
_PIPE_WIDTH = 200


def echo_rich(*renderables: Any) -> None:
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console(soft_wrap=False)
        for renderable in renderables:
            console.print(renderable, highlight=False)
        return
    console = Console(width=_PIPE_WIDTH, soft_wrap=False, no_color=True, highlight=False)
    with console.capture() as captured:
        for renderable in renderables:
            console.print(renderable)
    for line in captured.get().splitlines():
        click.echo(line.rstrip())
