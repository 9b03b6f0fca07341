"""Audit: read every host's config in parallel and classify it (one connection each; one exec of
the read script in bytes mode per host: see remote/ops.read_remote_config)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, TypeVar

from dflash_provision.errors import DflashProvisionError
from dflash_provision.fleet.classify import classify_exception
from dflash_provision.fleet.interrupt import (
    NOT_STARTED,
    FleetInterrupted,
    Stopping,
    collect_after_interrupt,
)
from dflash_provision.fleet.results import HostAudit
from dflash_provision.fleet.run import AuthorityFor, CountingTransport, FleetRun
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import AuditRecord
from dflash_provision.host_state.file_status import HostStatus
from dflash_provision.inventory import FleetMember
from dflash_provision.remote.ops import read_remote_config

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.transport.factory import Connector

DEFAULT_WORKERS = 64

AuditProgress = Callable[[HostAudit], None]


def _new_audit(run: FleetRun, member: FleetMember) -> HostAudit:
    authority = run.authority(member)
    return HostAudit(
        name=member.name,
        group=member.group,
        target=member.target.display(),
        path=member.target.config_path,
        status=HostStatus.ERROR,
        detail="",
        authority=authority.label,
        expected_sha256=authority.sha256,
    )


def audit_on(
    run: FleetRun,
    member: FleetMember,
    transport: CountingTransport,
    started: float,
    read: RemoteRead | None = None,
) -> HostAudit:
    """Read the member's file (unless ``read`` is given: a read already made) and classify it."""
    audit = _new_audit(run, member)
    execs_before = transport.execs
    t0 = time.monotonic()
    try:
        if read is None:
            read = read_remote_config(
                transport,
                member.target.config_path,
                metadata=False,
                # The bytes are hashed here, and a plain config costs the host one bounded dd
                # under timeout, run by its login shell: no sh, script or watchdog subshell.
                remote_hash=False,
            )
    except DflashProvisionError as exc:
        audit.timings.read_s = time.monotonic() - t0
        classify_failure(run, audit, exc)
    except Exception as exc:  # a bug must not abort the other hosts' audits: report it here
        audit.timings.read_s = time.monotonic() - t0
        audit.status, audit.detail = HostStatus.ERROR, internal_error(exc)
    else:
        audit.timings.read_s = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            _classify_read(run, member, read, audit)
        except Exception as exc:
            audit.status, audit.detail = HostStatus.ERROR, internal_error(exc)
        audit.timings.classify_s = time.monotonic() - t1
    audit.execs = transport.execs - execs_before
    audit.timings.total_s = time.monotonic() - started
    return audit


def classify_failure(run: FleetRun, audit: HostAudit, exc: DflashProvisionError) -> None:
    """Set ``audit``'s status from the error that kept its file from being read (unreachable,
    authentication, container down...), ``audit.timings.read_s`` being how long it waited."""
    audit.status, audit.detail = classify_exception(
        exc, waited_s=audit.timings.read_s, timeout_s=run.handshake_timeout
    )


def unread_audit(
    run: FleetRun, member: FleetMember, exc: DflashProvisionError, waited_s: float, started: float
) -> HostAudit:
    """The audit of a host whose connection (or first command) failed with ``exc``."""
    audit = _new_audit(run, member)
    audit.timings.read_s = waited_s
    classify_failure(run, audit, exc)
    audit.timings.total_s = time.monotonic() - started
    return audit


def internal_error(exc: BaseException) -> str:
    return f"internal error ({type(exc).__name__}: {exc}); please report it"


def _classify_read(run: FleetRun, member: FleetMember, read: RemoteRead, audit: HostAudit) -> None:
    verdict = run.verdict(read, run.authority(member))
    audit.status, audit.detail = verdict.status, verdict.detail
    if read.present:
        audit.sha256 = read.sha256
    # The field-by-field diff for a drifted file; an invalid one is told by its findings.
    audit.diff = list(verdict.changes) if verdict.status is HostStatus.DRIFTED else []
    audit.findings = list(verdict.findings)


def audit_host(run: FleetRun, member: FleetMember) -> HostAudit:
    """Audit one member on its own connection (opened and closed here)."""
    started = time.monotonic()
    transport = run.open(member)
    try:
        return audit_on(run, member, transport, started)
    finally:
        transport.close()


def audit(
    members: Sequence[FleetMember],
    authority_for: AuthorityFor,
    *,
    workers: int = DEFAULT_WORKERS,
    connector: Connector | None = None,
    progress: AuditProgress | None = None,
    history: HistoryStore | None = None,
    run: FleetRun | None = None,
) -> list[HostAudit]:
    """Audit every member in parallel; results come back in the members' order.

    ``progress`` is called in the calling thread as each host finishes. With ``history`` every
    result is recorded (one transaction for the whole fleet).
    """
    run = run or FleetRun(authority_for, connector=connector)
    resolve_authorities(run, members)
    try:
        ordered = for_each_host(
            members,
            lambda member: audit_host(run, member),
            workers,
            "audit",
            progress,
            run.stopping,
        )
    except FleetInterrupted as stopped:
        if history is not None:
            record_audits(history, stopped.done)  # what was audited before Ctrl-C
        raise
    if history is not None:
        record_audits(history, ordered)
    return ordered


_Result = TypeVar("_Result")


def for_each_host(
    members: Sequence[FleetMember],
    work: Callable[[FleetMember], _Result],
    workers: int,
    name: str,
    progress: Callable[[_Result], None] | None,
    stopping: threading.Event | None = None,
) -> list[_Result]:
    """``work`` on every member in a bounded pool; ``progress`` is called in this thread as each
    host finishes; the results come back in the members' order.

    Ctrl-C (KeyboardInterrupt in this thread) sets ``stopping``, so that no new host is
    contacted, cancels the queued ones, waits for those in flight and raises FleetInterrupted
    with what was done (see fleet/interrupt.py)."""
    stop = stopping if stopping is not None else threading.Event()

    def guarded(member: FleetMember) -> _Result:
        if stop.is_set():
            return NOT_STARTED  # type: ignore[no-any-return]  # a queued host, after Ctrl-C
        return work(member)

    results: dict[int, _Result] = {}
    pool = ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(members))), thread_name_prefix=name
    )
    futures: dict[Future[_Result], int] = {}
    try:
        for index, member in enumerate(members):
            futures[pool.submit(guarded, member)] = index
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if progress is not None:
                progress(result)
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        waiting = stop if isinstance(stop, Stopping) else None
        raise collect_after_interrupt([m.name for m in members], futures, waiting) from None
    except BaseException:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [results[index] for index in range(len(members))]


def resolve_authorities(run: FleetRun, members: Sequence[FleetMember]) -> None:
    # Sequentially and up front: a Hub error stops the run before any host is touched, and
    # workers never wait on each other's Hub requests.
    for member in members:
        run.authority(member)


def record_audits(history: HistoryStore, audits: Sequence[HostAudit], op: str = "audit") -> None:
    history.record_audits(
        [
            AuditRecord(
                HostKey.of_name(a.name),
                a.path,
                a.status.value,
                a.sha256,
                a.detail,
                a.timings.total_s,
            )
            for a in audits
        ],
        op=op,
    )
