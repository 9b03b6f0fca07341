"""Render fleet results: tables for people (TableSpec, printed by cli/_render.py), JSON documents
for programs, a node_exporter textfile (formats/prometheus_text.py).

Renderers return values (tables, strings); the CLI prints them. ``write_textfile`` is the one
writer here: node_exporter's textfile collector may read the file at any moment, so it is written
to a temporary file in the same directory and renamed over the old one.

Prometheus metrics (one series per host unless said otherwise)::

    dflash_config_in_sync{host,group,path}                1 when the file is the authoritative one
    dflash_config_status{host,group,path,status}          1 for the host's status, 0 for the others
    dflash_config_audit_duration_seconds{host,group,path} time spent on the host
    dflash_config_audit_hosts{status}                     hosts per status (fleet-wide)
    dflash_config_audit_timestamp_seconds                 when the audit finished (Unix time)
    dflash_config_audit_run_duration_seconds              wall time of the whole audit

``dflash_config_in_sync`` is 0 for hosts that could not be read (unreachable...): "not known to
be right" is what an alert wants; ``dflash_config_status`` tells the reasons apart.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dflash_provision.fleet import HostAudit, HostRepair, HostStatus, RepairAction
from dflash_provision.formats.prometheus_text import MetricFamily, render
from dflash_provision.plain_table import Cell, Column, TableSpec

STATUS_STYLE: dict[HostStatus, str] = {
    HostStatus.IN_SYNC: "green",
    HostStatus.SAME_VALUES: "red",
    HostStatus.DRIFTED: "bold red",
    HostStatus.MISSING: "red",
    HostStatus.INVALID: "bold red",
    HostStatus.LOADER_NORMALISED: "bold magenta",
    HostStatus.UNREACHABLE_REFUSED: "yellow",
    HostStatus.UNREACHABLE_TIMEOUT: "yellow",
    HostStatus.UNREACHABLE: "yellow",
    HostStatus.AUTH_FAILED: "yellow",
    HostStatus.HOST_KEY_UNKNOWN: "yellow",
    HostStatus.HOST_KEY_CHANGED: "bold yellow",
    HostStatus.PERMISSION_DENIED: "yellow",
    HostStatus.CONTAINER_NOT_RUNNING: "yellow",
    HostStatus.ERROR: "yellow",
}

ACTION_STYLE: dict[RepairAction, str] = {
    RepairAction.WROTE: "green",
    RepairAction.WOULD_WRITE: "cyan",
    RepairAction.FAILED: "bold red",
    RepairAction.SKIPPED_IN_SYNC: "dim",
    RepairAction.SKIPPED_NOT_AUDITED: "yellow",
    RepairAction.SKIPPED_MAX_FAILURES: "yellow",
    RepairAction.SKIPPED_INTERRUPTED: "yellow",
}

# Status order in summaries: good first, then what needs a write, then what could not be read.
_ORDER = list(HostStatus)


# -- summaries -----------------------------------------------------------------------------------


def status_counts(audits: Iterable[HostAudit]) -> Counter[HostStatus]:
    return Counter(a.status for a in audits)


def summary_line(audits: Sequence[HostAudit], elapsed_s: float | None = None) -> str:
    """E.g. ``20 hosts: 12 in sync, 3 drifted, 1 missing, 2 unreachable_timeout (1.3 s)``."""
    counts = status_counts(audits)
    parts = [f"{counts[s]} {s.value.replace('_', ' ')}" for s in _ORDER if counts[s]]
    text = f"{len(audits)} host{'s' if len(audits) != 1 else ''}: " + ", ".join(parts or ["none"])
    return text + (f" ({elapsed_s:.1f} s)" if elapsed_s is not None else "")


def repair_summary_line(repairs: Sequence[HostRepair], elapsed_s: float | None = None) -> str:
    counts = Counter(r.action for r in repairs)
    in_sync_now = sum(1 for r in repairs if r.final.status is HostStatus.IN_SYNC)
    parts = [f"{counts[a]} {a.value.replace('_', ' ')}" for a in RepairAction if counts[a]]
    hosts = f"{len(repairs)} host{'s' if len(repairs) != 1 else ''}"
    text = f"{hosts}: " + ", ".join(parts or ["none"]) + f"; {in_sync_now} in sync now"
    return text + (f" ({elapsed_s:.1f} s)" if elapsed_s is not None else "")


# -- tables (rich on a terminal; without rich when piped and it fits) ----------------------------

AUDIT_COLUMNS = (
    Column("host", no_wrap=True),
    Column("status", no_wrap=True),
    Column("detail", overflow="fold"),
)
REPAIR_COLUMNS = (
    Column("host", no_wrap=True),
    Column("was", no_wrap=True),
    Column("action", no_wrap=True),
    Column("now", no_wrap=True),
    Column("detail", overflow="fold"),
)


class _DiffOnce:
    """A diff is printed in full for the first host that has it; a host with the very same
    changes says so in one line (a fleet drifted one way is one diff, not one per host)."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, ...], str] = {}

    def detail(self, name: str, diff: Sequence[str]) -> str:
        key = tuple(diff)
        if key in self.first:
            return f"the same {len(diff)} change(s) as {self.first[key]}"
        self.first[key] = name
        return "\n".join(diff)


def audit_spec(audits: Sequence[HostAudit], *, show_diff: bool = True) -> TableSpec:
    """Host, status, detail; drifted hosts list every changed field under the first line, once
    per distinct diff. ``show_diff=False`` (--brief): one line per host."""
    rows = []
    once = _DiffOnce()
    for audit in audits:
        detail = once.detail(audit.name, audit.diff) if show_diff and audit.diff else audit.detail
        rows.append(
            (
                Cell(audit.name, markup=True),
                Cell(audit.status.value, STATUS_STYLE[audit.status]),
                Cell(detail),
            )
        )
    return TableSpec(AUDIT_COLUMNS, tuple(rows))


def repair_spec(repairs: Sequence[HostRepair], *, show_diff: bool = True) -> TableSpec:
    """Host, what it was, what was done, what it is now, and the message (a dry run's diff
    once per distinct diff; ``show_diff=False``: its first line)."""
    rows = []
    once = _DiffOnce()
    for r in repairs:
        now = None if r.action is RepairAction.WOULD_WRITE else r.final.status
        if r.action is RepairAction.WOULD_WRITE and r.before.diff:
            diff = r.before.diff
            detail = once.detail(r.name, diff) if show_diff else r.before.detail
        else:
            detail = r.message
        rows.append(
            (
                Cell(r.name, markup=True),
                Cell(r.before.status.value, STATUS_STYLE[r.before.status]),
                Cell(r.action.value, ACTION_STYLE[r.action]),
                Cell(now.value, STATUS_STYLE[now]) if now else Cell("-", "dim"),
                Cell(detail),
            )
        )
    return TableSpec(REPAIR_COLUMNS, tuple(rows))


# -- JSON ----------------------------------------------------------------------------------------


def audit_document(
    audits: Sequence[HostAudit], *, elapsed_s: float, exit_code: int
) -> dict[str, Any]:
    counts = status_counts(audits)
    return {
        "summary": {
            "hosts": len(audits),
            "elapsed_s": round(elapsed_s, 3),
            "exit_code": exit_code,
            "by_status": {s.value: counts[s] for s in _ORDER if counts[s]},
        },
        "hosts": [a.to_dict() for a in audits],
    }


def repair_document(
    repairs: Sequence[HostRepair], *, elapsed_s: float, exit_code: int, dry_run: bool
) -> dict[str, Any]:
    actions = Counter(r.action for r in repairs)
    return {
        "summary": {
            "hosts": len(repairs),
            "dry_run": dry_run,
            "elapsed_s": round(elapsed_s, 3),
            "exit_code": exit_code,
            "by_action": {a.value: actions[a] for a in RepairAction if actions[a]},
            "in_sync_now": sum(1 for r in repairs if r.final.status is HostStatus.IN_SYNC),
        },
        "hosts": [r.to_dict() for r in repairs],
    }


# -- Prometheus textfile -------------------------------------------------------------------------


def prometheus_text(audits: Sequence[HostAudit], *, timestamp: float, run_duration_s: float) -> str:
    """The node_exporter textfile for one audit (see the module docstring)."""
    in_sync = MetricFamily(
        "dflash_config_in_sync",
        "1 when the host's DFlash drafter config is the authoritative one, else 0.",
    )
    status_of = MetricFamily(
        "dflash_config_status",
        "Audit status of the host's drafter config: 1 for the current status, 0 for the others.",
    )
    duration = MetricFamily(
        "dflash_config_audit_duration_seconds",
        "Seconds the last audit spent on the host (connect, read, classify).",
    )
    for a in audits:
        where = {"host": a.name, "group": a.group, "path": a.path}
        in_sync.add(a.status is HostStatus.IN_SYNC, **where)
        for status in _ORDER:
            status_of.add(a.status is status, **where, status=status.value)
        duration.add(a.timings.total_s, **where)
    hosts = MetricFamily("dflash_config_audit_hosts", "Hosts per audit status in the last audit.")
    counts = status_counts(audits)
    for status in _ORDER:
        hosts.add(counts[status], status=status.value)
    finished = MetricFamily(
        "dflash_config_audit_timestamp_seconds", "Unix time when the last audit finished.", digits=3
    )
    finished.add(timestamp)
    run = MetricFamily(
        "dflash_config_audit_run_duration_seconds",
        "Wall-clock seconds the last audit took for the whole fleet.",
    )
    run.add(run_duration_s)
    return render([in_sync, status_of, duration, hosts, finished, run])


def write_textfile(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same dir, fsync, rename, 0644)."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes 0600; node_exporter usually runs as another user.
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
