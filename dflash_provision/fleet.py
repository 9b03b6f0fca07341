"""Audit and repair a fleet in parallel: one SSH connection and one read per host.

``audit`` reads every member's config with a bounded thread pool and classifies each host
(:class:`HostStatus`). ``repair`` does the same, and on every reachable host whose file is not the
authoritative config (drifted, missing, invalid, loader-normalised) runs the full write protocol
(``push_config``: atomic write + read-back) on the connection the audit opened, then audits the
host again. In-sync and unreachable hosts are never written to.

Per-host costs are kept flat: validation (whose "effective" layer imports and runs transformers)
runs once per distinct file content (sha256), never for a file identical to the authoritative
one, and the authoritative config is parsed once per drafter source.
"""

from __future__ import annotations

import enum
import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import (
    AuthError,
    ContainerError,
    DflashProvisionError,
    ExitCode,
    RemoteStepFailed,
    UnreachableError,
)
from dflash_provision.inventory import DrafterSpec, FleetMember
from dflash_provision.sources import LoadedConfig
from dflash_provision.transport.base import CommandResult, Transport

if TYPE_CHECKING:
    from dflash_provision.history import HistoryStore
    from dflash_provision.push import PushResult
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.transport.options import SshOptions

DEFAULT_WORKERS = 64


class HostStatus(enum.StrEnum):
    """What an audit found on one host."""

    IN_SYNC = "in_sync"
    DRIFTED = "drifted"  # valid config, different values from the authoritative one
    MISSING = "missing"  # no config file (or no model directory)
    INVALID = "invalid"  # not JSON, or fails the schema / DFlash invariants
    LOADER_NORMALISED = "loader_normalised"  # transformers would load different critical values
    UNREACHABLE_REFUSED = "unreachable_refused"
    UNREACHABLE_TIMEOUT = "unreachable_timeout"
    UNREACHABLE = "unreachable"  # other network failures: name not resolved, handshake failed
    AUTH_FAILED = "auth_failed"
    HOST_KEY_UNKNOWN = "host_key_unknown"
    HOST_KEY_CHANGED = "host_key_changed"
    PERMISSION_DENIED = "permission_denied"  # the file exists but this user cannot read it
    CONTAINER_NOT_RUNNING = "container_not_running"  # or does not exist
    ERROR = "error"  # anything else (the detail says what)

    @property
    def needs_write(self) -> bool:
        """The host answered and its file is not the authoritative config."""
        return self in NEEDS_WRITE

    @property
    def audited(self) -> bool:
        """The host's file could be read and judged."""
        return self is HostStatus.IN_SYNC or self in NEEDS_WRITE


NEEDS_WRITE = frozenset(
    {HostStatus.DRIFTED, HostStatus.MISSING, HostStatus.INVALID, HostStatus.LOADER_NORMALISED}
)
UNREACHABLE_STATUSES = frozenset(
    {HostStatus.UNREACHABLE_REFUSED, HostStatus.UNREACHABLE_TIMEOUT, HostStatus.UNREACHABLE}
)


@dataclass
class Timings:
    """Seconds spent on one host. ``read_s`` includes the SSH handshake (connections are lazy)."""

    read_s: float = 0.0
    classify_s: float = 0.0
    write_s: float = 0.0
    total_s: float = 0.0


@dataclass
class HostAudit:
    """One host's audit: the status, the evidence and the timings."""

    name: str
    group: str
    target: str  # the canonical target spec
    path: str  # the config file's path on the host
    status: HostStatus
    detail: str  # one line for humans
    authority: str  # label of the authoritative config this host was compared with
    expected_sha256: str
    sha256: str | None = None  # of the host's file, when it could be read
    diff: list[str] = field(default_factory=list)  # "path: host value → authoritative value"
    findings: list[dict[str, str]] = field(default_factory=list)  # validation findings
    timings: Timings = field(default_factory=Timings)
    execs: int = 0  # remote commands run for this host

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


class RepairAction(enum.StrEnum):
    WROTE = "wrote"
    WOULD_WRITE = "would_write"  # --dry-run
    FAILED = "failed"
    SKIPPED_IN_SYNC = "in_sync"  # nothing to do
    SKIPPED_NOT_AUDITED = "not_audited"  # unreachable, auth, permission...: never written to
    SKIPPED_MAX_FAILURES = "skipped_max_failures"  # --max-failures reached before this host


@dataclass
class HostRepair:
    """What repair did on one host: the audit before, the action, the audit after."""

    before: HostAudit
    action: RepairAction
    message: str = ""
    after: HostAudit | None = None  # fresh audit of a host that was written (or failed to be)
    sha256_before: str | None = None
    sha256_after: str | None = None
    history_id: int | None = None
    execs: int = 0  # remote commands run for this host in the whole repair

    @property
    def name(self) -> str:
        return self.before.name

    @property
    def final(self) -> HostAudit:
        """The host's latest known state."""
        return self.after or self.before

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "action": self.action.value,
            "message": self.message,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
            "execs": self.execs,
            "before": self.before.to_dict(),
            "after": self.after.to_dict() if self.after else None,
        }


AuthorityFor = Callable[[FleetMember], LoadedConfig]
AuditProgress = Callable[[HostAudit], None]
RepairProgress = Callable[[HostRepair], None]
TransportOpener = Callable[[FleetMember], Transport]


# -- shared per-run state ------------------------------------------------------------------------


class _Memo:
    """Compute a value once per key, even when many threads ask at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Any, Future[Any]] = {}

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            future = self._futures.get(key)
            owner = future is None
            if future is None:
                future = Future()
                self._futures[key] = future
        if owner:
            try:
                future.set_result(compute())
            except BaseException as exc:
                future.set_exception(exc)
        return future.result()

    def __len__(self) -> int:
        return len(self._futures)


@dataclass(frozen=True)
class _Authority:
    label: str
    data: bytes
    sha256: str
    doc: Any


@dataclass(frozen=True)
class _Verdict:
    status: HostStatus
    detail: str
    diff: tuple[str, ...] = ()
    findings: tuple[dict[str, str], ...] = ()


class _CountingTransport(Transport):
    """Counts the commands run through it (the benchmark's "round trips per host")."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.description = inner.description
        self.execs = 0

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0
    ) -> CommandResult:
        self.execs += 1
        return self.inner.run(argv, stdin=stdin, timeout=timeout)

    def close(self) -> None:
        self.inner.close()


class FleetRun:
    """State shared by the workers of one audit or repair: authorities and verdict caches."""

    def __init__(
        self,
        authority_for: AuthorityFor,
        *,
        ssh_options: SshOptions | None = None,
        open_transport: TransportOpener | None = None,
        command_timeout: float | None = None,
    ) -> None:
        self.authority_for = authority_for
        self._ssh_options = ssh_options
        self._open = open_transport
        self.command_timeout = command_timeout or (
            ssh_options.command_timeout if ssh_options is not None else 60.0
        )
        self._authorities = _Memo()
        self._verdicts = _Memo()
        # The shortest wait after which a silent host counts as timed out (see classify_exception).
        self.handshake_timeout = (
            min(ssh_options.connect_timeout, ssh_options.banner_timeout)
            if ssh_options is not None
            else None
        )
        self._cpu_lock = threading.Lock()
        self.validations = 0  # how many times validate_config ran (tests, benchmark)

    def authority(self, member: FleetMember) -> _Authority:
        def load() -> _Authority:
            loaded = self.authority_for(member)
            return _Authority(
                loaded.label,
                loaded.data,
                hashlib.sha256(loaded.data).hexdigest(),
                json.loads(loaded.data),
            )

        key: DrafterSpec | str = member.source if member.source.is_set else member.name
        result: _Authority = self._authorities.get(key, load)
        return result

    def open(self, member: FleetMember) -> _CountingTransport:
        if self._open is not None:
            return _CountingTransport(self._open(member))
        from dflash_provision.transport.factory import open_transport

        return _CountingTransport(open_transport(member.target, self._ssh_options))

    def verdict(self, data: bytes, sha256: str, authority: _Authority) -> _Verdict:
        if sha256 == authority.sha256:
            return _Verdict(HostStatus.IN_SYNC, "matches " + authority.label)
        result: _Verdict = self._verdicts.get(
            (sha256, authority.sha256), lambda: self._judge(data, authority)
        )
        return result

    def _judge(self, data: bytes, authority: _Authority) -> _Verdict:
        from dflash_provision.validate import validate_config

        # The counter needs the lock; validation itself is thread-safe (effective.py serialises
        # the transformers import) and runs once per distinct file thanks to the verdict cache.
        with self._cpu_lock:
            self.validations += 1
        report = validate_config(data, label="host file", effective=True)
        findings = tuple(f.to_dict() for f in report.errors)
        by_layer = {f.layer for f in report.errors}
        if by_layer & {"parse", "schema"}:
            return _Verdict(
                HostStatus.INVALID, _first(report.errors, {"parse", "schema"}), (), findings
            )
        if "effective" in by_layer:
            # The file may also break an invariant; what the loader does to it is the sharper fact.
            return _Verdict(
                HostStatus.LOADER_NORMALISED, _first(report.errors, {"effective"}), (), findings
            )
        if by_layer:
            return _Verdict(HostStatus.INVALID, _first(report.errors, by_layer), (), findings)
        from dflash_provision.diff import render_changes, semantic_diff

        doc = json.loads(data)
        lines = tuple(render_changes(semantic_diff(doc, authority.doc)))  # thread-safe
        if not lines:
            return _Verdict(
                HostStatus.IN_SYNC, "same values as the authoritative config (formatting differs)"
            )
        more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
        return _Verdict(HostStatus.DRIFTED, lines[0] + more, lines)


def _first(errors: Sequence[Any], layers: set[str]) -> str:
    chosen = [f for f in errors if f.layer in layers]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    head = chosen[0]
    where = f"{head.path}: " if head.path and not head.message.startswith(head.path) else ""
    return f"{head.layer}: {where}{head.message}{more}"


# -- one host ------------------------------------------------------------------------------------


_UNREACHABLE_BY_REASON = {
    "refused": HostStatus.UNREACHABLE_REFUSED,
    "timeout": HostStatus.UNREACHABLE_TIMEOUT,
}
_AUTH_BY_REASON = {
    "host-key-unknown": HostStatus.HOST_KEY_UNKNOWN,
    "host-key-changed": HostStatus.HOST_KEY_CHANGED,
}


def classify_exception(
    exc: BaseException, *, waited_s: float | None = None, timeout_s: float | None = None
) -> tuple[HostStatus, str]:
    """Map a transport / remote error to a status, by the error's type and ``reason``.

    ``waited_s`` / ``timeout_s``: a handshake that failed only after the whole connect/banner
    timeout had passed is a timeout, whatever paramiko's words (it sometimes reports a banner
    timeout as "No existing session").
    """
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(exc, UnreachableError):
        status = _UNREACHABLE_BY_REASON.get(exc.reason, HostStatus.UNREACHABLE)
        if (
            status is HostStatus.UNREACHABLE
            and waited_s is not None
            and timeout_s is not None
            and waited_s >= timeout_s * 0.95
        ):
            return HostStatus.UNREACHABLE_TIMEOUT, f"{message} (no answer within {timeout_s:g} s)"
        return status, message
    if isinstance(exc, AuthError):
        return _AUTH_BY_REASON.get(exc.reason, HostStatus.AUTH_FAILED), message
    if isinstance(exc, ContainerError):
        return HostStatus.CONTAINER_NOT_RUNNING, message
    if isinstance(exc, RemoteStepFailed) and exc.step == "timeout":
        # The host accepted the connection but the command hung: as good as unreachable.
        return HostStatus.UNREACHABLE_TIMEOUT, message
    return HostStatus.ERROR, message


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


def _audit_on(
    run: FleetRun,
    member: FleetMember,
    transport: _CountingTransport,
    started: float,
    read: RemoteRead | None = None,
) -> HostAudit:
    """Read the member's file (unless ``read`` is given: a read already made) and classify it."""
    from dflash_provision.remote.ops import read_remote_config

    audit = _new_audit(run, member)
    execs_before = transport.execs
    t0 = time.monotonic()
    try:
        if read is None:
            read = read_remote_config(
                transport, member.target.config_path, timeout=run.command_timeout, metadata=False
            )
    except DflashProvisionError as exc:
        audit.timings.read_s = time.monotonic() - t0
        audit.status, audit.detail = classify_exception(
            exc, waited_s=audit.timings.read_s, timeout_s=run.handshake_timeout
        )
    except Exception as exc:  # a bug must not abort the other hosts' audits: report it here
        audit.timings.read_s = time.monotonic() - t0
        audit.status, audit.detail = HostStatus.ERROR, _internal_error(exc)
    else:
        audit.timings.read_s = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            _classify_read(run, member, read, audit)
        except Exception as exc:
            audit.status, audit.detail = HostStatus.ERROR, _internal_error(exc)
        audit.timings.classify_s = time.monotonic() - t1
    audit.execs = transport.execs - execs_before
    audit.timings.total_s = time.monotonic() - started
    return audit


def _internal_error(exc: BaseException) -> str:
    return f"internal error ({type(exc).__name__}: {exc}); please report it"


def _classify_read(run: FleetRun, member: FleetMember, read: RemoteRead, audit: HostAudit) -> None:
    from dflash_provision.remote.ops import ReadStatus

    if read.status is ReadStatus.PRESENT and read.data is not None and read.sha256:
        audit.sha256 = read.sha256
        verdict = run.verdict(read.data, read.sha256, run.authority(member))
        audit.status, audit.detail = verdict.status, verdict.detail
        audit.diff, audit.findings = list(verdict.diff), list(verdict.findings)
    elif read.status is ReadStatus.MISSING:
        audit.status, audit.detail = HostStatus.MISSING, f"{read.path}: no such file"
    elif read.status is ReadStatus.DIR_MISSING:
        audit.status = HostStatus.MISSING
        audit.detail = f"{member.target.model_dir}: model directory does not exist"
    elif read.status is ReadStatus.PERMISSION_DENIED:
        audit.status, audit.detail = HostStatus.PERMISSION_DENIED, read.describe()
    else:
        audit.status, audit.detail = HostStatus.ERROR, read.describe()


def audit_host(run: FleetRun, member: FleetMember) -> HostAudit:
    """Audit one member on its own connection (opened and closed here)."""
    started = time.monotonic()
    transport = run.open(member)
    try:
        return _audit_on(run, member, transport, started)
    finally:
        transport.close()


# -- audit ---------------------------------------------------------------------------------------


def audit(
    members: Sequence[FleetMember],
    authority_for: AuthorityFor,
    *,
    workers: int = DEFAULT_WORKERS,
    ssh_options: SshOptions | None = None,
    progress: AuditProgress | None = None,
    history: HistoryStore | None = None,
    open_transport: TransportOpener | None = None,
    run: FleetRun | None = None,
) -> list[HostAudit]:
    """Audit every member in parallel; results come back in the members' order.

    ``progress`` is called in the calling thread as each host finishes. With ``history`` every
    result is recorded (one transaction for the whole fleet).
    """
    run = run or FleetRun(authority_for, ssh_options=ssh_options, open_transport=open_transport)
    _resolve_authorities(run, members)
    results: dict[str, HostAudit] = {}
    with ThreadPoolExecutor(
        max_workers=_pool_size(workers, members), thread_name_prefix="audit"
    ) as pool:
        futures = {pool.submit(audit_host, run, m): m for m in members}
        for future in as_completed(futures):
            result = future.result()
            results[result.name] = result
            if progress is not None:
                progress(result)
    ordered = [results[m.name] for m in members]
    if history is not None:
        _record_audits(history, ordered)
    return ordered


def _pool_size(workers: int, members: Sequence[FleetMember]) -> int:
    return max(1, min(workers, len(members)))


def _resolve_authorities(run: FleetRun, members: Sequence[FleetMember]) -> None:
    # Sequentially and up front: a Hub error stops the run before any host is touched, and
    # workers never wait on each other's Hub requests.
    for member in members:
        run.authority(member)


def _check_authorities(run: FleetRun, members: Sequence[FleetMember]) -> None:
    """Refuse to write an authoritative config that fails validation (ConfigInvalid)."""
    from dflash_provision.push import check_authority

    checked: set[str] = set()
    for member in members:
        authority = run.authority(member)
        if authority.sha256 not in checked:
            check_authority(LoadedConfig(authority.label, authority.data), force=False)
            checked.add(authority.sha256)


def _record_audits(history: HistoryStore, audits: Sequence[HostAudit], op: str = "audit") -> None:
    from dflash_provision.history import AuditRecord

    history.record_audits(
        [
            AuditRecord(a.name, a.path, a.status.value, a.sha256, a.detail, a.timings.total_s)
            for a in audits
        ],
        op=op,
    )


# -- repair --------------------------------------------------------------------------------------


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
    ssh_options: SshOptions | None = None,
    dry_run: bool = False,
    max_failures: int | None = None,
    progress: RepairProgress | None = None,
    history: HistoryStore | None = None,
    open_transport: TransportOpener | None = None,
    push_options: dict[str, Any] | None = None,
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
    run = run or FleetRun(authority_for, ssh_options=ssh_options, open_transport=open_transport)
    _resolve_authorities(run, members)
    if not dry_run:
        _check_authorities(run, members)
    budget = _FailureBudget(max_failures)
    results: dict[str, HostRepair] = {}

    def one(member: FleetMember) -> HostRepair:
        return _repair_host(run, member, dry_run, budget, history, push_options or {})

    with ThreadPoolExecutor(
        max_workers=_pool_size(workers, members), thread_name_prefix="repair"
    ) as pool:
        futures = {pool.submit(one, m): m for m in members}
        for future in as_completed(futures):
            result = future.result()
            results[result.name] = result
            if progress is not None:
                progress(result)
    ordered = [results[m.name] for m in members]
    if history is not None:
        # Each host's latest known state (after the write, for written hosts); the writes
        # themselves were recorded as they happened.
        _record_audits(history, [r.final for r in ordered])
    return ordered


def _repair_host(
    run: FleetRun,
    member: FleetMember,
    dry_run: bool,
    budget: _FailureBudget,
    history: HistoryStore | None,
    push_options: dict[str, Any],
) -> HostRepair:
    started = time.monotonic()
    transport = run.open(member)
    try:
        result = _repair_steps(
            run, member, transport, started, dry_run, budget, history, push_options
        )
        result.execs = transport.execs
        return result
    finally:
        transport.close()


def _repair_steps(
    run: FleetRun,
    member: FleetMember,
    transport: _CountingTransport,
    started: float,
    dry_run: bool,
    budget: _FailureBudget,
    history: HistoryStore | None,
    push_options: dict[str, Any],
) -> HostRepair:
    before = _audit_on(run, member, transport, started)
    if before.status is HostStatus.IN_SYNC:
        return HostRepair(before, RepairAction.SKIPPED_IN_SYNC, before.detail)
    if not before.status.needs_write:
        return HostRepair(before, RepairAction.SKIPPED_NOT_AUDITED, before.detail)
    if dry_run:
        return HostRepair(
            before, RepairAction.WOULD_WRITE, f"would replace ({before.status.value})"
        )
    if not budget.may_start():
        return HostRepair(
            before,
            RepairAction.SKIPPED_MAX_FAILURES,
            f"not written: --max-failures {budget.limit} reached",
        )
    result, readback = _write(run, member, transport, before, history, push_options)
    if result.action is RepairAction.FAILED:
        budget.failed()
    # The fresh audit: push's read-back is already a separate exec reading the file from disk
    # after the rename (what vLLM will see), so judge that; read again only when there was none.
    result.after = _audit_on(run, member, transport, time.monotonic(), read=readback)
    return result


def _write(
    run: FleetRun,
    member: FleetMember,
    transport: _CountingTransport,
    before: HostAudit,
    history: HistoryStore | None,
    push_options: dict[str, Any],
) -> tuple[HostRepair, RemoteRead | None]:
    """Push on the open connection; returns the result and push's read-back (if it got one)."""
    from dflash_provision.push import push_config

    authority = run.authority(member)
    loaded = LoadedConfig(authority.label, authority.data)
    repair = HostRepair(before, RepairAction.FAILED, sha256_before=before.sha256)
    readback: RemoteRead | None = None
    t0 = time.monotonic()
    history_id = (
        history.record_start(
            "repair", member.name, member.target.config_path, sha256_before=before.sha256
        )
        if history is not None
        else None
    )
    repair.history_id = history_id
    try:
        outcome = push_config(
            transport,
            member.target,
            loaded,
            timeout=run.command_timeout,
            validate=False,  # validated once per authoritative source in repair()
            **push_options,
        )
    except DflashProvisionError as exc:
        repair.message = exc.message
    except Exception as exc:  # see _audit_on; the file's state is unknown, the history says so
        repair.message = _internal_error(exc) + "; the file may or may not have been replaced"
    else:
        readback = outcome.readback
        repair.sha256_before = outcome.old_sha256
        repair.sha256_after = outcome.readback.sha256 if outcome.readback else None
        if outcome.ok:
            repair.action = RepairAction.WROTE
            repair.message = _describe_push(outcome, before)
        else:
            repair.message = outcome.message or f"push {outcome.status.value}"
    before.timings.write_s = time.monotonic() - t0
    if history is not None and history_id is not None:
        history.record_finish(
            history_id,
            status="ok" if repair.action is RepairAction.WROTE else "failed",
            sha256_before=before.sha256,
            sha256_after=repair.sha256_after,
            message=repair.message,
            duration_s=before.timings.write_s,
        )
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


# -- exit codes (documented in dflash_provision.cli.audit) ---------------------------------------


def audit_exit_code(audits: Sequence[HostAudit]) -> ExitCode:
    """0 all in sync; DRIFT (4) when any host's file is wrong; else UNREACHABLE (5) when any
    host could not be judged. Drift wins: it is a known-bad host, the other is an unknown one."""
    if any(a.status.needs_write for a in audits):
        return ExitCode.DRIFT
    if any(not a.status.audited for a in audits):
        return ExitCode.UNREACHABLE
    return ExitCode.OK


def repair_exit_code(repairs: Sequence[HostRepair], *, dry_run: bool) -> ExitCode:
    """See dflash_provision.cli.repair: 0 only when every host ends in sync."""
    if dry_run:
        return audit_exit_code([r.before for r in repairs])
    if any(
        r.action in (RepairAction.FAILED, RepairAction.SKIPPED_MAX_FAILURES)
        or (r.action is RepairAction.WROTE and r.final.status is not HostStatus.IN_SYNC)
        for r in repairs
    ):
        return ExitCode.ERROR
    if any(not r.final.status.audited for r in repairs):
        return ExitCode.UNREACHABLE
    return ExitCode.OK
