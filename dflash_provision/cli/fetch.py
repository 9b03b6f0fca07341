"""``dflash-provision fetch``: download a drafter's config from the Hub, pinned, and lock it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dflash_provision.cli._json_document import echo_document
from dflash_provision.errors import UsageError
from dflash_provision.source import lockfile
from dflash_provision.source.lockfile import DEFAULT_LOCK_PATH

if TYPE_CHECKING:
    from dflash_provision.source.hub import FetchedConfig
    from dflash_provision.source.pinned_files import PinnedFile


@click.command(
    "fetch",
    help=(
        "Download REPO_ID's config.json from the Hub (REPO_ID may be owner/name@rev), record the "
        "commit sha and sha256 in the lock file, and optionally write the bytes to a file. "
        "Uses the HF cache; honours HF_TOKEN, HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE. When the "
        "Hub cannot be reached (or HF_HUB_OFFLINE is set), a branch or tag is taken from the "
        "cache: a warning says so, --json has resolved_on_hub false, and the lock entry keeps "
        "the time the cache got that commit, not now. With --all-files the lock also pins every "
        "file of that commit vLLM reads (config, generation config, safetensors shards and "
        "their index, mask_embedding.pt, ...): path, size and the hash the Hub declares, from "
        "the Hub's tree listing (no weights are downloaded); without REPO_ID, --all-files adds "
        "them for the commit each lock entry already pins."
    ),
)
@click.argument("repo_spec", metavar="REPO_ID", required=False)
@click.option("--revision", "-r", help="Branch, tag or commit sha (default: main).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the config bytes to FILE (atomically).",
)
@click.option("--filename", default="config.json", show_default=True, help="File in the repo.")
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_LOCK_PATH,
    show_default=True,
    help="Lock file to record the pinned commit in.",
)
@click.option("--no-lock", is_flag=True, help="Do not touch the lock file.")
@click.option(
    "--all-files",
    is_flag=True,
    help="Also pin every file of the commit that vLLM reads (see docs/pinned-files.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the whole fetch may take: name lookup, metadata and download together.",
)
def command(
    repo_spec: str | None,
    revision: str | None,
    output: Path | None,
    filename: str,
    lock_path: Path,
    no_lock: bool,
    all_files: bool,
    as_json: bool,
    timeout: float,
) -> None:
    from dflash_provision.source import hub, lockfile
    from dflash_provision.source.authority import RepoRef

    if repo_spec is None:
        if not all_files:
            raise click.UsageError(  # click's own words, as for every missing argument
                "Missing argument 'REPO_ID'. (Or --all-files, to pin the files of the lock.)"
            )
        if revision or output or no_lock:
            raise UsageError("--all-files without REPO_ID takes no --revision, --output, --no-lock")
        _pin_locked_commits(lock_path, as_json, timeout)
        return
    parsed = RepoRef.parse(repo_spec)
    if parsed is None:
        raise UsageError(f"{repo_spec}: not a Hub repo id (expected owner/name or owner/name@rev)")
    repo_id, spec_revision = parsed.repo_id, parsed.revision
    if revision and spec_revision and revision != spec_revision:
        raise UsageError(f"{repo_spec}: conflicts with --revision {revision}; give one revision")

    fetched = hub.fetch_config(
        repo_id, revision or spec_revision, filename=filename, timeout=timeout
    )
    if output is not None:
        try:
            lockfile.write_atomic(output, fetched.data)
        except OSError as exc:
            raise UsageError(f"{output}: cannot write ({exc.strerror or exc})") from None
    if fetched.cache_fallback is not None:
        click.echo(f"warning: {_fallback_line(fetched)}", err=True)
    if not no_lock:
        # From the cache, the entry is as old as the cache's knowledge, not "fetched now".
        when = fetched.cached_since if fetched.cache_fallback is not None else None
        try:
            lockfile.upsert_lock(lock_path, lockfile.entry_from_fetched(fetched, fetched_at=when))
        except OSError as exc:
            raise UsageError(
                f"{lock_path}: cannot write lock file ({exc.strerror or exc})"
            ) from None

    result: dict[str, Any] = {
        "repo_id": fetched.repo_id,
        "revision": fetched.requested_revision,
        "commit_sha": fetched.commit_sha,
        "filename": fetched.filename,
        "sha256": fetched.sha256,
        "size": len(fetched.data),
        "cached_path": str(fetched.path),
        "output": str(output) if output is not None else None,
        "lock": None if no_lock else str(lock_path),
        # False: the revision was taken from the cache (see cache_fallback), not resolved now.
        "resolved_on_hub": fetched.cache_fallback is None,
        "cache_fallback": fetched.cache_fallback,
        "cached_since": _iso(fetched.cached_since),
    }
    if all_files:
        pinned = _pin_files(fetched.repo_id, fetched.commit_sha, None if no_lock else lock_path,
                            timeout)  # fmt: skip
        result["files"] = [f.to_dict() for f in pinned]
    if as_json:
        echo_document(result)
        return
    click.echo(f"fetched {fetched.repo_id} {fetched.filename} ({len(fetched.data)} bytes)")
    how = " (from the cache, not resolved now)" if fetched.cache_fallback is not None else ""
    click.echo(f"  revision  {fetched.requested_revision} -> {fetched.commit_sha}{how}")
    click.echo(f"  sha256    {fetched.sha256}")
    click.echo(f"  cached    {fetched.path}")
    if output is not None:
        click.echo(f"  written   {output}")
    click.echo(f"  lock      {'(not recorded: --no-lock)' if no_lock else lock_path}")
    if all_files:
        _echo_files(result["files"])


def _pin_files(
    repo_id: str, commit_sha: str, lock_path: Path | None, timeout: float
) -> list[PinnedFile]:
    """The files of the commit vLLM reads, listed by the Hub; recorded in the lock when given."""
    from dflash_provision.source import hub_tree, lockfile

    pinned = hub_tree.list_commit_files(repo_id, commit_sha, timeout=timeout)
    if lock_path is not None:
        try:
            lockfile.upsert_pinned_files(lock_path, repo_id, pinned)
        except OSError as exc:
            raise UsageError(
                f"{lock_path}: cannot write lock file ({exc.strerror or exc})"
            ) from None
    return pinned


def _pin_locked_commits(lock_path: Path, as_json: bool, timeout: float) -> None:
    """``fetch --all-files`` without REPO_ID: the files of each config the lock pins, at the
    commit it pins (the config entry is not touched, the commit does not move)."""
    entries = [e for e in lockfile.read_lock(lock_path) if e.filename == "config.json"]
    if not entries:
        raise UsageError(f"{lock_path}: no config.json entry to pin the files of")
    results: list[dict[str, Any]] = []
    for entry in entries:
        pinned = _pin_files(entry.repo_id, entry.commit_sha, lock_path, timeout)
        results.append(
            {
                "repo_id": entry.repo_id,
                "commit_sha": entry.commit_sha,
                "files": [f.to_dict() for f in pinned],
            }
        )
    if as_json:
        echo_document({"lock": str(lock_path), "pinned": results})
        return
    for result in results:
        click.echo(f"pinned {result['repo_id']}@{result['commit_sha']} in {lock_path}")
        _echo_files(result["files"])


def _echo_files(files: list[dict[str, Any]]) -> None:
    total = sum(int(f["size"]) for f in files)
    click.echo(f"  files     {len(files)} pinned ({total} bytes), no weights downloaded:")
    for f in files:
        click.echo(f"    {f['path']}  {f['size']} bytes  {f['algorithm']} {f['digest']}")


def _iso(when: datetime | None) -> str | None:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when is not None else None


def _fallback_line(fetched: FetchedConfig) -> str:
    """The one line that says a branch or tag was not resolved on the Hub in this run."""
    since = f" since {_iso(fetched.cached_since)}" if fetched.cached_since else ""
    return (
        f"{fetched.cache_fallback}: {fetched.repo_id}@{fetched.requested_revision} taken from "
        f"the cache, where it has been {fetched.commit_sha[:12]}{since}; the Hub may have moved "
        f"it on. Fetch again when the Hub can be reached, or pin --revision to a commit sha"
    )
