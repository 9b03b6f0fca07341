"""The authoritative config: which bytes push / verify / rollback / audit / repair compare with.

One model for every caller. A ``SourceSpec`` says where the bytes come from, exactly one of:

    repo     OWNER/NAME[@REV] on the Hub (pinned to the commit it resolves to)
    from     a local file (or a directory holding config.json)
    lock     the entry pinned in a lock file, served offline from the HF cache
    (none)   ./dflash.lock when it exists (the "default lock")

The CLI, our inventory, the Ansible inventory and the fleet engine only build a ``SourceSpec``;
``SourceSpec.load()`` turns it into an ``Authority``: the bytes, their sha256, a label people
recognise, the commit when the Hub pinned one, and the document parsed on first use.

The bytes are taken exactly as they come: push writes them unchanged, so the file on the host
has the same sha256 as the Hub file and the lock entry.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ConfigInvalid, UsageError
from dflash_provision.formats import strict_json
from dflash_provision.source.local_file import read_config_file
from dflash_provision.source.lockfile import (
    DEFAULT_LOCK_PATH,
    load_locked_config,
    read_pinned_files,
)

if TYPE_CHECKING:
    from dflash_provision.source.pinned_files import PinnedFile

# The Hub's repo id grammar (namespace/name), optionally pinned with @revision.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?:@(?P<rev>[^\s@]+))?$")

#: The kinds of source, in the order inventories name them.
SOURCE_KINDS = ("repo", "lock", "from")


@dataclass(frozen=True)
class RepoRef:
    """A Hub repo id and the revision asked for (a branch, tag or commit sha; None: main)."""

    repo_id: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> RepoRef | None:
        """``owner/name`` or ``owner/name@revision``; None when ``text`` is not a repo id."""
        match = _REPO_ID.match(text)
        if match is None:
            return None
        return cls(match.group("repo"), match.group("rev"))

    def at(self, revision: str | None) -> RepoRef:
        """The same repo at ``revision`` when one is given (it beats an ``@rev`` in the id)."""
        return replace(self, revision=revision) if revision else self

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


class SourceConflict(UsageError):
    """More than one source named; ``given`` lists their kinds (see SOURCE_KINDS) so that an
    inventory can word the error with its own field names and line."""

    def __init__(self, given: tuple[str, ...]) -> None:
        flags = {"repo": "--repo", "from": "--from", "lock": "--lock"}
        named = [flags[kind] for kind in ("repo", "from", "lock") if kind in given]
        super().__init__(f"give one authoritative source, not {' and '.join(named)}")
        self.given = given


def check_one_source(repo: object, lock: object, from_file: object) -> None:
    """The one-source rule, for every way of naming a source: SourceConflict for two or more."""
    values = (repo, lock, from_file)
    given = tuple(
        kind for kind, value in zip(SOURCE_KINDS, values, strict=True) if value is not None
    )
    if len(given) > 1:
        raise SourceConflict(given)


@dataclass(frozen=True)
class SourceSpec:
    """Where the authoritative config comes from: at most one of repo, from_file, lock (none:
    the default lock). ``lock_repo`` picks the entry when a lock records several repos."""

    repo: RepoRef | None = None
    from_file: str | None = None
    lock: str | None = None
    lock_repo: str | None = None

    def __post_init__(self) -> None:
        check_one_source(self.repo, self.lock, self.from_file)

    @classmethod
    def from_options(
        cls,
        repo: str | None = None,
        from_file: str | None = None,
        lock: str | None = None,
        *,
        lock_repo: str | None = None,
        revision: str | None = None,
    ) -> SourceSpec:
        """The spec the command-line options name; ``revision`` (fleet commands' --revision)
        beats an ``@rev`` in ``repo``. UsageError for two sources or a malformed repo id."""
        check_one_source(repo, lock, from_file)  # before the repo id is judged
        ref = None
        if repo is not None:
            ref = RepoRef.parse(repo)
            if ref is None:
                raise UsageError(f"--repo {repo!r}: expected OWNER/NAME or OWNER/NAME@REVISION")
        elif revision:
            raise UsageError("--revision needs --repo")
        return cls(ref.at(revision) if ref else None, from_file, lock, lock_repo)

    @property
    def is_set(self) -> bool:
        """False for the default lock (nothing named)."""
        return bool(self.repo or self.lock or self.from_file)

    def absolute(self) -> SourceSpec:
        """File paths made absolute, so the spec means the same from any directory."""
        return replace(
            self,
            lock=str(Path(self.lock).resolve()) if self.lock else None,
            from_file=str(Path(self.from_file).resolve()) if self.from_file else None,
        )

    def or_default_lock(self, default_lock: Path = DEFAULT_LOCK_PATH) -> SourceSpec:
        """This spec, or the default lock when nothing is named; UsageError if that is absent."""
        if self.is_set:
            return self
        if not default_lock.is_file():
            raise UsageError(
                "no authoritative config: name one with --repo OWNER/NAME[@REV], --from FILE or "
                f"--lock FILE (the default {default_lock} does not exist here; "
                "`dflash-provision fetch` writes it)"
            )
        return replace(self, lock=str(default_lock))

    def push_options(self) -> list[str]:
        """The push options that name the same source (for the fix commands reports suggest)."""
        options: list[str] = []
        for flag, value in (
            ("--repo", str(self.repo) if self.repo else None),
            ("--from", self.from_file),
            ("--lock", self.lock),
            ("--lock-repo", self.lock_repo),
        ):
            if value is not None:
                options += [flag, value]
        return options

    def load(self, default_lock: Path = DEFAULT_LOCK_PATH) -> Authority:
        """The authoritative config this spec names (see the module docstring)."""
        spec = self.or_default_lock(default_lock)
        if spec.repo is not None:
            return load_repo(spec.repo)
        if spec.from_file is not None:
            return load_local(Path(spec.from_file).expanduser())
        assert spec.lock is not None  # or_default_lock named one
        return _load_lock(Path(spec.lock), spec.lock_repo)


@dataclass(frozen=True)
class Authority:
    """Config bytes and where they came from: a path, "repo@sha", "host:/path" (``label``)."""

    label: str
    data: bytes
    commit_sha: str | None = None  # set for Hub and lock sources
    # A lock's other files of that commit (``fetch --all-files``): launch's pre-flight,
    # runtime-check's stage a, doctor and rollout's pre-flight check them where they lie.
    # Empty for every other source, and for a lock of the config alone.
    pinned_files: tuple[PinnedFile, ...] = ()

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def document(self) -> Any:
        """The config parsed strictly (ConfigInvalid when it does not parse)."""
        try:
            return strict_json.loads(self.data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigInvalid(
                f"{self.label}: the authoritative config is not valid JSON ({exc})"
            ) from None


def load_local(path: Path) -> Authority:
    """A local config file, or ``config.json`` inside a directory (read bounded, see local_file)."""
    file_path, data = read_config_file(path)
    return Authority(label=str(file_path), data=data)


def load_repo(ref: RepoRef) -> Authority:
    """The config of a Hub repo at the commit ``ref.revision`` resolves to."""
    from dflash_provision.source import hub  # deferred: huggingface_hub is slow to import

    fetched = hub.fetch_config(ref.repo_id, revision=ref.revision)
    # A branch or tag (or no revision: main) is resolved now; the label says to which commit,
    # the same way for --repo and an inventory's repo, so a moving branch is never silent.
    resolved = "" if hub.is_commit_sha(ref.revision) else f" ({fetched.requested_revision})"
    if fetched.cache_fallback is not None:  # not resolved now: the label must not hide it
        resolved = f" ({fetched.requested_revision} as cached: {fetched.cache_fallback})"
    return Authority(
        label=f"{ref.repo_id}@{fetched.commit_sha[:12]}{resolved}",
        data=fetched.data,
        commit_sha=fetched.commit_sha,
    )


def _load_lock(path: Path, repo_id: str | None) -> Authority:
    if not path.is_file():
        raise UsageError(f"--lock {path}: no such file")
    fetched = load_locked_config(path, repo_id)
    pinned = tuple(
        f
        for f in read_pinned_files(path)
        if f.repo_id == fetched.repo_id and f.commit_sha == fetched.commit_sha
    )
    return Authority(
        label=f"{fetched.repo_id}@{fetched.commit_sha[:12]} (from {path})",
        data=fetched.data,
        commit_sha=fetched.commit_sha,
        pinned_files=pinned,
    )
