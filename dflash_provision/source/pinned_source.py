"""The pinned files an ``--all-files`` check compares a host's directory with, for the drafter
source a command names: the lock's (``fetch --all-files`` put them there), or for ``--repo`` the
Hub's tree listing at the commit the config was taken from."""

from __future__ import annotations

from pathlib import Path

from dflash_provision.errors import UsageError
from dflash_provision.source.authority import Authority, SourceSpec
from dflash_provision.source.hub_tree import list_commit_files
from dflash_provision.source.lockfile import find_entry, read_lock, read_pinned_files
from dflash_provision.source.pinned_files import PinnedFile


def pinned_for(spec: SourceSpec, authority: Authority) -> list[PinnedFile]:
    """The files pinned for ``spec`` at the commit ``authority`` was loaded from (UsageError
    for a source that pins no commit, or a lock that pins no files of that commit)."""
    spec = spec.or_default_lock()
    if spec.from_file is not None:
        raise UsageError(
            "--all-files needs a pinned commit: name a lock (`dflash-provision fetch --all-files` "
            "writes one) or --repo, not --from"
        )
    if authority.commit_sha is None:
        raise UsageError("--all-files: the authoritative config pins no commit")
    if spec.repo is not None:
        return list_commit_files(spec.repo.repo_id, authority.commit_sha)
    assert spec.lock is not None
    return _from_lock(Path(spec.lock), spec.lock_repo, authority.commit_sha)


def _from_lock(lock: Path, repo_id: str | None, commit_sha: str) -> list[PinnedFile]:
    entry = find_entry(read_lock(lock), repo_id, lock_path=lock)
    files = [
        f
        for f in read_pinned_files(lock)
        if f.repo_id == entry.repo_id and f.commit_sha == commit_sha
    ]
    if not files:
        raise UsageError(
            f"{lock}: pins no files of {entry.repo_id}@{commit_sha[:12]} beyond config.json "
            f"(run `dflash-provision fetch --all-files --lock {lock}` to add them)"
        )
    return files
