"""``--batches 1,25%,100%``: cumulative batch ends, as Ansible's ``serial`` list (a count or a
share of the hosts); the hosts beyond the last end form one more batch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from dflash_provision.errors import UsageError

_T = TypeVar("_T")


def parse_batches(text: str) -> list[str]:
    """The batch ends as written; UsageError for an empty list or a bad entry."""
    parts = [part.strip() for part in text.split(",")]
    if not parts or any(not part for part in parts):
        raise UsageError(f"--batches {text!r}: give a list such as 1,25%,100%")
    for part in parts:
        _end(part, 100)  # validates
    return parts


def _end(part: str, total: int) -> int:
    try:
        if part.endswith("%"):
            share = float(part[:-1])
            if not 0 < share <= 100:
                raise ValueError
            return max(1, math.ceil(total * share / 100))
        count = int(part)
        if count < 1:
            raise ValueError
        return count
    except ValueError:
        raise UsageError(
            f"--batches: {part!r} is neither a host count >= 1 nor a share such as 25%"
        ) from None


def split(items: Sequence[_T], spec: Sequence[str]) -> list[list[_T]]:
    """``items`` cut into batches at the cumulative ends ``spec`` names (empty batches dropped)."""
    batches: list[list[_T]] = []
    start = 0
    for part in spec:
        end = min(len(items), max(start, _end(part, len(items))))
        if end > start:
            batches.append(list(items[start:end]))
            start = end
    if start < len(items):
        batches.append(list(items[start:]))
    return batches
