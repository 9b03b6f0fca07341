"""Repair: audit, then push the authoritative config to every reachable host that needs it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dflash_provision.check.file_status import HostStatus
from dflash_provision.errors import DflashProvisionError
from dflash_provision.fleet.auditing import (
    DEFAULT_WORKERS,
    audit_on,
    for_each_host,
    internal_error,
    record_audits,
    resolve_authorities,
)
from dflash_provision.fleet.interrupt import FleetInterrupted
from dflash_provision.fleet.results import HostAudit, HostRepair, RepairAction
from dflash_provision.fleet.run import AuthorityFor, CountingTransport, FleetRun
from dflash_provision.history import HostKey, journal
from dflash_provision.inventory import FleetMember
from dflash_provision.remote.proof import WriteOptions

if TYPE_CHECKING:
    from dflash_provision.history import HistoryStore
    from dflash_provision.place.push import PushResult
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.transport.factory import Connector

RepairProgress = Callable[[HostRepair], None]


def check_authorities(run: FleetRun, members: Sequence[FleetMember]) -> None:
    """Refuse to write an authoritative config that fails validation (ConfigInvalid)."""
    from dflash_provision.place.push import check_authority

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
    """Audit, then write the authoritative config to every reachable host that needs it.

    Each host is handled on one connection: read, then (write + read-back, the read-back being
    the fresh audit). The read comes first on purpose, although the write exec also returns the
    old bytes: whether a host may be written is judged on the controller (a file with the right
    values in other bytes is in sync and must not be rewritten; a file this login cannot read is
    not audited and must not be replaced), and the history row opens before a write starts. With
    ``dry_run`` nothing is written. ``max_failures`` stops starting new writes after that many
    failed. Writes are recorded in ``history`` as "started" before they begin.
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
    before = audit_on(run, member, transport, started)
    if before.status is HostStatus.IN_SYNC:
        return HostRepair(before, RepairAction.SKIPPED_IN_SYNC, before.detail)
    if not before.status.needs_write:
        return HostRepair(before, RepairAction.SKIPPED_NOT_AUDITED, before.detail)
    if dry_run:
        # The audit's own words for every host (the file missing, the parse error, what the
        # loader changes), not only a diff for drifted ones.
        return HostRepair(before, RepairAction.WOULD_WRITE, f"would write: {before.detail}")
    if run.stopping.is_set():  # Ctrl-C while this host was being audited
        return HostRepair(
            before, RepairAction.SKIPPED_INTERRUPTED, "not written: interrupted (Ctrl-C)"
        )
    if not budget.may_start():
        return HostRepair(
            before,
            RepairAction.SKIPPED_MAX_FAILURES,
            f"not written: --max-failures {budget.limit} reached",
        )
    result, readback = _write(run, member, transport, before, history, write)
    if result.action is RepairAction.FAILED:
        budget.failed()
    # The fresh audit: push's read-back is already a separate exec reading the file from disk
    # after the rename (what vLLM will see), so judge that; read again only when there was none.
    result.after = audit_on(run, member, transport, time.monotonic(), read=readback)
    return result


def _write(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    before: HostAudit,
    history: HistoryStore | None,
    write: WriteOptions,
) -> tuple[HostRepair, RemoteRead | None]:
    """Push on the open connection; returns the result and push's read-back (if it got one)."""
    from dflash_provision.place.push import push_config

    authority = run.authority(member)
    repair = HostRepair(before, RepairAction.FAILED, sha256_before=before.sha256)
    readback: RemoteRead | None = None
    t0 = time.monotonic()
    key = HostKey.of_name(member.name)
    path = member.target.config_path
    with journal(history, "repair", key, path, sha256_before=before.sha256) as recording:
        repair.history_id = recording.id
        try:
            outcome = push_config(
                transport,
                member.target,
                authority,
                write=write,
                validate=False,  # validated once per authoritative source in repair()
            )
        except DflashProvisionError as exc:
            repair.message = recording.message = exc.message
            recording.status = "failed"
        except Exception as exc:  # see _audit_on; the file's state is unknown, the history says so
            repair.message = internal_error(exc) + "; the file may or may not have been replaced"
            recording.status, recording.message = "failed", repair.message
        else:
            # The row is push's own (its status word, the settled sha256 of a cut-off write):
            # a repair is a push to a host audit found wrong, and journals as one.
            outcome.journal_into(recording)
            readback = outcome.readback
            repair.sha256_before = outcome.old_sha256
            repair.sha256_after = outcome.readback.sha256 if outcome.readback else None
            if outcome.ok:
                repair.action = RepairAction.WROTE
                repair.message = _describe_push(outcome, before)
            else:
                repair.message = outcome.message or f"push {outcome.status.value}"
            recording.message = repair.message  # what was fixed, and where the old file is
        before.timings.write_s = time.monotonic() - t0
    return repair, readback


def _describe_push(outcome: PushResult, before: HostAudit) -> str:
    was = {
        HostStatus.MISSING: "created",
        HostStatus.INVALID: "replaced an invalid file",
        HostStatus.LOADER_NORMALISED: "replaced a loader-normalised file",
        HostStatus.DRIFTED: f"fixed {len(before.diff)} field(s)",
    }.get(before.status, "written")
    backup = outcome.write.backup if outcome.write else None
    return was + (f"; old file kept as {backup}" if backup else "")
