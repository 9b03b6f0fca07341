"""The "invariants" and "target" rules mapped onto the speculators layout (speculators_layout.py).

Same rules as invariants.py, on the fields this layout keeps them in: layer_types against
num_hidden_layers and the window inside ``transformer_layer_config``; the taps as hidden-state
indices in ``aux_hidden_state_layer_ids``; ``mask_token_id`` inside the target's vocabulary;
N = ``proposal_methods[0].speculative_tokens`` within ``block_size - 1`` (``block_size`` when
``sample_from_anchor``). Plus what only this layout can get wrong: a top-level ``model_type``
that makes vLLM skip its speculators conversion, an algorithm that disagrees with
``speculators_model_type``, and a ``sliding_window_non_causal`` left to vLLM's default.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from dflash_provision.validation import speculators_layout as layout
from dflash_provision.validation.findings import Finding

_TLC = layout.LAYER_CONFIG
_SLIDING = "sliding_attention"
_LAYER_TYPES = ("sliding_attention", "full_attention")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _show(value: Any) -> str:
    return json.dumps(value)


def _err(path: str, message: str, severity: str = "error") -> Finding:
    return Finding("invariants", path, message, severity)  # type: ignore[arg-type]


def check_invariants(doc: dict[str, Any], num_speculative_tokens: int | None) -> list[Finding]:
    """All invariants of a lone speculators-layout drafter config."""
    findings = _check_kind(doc)
    findings += _check_layer_types(layout.layer_config(doc))
    findings += _check_window(layout.layer_config(doc))
    findings += _check_aux_ids(doc)
    findings += _check_vocab(doc)
    findings += _check_tokens(doc, num_speculative_tokens)
    findings += _check_causality(doc)
    return findings


def _check_kind(doc: dict[str, Any]) -> list[Finding]:
    findings = []
    model_type = doc.get("model_type")
    if model_type is not None and model_type != "speculators":
        findings.append(
            _err(
                "model_type",
                f"model_type is {_show(model_type)} at the top level: vLLM then loads the file "
                "as that model type and skips its speculators conversion (no aux ids, no mask "
                f"token): delete it (the drafter's type belongs in {_TLC}.model_type)",
            )
        )
    kind = doc.get("speculators_model_type")
    algorithm = layout.speculators_config(doc).get("algorithm")
    if isinstance(kind, str) and isinstance(algorithm, str) and kind != algorithm:
        findings.append(
            _err(
                "speculators_config.algorithm",
                f"speculators_config.algorithm is {_show(algorithm)} but speculators_model_type "
                f"is {_show(kind)}; vLLM serves by speculators_model_type: make them agree",
            )
        )
    return findings


def _check_layer_types(tlc: dict[str, Any]) -> list[Finding]:
    layer_types = tlc.get("layer_types")
    if not isinstance(layer_types, list):
        return []
    findings = []
    count = _int(tlc.get("num_hidden_layers"))
    if count is not None and len(layer_types) != count:
        findings.append(
            _err(
                f"{_TLC}.layer_types",
                f"{_TLC}.layer_types has {len(layer_types)} entries but {_TLC}.num_hidden_layers "
                f"is {count}; give exactly one type per layer",
            )
        )
    for i, kind in enumerate(layer_types):
        if kind not in _LAYER_TYPES:
            findings.append(
                _err(
                    f"{_TLC}.layer_types[{i}]",
                    f"{_TLC}.layer_types[{i}]: {_show(kind)} is not one of "
                    + ", ".join(_LAYER_TYPES),
                )
            )
    return findings


def _check_window(tlc: dict[str, Any]) -> list[Finding]:
    """vLLM's conversion keeps transformer_layer_config's fields as they are (no Qwen3Config
    rewrite), so a sliding layer needs the window itself; use_sliding_window false only matters
    to loaders that build a Qwen3Config from it (the speculators library): a warning."""
    layer_types = tlc.get("layer_types")
    if not isinstance(layer_types, list) or _SLIDING not in layer_types:
        return []
    sliding = [i for i, kind in enumerate(layer_types) if kind == _SLIDING]
    where = f"{_TLC}.layer_types has sliding_attention at {sliding}"
    findings = []
    size = _int(tlc.get("sliding_window"))
    if size is None or size <= 0:
        shown = _show(tlc["sliding_window"]) if "sliding_window" in tlc else "absent"
        findings.append(
            _err(
                f"{_TLC}.sliding_window",
                f"{_TLC}.sliding_window is {shown} but {where}; vLLM refuses a sliding layer "
                "without a window: set it to the trained window (e.g. 2048)",
            )
        )
    if tlc.get("use_sliding_window") is False:
        findings.append(
            _err(
                f"{_TLC}.use_sliding_window",
                f"{_TLC}.use_sliding_window is false but {where}; a Qwen3Config built from it "
                "(the speculators library) drops the window: set use_sliding_window: true",
                "warning",
            )
        )
    return findings


def _check_aux_ids(doc: dict[str, Any]) -> list[Finding]:
    path = "aux_hidden_state_layer_ids"
    ids = doc.get(path)
    if not isinstance(ids, list) or not ids or not all(_int(i) is not None for i in ids):
        return []  # absent, empty or wrongly typed: the schema layer says so
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        return [_err(path, f"{path} {_show(ids)} repeats {dupes}; ids must be unique")]
    findings = []
    if any(b <= a for a, b in itertools.pairwise(ids)):
        findings.append(_err(path, f"{path} {_show(ids)} is not strictly increasing; sort them"))
    for i, value in enumerate(ids):
        if value < 1:
            findings.append(
                _err(
                    f"{path}[{i}]",
                    f"{path}[{i}] is {value}: aux ids are hidden-state indices (0 is the "
                    "embedding output; vLLM reads target layer id - 1 = -1); need >= 1",
                )
            )
    return findings


def _check_vocab(doc: dict[str, Any]) -> list[Finding]:
    """The mask token is embedded with the target's embedding: it must be inside the full
    vocabulary (transformer_layer_config.vocab_size), not the draft vocabulary, which only
    bounds the drafter's own lm_head and may be smaller."""
    findings = []
    vocab = _int(layout.layer_config(doc).get("vocab_size"))
    mask = _int(doc.get("mask_token_id"))
    if mask is not None and vocab is not None and mask >= vocab:
        findings.append(
            _err(
                "mask_token_id",
                f"mask_token_id is {mask}; need 0 <= mask_token_id < {_TLC}.vocab_size ({vocab})",
            )
        )
    draft = _int(doc.get("draft_vocab_size"))
    if draft is not None and vocab is not None and draft > vocab:
        findings.append(
            _err(
                "draft_vocab_size",
                f"draft_vocab_size {draft} exceeds {_TLC}.vocab_size {vocab}; the draft "
                "vocabulary is a subset of the target's",
            )
        )
    return findings


def _check_tokens(doc: dict[str, Any], num_speculative_tokens: int | None) -> list[Finding]:
    size = _int(doc.get("block_size"))
    if size is None:
        return []
    anchor = doc.get("sample_from_anchor") is True
    limit, bound = (size, "block_size") if anchor else (size - 1, "block_size - 1")
    findings = []
    n = layout.speculative_tokens(doc)
    if n is not None and n > limit:
        findings.append(
            _err(
                layout.SPEC_TOKENS_PATH,
                f"{layout.SPEC_TOKENS_PATH} is {n} but {bound} = {limit}"
                + (" (sample_from_anchor)" if anchor else "")
                + f"; vLLM serves N = {n} and every draft past the block is rejected: use "
                f"at most {limit}",
            )
        )
    if num_speculative_tokens is not None and num_speculative_tokens > limit:
        findings.append(
            _err(
                "block_size",
                f"num_speculative_tokens {num_speculative_tokens} exceeds {bound} = {limit}; "
                f"acceptance drops to 0%: use at most {limit}",
            )
        )
    return findings


def _check_causality(doc: dict[str, Any]) -> list[Finding]:
    if doc.get("sliding_window_non_causal") is False:
        layer_types = layout.layer_config(doc).get("layer_types")
        full = [i for i, kind in enumerate(layer_types or []) if kind == "full_attention"]
        if isinstance(layer_types, list) and full:
            # vLLM 0.32 turns the flag into dflash_config.causal, which its DFlash model applies
            # to every layer (seen in its probe: a full_attention layer resolved causal).
            return [
                _err(
                    "sliding_window_non_causal",
                    f"sliding_window_non_causal is false and {_TLC}.layer_types has "
                    f"full_attention at {full}: vLLM runs every layer causal then (its "
                    "dflash_config.causal covers all layers), while the speculators library "
                    "trains full-attention layers bidirectional; expect lower acceptance",
                    "warning",
                )
            ]
        return []
    if "sliding_window_non_causal" in doc:
        return []
    trained = "true (non-causal)" if layout.is_dflash2(doc) else "false (causal)"
    return [
        _err(
            "sliding_window_non_causal",
            "sliding_window_non_causal is absent: vLLM then runs the drafter non-causal while "
            f"the speculators library trains {doc.get('speculators_model_type')} drafters with "
            f"{trained} by default: write the value it was trained with",
        )
    ]


def check_target(doc: dict[str, Any], target: dict[str, Any], target_field: Any) -> list[Finding]:
    """The "target" layer for this layout: sizes, taps inside the target, the verifier."""
    findings = []

    def mismatch(path: str, message: str, severity: str = "error") -> None:
        findings.append(Finding("target", path, message, severity))  # type: ignore[arg-type]

    tlc = layout.layer_config(doc)
    hidden_path = "target_hidden_size" if doc.get("target_hidden_size") else f"{_TLC}.hidden_size"
    hidden = doc.get("target_hidden_size") or tlc.get("hidden_size")
    for path, mine, name in (
        (hidden_path, hidden, "hidden_size"),
        (f"{_TLC}.vocab_size", tlc.get("vocab_size"), "vocab_size"),
    ):
        theirs = target_field(target, name)
        if theirs is not None and mine != theirs:
            mismatch(path, f"{path}: drafter {_show(mine)}, target {_show(theirs)}; must be equal")
    layers = _int(target_field(target, "num_hidden_layers"))
    if layers is None:
        mismatch("", "target config has no integer num_hidden_layers; cannot check layer ids")
        return findings
    for i, value in enumerate(layout.aux_ids(doc) or []):
        if value > layers:
            mismatch(
                f"aux_hidden_state_layer_ids[{i}]",
                f"aux_hidden_state_layer_ids[{i}] is {value} but the target has {layers} layers "
                f"(hidden states 0..{layers})",
            )
    verifier = layout.speculators_config(doc).get("verifier")
    archs = verifier.get("architectures") if isinstance(verifier, dict) else None
    theirs = target.get("architectures")
    if isinstance(archs, list) and archs and isinstance(theirs, list) and archs != theirs:
        mismatch(
            "speculators_config.verifier.architectures",
            f"speculators_config.verifier.architectures {_show(archs)}, target architectures "
            f"{_show(theirs)}: the drafter was trained for another verifier",
            "warning",
        )
    return findings
