"""The files of a Hub commit that vLLM reads, from the Hub's tree listing: path, size and the
hash it declares, without downloading any of them.

``HfApi.list_repo_tree`` (``GET /api/models/{repo}/tree/{commit}``, huggingface_hub 2.4
hf_api.py) at the pinned commit, top level only (vLLM reads no subdirectory), not expanded: the
``lfs`` object (``oid`` = the content's sha256, ``size``) and the git ``oid`` are in every
entry; ``expand`` adds only the last commit and the security scan, and cuts the page size from
1000 entries to 50. The listing is untrusted input: every entry is checked (names, sizes, hex
digests) before it is pinned, and at most MAX_ENTRIES are read.
"""

from __future__ import annotations

from typing import Any

from dflash_provision.errors import ExitCode, HubError
from dflash_provision.source import hub_deadline
from dflash_provision.source.hub import raise_request_failure
from dflash_provision.source.pinned_files import (
    GIT_BLOB,
    SHA256,
    PinnedFile,
    parse_pinned,
    vllm_reads,
)

MAX_ENTRIES = 10_000  # the largest model repos have a few hundred files at the top level


def list_commit_files(
    repo_id: str,
    commit_sha: str,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    timeout: float = 10.0,
) -> list[PinnedFile]:
    """The files of ``repo_id`` at ``commit_sha`` that vLLM reads (see pinned_files), sorted.

    HubError (exit 10-16) for every way the Hub can say no or not answer in ``timeout`` s.
    """
    from huggingface_hub import HfApi, constants

    where = f"{repo_id}@{commit_sha} (tree listing)"
    if constants.is_offline_mode():
        raise HubError(
            f"{where}: HF_HUB_OFFLINE is set and the files of a commit are listed by the Hub; "
            "unset it to pin the drafter's files",
            exit_code=ExitCode.HUB_OFFLINE_NOT_CACHED,
        )
    api = HfApi(endpoint=endpoint, token=token)

    def listing() -> list[Any]:
        entries: list[Any] = []
        for item in api.list_repo_tree(repo_id, revision=commit_sha, recursive=False):
            entries.append(item)
            if len(entries) > MAX_ENTRIES:
                break
        return entries

    try:
        entries = hub_deadline.run_within(timeout, listing)
    except (KeyError, TypeError, ValueError) as exc:  # an entry the client could not read
        raise HubError(
            f"{where}: the Hub's listing is malformed ({type(exc).__name__}: {exc})"[:300],
            exit_code=ExitCode.HUB_INTEGRITY,
        ) from None
    except Exception as exc:
        raise_request_failure(exc, repo_id, commit_sha, "(tree listing)", endpoint=endpoint)
    if len(entries) > MAX_ENTRIES:
        raise HubError(
            f"{where}: the Hub lists more than {MAX_ENTRIES} entries; refused",
            exit_code=ExitCode.HUB_INTEGRITY,
        )
    return pinned_from_listing(repo_id, commit_sha, entries, where=where)


def pinned_from_listing(
    repo_id: str, commit_sha: str, entries: list[Any], *, where: str
) -> list[PinnedFile]:
    """The entries vLLM reads, as pinned files; HubError (16) for an entry that is malformed."""
    from huggingface_hub.hf_api import RepoFile

    files = [e for e in entries if isinstance(e, RepoFile)]
    names = [f.path for f in files]
    pinned: list[PinnedFile] = []
    for item in files:
        if not vllm_reads(item.path, names):
            continue
        lfs = item.lfs
        raw = {
            "repo_id": repo_id,
            "commit_sha": commit_sha,
            "path": item.path,
            "size": item.size,
            "algorithm": SHA256 if lfs is not None else GIT_BLOB,
            "digest": (lfs.sha256 if lfs is not None else item.blob_id),
        }
        if lfs is not None and lfs.size != item.size:
            raise HubError(
                f"{where}: {item.path}: the Hub lists size {item.size} and LFS size {lfs.size}",
                exit_code=ExitCode.HUB_INTEGRITY,
            )
        try:
            pinned.append(parse_pinned(raw, item.path))
        except ValueError as exc:
            raise HubError(
                f"{where}: the Hub's listing is malformed: {exc}", exit_code=ExitCode.HUB_INTEGRITY
            ) from None
    return sorted(pinned, key=lambda f: f.path)
