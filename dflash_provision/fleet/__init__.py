"""Audit and repair a fleet in parallel: one SSH connection and one read per host.

``audit`` reads every member's config with a bounded thread pool and classifies each host
(:class:`HostStatus`). ``repair`` does the same, and on every reachable host whose file is not
the authoritative bytes (same_values, drifted, missing, invalid, loader_normalised) runs the full
write protocol (``push_config``: atomic write + read-back) on the connection the audit opened,
then audits the host again. In-sync and unreachable hosts are never written to. Whether a file
is right is decided by :func:`dflash_provision.host_state.file_status.judge`, as for verify,
launch and runtime-check.

Per-host costs are kept flat: validation (whose "effective" layer imports and runs transformers)
runs once per distinct file content (sha256), never for a file identical to the authoritative
one, and the authoritative config is parsed once per drafter source.
"""

from __future__ import annotations

from dflash_provision.fleet.auditing import DEFAULT_WORKERS, AuditProgress, audit, audit_host
from dflash_provision.fleet.classify import classify_exception
from dflash_provision.fleet.repairing import RepairProgress, repair
from dflash_provision.fleet.results import (
    HostAudit,
    HostRepair,
    RepairAction,
    Timings,
    audit_exit_code,
    repair_exit_code,
)
from dflash_provision.fleet.run import AuthorityFor, FleetRun, authority_loader
from dflash_provision.host_state.file_status import NEEDS_WRITE, UNREACHABLE_STATUSES, HostStatus

__all__ = [
    "DEFAULT_WORKERS",
    "NEEDS_WRITE",
    "UNREACHABLE_STATUSES",
    "AuditProgress",
    "AuthorityFor",
    "FleetRun",
    "HostAudit",
    "HostRepair",
    "HostStatus",
    "RepairAction",
    "RepairProgress",
    "Timings",
    "audit",
    "audit_exit_code",
    "audit_host",
    "authority_loader",
    "classify_exception",
    "repair",
    "repair_exit_code",
]
