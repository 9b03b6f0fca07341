"""``dflash.lock``: which Hub commit and which bytes a config was taken from.

One entry per (repo_id, filename): the revision asked for, the commit sha it resolved to, the
sha256 and size of the bytes, and when that commit was first recorded. Later commands (push,
audit) read the lock to get the exact same bytes again, from the HF cache, without the network.

With ``fetch --all-files`` the lock also pins every file of the commit that vLLM reads
(``files``: path, size, the hash the Hub declares; see source/pinned_files.py). A lock without
``files`` is a lock of the config alone, as every lock was before; a reader that knows only
``entries`` reads a lock with ``files`` as such a lock.

Format: JSON, keys sorted, indent 2, entries sorted by (repo_id, filename), files by
(repo_id, path), trailing newline.
JSON because the standard library both reads and writes it exactly (tomllib only reads, and a
hand-written TOML writer is one more place for quoting bugs); sorted and indented so the file
diffs cleanly in review and re-writing unchanged content gives identical bytes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ConfigInvalid, UsageError
from dflash_provision.formats import strict_json

if TYPE_CHECKING:
    from dflash_provision.source.hub import FetchedConfig
    from dflash_provision.source.pinned_files import PinnedFile

DEFAULT_LOCK_PATH = Path("dflash.lock")
LOCK_VERSION = 1

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class LockEntry:
    repo_id: str
    revision: str  # as requested: branch, tag or sha
    commit_sha: str  # 40 hex: what the revision resolved to
    filename: str
    sha256: str  # of the file's bytes
    size: int
    fetched_at: str  # UTC ISO 8601, when this commit + bytes were first recorded

    @property
    def key(self) -> tuple[str, str]:
        return (self.repo_id, self.filename)


def entry_from_fetched(fetched: FetchedConfig, *, fetched_at: datetime | None = None) -> LockEntry:
    """The lock entry that records ``fetched``."""
    when = (fetched_at or datetime.now(UTC)).astimezone(UTC)
    return LockEntry(
        repo_id=fetched.repo_id,
        revision=fetched.requested_revision,
        commit_sha=fetched.commit_sha,
        filename=fetched.filename,
        sha256=fetched.sha256,
        size=len(fetched.data),
        fetched_at=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def read_lock(path: Path | str) -> list[LockEntry]:
    """Entries of the lock at ``path``, sorted. UsageError if it is missing or malformed."""
    path = Path(path)
    return _parse(_read_text(path), path)[0]


def read_pinned_files(path: Path | str) -> list[PinnedFile]:
    """The files the lock at ``path`` pins (none for a lock of the config alone)."""
    path = Path(path)
    return _parse(_read_text(path), path)[1]


def upsert_pinned_files(path: Path | str, repo_id: str, files: list[PinnedFile]) -> None:
    """Record ``files`` as the pinned files of ``repo_id`` (replacing those it had), keeping the
    lock's entries. The lock must exist (fetch records the config first)."""
    path = Path(path)
    entries, pinned = _parse(_read_text(path), path)
    kept = [f for f in pinned if f.repo_id != repo_id]
    write_atomic(path, render_lock(entries, kept + list(files)).encode("utf-8"))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"{path}: no such lock file (run `dflash-provision fetch REPO_ID` first)"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read lock file ({exc.strerror})") from None


def upsert_lock(path: Path | str, entry: LockEntry) -> None:
    """Add ``entry`` to the lock at ``path`` (created if absent), replacing the entry with the
    same (repo_id, filename). The file is replaced atomically (temp file, fsync, rename).

    If the same commit and bytes are already recorded, the old ``fetched_at`` is kept so that
    fetching again does not change the file.

    If the entry's commit moves, the files pinned at the old commit for that repo are dropped:
    they no longer say what the commit holds (``fetch --all-files`` pins the new commit's).
    """
    path = Path(path)
    entries, pinned = _parse(_read_text(path), path) if path.exists() else ([], [])
    by_key = {e.key: e for e in entries}
    old = by_key.get(entry.key)
    if old is not None and (old.commit_sha, old.sha256, old.revision) == (
        entry.commit_sha,
        entry.sha256,
        entry.revision,
    ):
        entry = replace(entry, fetched_at=old.fetched_at)
    by_key[entry.key] = entry
    pinned = [f for f in pinned if f.repo_id != entry.repo_id or f.commit_sha == entry.commit_sha]
    write_atomic(path, render_lock(list(by_key.values()), pinned).encode("utf-8"))


def render_lock(entries: list[LockEntry], files: list[PinnedFile] | None = None) -> str:
    document: dict[str, Any] = {
        "version": LOCK_VERSION,
        "entries": [asdict(e) for e in sorted(entries, key=lambda e: e.key)],
    }
    if files:  # a lock of the config alone stays byte for byte what it always was
        document["files"] = [f.to_dict() for f in sorted(files, key=lambda f: f.key)]
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def find_entry(
    entries: list[LockEntry],
    repo_id: str | None = None,
    filename: str = "config.json",
    *,
    lock_path: Path | str | None = None,
) -> LockEntry:
    """The one entry for ``filename`` (and ``repo_id`` if given). UsageError if none or several."""
    where = f"{lock_path}: " if lock_path is not None else "lock: "
    matches = [
        e for e in entries if e.filename == filename and (repo_id is None or e.repo_id == repo_id)
    ]
    if not matches:
        wanted = f"{repo_id} {filename}" if repo_id else filename
        recorded = ", ".join(f"{e.repo_id} {e.filename}" for e in entries) or "nothing"
        raise UsageError(f"{where}no entry for {wanted} (it records {recorded})")
    if len(matches) > 1:
        repos = ", ".join(e.repo_id for e in matches)
        raise UsageError(f"{where}several repos record {filename} ({repos}): name one")
    return matches[0]


def load_locked_config(
    lock_path: Path | str,
    repo_id: str | None = None,
    *,
    filename: str = "config.json",
    cache_dir: str | None = None,
    endpoint: str | None = None,
) -> FetchedConfig:
    """The config pinned by the lock: fetched by commit sha (so from the cache, no request, once
    fetched) and checked against the recorded sha256. ConfigInvalid if the bytes differ.

    The result's ``requested_revision`` is the revision recorded in the lock (e.g. "main"), its
    ``commit_sha`` the pinned commit.
    """
    from dflash_provision.source import hub

    entry = find_entry(read_lock(lock_path), repo_id, filename, lock_path=lock_path)
    fetched = hub.pinned_from_cache(
        entry.repo_id, entry.commit_sha, entry.filename, entry.sha256, cache_dir=cache_dir
    ) or hub.fetch_config(
        entry.repo_id, entry.commit_sha, entry.filename, cache_dir=cache_dir, endpoint=endpoint
    )
    if fetched.sha256 != entry.sha256:
        raise ConfigInvalid(
            f"{entry.repo_id}@{entry.commit_sha} {entry.filename}: sha256 {fetched.sha256} "
            f"does not match {entry.sha256} recorded in {lock_path} (cache or Hub content changed)"
        )
    return replace(fetched, requested_revision=entry.revision)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never half."""
    directory = path.parent if str(path.parent) else Path(".")
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    import tempfile  # here: tempfile imports shutil, random, bz2, lzma (only writers need it)

    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _parse(text: str, path: Path) -> tuple[list[LockEntry], list[PinnedFile]]:
    def bad(why: str) -> UsageError:
        return UsageError(f"{path}: malformed lock file: {why}")

    try:
        document = strict_json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    except strict_json.StrictJsonError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise bad('expected an object with an "entries" list')
    if document.get("version") != LOCK_VERSION:
        raise bad(f"unsupported version {document.get('version')!r} (expected {LOCK_VERSION})")
    entries = [_parse_entry(raw, i, bad) for i, raw in enumerate(document["entries"])]
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        if entry.key in seen:
            raise bad(f"{entry.repo_id} {entry.filename} is recorded twice")
        seen.add(entry.key)
    return sorted(entries, key=lambda e: e.key), _parse_files(document.get("files", []), bad)


def _parse_files(raw: Any, bad: Callable[[str], UsageError]) -> list[PinnedFile]:
    from dflash_provision.source.pinned_files import parse_pinned

    if not isinstance(raw, list):
        raise bad('"files" must be a list')
    files = []
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(raw):
        try:
            pinned = parse_pinned(item, f"file {index}")
        except ValueError as exc:
            raise bad(str(exc)) from None
        if pinned.key in seen:
            raise bad(f"{pinned.repo_id} {pinned.path} is pinned twice")
        seen.add(pinned.key)
        files.append(pinned)
    return sorted(files, key=lambda f: f.key)


def _parse_entry(raw: Any, index: int, bad: Callable[[str], UsageError]) -> LockEntry:
    names = [f.name for f in fields(LockEntry)]
    if not isinstance(raw, dict):
        raise bad(f"entry {index} is not an object")
    missing = [n for n in names if n not in raw]
    if missing:
        raise bad(f"entry {index} lacks {', '.join(missing)}")
    for name in names:
        wanted = int if name == "size" else str
        value = raw[name]
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise bad(f"entry {index}: {name} must be {wanted.__name__}")
    if not _SHA1.match(raw["commit_sha"]):
        raise bad(f"entry {index}: commit_sha {raw['commit_sha']!r} is not 40 hex digits")
    if not _SHA256.match(raw["sha256"]):
        raise bad(f"entry {index}: sha256 {raw['sha256']!r} is not 64 hex digits")
    if raw["size"] < 0:
        raise bad(f"entry {index}: size is negative")
    return LockEntry(**{n: raw[n] for n in names})
