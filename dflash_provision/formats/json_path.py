"""The one way a place in a JSON document is written, ``a.b[2].c``: findings, changes and the
strict parser's errors all name places so."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def json_path(parts: Iterable[str | int]) -> str:
    """Render a path as ``a.b[2].c``, the form every finding and change uses.

    Keys that would read ambiguously (dots, spaces, empty) are written as ``["a.b"]``.
    """
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out
