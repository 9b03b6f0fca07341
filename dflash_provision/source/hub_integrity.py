"""Check a Hub file's bytes against what the Hub declared for it, and evict bytes that fail.

The Hub declares every file in the HEAD answer of ``/resolve``: its ``ETag`` (the git blob id of a
file kept in git) or ``X-Linked-Etag`` (the sha256 of an LFS / Xet object), and its size
(``X-Linked-Size`` or ``Content-Length``). huggingface_hub checks the size of what it downloaded
but never the hash, and names the cached blob after the ETag (``blobs/<etag>``) without looking
inside it. So the blob's name is the declaration, and a body that a proxy, a mirror or a
man-in-the-middle changed, or a cache file changed on disk, would otherwise be accepted,
locked and pushed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_BLOB = re.compile(r"^[0-9a-f]{40}$")


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob holding ``data`` (the Hub's ETag for files kept in git)."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


def declared_mismatch(data: bytes, etag: str | None, size: int | None) -> str | None:
    """Why ``data`` is not the file the Hub declared (None when it is).

    ``etag`` is the normalised ETag (no quotes, no ``W/``); None when nothing was declared (a
    cache on a filesystem without symlinks keeps no blob name), then only ``size`` is checked.
    """
    if size is not None and size != len(data):
        return f"the Hub declared {size} bytes and sent {len(data)}"
    if etag is None:
        return None
    if _SHA256.fullmatch(etag):
        actual = hashlib.sha256(data).hexdigest()
        kind = "sha256"
    elif _GIT_BLOB.fullmatch(etag):
        actual = git_blob_id(data)
        kind = "git blob id"
    else:
        shown = etag[:80]
        return f"the Hub's ETag {shown!r} is neither a sha256 nor a git blob id: cannot check"
    if actual != etag:
        return f"the Hub declared {kind} {etag} and the bytes have {actual}"
    return None


def cached_etag(path: Path) -> str | None:
    """The ETag a cached file was stored under: the name of the blob its snapshot entry links to."""
    blob = Path(os.path.realpath(path))
    return blob.name if blob != path and blob.parent.name == "blobs" else None


def evict(snapshot_path: Path) -> None:
    """Remove bytes that failed their check from the HF cache (the snapshot entry and the blob it
    links to), so the next fetch downloads them again instead of trusting them. Best effort:
    nothing here raises. (A partial download needs nothing: huggingface_hub removes its
    process-unique temporary file itself when a download fails.)"""
    blob = Path(os.path.realpath(snapshot_path))
    doomed = [snapshot_path]
    if blob != snapshot_path and blob.parent.name == "blobs":
        doomed.append(blob)
    for path in doomed:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
