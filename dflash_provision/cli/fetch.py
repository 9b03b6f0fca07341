"""``dflash-provision fetch``: download a drafter's config from the Hub, pinned, and lock it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dflash_provision.errors import UsageError
from dflash_provision.source.lockfile import DEFAULT_LOCK_PATH

if TYPE_CHECKING:
    from dflash_provision.source.hub import FetchedConfig


@click.command(
    "fetch",
    help=(
        "Download REPO_ID's config.json from the Hub (REPO_ID may be owner/name@rev), record the "
        "commit sha and sha256 in the lock file, and optionally write the bytes to a file. "
        "Uses the HF cache; honours HF_TOKEN, HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE. When the "
        "Hub cannot be reached (or HF_HUB_OFFLINE is set), a branch or tag is taken from the "
        "cache: a warning says so, --json has resolved_on_hub false, and the lock entry keeps "
        "the time the cache got that commit, not now."
    ),
)
@click.argument("repo_spec", metavar="REPO_ID")
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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the whole fetch may take: name lookup, metadata and download together.",
)
def command(
    repo_spec: str,
    revision: str | None,
    output: Path | None,
    filename: str,
    lock_path: Path,
    no_lock: bool,
    as_json: bool,
    timeout: float,
) -> None:
    from dflash_provision.source import hub, lockfile
    from dflash_provision.source.authority import RepoRef

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

    result = {
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
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"fetched {fetched.repo_id} {fetched.filename} ({len(fetched.data)} bytes)")
    how = " (from the cache, not resolved now)" if fetched.cache_fallback is not None else ""
    click.echo(f"  revision  {fetched.requested_revision} -> {fetched.commit_sha}{how}")
    click.echo(f"  sha256    {fetched.sha256}")
    click.echo(f"  cached    {fetched.path}")
    if output is not None:
        click.echo(f"  written   {output}")
    click.echo(f"  lock      {'(not recorded: --no-lock)' if no_lock else lock_path}")


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
