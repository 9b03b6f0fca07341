"""What a fleet command found and did per host, and the exit codes that sum it up."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.host_state.file_status import EXIT_CODE, Command, HostStatus

if TYPE_CHECKING:
    from dflash_provision.place.push import PushResult


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
    #: The write's outcome, when repair wrote (or tried to): the sha256 figures are its own.
    push: PushResult | None = field(default=None, repr=False)
    history_id: int | None = None
    execs: int = 0  # remote commands run for this host in the whole repair

    @property
    def name(self) -> str:
        return self.before.name

    @property
    def sha256_before(self) -> str | None:
        """The file the write replaced (or found): as the write hashed it."""
        return self.push.old_sha256 if self.push is not None else None

    @property
    def sha256_after(self) -> str | None:
        """What the file held after the write, as its history row keeps it."""
        return self.push.sha256_after if self.push is not None else None

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


# Each host's code is its status's in the command's row of file_status.EXIT_CODE; with hosts of
# several codes the first of this order wins: a known-wrong file (drift) is the more urgent news,
# then the failures nearest the file (the nearer, the more they say).
_PRECEDENCE = (
    ExitCode.DRIFT,
    ExitCode.REMOTE_FAILED,
    ExitCode.CONTAINER,
    ExitCode.AUTH,
    ExitCode.UNREACHABLE,
)


def fleet_exit_code(command: Command, statuses: Iterable[HostStatus]) -> ExitCode:
    """The fleet's code: OK when every host's code is OK, else the first of _PRECEDENCE."""
    codes = {EXIT_CODE[command][status] for status in statuses}
    return next((code for code in _PRECEDENCE if code in codes), ExitCode.OK)


def audit_exit_code(audits: Sequence[HostAudit]) -> ExitCode:
    """0 all in sync; DRIFT (4) when any host's file is wrong (same_values included: a lock pins
    bytes); else 7 read failed, 8 container, 6 authentication or host key, 5 unreachable."""
    return fleet_exit_code(Command.AUDIT, (a.status for a in audits))


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
        for r in repairs
    ):
        return ExitCode.REMOTE_FAILED
    # A written host that is not in sync afterwards is a failed write: REMOTE_FAILED in the row.
    return fleet_exit_code(Command.REPAIR, (r.final.status for r in repairs))
