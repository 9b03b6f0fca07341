"""Put pinned files in place on a host (push --all-files): streamed from the controller's Hub
cache over the connection in chunks, each chunk one exec of scripts/place.sh, the file written
beside its final name, fsynced, its hash proved on the host, then renamed. An interrupted
placement leaves its part on the host; the next one asks its size and sends only the rest.

One copy on the controller (the HF cache, checked against the pin before a byte is sent), none
on the host besides the part that becomes the file: no backup of a multi-GB shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_provision.errors import ExitCode, HubError, RemoteStepFailed
from dflash_provision.remote.ops import remote_deadline
from dflash_provision.remote.protocol import run_script, stderr_line
from dflash_provision.source import hub_deadline
from dflash_provision.source.hub import raise_request_failure
from dflash_provision.source.pinned_files import GIT_BLOB, PinnedFile

if TYPE_CHECKING:
    from dflash_provision.transport.base import Transport

CHUNK_BYTES = 32 * 1024 * 1024  # one exec's stdin: bounded memory here, a resume point there
_READ = 1024 * 1024
Progress = Callable[[str, int, int], None]  # name, bytes on the host, size


@dataclass(frozen=True)
class Placed:
    name: str
    size: int
    resumed_at: int  # bytes the host already held from an interrupted placement
    sent: int  # bytes sent in this placement
    mode: str = ""  # the placed file's mode (octal), as place.sh set it
    mode_from: str = ""  # whose mode it took: replaced, config.json or default (0644)


def cached_copy(pinned: PinnedFile, *, timeout: float) -> Path:
    """The file in the controller's HF cache at the pinned commit (downloaded once when it is
    not there), proved against the pin; HubError (16) when the cached bytes are other bytes."""
    from huggingface_hub import hf_hub_download

    try:
        path = Path(
            hub_deadline.run_within(
                timeout,
                lambda: hf_hub_download(pinned.repo_id, pinned.path, revision=pinned.commit_sha),
            )
        )
    except Exception as exc:
        raise_request_failure(exc, pinned.repo_id, pinned.commit_sha, pinned.path)
    if digest_of(path, pinned) != pinned.digest or path.stat().st_size != pinned.size:
        raise HubError(
            f"{pinned.repo_id}@{pinned.commit_sha[:12]} {pinned.path}: the cached copy at {path} "
            f"is not the pinned file; nothing sent",
            exit_code=ExitCode.HUB_INTEGRITY,
        )
    return path


def digest_of(path: Path, pinned: PinnedFile) -> str:
    h = hashlib.sha1(usedforsecurity=False) if pinned.algorithm == GIT_BLOB else hashlib.sha256()
    if pinned.algorithm == GIT_BLOB:
        h.update(b"blob %d\x00" % path.stat().st_size)
    with path.open("rb") as handle:
        while chunk := handle.read(_READ):
            h.update(chunk)
    return h.hexdigest()


def place_file(
    transport: Transport,
    model_dir: str,
    pinned: PinnedFile,
    source: Path,
    *,
    progress: Progress | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Placed:
    """Put ``source`` (the pinned file's bytes) at ``model_dir/pinned.path`` on the host."""
    have = _part_size(transport, model_dir, pinned)
    resumed_at = have if 0 < have <= pinned.size else 0
    for attempt in (1, 2):  # a part whose bytes were not the file's: once more from 0
        offset = resumed_at if attempt == 1 else 0
        try:
            sent, mode = _send_from(
                transport, model_dir, pinned, source, offset, chunk_bytes, progress
            )
        except _HashMismatch:
            if offset == 0:
                raise RemoteStepFailed(
                    f"{transport.description}: {pinned.path}: the bytes sent did not hash to the "
                    "pin on the host",
                    step="hash",
                ) from None
            resumed_at = 0
            continue
        mode_bits, _, mode_from = mode.partition(" ")
        return Placed(pinned.path, pinned.size, offset, sent, mode_bits, mode_from)
    raise AssertionError("unreachable")  # pragma: no cover


class _HashMismatch(Exception):
    pass


def _part_size(transport: Transport, model_dir: str, pinned: PinnedFile) -> int:
    reply = _run(transport, model_dir, pinned, -1, 0, last=False, stdin=None)
    text = reply.get("part", "")
    return int(text) if text.isdigit() else 0


def _send_from(
    transport: Transport,
    model_dir: str,
    pinned: PinnedFile,
    source: Path,
    offset: int,
    chunk_bytes: int,
    progress: Progress | None,
) -> tuple[int, str]:
    """The bytes sent, and the last chunk's ``mode`` line (``MODE FROM``)."""
    sent = 0
    with source.open("rb") as handle:
        handle.seek(offset)
        position = offset
        while True:
            data = handle.read(chunk_bytes)
            end = position + len(data)
            last = end >= pinned.size
            reply = _run(transport, model_dir, pinned, position, end, last=last, stdin=data)
            sent += len(data)
            position = end
            if progress is not None:
                progress(pinned.path, position, pinned.size)
            if last or not data:
                return sent, reply.get("mode", "")


def _run(
    transport: Transport,
    model_dir: str,
    pinned: PinnedFile,
    offset: int,
    end: int,
    *,
    last: bool,
    stdin: bytes | None,
) -> dict[str, str]:
    limit = transport.command_timeout
    args = [
        model_dir.rstrip("/") or "/",
        pinned.path,
        str(pinned.size),
        pinned.algorithm,
        pinned.digest,
        str(offset),
        str(end),
        "1" if last else "0",
        str(max(1, int(min(10.0, limit / 3)))),
        str(remote_deadline(limit)),
    ]
    result, reply = run_script(transport, "place", args, stdin=stdin if stdin is not None else b"")
    if "error" in reply.fields:
        step, _, rest = reply.fields["error"].partition(" ")
        reason, _, message = rest.partition(" ")
        if step == "hash" and reason == "mismatch":
            raise _HashMismatch(message)
        raise RemoteStepFailed(f"{transport.description}: {message}", step=step)
    if not reply.lines or result.exit_status != 0:
        raise RemoteStepFailed(
            f"{transport.description}: placing {pinned.path} failed: {stderr_line(result)}",
            step="write",
        )
    return reply.fields
