"""Repair: push the authoritative config to every reachable host whose file is not its bytes,
writing first and judging the old file from what the write brought back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dflash_provision.errors import DflashProvisionError
from dflash_provision.fleet.auditing import (
    DEFAULT_WORKERS,
    audit_on,
    for_each_host,
    internal_error,
    record_audits,
    resolve_authorities,
    unread_audit,
)
from dflash_provision.fleet.interrupt import FleetInterrupted
from dflash_provision.fleet.results import HostAudit, HostRepair, RepairAction
from dflash_provision.fleet.run import AuthorityFor, CountingTransport, FleetRun
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import journal
from dflash_provision.host_state.file_status import HostStatus
from dflash_provision.inventory import FleetMember
from dflash_provision.place.push import PushStatus, check_authority, push_config
from dflash_provision.remote.ops import ReadStatus, RemoteRead, WriteStatus, present_read
from dflash_provision.remote.proof import WriteOptions

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.place.push import PushResult
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.transport.factory import Connector

RepairProgress = Callable[[HostRepair], None]


def check_authorities(run: FleetRun, members: Sequence[FleetMember]) -> None:
    """Refuse to write an authoritative config that fails validation (ConfigInvalid)."""
    checked: set[str] = set()
    for member in members:
        authority = run.authority(member)
        if authority.sha256 not in checked:
            check_authority(authority, force=False)
            checked.add(authority.sha256)


class _FailureBudget:
    """Counts failed writes; once ``limit`` is reached no new write starts."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.failures = 0
        self._lock = threading.Lock()

    def may_start(self) -> bool:
        with self._lock:
            return self.limit is None or self.failures < self.limit

    def failed(self) -> None:
        with self._lock:
            self.failures += 1


def repair(
    members: Sequence[FleetMember],
    authority_for: AuthorityFor,
    *,
    workers: int = DEFAULT_WORKERS,
    connector: Connector | None = None,
    dry_run: bool = False,
    max_failures: int | None = None,
    progress: RepairProgress | None = None,
    history: HistoryStore | None = None,
    write: WriteOptions | None = None,
    run: FleetRun | None = None,
) -> list[HostRepair]:
    """Write the authoritative config to every reachable host whose file is not its bytes.

    Each host is handled on one connection, write first: the write exec itself finds a file
    that is already right (nothing is written or locked; its bytes come back and are judged
    here: one exec per in-sync host), refuses a file this login cannot read (it cannot be
    judged), and otherwise replaces the file, keeps the old one and reads the file back, the
    old bytes following (one exec per written host too). The old bytes are then judged on the
    controller as an audit's read would be: that is the "before" column. Every
    status that is not ``in_sync`` is written (``same_values`` too: a lock pins bytes). With
    ``dry_run`` (and for hosts after Ctrl-C or ``max_failures``) the file is only read.
    ``max_failures`` stops starting new writes after that many failed. A write is journaled in
    ``history`` as "started" before it begins; a host found in sync leaves no write row (its
    audit row says so).
    """
    run = run or FleetRun(authority_for, connector=connector)
    resolve_authorities(run, members)
    if not dry_run:
        check_authorities(run, members)
    budget = _FailureBudget(max_failures)

    def one(member: FleetMember) -> HostRepair:
        return _repair_host(run, member, dry_run, budget, history, write or WriteOptions())

    try:
        ordered = for_each_host(members, one, workers, "repair", progress, run.stopping)
    except FleetInterrupted as stopped:
        if history is not None:  # the writes are journaled already; the hosts' states too
            record_audits(history, [r.final for r in stopped.done])
        raise
    if history is not None:
        # Each host's latest known state (after the write, for written hosts); the writes
        # themselves were recorded as they happened.
        record_audits(history, [r.final for r in ordered])
    return ordered


def _repair_host(
    run: FleetRun,
    member: FleetMember,
    dry_run: bool,
    budget: _FailureBudget,
    history: HistoryStore | None,
    write: WriteOptions,
) -> HostRepair:
    started = time.monotonic()
    transport = run.open(member)
    try:
        result = _repair_steps(run, member, transport, started, dry_run, budget, history, write)
        result.execs = transport.execs
        return result
    finally:
        transport.close()


def _repair_steps(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    started: float,
    dry_run: bool,
    budget: _FailureBudget,
    history: HistoryStore | None,
    write: WriteOptions,
) -> HostRepair:
    if dry_run or run.stopping.is_set() or not budget.may_start():
        # No write will start: the audit says what the host holds, and why it is not written.
        return _audit_first(run, member, transport, started, dry_run, budget)
    return _write_first(run, member, transport, started, budget, history, write)


def _audit_first(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    started: float,
    dry_run: bool,
    budget: _FailureBudget,
) -> HostRepair:
    before = audit_on(run, member, transport, started)
    if before.status is HostStatus.IN_SYNC:
        return HostRepair(before, RepairAction.SKIPPED_IN_SYNC, before.detail)
    if not before.status.needs_write:
        return HostRepair(before, RepairAction.SKIPPED_NOT_AUDITED, before.detail)
    if dry_run:
        # The audit's own words for every host (the file missing, the parse error, what the
        # loader changes), not only a diff for drifted ones.
        return HostRepair(before, RepairAction.WOULD_WRITE, f"would write: {before.detail}")
    if run.stopping.is_set():  # Ctrl-C before this host's write
        return HostRepair(
            before, RepairAction.SKIPPED_INTERRUPTED, "not written: interrupted (Ctrl-C)"
        )
    return HostRepair(
        before,
        RepairAction.SKIPPED_MAX_FAILURES,
        f"not written: --max-failures {budget.limit} reached",
    )


def _write_first(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    started: float,
    budget: _FailureBudget,
    history: HistoryStore | None,
    write: WriteOptions,
) -> HostRepair:
    """The write exec first: it finds a file that is already right (and sends its bytes, which
    are judged here), refuses one this login cannot read, and otherwise replaces the file and
    keeps the old one, whose bytes come back after the read-back and are judged here as the
    audit's would have been: 1 exec either way. Only a write that failed reads the file again,
    to say what the host holds."""
    t0 = time.monotonic()
    try:
        # The connection on its own first: an unreachable host opens no history row.
        transport.connect()
    except DflashProvisionError as exc:
        return _not_reached(run, member, exc, time.monotonic() - t0, started)
    if run.stopping.is_set():  # Ctrl-C while connecting: this host's write never starts
        return _audit_first(run, member, transport, started, False, budget)
    result, readback = _write(run, member, transport, history, write)
    if result.action not in (RepairAction.WROTE, RepairAction.FAILED):
        return result  # in sync, or not written (why is in its audit)
    if result.action is RepairAction.FAILED:
        budget.failed()
    # The fresh audit: push's read-back already read the file by its path after the rename
    # (what vLLM will see), so judge that; read again only when there was none.
    result.after = audit_on(run, member, transport, time.monotonic(), read=readback)
    return result


def _not_reached(
    run: FleetRun, member: FleetMember, exc: DflashProvisionError, waited_s: float, started: float
) -> HostRepair:
    before = unread_audit(run, member, exc, waited_s, started)
    return HostRepair(before, RepairAction.SKIPPED_NOT_AUDITED, before.detail)


#: The write's steps that run before anything is created or locked: a write that failed in one
#: of them touched nothing, and the host's file is then told by a read (as an audit would).
_CHECK_STEPS = frozenset({"args", "dir", "symlink", "dest"})


def _write(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    history: HistoryStore | None,
    write: WriteOptions,
) -> tuple[HostRepair, RemoteRead | None]:
    """Push on the open connection; returns the repair (its ``before`` judged from the old file
    the write found) and push's read-back (if it got one)."""
    started = time.monotonic()
    authority = run.authority(member)
    key = HostKey.of_name(member.name)
    path = member.target.config_path
    with journal(history, "repair", key, path) as recording:
        try:
            outcome = push_config(
                transport,
                member.target,
                authority,
                write=write,
                validate=False,  # validated once per authoritative source in repair()
                unread=True,
            )
        except DflashProvisionError as exc:
            # push raises only for a command that never ran (the host refused the session,
            # the container is down): nothing was written, and there is nothing to record.
            recording.discard = True
            return _not_reached(run, member, exc, time.monotonic() - started, started), None
        except Exception as exc:  # see _audit_on; the file's state is unknown, the history says so
            message = internal_error(exc) + "; the file may or may not have been replaced"
            recording.status, recording.message = "failed", message
            before = audit_on(run, member, transport, started)
            return HostRepair(before, RepairAction.FAILED, message), None
        if _found_right_then_changed(outcome):
            # No write happened (nothing to journal): the host was in sync when the write
            # looked; another writer replaced the file before its read-back, which is the after.
            recording.discard = True
            found = present_read(path, authority.data)
            before = audit_on(run, member, transport, started, read=found)
            repair = HostRepair(before, RepairAction.SKIPPED_IN_SYNC, outcome.message)
            repair.after = audit_on(run, member, transport, time.monotonic(), read=outcome.readback)
            return repair, outcome.readback
        before = _before(run, member, transport, started, outcome)
        if outcome.status is PushStatus.UNCHANGED or (
            outcome.write is not None
            and outcome.write.failed_step in _CHECK_STEPS
            and not before.status.needs_write
        ):
            # Already right, or refused before touching anything a file repair would not write
            # (unreadable, not a regular file): no change to journal.
            recording.discard = True
            action = (
                RepairAction.SKIPPED_IN_SYNC
                if before.status is HostStatus.IN_SYNC
                else RepairAction.SKIPPED_NOT_AUDITED
            )
            return HostRepair(before, action, before.detail), None
        # The row is push's own (its status word, the settled sha256 of a cut-off write):
        # a repair is a push to a host the judge found wrong, and journals as one.
        outcome.journal_into(recording)
        # The sha256 figures are the write's (a cut-off write's after is what the host showed
        # when it was settled, as history keeps).
        repair = HostRepair(before, RepairAction.FAILED, push=outcome)
        repair.history_id = recording.id
        if outcome.ok:
            repair.action = RepairAction.WROTE
            repair.message = _describe_push(outcome, before)
        else:
            repair.message = outcome.message or f"push {outcome.status.value}"
        recording.message = repair.message  # what was fixed, and where the old file is
        before.timings.write_s = time.monotonic() - started
    return repair, outcome.readback


def _found_right_then_changed(outcome: PushResult) -> bool:
    """The write found the authoritative bytes in place (wrote nothing), and its read-back then
    saw another writer's file (push's ``replaced`` of an unchanged write)."""
    return (
        outcome.status is PushStatus.REPLACED
        and outcome.write is not None
        and outcome.write.status is WriteStatus.UNCHANGED
        and outcome.readback is not None
    )


def _before(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    started: float,
    outcome: PushResult,
) -> HostAudit:
    """The audit of the file the write found: judged from the bytes the write brought back
    (the old file, or the unchanged one); read fresh when the write did not get that far."""
    path = member.target.config_path
    seen = outcome.write
    if outcome.status is PushStatus.UNCHANGED and outcome.readback is not None:
        return audit_on(run, member, transport, started, read=outcome.readback)
    if outcome.cut_off:
        # The report never came: a read now could show the new file as the old one.
        unknown = RemoteRead(
            path,
            ReadStatus.ERROR,
            message=f"not known: the write's report was cut off ({outcome.cut_off})",
        )
        return audit_on(run, member, transport, started, read=unknown)
    if seen is None or not seen.old.known or seen.failed_step in _CHECK_STEPS:
        return audit_on(run, member, transport, started)  # one more exec, off the common path
    if not seen.old.present:
        status = ReadStatus.DIR_MISSING if seen.created_dir else ReadStatus.MISSING
        return audit_on(run, member, transport, started, read=RemoteRead(path, status))
    if outcome.old_data is None:
        return audit_on(
            run, member, transport, started,
            read=RemoteRead(path, ReadStatus.ERROR, message=OLD_BYTES_LOST),
        )  # fmt: skip
    return audit_on(run, member, transport, started, read=present_read(path, outcome.old_data))


OLD_BYTES_LOST = "its bytes did not come back as the write hashed them"


def _describe_push(outcome: PushResult, before: HostAudit) -> str:
    was = {
        HostStatus.MISSING: "created",
        HostStatus.INVALID: "replaced an invalid file",
        HostStatus.LOADER_NORMALISED: "replaced a loader-normalised file",
        HostStatus.DRIFTED: f"fixed {len(before.diff)} field(s)",
    }.get(before.status, "written")
    backup = outcome.write.backup if outcome.write else None
    return was + (f"; old file kept as {backup}" if backup else "")
