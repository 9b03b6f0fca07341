"""The second published drafter layout: DFlash drafters trained (or converted) with the
``speculators`` library, and the one place that knows how runtimes read it.

Layout (``DFlashSpeculatorConfig``): the drafter's own transformer settings live in
``transformer_layer_config``; the top level carries ``speculators_model_type`` ("dflash" or
"dflash2"), ``aux_hidden_state_layer_ids``, ``mask_token_id``, ``block_size``,
``draft_vocab_size``, ``sliding_window_non_causal``, ``sample_from_anchor``, and
``speculators_config {algorithm, proposal_methods: [{speculative_tokens}], verifier}``.

How vLLM reads it (0.32, ``transformers_utils/configs/speculators``), mirrored by
:func:`runtime_view`: a config with a non-null ``speculators_config`` and no ``model_type`` is
loaded as vLLM's own ``SpeculatorsConfig``, which starts from ``transformer_layer_config`` and adds
``eagle_aux_hidden_state_layer_ids`` = the aux ids as given (hidden-state indices: 0 is the
embedding output) and ``dflash_config {mask_token_id, target_layer_ids = aux - 1,
sample_from_anchor, causal = not sliding_window_non_causal (absent: non-causal)}``; any
``dflash_config`` inside ``transformer_layer_config`` is replaced. ``vllm serve <drafter dir>``
takes method and N from ``speculators_model_type`` and ``proposal_methods[0].speculative_tokens``
(a ``--speculative-config`` may override N, never the method or the drafter) and serves
``speculators_config.verifier.name_or_path`` as the target.
"""

from __future__ import annotations

from typing import Any

LAYER_CONFIG = "transformer_layer_config"
SPEC_TOKENS_PATH = "speculators_config.proposal_methods[0].speculative_tokens"
METHODS = {"dflash": "dflash", "dflash2": "dflash"}  # speculators type -> vLLM method


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_speculators(doc: dict[str, Any]) -> bool:
    """vLLM's own test: a ``speculators_config`` that is not null."""
    return doc.get("speculators_config") is not None


def layer_config(doc: dict[str, Any]) -> dict[str, Any]:
    value = doc.get(LAYER_CONFIG)
    return value if isinstance(value, dict) else {}


def speculators_config(doc: dict[str, Any]) -> dict[str, Any]:
    value = doc.get("speculators_config")
    return value if isinstance(value, dict) else {}


def aux_ids(doc: dict[str, Any]) -> list[int] | None:
    ids = doc.get("aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids and all(_int(i) is not None for i in ids):
        return list(ids)
    return None


def speculative_tokens(doc: dict[str, Any]) -> int | None:
    """N as vLLM takes it: the first proposal method's ``speculative_tokens``."""
    methods = speculators_config(doc).get("proposal_methods")
    if isinstance(methods, list) and methods and isinstance(methods[0], dict):
        return _int(methods[0].get("speculative_tokens"))
    return None


def method(doc: dict[str, Any]) -> str | None:
    """The vLLM method this drafter is served with ("dflash" for dflash and dflash2)."""
    kind = doc.get("speculators_model_type")
    return METHODS.get(kind) if isinstance(kind, str) else None


def verifier(doc: dict[str, Any]) -> str | None:
    value = speculators_config(doc).get("verifier")
    path = value.get("name_or_path") if isinstance(value, dict) else None
    return path if isinstance(path, str) else None


def is_dflash2(doc: dict[str, Any]) -> bool:
    return doc.get("speculators_model_type") == "dflash2"


def runtime_view(doc: dict[str, Any], *, keep_block_size: bool = True) -> dict[str, Any]:
    """The drafter in the reference layout, as vLLM's speculators conversion builds it.

    A config in the reference layout is returned as it is. ``block_size`` is kept at the top
    level unless ``keep_block_size`` is false (vLLM's conversion drops it: it does not read it
    for DFlash; the checks of N against it do).
    """
    if not is_speculators(doc):
        return doc
    view = dict(layer_config(doc))
    view["architectures"] = ["DFlash2DraftModel" if is_dflash2(doc) else "DFlashDraftModel"]
    view["draft_vocab_size"] = doc.get("draft_vocab_size")
    if doc.get("target_hidden_size") is not None:
        view["target_hidden_size"] = doc["target_hidden_size"]
    ids = aux_ids(doc)
    if ids is not None:
        view["eagle_aux_hidden_state_layer_ids"] = ids
        view["dflash_config"] = {
            "mask_token_id": doc.get("mask_token_id"),
            "target_layer_ids": [i - 1 for i in ids],
            "sample_from_anchor": doc.get("sample_from_anchor", False),
            "causal": not doc.get("sliding_window_non_causal", True),
        }
    if "block_size" in doc and keep_block_size:
        view["block_size"] = doc["block_size"]
    return view


# The reference layout's field -> where the speculators layout keeps it, so a line about the
# runtime view names the field a user edits.
_TOP_LEVEL = {
    "eagle_aux_hidden_state_layer_ids": "aux_hidden_state_layer_ids",
    "dflash_config.target_layer_ids": "aux_hidden_state_layer_ids (- 1)",
    "dflash_config.mask_token_id": "mask_token_id",
    "dflash_config.causal": "sliding_window_non_causal (negated)",
    "dflash_config.sample_from_anchor": "sample_from_anchor",
    "draft_vocab_size": "draft_vocab_size",
    "block_size": "block_size",
    "architectures": "speculators_model_type",
}


def file_field(doc: dict[str, Any], view_path: str) -> str:
    """Where the field ``view_path`` of :func:`runtime_view` sits in the file itself."""
    if not is_speculators(doc):
        return view_path
    head = view_path.split("[", 1)[0]
    for name, where in _TOP_LEVEL.items():
        if head == name or head.startswith(name + "."):
            suffix = view_path[len(name) :]
            return where if "(" in where else where + suffix
    return f"{LAYER_CONFIG}.{view_path}"


# -- default tap spacing of the reference implementation ----------------------------------------


def default_target_layer_ids(num_target_layers: int, taps: int) -> list[int]:
    """z-lab/dflash's default ids for ``taps`` taps into a target of ``num_target_layers`` layers:
    evenly spaced from 1 to N - 3, rounded with Python's round() (half to even), as it does;
    one tap: the middle layer."""
    if taps <= 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + (i * span) / (taps - 1)) for i in range(taps)]


def tap_spacing_hint(doc: dict[str, Any], num_target_layers: int) -> tuple[str, str] | None:
    """(path, message) when a DFlash drafter's taps differ from the reference default spacing.

    DFlash2 drafters (either layout) choose other taps by design: never a hint for them. For the
    speculators layout the aux ids are hidden-state indices (reference id + 1, as vLLM's
    conversion and the speculators converter both have it), so the expected aux ids are the
    default ids + 1.
    """
    view = runtime_view(doc)
    archs = view.get("architectures")
    if not isinstance(archs, list) or "DFlashDraftModel" not in archs:
        return None
    inner = view.get("dflash_config")
    ids = inner.get("target_layer_ids") if isinstance(inner, dict) else None
    if not isinstance(ids, list) or not ids or not all(_int(i) is not None for i in ids):
        return None
    expected = default_target_layer_ids(num_target_layers, len(ids))
    if ids == expected or len(set(expected)) != len(expected):
        return None  # matching, or a target too small for the spacing to mean anything
    where = f"{num_target_layers} target layers, {len(ids)} taps"
    if is_speculators(doc):
        want = [i + 1 for i in expected]
        return (
            "aux_hidden_state_layer_ids",
            f"aux_hidden_state_layer_ids {aux_ids(doc)} differ from the reference default spacing "
            f"for {where}: expected {want} (the default target layer ids {expected} + 1; vLLM "
            "reads aux ids as hidden-state indices); fine only if the drafter was trained with "
            "these taps",
        )
    return (
        "dflash_config.target_layer_ids",
        f"dflash_config.target_layer_ids {ids} differ from the reference default spacing for "
        f"{where}: expected {expected}; fine only if the drafter was trained with these taps",
    )
