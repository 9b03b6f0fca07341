"""What a fleet command found and did per host, and the exit codes that sum it up."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dflash_provision.errors import ExitCode


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
    SKIPPED_INTERRUPTED = "skipped_interrupted"  # audited, then Ctrl-C: no write started


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


# -- exit codes (documented in dflash_provision.cli.audit and cli.repair) ----------------------


# A host that could not be judged exits as `verify` of that host would; with several kinds, the
# first of this list wins (the nearer the failure is to the file, the more it says).
_NOT_JUDGED_EXIT = (
    ({HostStatus.PERMISSION_DENIED, HostStatus.ERROR}, ExitCode.REMOTE_FAILED),
    ({HostStatus.CONTAINER_NOT_RUNNING}, ExitCode.CONTAINER),
    (
        {HostStatus.AUTH_FAILED, HostStatus.HOST_KEY_UNKNOWN, HostStatus.HOST_KEY_CHANGED},
        ExitCode.AUTH,
    ),
)


def not_judged_exit_code(audits: Sequence[HostAudit]) -> ExitCode:
    """For hosts whose file could not be read: 7 read failed, 8 container, 6 authentication or
    host key, 5 unreachable (in that order of precedence); OK when every host was judged."""
    statuses = {a.status for a in audits if not a.status.audited}
    if not statuses:
        return ExitCode.OK
    for kinds, code in _NOT_JUDGED_EXIT:
        if statuses & kinds:
            return code
    return ExitCode.UNREACHABLE


def audit_exit_code(audits: Sequence[HostAudit]) -> ExitCode:
    """0 all in sync; DRIFT (4) when any host's file is wrong; else the code of the hosts that
    could not be judged (see not_judged_exit_code). Drift wins: it is a known-bad host, the
    others are unknown ones."""
    if any(a.status.needs_write for a in audits):
        return ExitCode.DRIFT
    return not_judged_exit_code(audits)


def repair_exit_code(repairs: Sequence[HostRepair], *, dry_run: bool) -> ExitCode:
    """See dflash_provision.cli.repair: 0 only when every host ends in sync."""
    if dry_run:
        return audit_exit_code([r.before for r in repairs])
    if any(
        r.action
        in (
            RepairAction.FAILED,
            RepairAction.SKIPPED_MAX_FAILURES,
            RepairAction.SKIPPED_INTERRUPTED,
        )
        or (r.action is RepairAction.WROTE and r.final.status is not HostStatus.IN_SYNC)
        for r in repairs
    ):
        return ExitCode.REMOTE_FAILED
    return not_judged_exit_code([r.final for r in repairs])
