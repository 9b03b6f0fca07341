"""The one judge of a drafter directory's files against the files a lock pins (``--all-files``),
and what each command makes of its verdict: the companion of file_status.py, which judges
``config.json`` alone.

Each pinned file gets one :class:`FileVerdict`; a name vLLM would read that the commit does not
have is ``stray``. The directory's :class:`FilesStatus` follows from them: any wrong file makes
it ``drifted`` (exit 4, as a drifted config), a file this login cannot read ``permission_denied``
(7), a file that could not be hashed in time (or changed while it was hashed) ``inconclusive``
(26): a check that cannot tell never passes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.host_state.file_status import Command
from dflash_provision.source.pinned_files import GIT_BLOB, vllm_reads

if TYPE_CHECKING:
    from dflash_provision.remote.files_read import FileFacts, FilesRead
    from dflash_provision.source.pinned_files import PinnedFile


class FileVerdict(enum.StrEnum):
    """One file's verdict (the values are the --json words)."""

    PROVED = "proved"  # hashed on the host in this check: the pinned hash
    UNCHANGED = "unchanged"  # the identity a recorded proof hashed: relied on, not hashed again
    MISSING = "missing"
    WRONG_SIZE = "wrong_size"  # a truncated or overlong file: not hashed
    WRONG_BYTES = "wrong_bytes"  # the pinned size, another hash (e.g. another revision's shard)
    SYMLINK_OUTSIDE = "symlink_outside"  # a link out of the directory: refused, not followed
    NOT_REGULAR = "not_regular"  # a directory, FIFO or device under the name
    STRAY = "stray"  # vLLM would read it, the pinned commit does not have it
    UNREADABLE = "unreadable"  # this login cannot read it
    NOT_CHECKED = "not_checked"  # cannot tell: the deadline, a change while hashing, a failure


GOOD = frozenset({FileVerdict.PROVED, FileVerdict.UNCHANGED})
WRONG = frozenset(
    {
        FileVerdict.MISSING,
        FileVerdict.WRONG_SIZE,
        FileVerdict.WRONG_BYTES,
        FileVerdict.SYMLINK_OUTSIDE,
        FileVerdict.NOT_REGULAR,
        FileVerdict.STRAY,
    }
)


class FilesStatus(enum.StrEnum):
    """The directory's status as a whole."""

    IN_SYNC = "in_sync"  # every pinned file proved (or unchanged since its proof), no stray
    DRIFTED = "drifted"  # at least one file wrong, missing or stray
    PERMISSION_DENIED = "permission_denied"  # none wrong, one or more could not be read
    INCONCLUSIVE = "inconclusive"  # none wrong, one or more could not be told


_ROW: dict[FilesStatus, ExitCode] = {
    FilesStatus.IN_SYNC: ExitCode.OK,
    FilesStatus.DRIFTED: ExitCode.DRIFT,
    FilesStatus.PERMISSION_DENIED: ExitCode.REMOTE_FAILED,
    FilesStatus.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
}
#: command -> directory status -> exit code (audit: a host exits as `verify` of it would).
#: launch refuses with the same codes before anything starts or stops (rollout's pre-flight
#: takes launch's row: any code but 0 refuses the rollout, 31); runtime-check's row is stage
#: a's: a wrong or unreadable file fails it (24), one that cannot be told leaves it
#: inconclusive (26), as the config's own row in file_status.py.
EXIT_CODE: Mapping[Command, Mapping[FilesStatus, ExitCode]] = {
    Command.VERIFY: _ROW,
    Command.AUDIT: _ROW,
    Command.LAUNCH: _ROW,
    Command.RUNTIME_CHECK: {
        FilesStatus.IN_SYNC: ExitCode.OK,
        FilesStatus.DRIFTED: ExitCode.RUNTIME_CHECK_FAILED,
        FilesStatus.PERMISSION_DENIED: ExitCode.RUNTIME_CHECK_FAILED,
        FilesStatus.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
    },
}
# Of the files' codes of many hosts, the one reported: a known-wrong file first (as audit's
# roll-up), then a file that could not be read, then one that could not be told.
_PRECEDENCE = (ExitCode.DRIFT, ExitCode.REMOTE_FAILED, ExitCode.INCONCLUSIVE)


def fleet_files_exit(codes: Iterable[ExitCode]) -> ExitCode:
    """The files' code of a fleet: the first of DRIFT, 7, 26 that a host has (0 if none)."""
    present = set(codes)
    return next((code for code in _PRECEDENCE if code in present), ExitCode.OK)


def combined_exit(config: ExitCode, files: ExitCode) -> ExitCode:
    """The one code of the config's verdict and the files' (a host's, or a fleet's roll-ups):
    drift in either first (the more urgent news), then the config's failure to be read
    (the files were then not read either), then the files' own."""
    if ExitCode.DRIFT in (config, files):
        return ExitCode.DRIFT
    return config if config is not ExitCode.OK else files


@dataclass(frozen=True)
class FileJudgement:
    name: str
    verdict: FileVerdict
    detail: str
    pinned: PinnedFile | None = None  # None for a stray
    size: int | None = None  # found on the host
    digest: str | None = None  # computed on the host
    relied_on: str | None = None  # with UNCHANGED: when the proof relied on was recorded

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "pinned": (
                None
                if self.pinned is None
                else {
                    "size": self.pinned.size,
                    "algorithm": self.pinned.algorithm,
                    "digest": self.pinned.digest,
                }
            ),
            "size": self.size,
            "digest": self.digest,
            "hashed_on_host": self.verdict is not FileVerdict.UNCHANGED and self.digest is not None,
            "relied_on_proof_of": self.relied_on,
        }


@dataclass
class FilesJudgement:
    status: FilesStatus
    detail: str
    files: list[FileJudgement] = field(default_factory=list)
    where: str = ""

    def exit_code(self, command: Command) -> ExitCode:
        return EXIT_CODE[command][self.status]

    @property
    def problems(self) -> list[FileJudgement]:
        return [f for f in self.files if f.verdict not in GOOD]

    @property
    def relied(self) -> list[FileJudgement]:
        return [f for f in self.files if f.verdict is FileVerdict.UNCHANGED]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "detail": self.detail,
            "directory": self.where,
            "files": [f.to_dict() for f in self.files],
        }


_STRAY = "vLLM would load it; the pinned commit has no such file"


def judge_files(
    pinned: list[PinnedFile], read: FilesRead, relied_on: Mapping[str, str] | None = None
) -> FilesJudgement:
    """The verdict of each pinned file and each stray, and the directory's status.
    ``relied_on``: name -> when the proof whose identity was sent to the host was recorded."""
    relied_on = relied_on or {}
    if read.dir_state != "ok":
        return _no_directory(pinned, read)
    files = [_judge_one(p, read.facts.get(p.path), read, relied_on) for p in pinned]
    names = {p.path for p in pinned}
    files += [
        FileJudgement(name, FileVerdict.STRAY, _STRAY)
        for name in read.present
        if name not in names and vllm_reads(name, read.present)
    ]
    files += [
        FileJudgement("(a name with a line break)", FileVerdict.STRAY, _STRAY)
        for _ in range(read.odd_present)
    ]
    if read.too_many_present:
        files.append(
            FileJudgement(
                "(more names)",
                FileVerdict.NOT_CHECKED,
                "cannot tell: the directory holds more names vLLM could read than were listed",
            )
        )
    verdicts = {f.verdict for f in files}
    if verdicts & WRONG:
        status = FilesStatus.DRIFTED
    elif FileVerdict.UNREADABLE in verdicts:
        status = FilesStatus.PERMISSION_DENIED
    elif FileVerdict.NOT_CHECKED in verdicts:
        status = FilesStatus.INCONCLUSIVE
    else:
        status = FilesStatus.IN_SYNC
    return FilesJudgement(status, _summary(status, files), files, read.where)


def _no_directory(pinned: list[PinnedFile], read: FilesRead) -> FilesJudgement:
    if read.dir_state == "permission-denied":
        files = [
            FileJudgement(p.path, FileVerdict.UNREADABLE, "the directory cannot be entered", p)
            for p in pinned
        ]
        return FilesJudgement(
            FilesStatus.PERMISSION_DENIED, f"{read.where}: cannot be entered", files, read.where
        )
    why = "is not a directory" if read.dir_state == "not-a-directory" else "does not exist"
    files = [FileJudgement(p.path, FileVerdict.MISSING, f"the directory {why}", p) for p in pinned]
    return FilesJudgement(FilesStatus.DRIFTED, f"{read.where}: {why}", files, read.where)


def _judge_one(
    pinned: PinnedFile, facts: FileFacts | None, read: FilesRead, relied_on: Mapping[str, str]
) -> FileJudgement:
    def verdict(kind: FileVerdict, detail: str) -> FileJudgement:
        size = facts.size if facts else None
        digest = facts.digest if facts else None
        return FileJudgement(pinned.path, kind, detail, pinned, size, digest)

    if facts is None:
        if read.cut_off and read.hashing == pinned.path:
            why = "the deadline (--command-timeout) passed while it was hashed"
        elif read.cut_off:
            why = "the check ended before this file (--command-timeout)"
        else:
            why = "the host said nothing of it"
        return verdict(FileVerdict.NOT_CHECKED, f"cannot tell: {why}")
    simple = {
        "missing": (FileVerdict.MISSING, "no such file"),
        "symlink-outside": (
            FileVerdict.SYMLINK_OUTSIDE,
            "a symlink that points outside the directory: refused, not followed",
        ),
        "not-regular": (FileVerdict.NOT_REGULAR, "not a regular file"),
        "unreadable": (FileVerdict.UNREADABLE, "not readable by this login"),
        "timeout": (
            FileVerdict.NOT_CHECKED,
            "cannot tell: too near the deadline to hash it (--command-timeout)",
        ),
        "changed": (FileVerdict.NOT_CHECKED, "cannot tell: it changed while it was hashed"),
        "hash-failed": (FileVerdict.NOT_CHECKED, "cannot tell: hashing it failed on the host"),
    }
    if facts.state in simple:
        kind, detail = simple[facts.state]
        return verdict(kind, detail)
    if facts.state == "size":
        return verdict(
            FileVerdict.WRONG_SIZE, f"{facts.size} bytes, the pinned commit's has {pinned.size}"
        )
    if facts.state == "same":
        when = relied_on.get(pinned.path, "an earlier check")
        return FileJudgement(
            pinned.path,
            FileVerdict.UNCHANGED,
            f"not hashed again: unchanged (device, inode, size, mtime, ctime) since the proof "
            f"of {when}",
            pinned,
            facts.size,
            pinned.digest,
            when,
        )
    what = "git blob id" if pinned.algorithm == GIT_BLOB else "sha256"
    if facts.digest == pinned.digest:
        return verdict(FileVerdict.PROVED, f"{what} computed on the host matches the pin")
    return verdict(
        FileVerdict.WRONG_BYTES,
        f"other bytes: {what} {(facts.digest or '?')[:12]}…, pinned {pinned.digest[:12]}…",
    )


def _summary(status: FilesStatus, files: list[FileJudgement]) -> str:
    bad = [f for f in files if f.verdict not in GOOD]
    relied = sum(1 for f in files if f.verdict is FileVerdict.UNCHANGED)
    if status is FilesStatus.IN_SYNC:
        proved = len(files) - relied
        tail = f", {relied} unchanged since a recorded proof (not hashed again)" if relied else ""
        return f"{len(files)} pinned files in place: {proved} hashed on the host{tail}"
    head = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{head.name}: {head.verdict.value}: {head.detail}{more}"
