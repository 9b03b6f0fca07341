"""json.loads for text that may be hostile: bounded nesting, only finite numbers of sane size.

Python's json accepts things no config should hold and that break later readers:

- nesting deeper than the interpreter's recursion limit raises RecursionError (a traceback, no
  position), and nesting a little below it still overflows every recursive walker after it
  (schema, diff, transformers). A cheap non-recursive pre-scan refuses deep documents first and
  names the line and column where they become too deep.
- ``1e999999`` silently becomes ``inf`` (which json.dumps then writes as ``Infinity``, not
  JSON), and ``NaN``/``Infinity`` are accepted as literals.
- integers have no size limit below Python's 4300-digit conversion guard (``2**4000`` parses,
  and passes a schema's ``"type": "integer"``).

Every refusal is a ``StrictJsonError`` (a ValueError) with a one-line message and, where it has
one, the JSON path of the value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflash_provision.formats.json_path import json_path

# Published DFlash configs nest 2 levels deep; 64 leaves room for any real config and stays far
# below the recursion limit of every walker that runs after parsing.
MAX_NESTING = 64
# Integers a config can mean fit in 64 bits (token ids, sizes, layer counts).
MAX_INT = 2**63 - 1

# Strings (closed or not: an unterminated one runs to the end) and the brackets outside them.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


class StrictJsonError(ValueError):
    """The text is not JSON a config may hold; ``path`` locates the value when known."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path


@dataclass(frozen=True)
class _BadNumber:
    """Left in the tree by the number hooks, so the walk afterwards can name its path."""

    text: str
    why: str


def loads(
    text: str, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """Parse ``text`` like json.loads, refusing deep nesting, non-finite and oversized numbers.

    Raises json.JSONDecodeError for syntax errors and too deep nesting (both with line and
    column), StrictJsonError for a bad number or a ``NaN``/``Infinity`` literal.
    """
    _check_nesting(text)
    doc = json.loads(
        text,
        object_pairs_hook=object_pairs_hook,
        parse_float=_parse_float,
        parse_int=_parse_int,
        parse_constant=_reject_constant,
    )
    _raise_for_bad_numbers(doc)
    return doc


def _check_nesting(text: str) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise json.JSONDecodeError(
                    f"nested more than {MAX_NESTING} levels deep", text, match.start()
                )
        elif char in "]}":
            depth -= 1


def _parse_float(literal: str) -> float | _BadNumber:
    value = float(literal)
    if math.isfinite(value):
        return value
    return _BadNumber(literal, "overflows to infinity")


def _parse_int(literal: str) -> int | _BadNumber:
    # Compare lengths before converting: int() of a 5000-digit literal raises, and of a
    # 4000-digit one costs time for nothing.
    digits = literal.lstrip("-")
    if len(digits) > len(str(MAX_INT)) or abs(int(literal)) > MAX_INT:
        shown = literal if len(literal) <= 24 else f"{literal[:12]}… ({len(digits)} digits)"
        return _BadNumber(shown, "is beyond any realistic value (limit: a 64-bit integer)")
    return int(literal)


def _reject_constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not valid JSON (JavaScript-only constant)")


def _raise_for_bad_numbers(doc: Any) -> None:
    found: list[tuple[list[str | int], _BadNumber]] = []
    # Iterative on purpose (the depth is bounded already, but the walk needs no stack either).
    pending: list[tuple[Any, list[str | int]]] = [(doc, [])]
    while pending:
        value, parts = pending.pop()
        if isinstance(value, _BadNumber):
            found.append((parts, value))
        elif isinstance(value, dict):
            pending.extend((child, [*parts, key]) for key, child in value.items())
        elif isinstance(value, list):
            pending.extend((child, [*parts, i]) for i, child in enumerate(value))
    if not found:
        return
    found.sort(key=lambda item: json_path(item[0]))
    parts, bad = found[0]
    path = json_path(parts)
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    where = f"{path}: " if path else ""
    raise StrictJsonError(f"{where}number {bad.text} {bad.why}{more}", path=path)
