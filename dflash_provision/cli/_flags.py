"""Flag spellings that changed: the old one keeps working and says what to type instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def deprecated_spelling(old: str, new: str, why: str = "") -> Callable[..., Any]:
    """A click callback for a hidden option with an old spelling: passes the value through and
    prints one warning line on stderr naming the new spelling (and why it changed)."""

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value not in (None, (), False):
            reason = f" ({why})" if why else ""
            click.echo(f"warning: {old} is deprecated; use {new}{reason}", err=True)
        return value

    return warn
