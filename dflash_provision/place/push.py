"""Push, verify and roll back one target's config. Core logic: returns values, never prints.

push    validate the authoritative bytes → (dry run: one read exec, diff, stop) → one write exec
        (scripts/write.sh: lock, temp file, verify, fsync, backup, rename, fsync dir, then the
        file read back by its path and the old bytes) → the read-back compared with what was
        meant, bytes and parsed JSON (other bytes: one more exec describes what is there).
verify  one read exec, judged against the authority (file_status.judge).
rollback  one exec to list backups, one to read the chosen backup, then the same write protocol
        (the current file becomes a backup too) and the same read-back.

Connection-level failures (unreachable, auth, timeout, container down) propagate as the
transport's DflashProvisionError; everything a reachable host can report is a result value.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import (
    ConfigInvalid,
    DflashProvisionError,
    ExitCode,
    UsageError,
)
from dflash_provision.host_state.file_status import EXIT_CODE, Command, HostStatus, judge
from dflash_provision.remote.ops import (
    Backup,
    ReadStatus,
    RemoteRead,
    WriteOutcome,
    WriteStatus,
    list_remote_backups,
    read_backup,
    read_remote_config,
)
from dflash_provision.remote.proof import WriteOptions, WriteProof, write_and_prove
from dflash_provision.remote.settle import Verdict
from dflash_provision.source.authority import Authority
from dflash_provision.target import CONFIG_FILENAME
from dflash_provision.transport.base import Transport
from dflash_provision.validation.diff import ConfigDiff, config_diff
from dflash_provision.validation.validate import validate_config

if TYPE_CHECKING:
    from dflash_provision.history.store import Recording
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.validation.findings import ValidationReport

NOT_APPLIED_MESSAGE = "write did not take effect"
REPLACED_MESSAGE = "replaced by a later write"
CHANGED_UNDER_MESSAGE = "changed by another writer before its read-back"
UNKNOWN_MESSAGE = "outcome unknown"
_DEFAULT_WRITE = WriteOptions()


class NoBackups(UsageError):
    """Rollback asked for, but the target keeps no backup of its config: nothing to restore is
    a request that cannot be met (exit 2, like a --to that names no backup), not a bug."""


# ---------------------------------------------------------------------------------------------
# diff helpers


def _sha(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


# ---------------------------------------------------------------------------------------------
# push


class PushStatus(enum.StrEnum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"  # the file already had the bytes; nothing written
    DRY_RUN = "dry-run"  # would write (the diff says what); nothing written
    FAILED = "failed"  # the new file was never put in place (the host says so)
    NOT_APPLIED = "not-applied"  # the protocol "succeeded" but the file does not hold the bytes
    REPLACED = "replaced"  # the new file was put in place, then replaced by a later write
    UNKNOWN = "unknown"  # cut off, and the host could not be asked again: run verify


@dataclass
class PushResult:
    """The outcome of one push (or rollback) to one target."""

    target: str
    path: str
    status: PushStatus
    source: str  # label of the authoritative bytes, or "backup NAME" for a rollback
    new_sha256: str
    old_sha256: str | None = None  # None: there was no file
    diff: ConfigDiff | None = None
    warnings: list[str] = field(default_factory=list)
    forced: bool = False
    validation: ValidationReport | None = None
    #: The write's own record (None for a dry run): what push judged, and every figure of the
    #: write below is read from it, not copied.
    proof: WriteProof | None = None
    #: A dry run's read of the file (a write's read-back is its proof's).
    dry_read: RemoteRead | None = None
    restored_from: Backup | None = None  # rollback only
    failed_step: str | None = None
    message: str = ""

    @property
    def write(self) -> WriteOutcome | None:
        """What the write reported (None: a dry run, or no report but a settled one)."""
        return self.proof.outcome if self.proof is not None else None

    @property
    def readback(self) -> RemoteRead | None:
        """The file read back after the write (a dry run: the file as found)."""
        return self.proof.readback if self.proof is not None else self.dry_read

    @property
    def cut_off(self) -> str:
        """Why the write's report never arrived ("" when it did): the outcome was then read
        from the host on a fresh connection (or is UNKNOWN)."""
        return self.proof.cut_off if self.proof is not None else ""

    @property
    def interrupted(self) -> bool:
        """A Ctrl-C cut the write off."""
        return self.proof is not None and self.proof.interrupted

    @property
    def old_data(self) -> bytes | None:
        """The replaced (or found) file's bytes, when known: for a caller that judges them."""
        return self.proof.old.data if self.proof is not None else None

    @property
    def sha256_after(self) -> str | None:
        """What the file held when last seen (history's sha256_after): after the write, its
        read-back's or, cut off, the settled one's; a dry run's, the file as found."""
        if self.proof is not None:
            return self.proof.sha256_after
        return self.dry_read.sha256 if self.dry_read is not None else None

    @property
    def ok(self) -> bool:
        return self.status in (PushStatus.WRITTEN, PushStatus.UNCHANGED, PushStatus.DRY_RUN)

    @property
    def exit_code(self) -> ExitCode:
        if self.ok:
            return ExitCode.OK
        return {
            PushStatus.REPLACED: ExitCode.DRIFT,  # the file differs from what was pushed
            PushStatus.UNKNOWN: ExitCode.OUTCOME_UNKNOWN,
        }.get(self.status, ExitCode.REMOTE_FAILED)

    def journal_into(self, recording: Recording) -> None:
        """What the journal row opened for this push or rollback keeps of its outcome."""
        recording.status = self.status.value
        recording.sha256_before = self.old_sha256
        recording.sha256_after = self.sha256_after
        recording.message = self.message

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json output."""
        write = self.write
        return {
            "target": self.target,
            "path": self.path,
            "status": self.status.value,
            "source": self.source,
            "new_sha256": self.new_sha256,
            "old_sha256": self.old_sha256,
            "changes": [c.to_dict() for c in self.diff.changes] if self.diff else [],
            "diff": self.diff.lines if self.diff else [],
            "warnings": self.warnings,
            "forced": self.forced,
            "durability": write.durability.value if write and write.durability else None,
            "backup": write.backup if write else None,
            "pruned": write.pruned if write else 0,
            "lock": write.lock_method if write else None,
            "readback_sha256": self.readback.sha256 if self.readback else None,
            "restored_from": self.restored_from.name if self.restored_from else None,
            "failed_step": self.failed_step,
            "reason": write.reason if write and not write.ok else None,
            "message": self.message,
            "cut_off": self.cut_off or None,
            "interrupted": self.interrupted,
        }


def check_authority(
    authority: Authority, *, force: bool, effective: bool = True, verb: str = "push"
) -> tuple[ValidationReport, list[str]]:
    """Validate the bytes to write. ConfigInvalid unless valid or ``force``; returns warnings.

    ``verb`` words the refusal ("push", "restore"). The ``--force`` hint is offered only where
    ``--force`` would then write the file: never for a file that does not parse."""
    report = validate_config(authority.data, label=authority.label, effective=effective)
    if report.ok:
        return report, []
    errors = [f for f in report.findings if f.severity == "error"]
    summary = "; ".join(
        f"{f.layer}: {f.path + ': ' if f.path else ''}{f.message}" for f in errors[:3]
    )
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    if report.layers.get("parse") == "failed":
        # --force overrides what a config says, not whether it is JSON every reader takes the
        # same way: a syntax error, 1e999999 (infinity), a 2**4000 or a duplicate key.
        even = " even with --force" if force else ""
        raise ConfigInvalid(
            f"{authority.label} fails validation, refusing to {verb}{even}: it does not parse "
            f"as a config: {summary}{more} (--force cannot override this)"
        )
    if not force:
        raise ConfigInvalid(
            f"{authority.label} fails validation, refusing to {verb}: {summary}{more} "
            f"(--force {verb}s it anyway)"
        )
    gerund = verb.removesuffix("e") + "ing"
    return report, [
        f"--force: {gerund} {authority.label} although it FAILS validation "
        f"({len(errors)} error(s): {summary}{more})"
    ]


def push_config(
    transport: Transport,
    target: Target,
    authority: Authority,
    *,
    dry_run: bool = False,
    force: bool = False,
    write: WriteOptions = _DEFAULT_WRITE,
    validate: bool = True,
    verb: str = "push",
    unread: bool = False,
) -> PushResult:
    """Make ``target``'s config hold exactly ``authority.data``, and prove it by reading it back.

    Validation runs first (``validate=False`` skips it for callers that validated once for a
    whole fleet); an invalid config raises ConfigInvalid unless ``force``. ``write``: backups,
    mkdir, symlinks, timeout (see remote.proof.WriteOptions). ``unread``: the caller has not
    read the file (repair): see remote.proof.write_and_prove; ``old_data`` then gives the
    replaced file's bytes for the caller to judge.
    """
    report, warnings = (
        check_authority(authority, force=force, verb=verb) if validate else (None, [])
    )
    path = target.config_path
    result = PushResult(
        target=str(target),
        path=path,
        status=PushStatus.DRY_RUN,
        source=authority.label,
        new_sha256=_sha(authority.data) or "",
        warnings=warnings,
        forced=force and bool(warnings),
        validation=report,
    )
    if not unread:
        _refuse_a_new_file_of_another_name(transport, target, timeout=write.timeout)
    if dry_run:
        return _dry_run(transport, result, authority.data, mkdir=write.mkdir, timeout=write.timeout)
    return _write_and_prove(transport, result, authority.data, write, unread=unread)


def _refuse_a_new_file_of_another_name(
    transport: Transport, target: Target, *, timeout: float | None
) -> None:
    """``h01:/models/X/confg.json``: a target naming a .json file vLLM does not read, that is
    not there. Writing it would create a stray file beside config.json and report success; a
    file of that name that exists is the user's own and is written as asked. One more read,
    only for such a name."""
    name = target.config_path.rsplit("/", 1)[-1]
    if name == CONFIG_FILENAME:
        return
    current = read_remote_config(transport, target.config_path, timeout=timeout, metadata=False)
    if current.status not in (ReadStatus.MISSING, ReadStatus.DIR_MISSING):
        return
    directory = replace(target, path=target.model_dir).display()
    raise UsageError(
        f"target {target}: there is no {name} there and vLLM reads {CONFIG_FILENAME}; "
        f"refusing to create a file of another name: give the directory ({directory}) to "
        f"write its {CONFIG_FILENAME}"
    )


def _dry_run(
    transport: Transport, result: PushResult, data: bytes, *, mkdir: bool, timeout: float | None
) -> PushResult:
    current = read_remote_config(transport, result.path, timeout=timeout)
    result.dry_read = current
    if current.status is ReadStatus.DIR_MISSING and not mkdir:
        result.status = PushStatus.FAILED
        result.failed_step = "dir"
        result.message = f"{result.path}: directory missing (--mkdir creates it)"
        return result
    if current.status not in (ReadStatus.PRESENT, ReadStatus.MISSING, ReadStatus.DIR_MISSING):
        result.status = PushStatus.FAILED
        result.failed_step = "read"
        result.message = current.describe() + _read_hint(current)
        return result
    result.old_sha256 = current.sha256
    result.diff = config_diff(current.data, data)
    result.status = PushStatus.UNCHANGED if result.diff.bytes_equal else PushStatus.DRY_RUN
    return result


def _write_and_prove(
    transport: Transport, result: PushResult, data: bytes, options: WriteOptions, *, unread: bool
) -> PushResult:
    proof = write_and_prove(transport, result.path, data, options, unread=unread)
    outcome, old = proof.outcome, proof.old
    result.proof = proof
    result.old_sha256 = old.sha256
    if outcome.reply_error:
        result.warnings.append(
            f"{outcome.reply_error}; none of its bytes was used (the file was read again)"
        )
    if proof.settled is not None:
        return _from_settled(result, proof)
    if not outcome.ok:
        # A write that failed before looking at the old file knows nothing about it: no diff
        # then, rather than a "(new file)" that may be false.
        if old.known:
            result.diff = config_diff(old.data, data)
        not_applied = outcome.failed_step == "readback"
        result.status = PushStatus.NOT_APPLIED if not_applied else PushStatus.FAILED
        result.failed_step = outcome.failed_step
        result.message = (
            f"{NOT_APPLIED_MESSAGE}: {result.path} still has sha256 {outcome.sha256_after} "
            f"after the rename, expected {result.new_sha256}"
            if not_applied
            # No path prefix: the caller names the target, and the step's message names the
            # directory involved when it matters.
            else f"{outcome.failure_text()}; the old file was left untouched"
        )
        return result
    result.diff = (
        config_diff(old.data, data)
        if old.data is not None or not old.present
        else ConfigDiff([], [f"({OLD_UNREADABLE})"], bytes_equal=False, note=OLD_UNREADABLE)
    )
    # The read-back, by the path a reader opens, after the rename: whatever the write believed,
    # this is what a reader (vLLM) will see.
    readback = proof.readback
    assert readback is not None
    if readback.data != data and outcome.status is WriteStatus.UNCHANGED:
        # The write found these very bytes in place and wrote nothing; that path takes no lock,
        # so another writer may rename its file in before this read-back: nothing failed to
        # take effect here (no rename was tried), the file was replaced after this push found
        # it right. Said as what happened, with what the file holds now.
        result.status = PushStatus.REPLACED
        result.failed_step = "readback"
        result.message = (
            f"unchanged (the file already held these bytes; nothing was written), then "
            f"{CHANGED_UNDER_MESSAGE}: {_now_text(result.path, readback)}"
        )
        return result
    if readback.data != data:
        result.status = PushStatus.NOT_APPLIED
        result.failed_step = "readback"
        result.message = _not_applied_message(result.path, readback, data)
        return result
    result.status = (
        PushStatus.UNCHANGED if outcome.status is WriteStatus.UNCHANGED else PushStatus.WRITTEN
    )
    return result


OLD_UNREADABLE = "the old file's bytes did not come back as the write hashed them"


def _from_settled(result: PushResult, proof: WriteProof) -> PushResult:
    """The outcome of a write whose report was cut off, from what the host showed afterwards
    on a fresh connection (proof.settled): never "the old file was left untouched" unless the
    host said the new file was not, and will never be, put in place."""
    settled = proof.settled
    assert settled is not None
    cut = f"cut off ({proof.cut_off})"
    now = f"{result.path} has sha256 {settled.sha256 or '(no file)'}"
    holds_new = settled.sha256 == result.new_sha256
    if settled.verdict is Verdict.UNKNOWN:
        result.status = PushStatus.UNKNOWN
        result.failed_step = "settle"
        result.message = (
            f"{UNKNOWN_MESSAGE}: the write was {cut} and the host could not be asked again "
            f"({settled.message}); the new file may or may not be in place: check with "
            f"`dflash-provision verify {result.target}` (same source options as this push)"
        )
    elif holds_new:
        landed = settled.verdict is Verdict.LANDED
        result.status = PushStatus.WRITTEN if landed else PushStatus.UNCHANGED
        result.message = (
            f"{'written' if landed else 'unchanged'} (checked on a new connection after the "
            f"write was {cut}): {now}"
        )
    elif settled.verdict is Verdict.LANDED:
        result.status = PushStatus.REPLACED
        result.message = f"written, then {REPLACED_MESSAGE} (write {cut}): {now}"
    else:
        result.status = PushStatus.FAILED
        result.failed_step = proof.outcome.failed_step or "transport"
        result.message = (
            f"the write was {cut} before the new file was put in place, and will not be "
            f"(checked on a new connection): {now}"
        )
    return result


def _read_hint(read: RemoteRead) -> str:
    """What to do when a file could not be read for lack of permission (else "")."""
    if read.status is ReadStatus.PERMISSION_DENIED:
        return "; use --sudo, or log in as a user that can read it"
    return ""


def _now_text(path: str, readback: RemoteRead) -> str:
    """What ``path`` holds now, from its read-back: "P has sha256 X" or the read's status."""
    if readback.present:
        return f"{path} has sha256 {readback.sha256}"
    return readback.describe()


def _not_applied_message(path: str, readback: RemoteRead, data: bytes) -> str:
    if not readback.present:
        return f"{NOT_APPLIED_MESSAGE}: reading {path} back gives {readback.describe()}"
    diff = config_diff(readback.data, data)
    what = (
        "the same JSON in different bytes"
        if diff.formatting_only
        else f"{len(diff.changes)} difference(s) from what was written: "
        + "; ".join(diff.lines[:3])
    )
    return (
        f"{NOT_APPLIED_MESSAGE}: {path} read back with sha256 {readback.sha256}, "
        f"expected {_sha(data)} ({what})"
    )


# ---------------------------------------------------------------------------------------------
# verify


@dataclass
class VerifyResult:
    """verify's verdict: ``status`` is file_status.judge's (audit's words, so verify, audit and
    repair say the same thing in text and JSON), ``message`` verify's own line about it."""

    target: str
    path: str
    status: HostStatus
    source: str
    expected_sha256: str
    read: RemoteRead
    diff: ConfigDiff | None = None
    message: str = ""

    @property
    def exit_code(self) -> ExitCode:
        return EXIT_CODE[Command.VERIFY][self.status]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "path": self.path,
            "status": self.status.value,
            "source": self.source,
            "expected_sha256": self.expected_sha256,
            "actual_sha256": self.read.sha256,
            "read_status": self.read.status.value,
            "changes": [c.to_dict() for c in self.diff.changes] if self.diff else [],
            "diff": self.diff.lines if self.diff else [],
            "formatting_only": bool(self.diff and self.diff.formatting_only),
            "message": self.message,
        }


def compare_read(target: str, read: RemoteRead, authority: Authority) -> VerifyResult:
    """Judge a RemoteRead against the authority (file_status.judge; no I/O) and say it as
    verify does."""
    judgement = judge(read, authority)
    expected = _sha(authority.data) or ""
    result = VerifyResult(
        target, read.path, judgement.status, authority.label, expected, read, judgement.diff
    )
    status = judgement.status
    if status is HostStatus.MISSING:
        result.message = (
            f"{read.path}: no config file; push creates it"
            if read.status is ReadStatus.MISSING
            else f"{read.path}: no config file, its directory does not exist; "
            "push --mkdir creates it"
        )
    elif not status.audited:
        result.message = f"cannot verify: {read.describe()}{_read_hint(read)}"
    elif status is HostStatus.IN_SYNC:
        result.message = f"{read.path} matches {authority.label} (sha256 {expected[:12]})"
    elif status is HostStatus.SAME_VALUES:
        result.message = (
            f"{read.path} differs from {authority.label}: same JSON, different bytes "
            f"(sha256 {read.sha256} instead of {expected})"
        )
    else:
        changes = len(judgement.diff.changes) if judgement.diff else 0
        result.message = f"{read.path} differs from {authority.label}: {changes or 'see'} change(s)"
    return result


def verify_config(
    transport: Transport,
    target: Target,
    authority: Authority,
    *,
    timeout: float | None = None,
) -> VerifyResult:
    """Read ``target``'s config back (one exec) and compare it with the authoritative bytes."""
    read = read_remote_config(transport, target.config_path, timeout=timeout)
    return compare_read(str(target), read, authority)


# ---------------------------------------------------------------------------------------------
# rollback


def list_backups(
    transport: Transport, target: Target, *, timeout: float | None = None
) -> list[Backup]:
    """The target config's backups, oldest first."""
    return list_remote_backups(transport, target.config_path, timeout=timeout)


def choose_backup(backups: list[Backup], current_sha256: str | None, to: str | None) -> Backup:
    """The backup named ``to`` (full name or its timestamp part), else the newest one whose
    bytes differ from the current file (restoring identical bytes would change nothing)."""
    if to is not None:
        for backup in backups:
            if to in (backup.name, backup.path) or backup.name.endswith("." + to):
                return backup
        names = ", ".join(b.name for b in backups) or "none"
        raise UsageError(f"no backup named {to!r} (available: {names})")
    for backup in reversed(backups):
        if backup.sha256 != current_sha256:
            return backup
    return backups[-1]


def rollback_config(
    transport: Transport,
    target: Target,
    *,
    to: str | None = None,
    write: WriteOptions = _DEFAULT_WRITE,
    force: bool = False,
    dry_run: bool = False,
) -> PushResult:
    """Restore a backup (see choose_backup) through the atomic write protocol + read-back.

    The backup is validated like a pushed config: ConfigInvalid unless valid or ``force``.
    ``dry_run``: the same choice, reads and diff, and nothing written."""
    timeout = write.timeout
    path = target.config_path
    backups = list_backups(transport, target, timeout=timeout)
    if not backups:
        raise NoBackups(
            f"{target}: no backups of {path} to roll back to (push keeps one each time it "
            "replaces the file)"
        )
    current = read_remote_config(transport, path, timeout=timeout)
    chosen = choose_backup(backups, current.sha256, to)
    # Read with the restore checks (regular file, expected owner, no other name), never
    # through a link; then validated like any config a push sends.
    saved = read_backup(transport, path, chosen.name, timeout=timeout)
    if _sha(saved) != chosen.sha256:
        raise DflashProvisionError(
            f"{target}: backup {chosen.name} changed while it was read (sha256 "
            f"{_sha(saved)}, listed as {chosen.sha256})",
            exit_code=ExitCode.REMOTE_FAILED,
        )
    authority = Authority(label=f"backup {chosen.name}", data=saved)
    result = push_config(
        transport, target, authority, write=write, force=force, verb="restore", dry_run=dry_run
    )
    result.restored_from = chosen
    return result
