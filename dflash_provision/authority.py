"""Which bytes are authoritative for push / verify / rollback: exactly one source.

    --repo OWNER/NAME[@REV]   fetched from the Hub (pinned to the commit it resolves to)
    --from FILE               a local file (or a directory holding config.json)
    --lock FILE               the entry pinned in a lock file, served offline from the HF cache
    (nothing)                 ./dflash.lock when it exists

The bytes are taken exactly as they come: push writes them unchanged, so the file on the host
has the same sha256 as the Hub file and the lock entry.
"""

from __future__ import annotations

from pathlib import Path

from dflash_provision.errors import UsageError
from dflash_provision.sources import LoadedConfig, load_local, parse_repo_spec

DEFAULT_LOCK = Path("dflash.lock")


def resolve_authoritative(
    repo: str | None = None,
    from_file: str | Path | None = None,
    lock: str | Path | None = None,
    *,
    lock_repo: str | None = None,
    default_lock: Path = DEFAULT_LOCK,
) -> LoadedConfig:
    """Load the one authoritative config named by the options (see the module docstring).

    ``lock_repo`` picks the entry when a lock file records several repos. UsageError when more
    than one source is named, or none is and ``default_lock`` does not exist.
    """
    named = [
        opt
        for opt, value in (("--repo", repo), ("--from", from_file), ("--lock", lock))
        if value is not None
    ]
    if len(named) > 1:
        raise UsageError(f"give one authoritative source, not {' and '.join(named)}")
    if repo is not None:
        return _from_repo(repo)
    if from_file is not None:
        return load_local(Path(from_file).expanduser())
    if lock is None:
        if not default_lock.is_file():
            raise UsageError(
                "no authoritative config: name one with --repo OWNER/NAME[@REV], --from FILE or "
                f"--lock FILE (the default {default_lock} does not exist here; "
                "`dflash-provision fetch` writes it)"
            )
        lock = default_lock
    return _from_lock(Path(lock), lock_repo)


def _from_repo(spec: str) -> LoadedConfig:
    parsed = parse_repo_spec(spec)
    if parsed is None:
        raise UsageError(f"--repo {spec!r}: expected OWNER/NAME or OWNER/NAME@REVISION")
    from dflash_provision import hub  # deferred: huggingface_hub is slow to import

    repo_id, revision = parsed
    fetched = hub.fetch_config(repo_id, revision=revision)
    return LoadedConfig(
        label=f"{repo_id}@{fetched.commit_sha[:12]}",
        data=fetched.data,
        commit_sha=fetched.commit_sha,
    )


def _from_lock(path: Path, repo_id: str | None) -> LoadedConfig:
    if not path.is_file():
        raise UsageError(f"--lock {path}: no such file")
    from dflash_provision.lockfile import load_locked_config

    fetched = load_locked_config(path, repo_id)
    return LoadedConfig(
        label=f"{fetched.repo_id}@{fetched.commit_sha[:12]} (from {path})",
        data=fetched.data,
        commit_sha=fetched.commit_sha,
    )
