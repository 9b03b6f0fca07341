"""Bring the safetensors headers of a drafter directory here: from a target in one exec
(scripts/weights.sh), or from a local directory under the same rules.

The rules, on both sides: ``*.safetensors`` and ``model.safetensors.index.json`` only; regular
files only; a symlink is followed only when it resolves inside the directory; at most
MAX_FILES files, a header of at most MAX_HEADER_BYTES each, MAX_TOTAL_BYTES in all, an index of
at most MAX_INDEX_BYTES. Only the headers travel, never the weights. What the bytes mean is
judged by ``safetensors_header`` and ``weights_check`` (as untrusted input).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dflash_provision.formats.safetensors_header import LIMIT_TEXT, MAX_HEADER_BYTES
from dflash_provision.remote.ops import remote_deadline
from dflash_provision.remote.protocol import (
    RemoteProtocolError,
    parse_reply,
    script_argv,
    stderr_line,
)
from dflash_provision.transport.base import Transport

MAX_FILES = 256  # the largest published models have ~200 shards; a drafter has one or two
MAX_TOTAL_BYTES = 32 * 1024 * 1024
MAX_INDEX_BYTES = 4 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"

_SKIP_TEXT = {
    "symlink-outside": "a symlink that points outside the directory: not followed",
    "not-regular": "not a regular file",
    "unreadable": "not readable by this login",
    "short": "shorter than the 8-byte header length (or its size cannot be read)",
    "too-large": "a header length beyond any limit",
    "total-too-large": f"the headers together exceed {MAX_TOTAL_BYTES // (1024 * 1024)} MiB",
    "bad-name": "a name with a line break",
}


@dataclass(frozen=True)
class HeaderBytes:
    """One file's size, declared header length and header bytes (None: the declared length
    runs beyond the file, so nothing was read)."""

    name: str
    size: int
    length: int
    raw: bytes | None


@dataclass
class WeightsRead:
    """What the directory holds, as read: headers, files that were not read (and why), the
    index's bytes. ``problem``: why nothing could be read at all."""

    where: str
    files: list[HeaderBytes] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # "NAME: why", one line each
    index: bytes | None = None
    index_problem: str | None = None
    problem: str | None = None


def read_remote_weights(
    transport: Transport, model_dir: str, *, timeout: float | None = None
) -> WeightsRead:
    """The headers of ``model_dir`` on the transport's machine, in one exec."""
    directory = model_dir.rstrip("/") or "/"
    limit = transport.command_timeout if timeout is None else timeout
    args = [
        directory,
        str(MAX_FILES),
        str(MAX_HEADER_BYTES),
        str(MAX_TOTAL_BYTES),
        str(MAX_INDEX_BYTES),
        str(remote_deadline(limit)),
    ]
    result = transport.run(script_argv("weights", *args), stdin=None, timeout=timeout)
    parsed = parse_reply(result.stdout, "weights")
    where = f"{transport.description}:{directory}"
    if "dir" not in parsed.fields or parsed.data is None or result.exit_status != 0:
        raise RemoteProtocolError(
            f"{transport.description}: reading the safetensors headers in {directory} failed: "
            f"{stderr_line(result)}",
            step="read",
        )
    return _from_lines(where, parsed.lines, parsed.data)


def _from_lines(where: str, lines: list[str], data: bytes) -> WeightsRead:
    read = WeightsRead(where)
    index_size: int | None = None
    for line in lines:
        key, _, rest = line.partition(" ")
        if key == "dir" and rest != "ok":
            read.problem = f"the directory: {rest.replace('-', ' ')}"
        elif key == "too-many":
            read.problem = f"{rest} *.safetensors files, more than the limit of {MAX_FILES}"
        elif key == "file":
            parts = rest.split(" ", 2)
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
                raise RemoteProtocolError(f"{where}: unexpected line {line[:80]!r}", step="read")
            size, length = int(parts[0]), int(parts[1])
            read.files.append(HeaderBytes(parts[2], size, length, None))
        elif key == "skip":
            reason, _, name = rest.partition(" ")
            read.unread.append(f"{name}: {_skip_text(reason)}")
        elif key == "skip-index":
            read.index_problem = f"{INDEX_NAME}: {_SKIP_TEXT.get(rest, rest.replace('-', ' '))}"
        elif key == "index" and rest.isdigit():
            index_size = int(rest)
    return _fill(read, data, index_size)


def _skip_text(reason: str) -> str:
    if reason.startswith("too-large-") and reason[10:].isdigit():
        return f"header length {reason[10:]} bytes, over the {LIMIT_TEXT} limit: not read"
    return _SKIP_TEXT.get(reason, reason)


def _fill(read: WeightsRead, data: bytes, index_size: int | None) -> WeightsRead:
    """Cut ``data`` into the headers announced (in order) and the index."""
    at = 0
    files = []
    for item in read.files:
        if 8 + item.length > item.size:
            files.append(item)
            continue
        files.append(HeaderBytes(item.name, item.size, item.length, data[at : at + item.length]))
        at += item.length
    expected = at + (index_size or 0)
    if len(data) != expected:
        # A file that changed (or was swapped) between the length and the read.
        read.files = []
        read.problem = (
            f"the files changed while their headers were read ({len(data)} bytes arrived, "
            f"{expected} announced)"
        )
        return read
    read.files = files
    if index_size is not None:
        read.index = data[at:]
    return read


# --------------------------------------------------------------------------------------------
# local


def read_local_weights(directory: Path) -> WeightsRead:
    """The same read on this machine (``validate DIR``), under the same rules."""
    read = WeightsRead(str(directory))
    real = directory.resolve()
    names = sorted(p.name for p in directory.glob("*.safetensors"))
    if len(names) > MAX_FILES:
        read.problem = f"{len(names)} *.safetensors files, more than the limit of {MAX_FILES}"
        return read
    total = 0
    for name in names:
        item, why = _local_header(directory / name, real, MAX_TOTAL_BYTES - total)
        if why:
            read.unread.append(f"{name}: {why}")
        if item is not None:
            read.files.append(item)
            total += len(item.raw or b"")
    index = directory / INDEX_NAME
    if index.exists() or index.is_symlink():
        data, why = _local_bytes(index, real, MAX_INDEX_BYTES)
        read.index, read.index_problem = data, (f"{INDEX_NAME}: {why}" if why else None)
    return read


def _open_inside(path: Path, real: Path) -> tuple[int | None, str]:
    """A read descriptor on a regular file inside ``real`` (no link followed out of it)."""
    if path.is_symlink() and not path.resolve().is_relative_to(real):
        return None, _SKIP_TEXT["symlink-outside"]
    target = path.resolve() if path.is_symlink() else path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return None, exc.strerror or "cannot be opened"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, _SKIP_TEXT["not-regular"]
    return fd, ""


def _local_header(path: Path, real: Path, room: int) -> tuple[HeaderBytes | None, str]:
    fd, why = _open_inside(path, real)
    if fd is None:
        return None, why
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        if len(prefix) < 8:
            return None, _SKIP_TEXT["short"]
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_BYTES:
            return None, _skip_text(f"too-large-{length}")
        if 8 + length > size:
            return HeaderBytes(path.name, size, length, None), ""
        if length > room:
            return None, _SKIP_TEXT["total-too-large"]
        return HeaderBytes(path.name, size, length, handle.read(length)), ""


def _local_bytes(path: Path, real: Path, limit: int) -> tuple[bytes | None, str]:
    fd, why = _open_inside(path, real)
    if fd is None:
        return None, why
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        return None, f"larger than {limit // (1024 * 1024)} MiB: not read"
    return data, ""
