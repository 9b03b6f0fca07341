"""Canonical JSON and a semantic diff of two configs.

Drift is a difference in *meaning*: key order, whitespace and float spelling (1e-06 vs 0.000001)
are not drift; a value, a type (2048 vs 2048.0), an added or removed key, or a list element at a
given position (layer_types and layer ids are ordered) is.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Literal

from dflash_provision.findings import json_path

ChangeKind = Literal["changed", "added", "removed", "type_changed"]

_MAX_VALUE = 300

# deepdiff report name -> our kind
_KINDS: dict[str, ChangeKind] = {
    "values_changed": "changed",
    "type_changes": "type_changed",
    "dictionary_item_added": "added",
    "iterable_item_added": "added",
    "dictionary_item_removed": "removed",
    "iterable_item_removed": "removed",
}


def canonical_bytes(obj: Any) -> bytes:
    """The one byte form pushes write: sorted keys, 2-space indent, UTF-8, trailing newline."""
    text = json.dumps(
        obj, sort_keys=True, indent=2, separators=(",", ": "), ensure_ascii=False, allow_nan=False
    )
    return (text + "\n").encode("utf-8")


@dataclass(frozen=True)
class Change:
    """One semantic difference. ``old`` is None for "added", ``new`` is None for "removed"."""

    path: str  # "dflash_config.target_layer_ids[1]"; "" for the whole document
    kind: ChangeKind
    old: Any = None
    new: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "old": self.old, "new": self.new}


# deepdiff's literal_eval path trips CPython 3.11's thread-unsafe AST constructor
# (gh-106905: "AST constructor recursion depth mismatch") when fleet workers diff at once.
_DEEPDIFF_LOCK = threading.Lock()


def semantic_diff(old: object, new: object) -> list[Change]:
    """Every difference between two parsed configs, lists compared position by position."""
    from deepdiff import DeepDiff  # deferred: deepdiff pulls in numpy-sized import time

    with _DEEPDIFF_LOCK:
        tree = DeepDiff(
            old,
            new,
            view="tree",
            # Position matters (layer_types, target_layer_ids): pair elements by index instead
            # of letting difflib find "moves", and always descend into dicts.
            zip_ordered_iterables=True,
            threshold_to_diff_deeper=0,
            ignore_order=False,
        )
    keyed: list[tuple[tuple[tuple[int, str, int], ...], Change]] = []
    for report, levels in tree.items():
        kind = _KINDS.get(report)
        if kind is None:
            raise ValueError(f"unexpected deepdiff report {report!r}")  # e.g. set items: not JSON
        for level in levels:
            parts = level.path(output_format="list")
            old_value = None if kind == "added" else level.t1
            new_value = None if kind == "removed" else level.t2
            if kind == "type_changed" and (old_value is None or new_value is None):
                kind_here: ChangeKind = "changed"  # null <-> value is a plain change of value
            else:
                kind_here = kind
            change = Change(json_path(parts), kind_here, old_value, new_value)
            keyed.append((_sort_key(parts), change))
    return [change for _, change in sorted(keyed, key=lambda pair: pair[0])]


def _sort_key(parts: list[str | int]) -> tuple[tuple[int, str, int], ...]:
    # Keys alphabetically, list indexes numerically ("[10]" after "[9]").
    return tuple((1, "", p) if isinstance(p, int) else (0, p, 0) for p in parts)


def render_value(value: Any) -> str:
    """A value as JSON on one line (null, true, 2048.0), shortened when very long."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 1] + "…"


def render_change(change: Change) -> str:
    label = change.path or "(document)"
    if change.kind == "added":
        return f"+ {label}: {render_value(change.new)}"
    if change.kind == "removed":
        return f"- {label}: {render_value(change.old)}"
    line = f"{label}: {render_value(change.old)} → {render_value(change.new)}"
    if change.kind == "type_changed":
        line += f" ({_type_name(change.old)} → {_type_name(change.new)})"
    return line


def render_changes(changes: list[Change]) -> list[str]:
    """One human line per change: ``path: old → new``, ``+ path: value``, ``- path: value``."""
    return [render_change(change) for change in changes]


def _type_name(value: Any) -> str:
    names = {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
