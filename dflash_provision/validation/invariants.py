"""The "invariants" and "target" layers: DFlash rules a schema cannot express.

Rules (see dflash-facts.md §Invariants): layer_types matches num_hidden_layers; sliding layers need
a window and use_sliding_window; target_layer_ids are sane and inside the target; mask_token_id is
inside the vocabulary; block_size exists and bounds the speculative token count; DFlash2 is
explicitly non-causal. Every check tolerates wrongly typed fields (the schema layer reports those)
so that one bad field never hides the others.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from dflash_provision.validation import speculators_checks, speculators_layout
from dflash_provision.validation.findings import Finding
from dflash_provision.validation.speculators_layout import tap_spacing_hint

LAYER_TYPE_VALUES = ("sliding_attention", "full_attention")


def _int(value: Any) -> int | None:
    """``value`` if it is a real int (not bool, not float), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _show(value: Any) -> str:
    return json.dumps(value)


def _dflash(doc: dict[str, Any]) -> dict[str, Any]:
    cfg = doc.get("dflash_config")
    return cfg if isinstance(cfg, dict) else {}


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(_int(v) is not None for v in value):
        return list(value)
    return None


def block_size_of(doc: dict[str, Any]) -> tuple[int | None, str]:
    """block_size as runtimes read it: ``dflash_config.block_size`` first, then top level."""
    inner = _dflash(doc).get("block_size")
    if inner is not None:
        return _int(inner), "dflash_config.block_size"
    return _int(doc.get("block_size")), "block_size"


def check_invariants(
    doc: dict[str, Any], *, num_speculative_tokens: int | None = None
) -> list[Finding]:
    """All invariants that apply to a lone drafter config (either published layout)."""
    if speculators_layout.is_speculators(doc):
        return speculators_checks.check_invariants(doc, num_speculative_tokens)
    findings: list[Finding] = []
    findings += _check_layer_types(doc)
    findings += _check_sliding(doc)
    findings += _check_target_layer_ids(doc)
    findings += _check_mask_token(doc)
    findings += _check_block_size(doc, num_speculative_tokens)
    findings += _check_causality(doc)
    return findings


def _err(path: str, message: str, severity: str = "error") -> Finding:
    return Finding("invariants", path, message, severity)  # type: ignore[arg-type]


def _check_layer_types(doc: dict[str, Any]) -> list[Finding]:
    layer_types = doc.get("layer_types")
    if not isinstance(layer_types, list):
        return []
    findings = []
    num_layers = _int(doc.get("num_hidden_layers"))
    if num_layers is not None and len(layer_types) != num_layers:
        findings.append(
            _err(
                "layer_types",
                f"layer_types has {len(layer_types)} entries but num_hidden_layers is "
                f"{num_layers}; give exactly one type per layer",
            )
        )
    for i, kind in enumerate(layer_types):
        if kind not in LAYER_TYPE_VALUES:
            findings.append(
                _err(
                    f"layer_types[{i}]",
                    f"layer_types[{i}]: {_show(kind)} is not one of {', '.join(LAYER_TYPE_VALUES)}",
                )
            )
    return findings


def _check_sliding(doc: dict[str, Any]) -> list[Finding]:
    layer_types = doc.get("layer_types")
    if not isinstance(layer_types, list) or "sliding_attention" not in layer_types:
        return []
    sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    where = f"layer_types has sliding_attention at {sliding}"
    findings = []
    window = doc.get("sliding_window")
    size = _int(window)
    if size is None or size <= 0:
        findings.append(
            _err(
                "sliding_window",
                f"sliding_window is {_show(window) if 'sliding_window' in doc else 'absent'} but "
                f"{where}; set sliding_window to the trained window (e.g. 2048)",
            )
        )
    if doc.get("use_sliding_window") is not True:
        value = _show(doc["use_sliding_window"]) if "use_sliding_window" in doc else "absent"
        findings.append(
            _err(
                "use_sliding_window",
                f"use_sliding_window is {value} but {where}; transformers then drops "
                "sliding_window to null: set use_sliding_window: true",
            )
        )
    return findings


def _check_target_layer_ids(doc: dict[str, Any]) -> list[Finding]:
    path = "dflash_config.target_layer_ids"
    ids = _int_list(_dflash(doc).get("target_layer_ids"))
    if ids is None:
        return []  # absent or wrongly typed: the schema layer says so
    if not ids:
        return [_err(path, f"{path} is empty; list the target layers the drafter reads")]
    findings = []
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        findings.append(_err(path, f"{path} {_show(ids)} repeats {dupes}; ids must be unique"))
    elif any(b <= a for a, b in itertools.pairwise(ids)):  # (repeats already said)
        findings.append(_err(path, f"{path} {_show(ids)} is not strictly increasing; sort the ids"))
    num_target = _int(doc.get("num_target_layers"))
    for i, layer in enumerate(ids):
        if layer < 0 or (num_target is not None and layer >= num_target):
            bound = f"0 <= id < num_target_layers ({num_target})" if num_target else "id >= 0"
            findings.append(_err(f"{path}[{i}]", f"{path}[{i}] is {layer}; need {bound}"))
    aux = doc.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        expected = [i + 1 for i in ids]
        if aux != expected:
            findings.append(
                _err(
                    "eagle_aux_hidden_state_layer_ids",
                    f"eagle_aux_hidden_state_layer_ids is {_show(aux)} but must be "
                    f"target_layer_ids + 1 = {_show(expected)} (runtimes capture hidden state "
                    "id + 1; index 0 is the embedding output)",
                )
            )
    return findings


def _check_mask_token(doc: dict[str, Any]) -> list[Finding]:
    path = "dflash_config.mask_token_id"
    mask = _int(_dflash(doc).get("mask_token_id"))
    vocab = _int(doc.get("vocab_size"))
    if mask is None:
        return []
    if mask < 0 or (vocab is not None and mask >= vocab):
        bound = f"0 <= mask_token_id < vocab_size ({vocab})" if vocab else "mask_token_id >= 0"
        return [_err(path, f"{path} is {mask}; need {bound}")]
    return []


def _check_block_size(doc: dict[str, Any], num_speculative_tokens: int | None) -> list[Finding]:
    findings = []
    inner, top = _dflash(doc).get("block_size"), doc.get("block_size")
    if inner is None and top is None:
        return [
            _err(
                "block_size",
                "block_size is absent (neither dflash_config.block_size nor block_size); "
                "set it to the size the drafter was trained with (e.g. 16)",
            )
        ]
    if inner is not None and top is not None and inner != top:
        findings.append(
            _err(
                "block_size",
                f"block_size is {_show(top)} but dflash_config.block_size is {_show(inner)}; "
                "runtimes read dflash_config.block_size: keep one value",
            )
        )
    size, path = block_size_of(doc)
    if size is None:
        return findings  # wrong type: schema layer reports it
    if size < 2:
        findings.append(_err(path, f"{path} is {size}; need >= 2 (block_size - 1 drafts)"))
    if num_speculative_tokens is not None and num_speculative_tokens > size - 1:
        findings.append(
            _err(
                path,
                f"num_speculative_tokens {num_speculative_tokens} exceeds {path} - 1 = "
                f"{size - 1}; acceptance drops to 0%: use at most {size - 1}",
            )
        )
    return findings


def _check_causality(doc: dict[str, Any]) -> list[Finding]:
    archs = doc.get("architectures")
    if isinstance(archs, list) and "DFlash2DraftModel" in archs:
        if doc.get("is_causal") is not False:
            value = _show(doc["is_causal"]) if "is_causal" in doc else "absent"
            return [
                _err(
                    "is_causal",
                    f"is_causal is {value} for DFlash2DraftModel; runtimes then treat sliding "
                    "layers as causal: set is_causal: false",
                )
            ]
        return []
    if "is_causal" in doc and not isinstance(doc["is_causal"], bool):
        return [_err("is_causal", f"is_causal is {_show(doc['is_causal'])}; use true or false")]
    return []


def _target_field(target: dict[str, Any], name: str) -> Any:
    """A target field, looking into ``text_config`` for multimodal targets."""
    if name in target:
        return target[name]
    text = target.get("text_config")
    return text.get(name) if isinstance(text, dict) else None


def check_target(doc: dict[str, Any], target: dict[str, Any]) -> list[Finding]:
    """The "target" layer: the drafter fits the target model it will be attached to, and its
    taps follow the reference default spacing (a warning when not, DFlash only)."""
    findings = _fit_target(doc, target)
    layers = _int(_target_field(target, "num_hidden_layers"))
    # Next to a real mismatch (a drafter for another target) the spacing hint is only noise.
    fits = not any(f.severity == "error" for f in findings)
    hint = tap_spacing_hint(doc, layers) if layers is not None and fits else None
    if hint is not None:
        findings.append(Finding("target", hint[0], hint[1], "warning"))
    return findings


def _fit_target(doc: dict[str, Any], target: dict[str, Any]) -> list[Finding]:
    if speculators_layout.is_speculators(doc):
        return speculators_checks.check_target(doc, target, _target_field)
    findings = []

    def mismatch(path: str, message: str) -> None:
        findings.append(Finding("target", path, message))

    for name in ("hidden_size", "vocab_size"):
        mine, theirs = doc.get(name), _target_field(target, name)
        if theirs is not None and mine != theirs:
            mismatch(name, f"{name}: drafter {_show(mine)}, target {_show(theirs)}; must be equal")
    target_layers = _int(_target_field(target, "num_hidden_layers"))
    if target_layers is None:
        mismatch("", "target config has no integer num_hidden_layers; cannot check layer ids")
        return findings
    if doc.get("num_target_layers") != target_layers:
        mismatch(
            "num_target_layers",
            f"num_target_layers: drafter {_show(doc.get('num_target_layers'))}, target "
            f"num_hidden_layers {target_layers}; set num_target_layers: {target_layers}",
        )
    ids = _int_list(_dflash(doc).get("target_layer_ids")) or []
    for i, layer in enumerate(ids):
        if layer >= target_layers:
            mismatch(
                f"dflash_config.target_layer_ids[{i}]",
                f"dflash_config.target_layer_ids[{i}] is {layer} but the target has only "
                f"{target_layers} layers (ids 0..{target_layers - 1})",
            )
    return findings
