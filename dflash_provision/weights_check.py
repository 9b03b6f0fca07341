"""Do the drafter's weights fit its config? Judged from the safetensors headers alone.

Two published revisions of one drafter can differ in layer count, taps and window; a config of
one beside the weights of the other loads only when the shapes happen to fit, and serves at a
few percent acceptance. The headers tell the shapes without reading the weights:

    num_hidden_layers     max ``layers.{i}`` index + 1; every layer holds the same tensors
    hidden_size           norm / hidden_norm / layer norms, the projections' hidden side
    heads and head_dim    q/k/v/o_proj rows and columns, q_norm / k_norm
    intermediate_size     mlp gate/up/down_proj
    target_layer_ids      fc.weight [hidden, len(target_layer_ids) × target hidden_size]
    vocab_size            embed_tokens / lm_head rows, when the drafter ships them

Tensor names as vLLM's ``qwen3_dflash.py`` loads them (``layers.{i}.self_attn.q_proj.weight``,
``fc.weight``, ``hidden_norm.weight``, ``norm.weight``), with an optional ``model.`` prefix and
vLLM's own renames (``midlayer.`` → ``layers.0.``, ``encoder.fc.`` → ``fc.``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision import strict_json
from dflash_provision.remote.weights_read import INDEX_NAME, WeightsRead
from dflash_provision.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    TensorInfo,
    check_length,
    parse_header,
)

if TYPE_CHECKING:
    from dflash_provision.transport.base import Transport
    from dflash_provision.transport.factory import Connector

_LAYER = re.compile(r"layers\.(\d{1,6})\.(.+)")
_RENAMES = (
    ("midlayer.", "layers.0."),
    ("encoder.output_norm_enc.", "hidden_norm."),
    ("encoder.fc.", "fc."),
)
_MAX_LINES = 40  # a directory of unrelated weights would otherwise print one line per tensor


@dataclass
class WeightsCheck:
    """The verdict (``data["weights"]`` of stage a, per the helpers' contract)."""

    checked: bool
    ok: bool | None
    mismatches: list[str] = field(default_factory=list)
    detail: str = ""
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.ok is False

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "ok": self.ok,
            "mismatches": list(self.mismatches),
            "detail": self.detail,
            "notes": list(self.notes),
            "files": list(self.files),
        }


def not_checked(detail: str) -> WeightsCheck:
    return WeightsCheck(checked=False, ok=None, detail=detail)


def check_weights(
    doc: dict[str, Any], read: WeightsRead, *, target_hidden: int | None = None
) -> WeightsCheck:
    """Compare the headers in ``read`` with config ``doc`` (``target_hidden``: the target
    model's hidden_size when its config is known)."""
    if read.problem:
        return not_checked(f"weights not checked: {read.problem}")
    if read.unread:
        return not_checked("weights not checked: " + "; ".join(read.unread))
    if not read.files and read.index is None:
        return not_checked(f"no weights to check (no *.safetensors in {read.where})")
    tensors: dict[str, TensorInfo] = {}
    broken: list[str] = []
    headers: list[SafetensorsHeader] = []
    for item in read.files:
        try:
            check_length(item.length, item.size)
            header = parse_header(item.name, item.raw or b"", item.size)
        except HeaderError as exc:
            broken.append(f"{item.name}: {exc}")
            continue
        headers.append(header)
        for name, info in header.tensors.items():
            tensors.setdefault(_canonical(name), info)
    names = [item.name for item in read.files]
    broken += _index_problems(read, headers)
    notes: list[str] = []
    mismatches = broken + (compare(doc, tensors, target_hidden, notes) if headers else [])
    if not mismatches and not headers:
        return not_checked(f"no weights to check (no *.safetensors in {read.where})")
    if len(mismatches) > _MAX_LINES:
        mismatches = [*mismatches[:_MAX_LINES], f"(+{len(mismatches) - _MAX_LINES} more)"]
    count = len(tensors)
    detail = (
        f"{count} tensors in {', '.join(names)} fit the config"
        if not mismatches
        else f"{len(mismatches)} field(s) of the config disagree with {', '.join(names)}"
    )
    if read.index_problem:
        notes.append(f"{read.index_problem} (the shards present were checked)")
    return WeightsCheck(True, not mismatches, mismatches, detail, notes, names)


def _canonical(name: str) -> str:
    name = name.removeprefix("model.")
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _index_problems(read: WeightsRead, headers: list[SafetensorsHeader]) -> list[str]:
    """The index's weight_map against the shards: every shard it names is there and holds the
    tensors it says."""
    if read.index is None:
        return []
    try:
        doc = strict_json.loads(read.index.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return [f"{INDEX_NAME}: not valid JSON"]
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return [f"{INDEX_NAME}: no weight_map of tensor name → file"]
    by_file = {header.file: header.tensors for header in headers}
    problems = []
    for shard in sorted(set(weight_map.values())):
        if shard not in by_file:
            problems.append(f"{INDEX_NAME}: names {_q(shard)}, which is not in the directory")
    missing = [n for n, f in weight_map.items() if f in by_file and n not in by_file[f]]
    if missing:
        problems.append(
            f"{INDEX_NAME}: {len(missing)} tensor(s) it places in a shard are not there "
            f"(first: {_q(missing[0])})"
        )
    return problems


def _q(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


# --------------------------------------------------------------------------------------------
# the shapes against the config


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


def _pos(value: Any) -> int | None:
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
    hidden, heads = _pos(src.get("hidden_size")), _pos(src.get("num_attention_heads"))
    head_dim = _pos(src.get("head_dim"))
    if head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads
    return _Sizes(
        hidden=hidden,
        layers=_pos(src.get("num_hidden_layers")),
        heads=heads,
        kv_heads=_pos(src.get("num_key_value_heads")) or heads,
        head_dim=head_dim,
        intermediate=_pos(src.get("intermediate_size")),
        vocab=_pos(src.get("vocab_size")),
        draft_vocab=_pos(doc.get("draft_vocab_size")) or _pos(src.get("vocab_size")),
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
    per_tap = _pos(doc.get("target_hidden_size")) or target_hidden
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


# --------------------------------------------------------------------------------------------
# the entry points the commands use


def check_remote(
    transport: Transport,
    model_dir: str,
    doc: dict[str, Any],
    *,
    target_hidden: int | None = None,
    timeout: float | None = None,
) -> WeightsCheck:
    """Read the headers in ``model_dir`` on the target (one exec) and compare. A read the
    remote side could not report is "not checked" (never a pass); connection failures raise."""
    from dflash_provision.remote.ops import RemoteProtocolError
    from dflash_provision.remote.weights_read import read_remote_weights

    try:
        read = read_remote_weights(transport, model_dir, timeout=timeout)
    except RemoteProtocolError as exc:
        return not_checked(f"weights not checked: {exc.message}")
    return check_weights(doc, read, target_hidden=target_hidden)


def target_hidden_of(target_config: bytes | None) -> int | None:
    """The target model's hidden_size from its config.json bytes (None when unknown)."""
    if target_config is None:
        return None
    try:
        doc = strict_json.loads(target_config.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    inner = doc.get("text_config")  # multimodal targets keep the language model's sizes here
    return _pos(doc.get("hidden_size")) or (
        _pos(inner.get("hidden_size")) if isinstance(inner, dict) else None
    )


def weights_fix(drafter_dir: str) -> str:
    """What to do when the weights and the config are of different revisions."""
    return (
        f"put the config and the weights of ONE revision in {drafter_dir}: download the weights "
        "of the config's revision (e.g. `hf download REPO --revision REV --local-dir DIR`), or "
        "push the config of the weights' revision (`dflash-provision push TARGET --repo REPO@REV`)"
    )


def check_source(
    spec: str,
    doc: dict[str, Any],
    *,
    target_config: bytes | None = None,
    connector: Connector | None = None,
) -> WeightsCheck | None:
    """The weights check of ``validate SOURCE``: for a local directory (read here) or a target
    (one exec there); None for a file or a Hub repo id (no weights beside them to read)."""
    from pathlib import Path

    from dflash_provision.authority import RepoRef
    from dflash_provision.remote.weights_read import read_local_weights

    hidden = target_hidden_of(target_config)
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            return None
        return check_weights(doc, read_local_weights(path), target_hidden=hidden)
    if RepoRef.parse(spec) is not None and not spec.startswith((".", "/", "~")):
        return None
    from dflash_provision.target import parse_target
    from dflash_provision.transport.factory import Connector

    target = parse_target(spec)
    with (connector or Connector()).open(target) as transport:
        return check_remote(transport, target.model_dir, doc, target_hidden=hidden)
