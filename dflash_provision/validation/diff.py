"""Canonical JSON and a semantic diff of two configs (and of two config files' bytes: ConfigDiff).

Drift is a difference in *meaning*: key order, whitespace and float spelling (1e-06 vs 0.000001)
are not drift; a value, a type (2048 vs 2048.0), an added or removed key, or a list element at a
given position (layer_types and layer ids are ordered) is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from dflash_provision.formats import strict_json
from dflash_provision.formats.json_path import json_path
from dflash_provision.validation.speculators_layout import file_field, is_speculators, runtime_view

ChangeKind = Literal["changed", "added", "removed", "type_changed"]

_MAX_VALUE = 300


@dataclass(frozen=True)
class Change:
    """One semantic difference. ``old`` is None for "added", ``new`` is None for "removed"."""

    path: str  # "dflash_config.target_layer_ids[1]"; "" for the whole document
    kind: ChangeKind
    old: Any = None
    new: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "old": self.old, "new": self.new}


def semantic_diff(old: object, new: object) -> list[Change]:
    """Every difference between two parsed configs, lists compared position by position.

    A walk over the two JSON trees (dicts by key, lists by index), sorted by path. Types are
    compared exactly: 2048 vs 2048.0 and 1 vs true are type changes; null vs a value is a change
    of value. Written out rather than delegated to a general diff library: it runs once per host
    in fleet commands, where a general library cost ~1 ms per config.
    """
    found: list[tuple[tuple[tuple[int, str, int], ...], Change]] = []
    _walk(old, new, [], found)
    return [change for _, change in sorted(found, key=lambda pair: pair[0])]


def _walk(
    old: object,
    new: object,
    parts: list[str | int],
    found: list[tuple[tuple[tuple[int, str, int], ...], Change]],
) -> None:
    def report(kind: ChangeKind, at: list[str | int], before: object, after: object) -> None:
        found.append((_sort_key(at), Change(json_path(at), kind, before, after)))

    if type(old) is not type(new):
        kind: ChangeKind = "changed" if old is None or new is None else "type_changed"
        report(kind, parts, old, new)
    elif isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() - new.keys():
            report("removed", [*parts, key], old[key], None)
        for key in new.keys() - old.keys():
            report("added", [*parts, key], None, new[key])
        for key in old.keys() & new.keys():
            _walk(old[key], new[key], [*parts, key], found)
    elif isinstance(old, list) and isinstance(new, list):
        for index, (before, after) in enumerate(zip(old, new, strict=False)):
            _walk(before, after, [*parts, index], found)
        for index in range(len(new), len(old)):
            report("removed", [*parts, index], old[index], None)
        for index in range(len(old), len(new)):
            report("added", [*parts, index], None, new[index])
    elif old != new and not (_is_nan(old) and _is_nan(new)):
        report("changed", parts, old, new)


def _is_nan(value: object) -> bool:
    # json.loads accepts NaN; it never equals itself, but two NaNs are no drift.
    return isinstance(value, float) and math.isnan(value)


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


# Fields that decide what a runtime does with a drafter, in the reference layout's names.
_MEANINGFUL = (
    "architectures",
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "layer_types",
    "sliding_window",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "rms_norm_eps",
)


def layouts_of(old: object, new: object) -> tuple[str, str]:
    """("reference" | "speculators", ...) for each side (a non-object counts as reference)."""

    def kind(doc: object) -> str:
        return "speculators" if isinstance(doc, dict) and is_speculators(doc) else "reference"

    return kind(old), kind(new)


def cross_layout_diff(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Two configs in different published layouts compared by what vLLM reads from them: the
    transformer fields, the taps (as vLLM's target_layer_ids), the mask token and block_size,
    each path named as the NEW side's file keeps it. A field by field diff of two layouts would
    only say that every key moved."""
    # The taps in B's convention: hidden-state indices (aux ids) for the speculators layout.
    as_aux = is_speculators(new)

    def meaning(doc: dict[str, Any]) -> dict[str, Any]:
        view = runtime_view(doc)
        picked = {name: view[name] for name in _MEANINGFUL if name in view}
        inner = view.get("dflash_config")
        inner = inner if isinstance(inner, dict) else {}
        if "mask_token_id" in inner:
            picked["dflash_config"] = {"mask_token_id": inner["mask_token_id"]}
        ids = inner.get("target_layer_ids")
        if isinstance(ids, list) and as_aux:
            ints = all(isinstance(i, int) for i in ids)
            picked["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids] if ints else ids
        elif ids is not None:
            picked.setdefault("dflash_config", {})["target_layer_ids"] = ids
        size = inner.get("block_size", view.get("block_size"))
        if size is not None:
            picked["block_size"] = size
        return picked

    return [
        Change(file_field(new, c.path) if c.path else c.path, c.kind, c.old, c.new)
        for c in semantic_diff(meaning(old), meaning(new))
    ]


@dataclass(frozen=True)
class ConfigDiff:
    """What changes from ``old`` to ``new`` bytes, in meaning (JSON) and in bytes."""

    changes: list[Change]
    lines: list[str]  # human lines, e.g. "dflash_config.mask_token_id: 248064 → 248070"
    bytes_equal: bool
    note: str = ""  # e.g. "new file", "old file is not valid JSON", "formatting only"

    @property
    def formatting_only(self) -> bool:
        return not self.bytes_equal and not self.changes and not self.note


def config_diff(old: bytes | None, new: bytes) -> ConfigDiff:
    """Semantic diff of two config byte strings (``old`` None: there is no old file)."""
    if old is None:
        return ConfigDiff([], ["(new file)"], bytes_equal=False, note="new file")
    if old == new:
        return ConfigDiff([], [], bytes_equal=True)
    old_obj, old_error = _parse_json(old)
    new_obj, new_error = _parse_json(new)
    if old_error or new_error:
        which = "current file" if old_error else "new config"
        note = f"{which} is not valid JSON ({old_error or new_error})"
        return ConfigDiff([], [f"({note})"], bytes_equal=False, note=note)
    changes = semantic_diff(old_obj, new_obj)
    lines = render_changes(changes) or ["(same JSON content; only formatting or key order differ)"]
    return ConfigDiff(changes, lines, bytes_equal=False)


def _parse_json(data: bytes) -> tuple[Any, str | None]:
    # The current file is the host's: strict parsing, so deep nesting or a 1e999999 is "not
    # valid JSON" here too, never a RecursionError or an Infinity in the diff.
    try:
        return strict_json.loads(data.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as exc:
        return None, str(exc).splitlines()[0]
