"""The header of a safetensors file, parsed as hostile input: tensor names, dtypes, shapes.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name →
``{"dtype", "shape", "data_offsets": [start, end]}``, plus an optional ``__metadata__`` object
of strings), then the tensors' bytes. The header tells every shape without reading the weights.

Everything here is checked, not trusted: the length against a limit and against the file, the
JSON strictly (bounded nesting and numbers, no duplicate keys), every entry's types, and that
the offsets describe the data the file holds (each tensor's bytes = its element count × its
dtype's size, contiguous from 0 to the end of the file, as the safetensors loader requires).
A refusal is a ``HeaderError`` of one line that quotes nothing from the file but a tensor name
(escaped, cut at 80 characters).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from dflash_provision.formats import strict_json

#: The longest header read (the safetensors library itself allows 100 MB; a drafter's header is
#: a few KB, a large model shard's a few hundred KB).
MAX_HEADER_BYTES = 4 * 1024 * 1024
LIMIT_TEXT = "4 MiB"

#: Bits per element of the dtypes the safetensors format names.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class HeaderError(ValueError):
    """The header is not a valid safetensors header; the message says why in one line."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    file: str
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None


def header_length(prefix: bytes, file_size: int | None, *, limit: int = MAX_HEADER_BYTES) -> int:
    """N from the file's first 8 bytes; HeaderError when it cannot be a header of this file."""
    if len(prefix) < 8:
        raise HeaderError(f"{len(prefix)} bytes: shorter than the 8-byte header length")
    length = int.from_bytes(prefix[:8], "little")
    return check_length(length, file_size, limit=limit)


def check_length(length: int, file_size: int | None, *, limit: int = MAX_HEADER_BYTES) -> int:
    """``length`` when it is within ``limit`` and the file; HeaderError otherwise."""
    if length > limit:
        raise HeaderError(f"header length {length} bytes is over the {limit}-byte limit")
    if length < 2:
        raise HeaderError(f"header length {length} bytes cannot hold a JSON object")
    if file_size is not None and 8 + length > file_size:
        raise HeaderError(f"header length {length} bytes runs beyond the file ({file_size} bytes)")
    return length


def parse_header(file: str, raw: bytes, file_size: int | None = None) -> SafetensorsHeader:
    """Parse ``raw`` (the N header bytes, without the length) of ``file``. With ``file_size``
    the offsets must describe exactly the bytes after the header."""
    doc = _strict_object(raw)
    metadata = _metadata(doc.pop("__metadata__", None))
    tensors: dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        tensors[name] = _tensor(name, entry)
    data_size = None if file_size is None else file_size - 8 - len(raw)
    _check_coverage(tensors, data_size)
    return SafetensorsHeader(file, tensors, metadata)


def _strict_object(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not UTF-8 (byte {exc.start})") from None
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in items:
            if key in obj:
                duplicates.append(key)
            obj[key] = value
        return obj

    try:
        doc = strict_json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise HeaderError(f"header is not JSON (line {exc.lineno}, column {exc.colno})") from None
    except strict_json.StrictJsonError as exc:
        raise HeaderError(f"header holds invalid JSON at {exc.path or 'top level'}") from None
    if duplicates:
        raise HeaderError(f"header names {_short(duplicates[0])} twice")
    if not isinstance(doc, dict):
        raise HeaderError("header is not a JSON object")
    return doc


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HeaderError("__metadata__ is not an object of strings")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor(name: str, entry: Any) -> TensorInfo:
    shown = _short(name)
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise HeaderError(f"{shown}: not an object of dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError(f"{shown}: dtype is not a safetensors dtype")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise HeaderError(f"{shown}: shape is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise HeaderError(f"{shown}: data_offsets is not [start, end]")
    start, end = offsets
    if end < start:
        raise HeaderError(f"{shown}: data_offsets end before they start")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - start:
        raise HeaderError(
            f"{shown}: {dtype} {shape} needs {bits / 8:g} bytes, data_offsets give {end - start}"
        )
    return TensorInfo(name, dtype, tuple(shape), start, end)


def _check_coverage(tensors: dict[str, TensorInfo], data_size: int | None) -> None:
    """The tensors' bytes follow each other from 0 with no gap or overlap (the safetensors
    loader refuses anything else) and, when the file's size is known, end where the file does."""
    at = 0
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if info.start != at:
            raise HeaderError(
                f"{_short(info.name)}: data starts at {info.start}, expected {at} "
                "(a gap or an overlap between tensors)"
            )
        at = info.end
    if data_size is not None and at != data_size:
        raise HeaderError(
            f"the header describes {at} bytes of tensor data, the file holds {data_size} "
            f"({'truncated' if data_size < at else 'extra bytes'})"
        )


def _short(name: str) -> str:
    """A tensor name for a message: quoted, cut when long (it comes from the file)."""
    return json.dumps(name if len(name) <= 80 else name[:77] + "...", ensure_ascii=True)
