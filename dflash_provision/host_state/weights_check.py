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

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.formats import strict_json
from dflash_provision.formats.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    TensorInfo,
    check_length,
    parse_header,
)
from dflash_provision.remote.protocol import RemoteProtocolError
from dflash_provision.remote.weights_read import (
    INDEX_NAME,
    WeightsRead,
    read_local_weights,
    read_remote_weights,
)
from dflash_provision.source.authority import RepoRef
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector
from dflash_provision.validation.weights_shapes import compare, positive

if TYPE_CHECKING:
    from dflash_provision.transport.base import Transport
    from dflash_provision.transport.factory import Connector

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
    return positive(doc.get("hidden_size")) or (
        positive(inner.get("hidden_size")) if isinstance(inner, dict) else None
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
    hidden = target_hidden_of(target_config)
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            return None
        return check_weights(doc, read_local_weights(path), target_hidden=hidden)
    if RepoRef.parse(spec) is not None and not spec.startswith((".", "/", "~")):
        return None
    target = parse_target(spec)
    with (connector or Connector()).open(target) as transport:
        return check_remote(transport, target.model_dir, doc, target_hidden=hidden)
