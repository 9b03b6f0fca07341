"""``audit --all-files``: each host's config audited as ``audit`` does, then every file the lock
pins checked where it lies, on the same connection (one more exec per host); only the files'
facts travel, never their bytes."""

from __future__ import annotations

import posixpath
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode
from dflash_provision.fleet.auditing import (
    audit_on,
    for_each_host,
    internal_error,
    record_audits,
    resolve_authorities,
    unread_audit,
)
from dflash_provision.fleet.interrupt import FleetInterrupted
from dflash_provision.fleet.results import HostAudit, audit_exit_code
from dflash_provision.fleet.run import FleetRun
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import AuditRecord
from dflash_provision.host_state.file_status import EXIT_CODE, Command, HostStatus
from dflash_provision.host_state.files_status import (
    FilesJudgement,
    FilesStatus,
    combined_exit,
    fleet_files_exit,
)
from dflash_provision.host_state.pinned_check import check_pinned_files
from dflash_provision.inventory import FleetMember
from dflash_provision.source.pinned_source import pinned_for

if TYPE_CHECKING:
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.source.pinned_files import PinnedFile


@dataclass
class HostFilesAudit:
    """One host: the config's audit and the files' verdict (None: the host was not reached, or
    its config not read, so its files were not checked either)."""

    audit: HostAudit
    files: FilesJudgement | None

    @property
    def exit_code(self) -> ExitCode:
        files = self.files.exit_code(Command.AUDIT) if self.files else ExitCode.OK
        return combined_exit(EXIT_CODE[Command.AUDIT][self.audit.status], files)

    def to_dict(self) -> dict[str, Any]:
        document = self.audit.to_dict()
        document["files"] = self.files.to_dict() if self.files else None
        return document


def audit_all_files(
    members: Sequence[FleetMember],
    run: FleetRun,
    *,
    workers: int,
    progress: Callable[[HostFilesAudit], None] | None = None,
    history: HistoryStore | None = None,
) -> list[HostFilesAudit]:
    """Audit every member's config and pinned files in parallel, in the members' order. The
    pinned files of every source are resolved first: a lock that pins none stops the run
    before any host is touched."""
    resolve_authorities(run, members)
    by_source: dict[object, list[PinnedFile]] = {}  # one tree listing per --repo source
    pinned: dict[str, list[PinnedFile]] = {}
    for m in members:
        key = (m.source, run.authority(m).commit_sha)
        if key not in by_source:
            by_source[key] = pinned_for(m.source, run.authority(m))
        pinned[m.name] = by_source[key]
    try:
        results = for_each_host(
            members,
            lambda m: _audit_host(run, m, pinned[m.name], history),
            workers,
            "audit",
            progress,
            run.stopping,
        )
    except FleetInterrupted as stopped:
        if history is not None:
            _record(history, [r for r in stopped.done if isinstance(r, HostFilesAudit)])
        raise
    if history is not None:
        _record(history, results)
    return results


def _record(history: HistoryStore, results: Sequence[HostFilesAudit]) -> None:
    """The configs' rows as audit records them, and one ``audit-files`` row per host whose
    files were checked (the directory, its status, the first problem), so that ``history``
    does not show a host whose config is in sync but whose weights are not as all right."""
    record_audits(history, [r.audit for r in results])
    rows = [
        AuditRecord(
            HostKey.of_name(r.audit.name),
            posixpath.dirname(r.audit.path) or "/",
            r.files.status.value,
            None,
            r.files.detail,
            r.audit.timings.total_s,
        )
        for r in results
        if r.files is not None
    ]
    if rows:
        history.record_audits(rows, op="audit-files")


def files_summary(results: Sequence[HostFilesAudit]) -> str:
    """``files: 3 in_sync, 1 drifted, 1 not checked`` (the hosts' files statuses, counted)."""
    counts = Counter(r.files.status.value if r.files else "not checked" for r in results)
    return "files: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def fleet_exit_code(results: Sequence[HostFilesAudit]) -> ExitCode:
    """audit's roll-up of the configs, combined with the roll-up of the files."""
    config = audit_exit_code([r.audit for r in results])
    files = fleet_files_exit(
        r.files.exit_code(Command.AUDIT) for r in results if r.files is not None
    )
    return combined_exit(config, files)


def _audit_host(
    run: FleetRun, member: FleetMember, pinned: list[PinnedFile], history: HistoryStore | None
) -> HostFilesAudit:
    started = time.monotonic()
    try:
        transport = run.open(member)
    except DflashProvisionError as exc:
        waited = time.monotonic() - started
        return HostFilesAudit(unread_audit(run, member, exc, waited, started), None)
    try:
        audit = audit_on(run, member, transport, started)
        if not audit.status.audited and audit.status is not HostStatus.PERMISSION_DENIED:
            return HostFilesAudit(audit, None)
        try:
            files = check_pinned_files(
                transport,
                member.target.model_dir,
                pinned,
                host=HostKey.of_name(member.name),
                history=history,
            )
        except DflashProvisionError as exc:
            files = _not_told(member, f"the files could not be checked: {exc.message}")
        except Exception as exc:  # a bug must not abort the other hosts' audits
            files = _not_told(member, internal_error(exc))
        audit.timings.total_s = time.monotonic() - started
        return HostFilesAudit(audit, files)
    finally:
        transport.close()


def _not_told(member: FleetMember, why: str) -> FilesJudgement:
    return FilesJudgement(FilesStatus.INCONCLUSIVE, why, [], member.target.model_dir)
