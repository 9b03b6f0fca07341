"""The tensor shapes of a DFlash drafter against its config: one line per config field that
disagrees, naming both values and the first tensor that shows it (weights_check's core).

Tensor names are the canonical ones (``model.`` prefix and vLLM's renames already undone):
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.{input,post_attention}_layernorm``,
``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, optionally ``embed_tokens`` / ``lm_head``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dflash_provision.formats.safetensors_header import TensorInfo

_LAYER = re.compile(r"layers\.(\d{1,6})\.(.+)")
_MAX_LINES = 40  # a hostile index (layers.999999) would otherwise list every gap


@dataclass(frozen=True)
class _Sizes:
    """The config's numbers the shapes depend on (None: absent or not a positive integer)."""

    hidden: int | None
    layers: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    intermediate: int | None
    vocab: int | None
    draft_vocab: int | None
    ids: list[Any] | None


def positive(value: Any) -> int | None:
    """``value`` when it is a positive integer (not a bool), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def sizes_of(doc: dict[str, Any]) -> _Sizes:
    # The speculators layout keeps the transformer's sizes in transformer_layer_config.
    inner = doc.get("transformer_layer_config")
    src = {**doc, **inner} if isinstance(inner, dict) else doc
    dflash = doc.get("dflash_config")
    ids = dflash.get("target_layer_ids") if isinstance(dflash, dict) else None
    for key in ("target_layer_ids", "aux_hidden_state_layer_ids"):
        ids = ids if ids is not None else doc.get(key)
    hidden, heads = positive(src.get("hidden_size")), positive(src.get("num_attention_heads"))
    head_dim = positive(src.get("head_dim"))
    if head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
    return _Sizes(
        hidden=hidden,
        layers=positive(src.get("num_hidden_layers")),
        heads=heads,
        kv_heads=positive(src.get("num_key_value_heads")) or heads,
        head_dim=head_dim,
        intermediate=positive(src.get("intermediate_size")),
        vocab=positive(src.get("vocab_size")),
        draft_vocab=positive(doc.get("draft_vocab_size")) or positive(src.get("vocab_size")),
        ids=ids if isinstance(ids, list) else None,
    )


def compare(
    doc: dict[str, Any],
    tensors: dict[str, TensorInfo],
    target_hidden: int | None,
    notes: list[str],
) -> list[str]:
    """One line per config field the tensors disagree with."""
    s = sizes_of(doc)
    layers: dict[int, dict[str, TensorInfo]] = {}
    top: dict[str, TensorInfo] = {}
    for name, info in tensors.items():
        match = _LAYER.fullmatch(name)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = info
        else:
            top[name] = info
    lines = _layer_count(s, layers)
    lines += _same_tensors_per_layer(layers)
    missing = [n for n in ("norm.weight", "hidden_norm.weight") if n not in top]
    lines += [f"{n}: absent from the weights (vLLM's DFlash drafter loads it)" for n in missing]
    observed = _Observed()
    for index in sorted(layers):
        _layer_shapes(s, layers[index], f"layers.{index}.", observed)
    _top_shapes(s, top, observed)
    lines += observed.lines()
    lines += _fc(doc, s, top, target_hidden, notes)
    return lines


def _layer_count(s: _Sizes, layers: dict[int, dict[str, TensorInfo]]) -> list[str]:
    found = max(layers) + 1 if layers else 0
    if s.layers is None or found == s.layers:
        return []
    what = f"layers.0-{found - 1}" if found > 1 else "layers.0" if found else "no layers.N tensors"
    return [f"num_hidden_layers: config {s.layers}, weights {found} ({what})"]


def _same_tensors_per_layer(layers: dict[int, dict[str, TensorInfo]]) -> list[str]:
    if not layers:
        return []
    union = set().union(*(set(parts) for parts in layers.values()))
    lines = []
    for index in range(max(layers) + 1):
        missing = sorted(union - set(layers.get(index, {})))
        if index not in layers:
            lines.append(f"layers.{index}: no tensors (the layers around it have them)")
        elif missing:
            shown = ", ".join(missing[:4]) + (
                f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""
            )
            lines.append(f"layers.{index}: missing {shown} (other layers have them)")
        if len(lines) > _MAX_LINES:
            break  # a hostile index (layers.999999) would otherwise list every gap
    return lines


class _Observed:
    """Per config field: what it says, and the first tensor that disagrees (with a count)."""

    def __init__(self) -> None:
        self.seen: dict[
            str, tuple[str, int, str, int]
        ] = {}  # field -> (config text, got, where, n)

    def expect(
        self, label: str, want: int | None, config_text: str, info: TensorInfo, dim: int
    ) -> None:
        if want is None or len(info.shape) <= dim or info.shape[dim] == want:
            return
        where = f"{info.name} {list(info.shape)}"
        if label in self.seen:
            text, got, first, n = self.seen[label]
            self.seen[label] = (text, got, first, n + 1)
        else:
            self.seen[label] = (config_text, info.shape[dim], where, 1)

    def lines(self) -> list[str]:
        out = []
        for label, (text, got, where, n) in self.seen.items():
            more = f", +{n - 1} more tensor(s)" if n > 1 else ""
            out.append(f"{label}: config {text}, weights {got} ({where}{more})")
        return out


def _product(*parts: tuple[str, int | None]) -> tuple[int | None, str]:
    if any(value is None for _, value in parts):
        return None, ""
    value = 1
    for _, part in parts:
        value *= part or 1
    text = " × ".join(str(v) for _, v in parts)
    return value, f"{text} = {value}"


def _layer_shapes(s: _Sizes, part: dict[str, TensorInfo], prefix: str, seen: _Observed) -> None:
    h = ("hidden_size", s.hidden, str(s.hidden))
    q_rows, q_text = _product(("heads", s.heads), ("head_dim", s.head_dim))
    kv_rows, kv_text = _product(("kv", s.kv_heads), ("head_dim", s.head_dim))
    q = ("num_attention_heads × head_dim", q_rows, q_text)
    kv = ("num_key_value_heads × head_dim", kv_rows, kv_text)
    i = ("intermediate_size", s.intermediate, str(s.intermediate))
    d = ("head_dim", s.head_dim, str(s.head_dim))
    rules: dict[str, tuple[tuple[str, int | None, str], ...]] = {
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "self_attn.q_norm.weight": (d,),
        "self_attn.k_norm.weight": (d,),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    for suffix, dims in rules.items():
        info = part.get(suffix)
        if info is not None:
            for dim, (label, want, text) in enumerate(dims):
                seen.expect(label, want, text, info, dim)


def _top_shapes(s: _Sizes, top: dict[str, TensorInfo], seen: _Observed) -> None:
    hidden = str(s.hidden)
    for name in ("norm.weight", "hidden_norm.weight"):
        if name in top:
            seen.expect("hidden_size", s.hidden, hidden, top[name], 0)
    if "fc.weight" in top:
        seen.expect("hidden_size", s.hidden, hidden, top["fc.weight"], 0)
    if "embed_tokens.weight" in top:
        seen.expect("vocab_size", s.vocab, str(s.vocab), top["embed_tokens.weight"], 0)
        seen.expect("hidden_size", s.hidden, hidden, top["embed_tokens.weight"], 1)
    if "lm_head.weight" in top:
        label = "draft_vocab_size" if s.draft_vocab != s.vocab else "vocab_size"
        seen.expect(label, s.draft_vocab, str(s.draft_vocab), top["lm_head.weight"], 0)
        seen.expect("hidden_size", s.hidden, hidden, top["lm_head.weight"], 1)


def _fc(
    doc: dict[str, Any],
    s: _Sizes,
    top: dict[str, TensorInfo],
    target_hidden: int | None,
    notes: list[str],
) -> list[str]:
    """fc.weight's input width = len(target_layer_ids) × the target's hidden size."""
    lines: list[str] = []
    fc = top.get("fc.weight")
    if s.ids is None:
        return lines
    if fc is None:
        return [*lines, "fc.weight: absent, but the config's target_layer_ids need it"]
    per_tap = positive(doc.get("target_hidden_size")) or target_hidden
    if per_tap is None:
        per_tap = s.hidden
        notes.append(
            "fc.weight's input width checked with the drafter's own hidden_size "
            "(the target's config is not known here)"
        )
    if per_tap is None or len(fc.shape) != 2:
        return lines
    want = len(s.ids) * per_tap
    got = fc.shape[1]
    if got == want:
        return lines
    taps = f" = {got // per_tap} × {per_tap}" if got % per_tap == 0 else ""
    return [
        *lines,
        f"target_layer_ids: config {len(s.ids)} ids × hidden {per_tap} = {want}, weights "
        f"fc.weight input width {got}{taps} (fc.weight {list(fc.shape)})",
    ]
