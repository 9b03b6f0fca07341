"""Fetch one file (normally config.json) from the HuggingFace Hub, pinned to a commit sha.

Everything goes through ``huggingface_hub.hf_hub_download`` and its ordinary cache, so HF_TOKEN,
HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE behave exactly as they do for the library. Two things are
added on top of it:

- A fast failure when the Hub is down. After a failed HEAD with nothing cached, hf_hub_download
  retries with backoff (1+2+4+8+8 s, up to a 60 s timeout each; huggingface_hub 2.4
  file_download.py and utils/_http.py) and offers no setting to turn that off. So before
  downloading we make one HEAD ourselves with ``get_hf_file_metadata`` (which does not retry by
  default). If it cannot connect, we fall back to the cache only, which is what the library would
  end up doing, minus the ~23 s. The price is one extra HEAD per fetch that is not already pinned
  and cached.
- Errors become HubError with a distinct exit code and a one-line message naming repo, revision
  and file.

A pinned 40-hex revision already in the cache makes no request at all: hf_hub_download returns
the snapshot file before any network call in that case, and we skip our HEAD too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

from dflash_provision.errors import ExitCode, HubError, UsageError
from dflash_provision.netlookup import LookupTimedOut, lookup_within
from dflash_provision.source.hub_integrity import cached_etag, declared_mismatch, evict
from dflash_provision.source.local_file import read_config_file

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata
    from huggingface_hub.errors import HfHubHTTPError

# Held around every hf_hub_download (see _offline_while). Downloads are one per drafter source
# and command, so serialising them costs nothing measurable.
_LIBRARY_SWITCH = threading.Lock()
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class FetchedConfig:
    """The bytes of one Hub file plus what pins them (the commit) and proves them (sha256)."""

    repo_id: str
    requested_revision: str  # what the user asked for: a branch, tag or commit sha
    commit_sha: str  # always 40 hex
    filename: str
    path: Path  # the file in the HF cache (snapshots/<commit_sha>/<filename>)
    data: bytes
    sha256: str
    #: Why a branch or tag was taken from the cache instead of resolved on the Hub (the Hub
    #: could not be reached, or HF_HUB_OFFLINE); None when the Hub resolved it in this call
    #: or the revision is a commit sha (nothing to resolve).
    cache_fallback: str | None = None
    #: With ``cache_fallback``: since when the cache has had the revision at this commit (its
    #: ref file's time: huggingface_hub rewrites it only when the commit changes); None when
    #: unknown. The commit may be this old, or older than the Hub's by then.
    cached_since: datetime | None = None


def is_commit_sha(revision: str | None) -> bool:
    return revision is not None and COMMIT_SHA.fullmatch(revision) is not None


def fetch_config(
    repo_id: str,
    revision: str | None = None,
    filename: str = "config.json",
    *,
    token: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | None = None,
    timeout: float = 10.0,
) -> FetchedConfig:
    """Download (or take from the cache) ``filename`` of ``repo_id`` at ``revision``.

    Raises HubError (exit codes 10-15) for every way the Hub can say no, UsageError for a
    malformed repo id.
    """
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    from dflash_provision.source import hub_deadline

    requested = revision or DEFAULT_REVISION
    where = _Where(
        repo_id=repo_id,
        revision=requested,
        filename=filename,
        endpoint=(endpoint or constants.ENDPOINT).rstrip("/"),
        cache_dir=cache_dir or constants.HF_HUB_CACHE,
    )
    offline = constants.is_offline_mode()

    def download() -> tuple[str, HfFileMetadata | None, str | None]:
        """The cached file's path, what the Hub declared in our HEAD (None: not asked) and why
        the Hub could not be asked (None: it could, or it did not need to be)."""
        meta: HfFileMetadata | None = None
        unreachable: str | None = None  # why the Hub could not be asked, if it could not
        try:
            pinned_in_cache = is_commit_sha(requested) and isinstance(
                try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=requested),
                str,
            )
            try:
                if not offline and not pinned_in_cache:
                    meta, unreachable = _probe(where, token=token)
                cache_only = offline or unreachable is not None
                if cache_only:
                    hub_deadline.network_done()
                with _offline_while(cache_only):
                    path_str = hf_hub_download(
                        repo_id,
                        filename,
                        revision=requested,
                        token=token,
                        endpoint=endpoint,
                        cache_dir=cache_dir,
                        etag_timeout=_etag_timeout(cache_only),
                        local_files_only=cache_only,
                    )
            except Exception as exc:
                _raise_mapped(exc, where, offline=offline, unreachable=unreachable)
        except HFValidationError as exc:
            raise UsageError(f"{repo_id}: not a valid Hub repo id ({_first_line(exc)})") from None
        except ValueError as exc:  # e.g. a filename that climbs out of the repo ("../x")
            raise UsageError(f"{where}: {_first_line(exc)}") from None
        return path_str, meta, unreachable

    # One deadline for everything in download() (name lookup, HEADs, the body): --timeout bounds
    # the whole fetch, not each read, also a response whose headers arrive a byte at a time.
    try:
        path_str, meta, unreachable = hub_deadline.run_within(timeout, download)
    except hub_deadline.DeadlinePassed as exc:
        _raise_transfer_failure(exc, where)
        raise

    path = Path(str(path_str))
    commit_sha = _commit_from_snapshot_path(path, filename) or (meta.commit_hash if meta else None)
    if commit_sha is None:
        raise HubError(f"{where}: cannot tell which commit {path} belongs to")
    data = _read_cached(where, path)
    # The bytes must be what the Hub declared: in our HEAD when we asked it in this call, else
    # (pinned, offline, Hub unreachable) in the name of the cached blob, which is the ETag it
    # declared when the file was downloaded. A lock's sha256 is checked on top, by the lock.
    _check_declared(where, path, data, meta)
    fetched = FetchedConfig(
        repo_id=repo_id,
        requested_revision=requested,
        commit_sha=commit_sha,
        filename=filename,
        path=path,
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    if is_commit_sha(requested) or not (offline or unreachable):
        return fetched
    # A branch or tag the Hub did not resolve now: say so, and since when the cache has it.
    why = "HF_HUB_OFFLINE is set" if offline else f"the Hub could not be reached ({unreachable})"
    return replace(fetched, cache_fallback=why, cached_since=_ref_time(path, requested))


def _ref_time(snapshot_file: Path, revision: str) -> datetime | None:
    """When huggingface_hub last wrote ``refs/<revision>`` beside the snapshot (it rewrites it
    only when the revision resolves to another commit); None when there is no such file."""
    repo_dir = snapshot_file.parent
    while repo_dir.name != "snapshots" and repo_dir != repo_dir.parent:
        repo_dir = repo_dir.parent
    try:
        mtime = (repo_dir.parent / "refs" / revision).stat().st_mtime
    except (OSError, ValueError):
        return None
    return datetime.fromtimestamp(mtime, UTC)


REFUSED = "refused: not written, not recorded in the lock, not kept in the cache"


def raise_request_failure(
    exc: BaseException, repo_id: str, revision: str, what: str, *, endpoint: str | None = None
) -> NoReturn:
    """HubError for a failed Hub request other than a file download (``what`` names it, e.g.
    "(tree listing)"), mapped as fetch_config maps its own; anything unknown is re-raised."""
    from huggingface_hub import constants

    from dflash_provision.source.hub_deadline import DeadlinePassed

    where = _Where(
        repo_id=repo_id,
        revision=revision,
        filename=what,
        endpoint=(endpoint or constants.ENDPOINT).rstrip("/"),
        cache_dir=constants.HF_HUB_CACHE,
    )
    if isinstance(exc, DeadlinePassed):
        raise HubError(
            f"{where}: the Hub at {where.shown_endpoint} did not answer within "
            f"{exc.seconds:g} s (--timeout)",
            exit_code=ExitCode.HUB_UNREACHABLE,
        ) from None
    if isinstance(exc, _transport_error()):
        raise HubError(
            f"{where}: cannot reach the Hub at {where.shown_endpoint} ({_first_line(exc)})",
            exit_code=ExitCode.HUB_UNREACHABLE,
        ) from None
    if isinstance(exc, Exception):
        _raise_mapped(exc, where, offline=False, unreachable=None)
    raise exc


@dataclass(frozen=True)
class _Where:
    repo_id: str
    revision: str
    filename: str
    endpoint: str
    cache_dir: str

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision} {self.filename}"

    @property
    def shown_endpoint(self) -> str:
        """The endpoint as messages show it: ``user:token@`` in HF_ENDPOINT is never printed."""
        return redact_credentials(self.endpoint)


def redact_credentials(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``, wherever it appears in ``text``."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def _time_left() -> float:
    """Seconds left of fetch_config's deadline; DeadlinePassed when none are."""
    from dflash_provision.source import hub_deadline

    left = hub_deadline.remaining()
    assert left is not None  # only called inside fetch_config's deadline
    return left


def _etag_timeout(cache_only: bool) -> float:
    # A read from the cache alone makes no request: it needs no time left (and must not fail
    # because the HEAD that found the Hub unreachable used the whole budget).
    return 1.0 if cache_only else _time_left()


def _probe(where: _Where, *, token: str | None) -> tuple[HfFileMetadata | None, str | None]:
    """One HEAD without retries. Returns (what the Hub declared, None) or (None, why the Hub is
    unreachable).

    Definite answers from the Hub (not found, gated, ...) raise at once; a Hub that cannot be
    reached (or only answers with redirects) means "cache only", so hf_hub_download never
    enters its slow retry loop.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import FileMetadataError, HfHubHTTPError

    from dflash_provision.source.hub_deadline import DeadlinePassed

    url = hf_hub_url(
        where.repo_id, where.filename, revision=where.revision, endpoint=where.endpoint
    )
    try:
        # Rounded so a message says "within 2 s", not "within 1.99991 s".
        lookup_failure = _lookup_failure(url, round(_time_left(), 1) or 0.1)
        if lookup_failure is not None:
            return None, lookup_failure
        meta = get_hf_file_metadata(url, token=token, timeout=_time_left(), endpoint=where.endpoint)
    except DeadlinePassed as exc:
        return None, f"no answer {exc}"
    except _transport_error() as exc:
        return None, _first_line(exc) or type(exc).__name__
    except _redirect_loop() as exc:
        return None, f"redirect loop: {_first_line(exc)}"
    except FileMetadataError:
        return None, "it answered but does not look like a Hub (no X-Repo-Commit or ETag)"
    except HfHubHTTPError as exc:
        if _is_server_side(exc):
            return None, f"HTTP {_status(exc)}"
        _raise_mapped(exc, where, offline=False, unreachable=None)
    return meta, None


def _check_declared(where: _Where, path: Path, data: bytes, meta: HfFileMetadata | None) -> None:
    """HubError (exit 16) unless ``data`` is the file the Hub declared; bad bytes are evicted.

    The declaration is the name of the cached blob (huggingface_hub stores a download under
    the ETag the Hub gave it, so this also catches a cache file changed on disk, also when the
    Hub is not asked) and, when our HEAD (``meta``) was answered with that same ETag, the size
    it declared.
    """
    etag = cached_etag(path) or (meta.etag if meta else None)
    size = meta.size if meta and meta.etag == etag else None
    problem = declared_mismatch(data, etag, size)
    if problem is None:
        return
    evict(path)
    raise HubError(f"{where}: {problem}; {REFUSED}", exit_code=ExitCode.HUB_INTEGRITY)


def _read_cached(where: _Where, path: Path) -> bytes:
    """The cached file's bytes, read like every SOURCE: bounded (1 MiB) and never waiting on a
    FIFO. The cache is a directory anyone with the user's rights can change; an entry that is not
    a regular file of a config's size is refused (exit 16) and evicted, so the next fetch
    downloads it again."""
    try:
        return read_config_file(path)[1]
    except UsageError as exc:
        evict(path)
        raise HubError(
            f"{where}: cached copy {exc.message}; {REFUSED}", exit_code=ExitCode.HUB_INTEGRITY
        ) from None


@contextlib.contextmanager
def _offline_while(cache_only: bool) -> Iterator[None]:
    """Make huggingface_hub itself offline while it reads the cache for a Hub we could not reach.

    ``local_files_only`` stops the download, but not the user-agent's side request (once a day,
    ``{endpoint}/api/agent-harnesses``, 3 s timeout and an unbounded name lookup) that
    huggingface_hub 2.x makes while building the headers; it skips that when
    ``constants.HF_HUB_OFFLINE`` is set, which it reads at call time.
    """
    from huggingface_hub import constants

    # The switch is process-wide: a fleet loads several drafter sources in parallel threads, and
    # one of them must not see the library offline because another could not reach the Hub.
    with _LIBRARY_SWITCH:
        if not cache_only:
            yield
            return
        was = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            constants.HF_HUB_OFFLINE = was


def _lookup_failure(url: str, timeout: float) -> str | None:
    """Why the Hub's host name cannot be looked up within ``timeout``, or None when it can (or
    when a proxy from the environment will look it up instead, as the HTTP client then lets it).

    The HTTP client's timeout covers connecting and reading, not the name lookup before them: a
    DNS server that does not answer made ``--timeout 2`` take 20 s.
    """
    import urllib.request  # here: http.client, ssl and email are slow to import (pinned reads)

    parts = urlsplit(url)
    host = parts.hostname
    if host is None or (urllib.request.getproxies() and not urllib.request.proxy_bypass(host)):
        return None
    try:
        lookup_within(host, parts.port or (443 if parts.scheme == "https" else 80), timeout)
    except LookupTimedOut as exc:
        return f"cannot resolve {host}: {exc}"
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    return None


def _redirect_loop() -> type[Exception]:
    """The HTTP client's "too many redirects" (not a transport error, so caught by name)."""
    loop: type[Exception] = _http_client().TooManyRedirects
    return loop


def _transport_error() -> type[Exception]:
    """The HTTP client's "could not connect / no answer in time" base class."""
    error: type[Exception] = _http_client().TransportError
    return error


def _http_client() -> ModuleType:
    """huggingface_hub 2.x is built on httpx2, 1.x on httpx: whichever is installed."""
    try:
        import httpx2

        return httpx2
    except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
        import httpx  # type: ignore[import-not-found]

        return httpx  # type: ignore[no-any-return]


def _is_server_side(exc: HfHubHTTPError) -> bool:
    status = _status(exc) or 0
    return status >= 500 or status in (408, 429)


def _raise_mapped(
    exc: Exception, where: _Where, *, offline: bool, unreachable: str | None
) -> NoReturn:
    """Turn a huggingface_hub exception into HubError; re-raise anything unknown (a bug)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # Order matters: GatedRepoError is a RepositoryNotFoundError, LocalEntryNotFoundError an
    # EntryNotFoundError.
    if isinstance(exc, GatedRepoError):
        refused = _status(exc) == 403
        why = "the token sent was not granted access" if refused else "no token was sent"
        raise HubError(
            f"{where}: {where.repo_id} is gated and {why}; "
            "set HF_TOKEN to a token that has been granted access",
            exit_code=ExitCode.HUB_GATED,
        ) from None
    if isinstance(exc, RepositoryNotFoundError):
        raise HubError(
            f"{where}: repository {where.repo_id} not found at {where.shown_endpoint} "
            "(if it is private, set HF_TOKEN)",
            exit_code=ExitCode.HUB_REPO_NOT_FOUND,
        ) from None
    if isinstance(exc, RevisionNotFoundError):
        raise HubError(
            f"{where}: revision {where.revision!r} not found in {where.repo_id}",
            exit_code=ExitCode.HUB_REVISION_NOT_FOUND,
        ) from None
    if isinstance(exc, LocalEntryNotFoundError):
        if offline:
            raise HubError(
                f"{where}: HF_HUB_OFFLINE is set and the file is not in the cache "
                f"({where.cache_dir}); fetch it once online or unset HF_HUB_OFFLINE",
                exit_code=ExitCode.HUB_OFFLINE_NOT_CACHED,
            ) from None
        raise HubError(
            f"{where}: cannot reach the Hub at {where.shown_endpoint} "
            f"({unreachable or 'no answer'}) "
            f"and the file is not in the cache ({where.cache_dir}); check the network, "
            "HF_ENDPOINT and any proxy (HTTPS_PROXY), then run again: once fetched, the file "
            "is served from the cache while the Hub is down",
            exit_code=ExitCode.HUB_UNREACHABLE,
        ) from None
    if isinstance(exc, EntryNotFoundError):
        raise HubError(
            f"{where}: file {where.filename} not found in {where.repo_id} "
            f"at revision {where.revision}",
            exit_code=ExitCode.HUB_FILE_NOT_FOUND,
        ) from None
    if isinstance(exc, HfHubHTTPError):
        raise HubError(
            f"{where}: the Hub at {where.shown_endpoint} said: {_first_line(exc)}"
        ) from None
    _raise_transfer_failure(exc, where)
    raise exc


def _raise_transfer_failure(exc: Exception, where: _Where) -> None:
    """HubError for a download that started and could not end well; returns for anything else."""
    from dflash_provision.source.hub_deadline import DeadlinePassed

    if isinstance(exc, DeadlinePassed):
        raise HubError(
            f"{where}: the Hub at {where.shown_endpoint} did not send the file within "
            f"{exc.seconds:g} s (--timeout); nothing recorded",
            exit_code=ExitCode.HUB_UNREACHABLE,
        ) from None
    if isinstance(exc, _redirect_loop()):
        raise HubError(
            f"{where}: the Hub at {where.shown_endpoint} answers with a redirect loop "
            f"({_first_line(exc)}); nothing recorded",
            exit_code=ExitCode.HUB_UNREACHABLE,
        ) from None
    # huggingface_hub's own size check (the body's length against the declared size).
    sizes = _CONSISTENCY.search(str(exc)) if isinstance(exc, OSError) else None
    if sizes is not None:
        raise HubError(
            f"{where}: the Hub declared {sizes['declared']} bytes and sent {sizes['sent']}; "
            f"{REFUSED}",
            exit_code=ExitCode.HUB_INTEGRITY,
        ) from None


_CONSISTENCY = re.compile(r"should be of size (?P<declared>\d+) but has size (?P<sent>\d+)")


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _first_line(exc: BaseException) -> str:
    # Library messages quote URLs, which carry HF_ENDPOINT's credentials when it has some.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact_credentials(lines[0]) if lines else type(exc).__name__


def _commit_from_snapshot_path(path: Path, filename: str) -> str | None:
    """The cache keeps files at .../snapshots/<commit>/<filename>; read the commit back."""
    depth = len(PurePosixPath(filename).parts)
    snapshot_dir = path.parents[depth - 1]
    if snapshot_dir.parent.name == "snapshots" and is_commit_sha(snapshot_dir.name):
        return snapshot_dir.name
    return None


def pinned_from_cache(
    repo_id: str,
    commit_sha: str,
    filename: str,
    sha256: str,
    *,
    cache_dir: str | None = None,
    max_bytes: int = 1 << 20,
) -> FetchedConfig | None:
    """The file of a pinned commit straight from the HF cache, when it is there with exactly the
    expected sha256; None otherwise (the caller then goes through huggingface_hub).

    Importing huggingface_hub costs ~0.4 s, most of a second push's start-up. A lock entry names
    the commit and the sha256, so the bytes prove themselves: where they were found matters no
    more than it does for the library, which reads the same ``snapshots/<sha>/<file>``.
    """
    if not is_commit_sha(commit_sha) or "\\" in filename or ".." in PurePosixPath(filename).parts:
        return None
    path = _hub_cache_dir(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    path = path / "snapshots" / commit_sha / filename
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes or hashlib.sha256(data).hexdigest() != sha256:
        return None
    return FetchedConfig(repo_id, commit_sha, commit_sha, filename, path, data, sha256)


def _hub_cache_dir(cache_dir: str | None) -> Path:
    """huggingface_hub's cache directory, resolved from the same variables in the same order."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    home = os.environ.get("HF_HOME") or str(Path(xdg) / "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"
