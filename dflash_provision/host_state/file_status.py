"""The one judge of a host's drafter config against the authoritative config, and the one table
that says what each command makes of its verdict.

Whether a file is right is decided by :func:`judge` and nowhere else: ``verify``, ``launch``'s
pre-flight, ``audit``, ``repair`` and runtime-check stage a all call it (a fleet run through a
per-content cache, fleet/run.py), so they give one file one status. What differs between the
commands is only what the status costs, and that is :data:`EXIT_CODE`, one row per command.

The authority is a lock's bytes, not a set of values: a file with the authoritative values in
other bytes (reformatted, keys reordered) is not ``in_sync`` but ``same_values``. The provisioning
commands count it as drift (verify and audit exit 4, repair writes the exact bytes), because the
sha256 proof is lost and the next reader cannot tell a reformat from an edit without parsing.
The runtime commands pass it with a warning that names it: the server loads the same values.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_provision.errors import ExitCode
from dflash_provision.remote.ops import ReadStatus
from dflash_provision.validation.diff import config_diff
from dflash_provision.validation.validate import validate_config

if TYPE_CHECKING:
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.source.authority import Authority
    from dflash_provision.validation.diff import ConfigDiff
    from dflash_provision.validation.findings import Finding


class HostStatus(enum.StrEnum):
    """What is known of one host's config file (the values are the --json / history words)."""

    IN_SYNC = "in_sync"  # the bytes are the authoritative bytes (same sha256)
    SAME_VALUES = "same_values"  # other bytes, the same JSON values (formatting, key order)
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
        """The host answered and its file is not the authoritative bytes."""
        return self in NEEDS_WRITE

    @property
    def audited(self) -> bool:
        """The host's file could be read and judged."""
        return self is HostStatus.IN_SYNC or self in NEEDS_WRITE


NEEDS_WRITE = frozenset(
    {
        HostStatus.SAME_VALUES,
        HostStatus.DRIFTED,
        HostStatus.MISSING,
        HostStatus.INVALID,
        HostStatus.LOADER_NORMALISED,
    }
)
UNREACHABLE_STATUSES = frozenset(
    {HostStatus.UNREACHABLE_REFUSED, HostStatus.UNREACHABLE_TIMEOUT, HostStatus.UNREACHABLE}
)


class Command(enum.StrEnum):
    """The commands that judge a host's file, as their rows in EXIT_CODE are named."""

    VERIFY = "verify"
    AUDIT = "audit"
    REPAIR = "repair"
    LAUNCH = "launch"
    RUNTIME_CHECK = "runtime-check"


# A file that could not be read costs what the failure to read it costs (verify raises these as
# errors with the same codes: errors.UnreachableError, AuthError, ContainerError).
_NOT_READ: dict[HostStatus, ExitCode] = {
    HostStatus.UNREACHABLE_REFUSED: ExitCode.UNREACHABLE,
    HostStatus.UNREACHABLE_TIMEOUT: ExitCode.UNREACHABLE,
    HostStatus.UNREACHABLE: ExitCode.UNREACHABLE,
    HostStatus.AUTH_FAILED: ExitCode.AUTH,
    HostStatus.HOST_KEY_UNKNOWN: ExitCode.AUTH,
    HostStatus.HOST_KEY_CHANGED: ExitCode.AUTH,
    HostStatus.PERMISSION_DENIED: ExitCode.REMOTE_FAILED,
    HostStatus.CONTAINER_NOT_RUNNING: ExitCode.CONTAINER,
    HostStatus.ERROR: ExitCode.REMOTE_FAILED,
}


def _row(
    in_sync: ExitCode, same_values: ExitCode, wrong: ExitCode, *, unread: ExitCode | None = None
) -> dict[HostStatus, ExitCode]:
    """A command's codes: for the authoritative bytes, for the authoritative values in other
    bytes, for a wrong file; a file not read costs what not reading it costs (``unread``: what
    a file that was reached but not read costs instead)."""
    row = {HostStatus.IN_SYNC: in_sync, HostStatus.SAME_VALUES: same_values}
    row.update({status: wrong for status in NEEDS_WRITE - {HostStatus.SAME_VALUES}})
    row.update(_NOT_READ)
    if unread is not None:
        row.update({HostStatus.PERMISSION_DENIED: unread, HostStatus.ERROR: unread})
    return row


_VERIFY = _row(ExitCode.OK, ExitCode.DRIFT, ExitCode.DRIFT)

#: command -> host status -> exit code. Audit and repair roll their hosts' codes up
#: (fleet/results.py: drift first, then 7, 8, 6, 5); repair's row is of a host's status after
#: the repair (a host still not in sync is a failed write, 7; with --dry-run repair exits as
#: audit); runtime-check's row is stage a's (OK: the stage passes; a failed stage exits 24).
EXIT_CODE: Mapping[Command, Mapping[HostStatus, ExitCode]] = {
    Command.VERIFY: _VERIFY,
    Command.AUDIT: _VERIFY,  # a host exits as `verify` of that host would
    Command.REPAIR: _row(ExitCode.OK, ExitCode.REMOTE_FAILED, ExitCode.REMOTE_FAILED),
    Command.LAUNCH: _row(ExitCode.OK, ExitCode.OK, ExitCode.DRIFT),
    Command.RUNTIME_CHECK: _row(
        ExitCode.OK,
        ExitCode.OK,
        ExitCode.RUNTIME_CHECK_FAILED,
        unread=ExitCode.RUNTIME_CHECK_FAILED,
    ),
}

#: The statuses a command lets pass, but not silently: its output names the status.
PASSES_WITH_WARNING: Mapping[Command, frozenset[HostStatus]] = {
    Command.LAUNCH: frozenset({HostStatus.SAME_VALUES}),
    Command.RUNTIME_CHECK: frozenset({HostStatus.SAME_VALUES}),
}


def passes(command: Command, status: HostStatus) -> bool:
    """``command`` goes on with a file of this status (see PASSES_WITH_WARNING for the warning)."""
    return EXIT_CODE[command][status] is ExitCode.OK


@dataclass(frozen=True)
class Judgement:
    """A file's status against the authority, with the evidence: ``detail`` is one line (audit's
    column), ``diff`` the comparison with the authoritative bytes when the file was read."""

    status: HostStatus
    detail: str
    diff: ConfigDiff | None = None
    findings: tuple[dict[str, str], ...] = ()  # validation errors of a file that was judged

    @property
    def changes(self) -> tuple[str, ...]:
        """``path: host value → authoritative value`` lines (none when no field differs)."""
        if self.diff is None or not self.diff.changes:
            return ()
        return tuple(self.diff.lines)


def judge(read: RemoteRead, authority: Authority) -> Judgement:
    """The status of the file ``read`` found, against ``authority`` (no I/O of its own).

    In order: the authoritative bytes (``in_sync``); no file (``missing``); not readable
    (``permission_denied``, ``error``); the authoritative values in other bytes
    (``same_values``); then the file's own validation (``invalid``, ``loader_normalised``, with
    the findings) before its differences (``drifted``). A file with the authoritative values is
    as valid as the authority, so only a file with other values is validated: that is the
    transformers import, once per distinct content thanks to the verdict cache."""
    if read.status is ReadStatus.MISSING:
        return Judgement(HostStatus.MISSING, f"{read.path}: no such file")
    if read.status is ReadStatus.DIR_MISSING:
        where = posixpath.dirname(read.path) or "/"
        return Judgement(HostStatus.MISSING, f"{where}: model directory does not exist")
    if read.status is ReadStatus.PERMISSION_DENIED:
        return Judgement(HostStatus.PERMISSION_DENIED, read.describe())
    if not read.present or read.data is None:
        return Judgement(HostStatus.ERROR, read.describe())
    return judge_bytes(read.data, authority)


def judge_bytes(data: bytes, authority: Authority) -> Judgement:
    """:func:`judge` of a file that was read: ``data`` are its bytes."""
    if data == authority.data:
        return Judgement(HostStatus.IN_SYNC, "matches " + authority.label)
    diff = config_diff(data, authority.data)
    if diff.formatting_only:
        return Judgement(
            HostStatus.SAME_VALUES,
            f"same values as {authority.label}, other bytes (formatting or key order)",
            diff,
        )
    report = validate_config(data, label="host file", effective=True)
    errors = report.errors
    findings = tuple(f.to_dict() for f in errors)
    layers = {f.layer for f in errors}
    if layers & {"parse", "schema"}:
        return Judgement(HostStatus.INVALID, _first(errors, {"parse", "schema"}), diff, findings)
    if report.loader_normalised:  # the rule validate --json uses too (findings.py)
        return Judgement(
            HostStatus.LOADER_NORMALISED, _first(errors, {"effective"}), diff, findings
        )
    if layers:
        return Judgement(HostStatus.INVALID, _first(errors, layers), diff, findings)
    more = f" (+{len(diff.lines) - 1} more)" if len(diff.lines) > 1 else ""
    return Judgement(HostStatus.DRIFTED, diff.lines[0] + more, diff)


def _first(errors: Sequence[Finding], layers: AbstractSet[str]) -> str:
    chosen = [f for f in errors if f.layer in layers]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    head = chosen[0]
    where = f"{head.path}: " if head.path and not head.message.startswith(head.path) else ""
    return f"{head.layer}: {where}{head.message}{more}"
