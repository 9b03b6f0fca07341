"""``runtime-check`` over a fleet: every member checked in parallel with the fleet engine's pool
(one connection per host, results in inventory order), summarised for a table, JSON and a
node_exporter textfile with per-host acceptance gauges.

Prometheus metrics (one series per host unless said otherwise)::

    dflash_runtime_check_up{host,group,path}                1 checked, 0 could not be checked
                                                            (unreachable, its deadline, an error)
    dflash_runtime_check_passed{host,group,path}            1 when every stage a-e passed
    dflash_runtime_check_inconclusive{host,group,path}      1 when no stage failed, one undecided
    dflash_runtime_stage_passed{host,group,path,stage}      1 passed, 0 failed or skipped
    dflash_runtime_acceptance_rate{host,group,path}         accepted / draft tokens (when measured)
    dflash_runtime_mean_acceptance_length{host,group,path}  1 + accepted / drafts (when measured)
    dflash_runtime_acceptance_regression{host,group,path}   drop of the mean acceptance length
                                                            vs the host's reference (0.12 = 12 %
                                                            lower; only when compared)
    dflash_runtime_check_duration_seconds{host,group,path}  time spent on the host
    dflash_runtime_check_timestamp_seconds                  when the run finished (Unix time)

An alert on ``dflash_runtime_acceptance_rate < 0.1`` catches an acceptance collapse the way
``dflash_config_in_sync == 0`` catches drift; ``dflash_runtime_check_passed == 0`` catches the
rest (a host that could not be reached has no acceptance series and check_passed 0), and
``dflash_runtime_check_up == 0`` names every host the run could not check, so that an alert
on its last acceptance cannot go silently stale.
"""

from __future__ import annotations

import contextlib
import enum
import shlex
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode, RemoteStepFailed
from dflash_provision.fleet.auditing import for_each_host, internal_error, resolve_authorities
from dflash_provision.fleet.classify import classify_exception
from dflash_provision.fleet.run import CountingTransport
from dflash_provision.formats.prometheus_text import MetricFamily, render
from dflash_provision.plain_table import Cell, Column, TableSpec
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.verify.runtime_check import (
    CheckReport,
    CheckSettings,
    push_fix_command,
    run_check,
)

if TYPE_CHECKING:
    from dflash_provision.fleet import FleetRun
    from dflash_provision.inventory import FleetMember

STAGE_KEYS = ("a", "b", "c", "d", "e")


class HostVerdict(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # a stage a-d failed
    ACCEPTANCE_LOW = "acceptance_low"  # only the acceptance gate failed
    INCONCLUSIVE = "inconclusive"  # no stage failed, one could not tell (never a pass)
    NOT_CHECKED = "not_checked"  # the host could not be reached or read (detail says why)


@dataclass
class HostCheck:
    name: str
    group: str
    target: str
    path: str
    verdict: HostVerdict
    detail: str
    report: CheckReport | None = None
    unreachable_status: str | None = None  # the audit status word when NOT_CHECKED
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "target": self.target,
            "path": self.path,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "status": self.unreachable_status,
            "duration_s": round(self.duration_s, 3),
            "check": self.report.to_dict() if self.report else None,
        }


def check_host(
    run: FleetRun,
    member: FleetMember,
    settings: CheckSettings,
    host_deadline: float | None = None,
) -> HostCheck:
    """Check one member on its own connection; errors become a NOT_CHECKED row, never raise.
    ``host_deadline``: the most seconds the host may take (then NOT_CHECKED, status
    "deadline", its connection closed; see ``_within``)."""
    if host_deadline is None:
        return _check_host(run, member, settings, run.open(member))
    return _within(run, member, settings, host_deadline)


def _within(
    run: FleetRun, member: FleetMember, settings: CheckSettings, host_deadline: float
) -> HostCheck:
    """The check in a daemon thread of its own, waited for at most ``host_deadline`` s. At the
    deadline the host's transport refuses every further command and is closed (which ends a read
    in flight), and the row says so: the run goes on without it, and a thread still finishing
    one bounded step does not hold the process at exit."""
    started = time.monotonic()
    guard = _Guard(run.open(member))
    rows: list[HostCheck] = []
    worker = threading.Thread(
        target=lambda: rows.append(_check_host(run, member, settings, guard)),
        name=f"runtime-check {member.name}",
        daemon=True,
    )
    worker.start()
    worker.join(host_deadline)
    if rows:
        return rows[0]
    guard.expire()
    row = _row(member)
    row.unreachable_status = "deadline"
    row.detail = (
        f"not checked: the host did not finish within its {host_deadline:g} s deadline "
        "(--deadline); its connection was closed"
    )
    row.duration_s = time.monotonic() - started
    return row


class _Guard(CountingTransport):
    """The host's transport until its deadline; then every command is refused at once."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self.expired = threading.Event()

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        if self.expired.is_set():
            raise RemoteStepFailed(f"{self.description}: deadline reached", step="timeout")
        return super().run(argv, stdin=stdin, timeout=timeout)

    def expire(self) -> None:
        self.expired.set()
        with contextlib.suppress(Exception):  # closing a connection that is already gone
            self.inner.close()


def _row(member: FleetMember) -> HostCheck:
    return HostCheck(
        member.name,
        member.group,
        member.target.display(),
        member.target.config_path,
        HostVerdict.NOT_CHECKED,
        "",
    )


def _check_host(
    run: FleetRun, member: FleetMember, settings: CheckSettings, transport: Transport
) -> HostCheck:
    started = time.monotonic()
    row = _row(member)
    authority = run.authority(member)
    fix = push_fix_command(member.target, shlex.join(member.source.push_options()))
    try:
        report = run_check(transport, member.target, authority, settings, push_fix=fix)
    except DflashProvisionError as exc:
        status, row.detail = classify_exception(
            exc, waited_s=time.monotonic() - started, timeout_s=run.handshake_timeout
        )
        row.unreachable_status = status.value
    except Exception as exc:  # a bug on one host must not stop the others
        row.detail = internal_error(exc)
        row.unreachable_status = "error"
    else:
        row.report = report
        row.verdict, row.detail = verdict_of(report)
    finally:
        transport.close()
    row.duration_s = time.monotonic() - started
    return row


def verdict_of(report: CheckReport) -> tuple[HostVerdict, str]:
    """One host's verdict and its one-line detail (``e: <stage e's summary>``); the fleet
    table's and the Ansible runtime_check task's."""
    failure = report.first_failure
    undecided = next((s for s in report.stages if s.inconclusive), None)
    if failure is None and undecided is not None:
        return HostVerdict.INCONCLUSIVE, f"{undecided.key}: {undecided.summary}"
    if failure is None:
        rate = report.acceptance
        return HostVerdict.PASSED, f"acceptance {rate:.1%}" if rate is not None else "passed"
    verdict = HostVerdict.ACCEPTANCE_LOW if failure.key == "e" else HostVerdict.FAILED
    return verdict, f"{failure.key}: {failure.summary}"


def check_fleet(
    members: Sequence[FleetMember],
    run: FleetRun,
    settings: CheckSettings,
    *,
    workers: int,
    progress: Callable[[HostCheck], None] | None = None,
    host_deadline: float | None = None,
) -> list[HostCheck]:
    """Check every member in parallel (bounded pool); rows in the members' order. With
    ``host_deadline`` no host takes longer than that (see ``check_host``), so the run ends
    within ceil(hosts / workers) host deadlines."""
    resolve_authorities(run, members)  # a Hub error stops the run before any host is touched
    return for_each_host(
        members,
        lambda m: check_host(run, m, settings, host_deadline),
        workers,
        "runtime-check",
        progress,
        run.stopping,
    )


def default_host_deadline(command_timeout: float) -> float:
    """A host's deadline when --deadline is not given: three command timeouts (a healthy check
    takes a few seconds; each of its steps is bounded by one command timeout)."""
    return 3.0 * command_timeout


def fleet_exit_code(rows: Sequence[HostCheck]) -> ExitCode:
    """24 when any host fails a stage a-d, else 25 when any is below the acceptance gate, else 5
    when any could not be checked, else 26 when any was inconclusive, else 0."""
    verdicts = {r.verdict for r in rows}
    if HostVerdict.FAILED in verdicts:
        return ExitCode.RUNTIME_CHECK_FAILED
    if HostVerdict.ACCEPTANCE_LOW in verdicts:
        return ExitCode.ACCEPTANCE_LOW
    if HostVerdict.NOT_CHECKED in verdicts:
        return ExitCode.UNREACHABLE
    if HostVerdict.INCONCLUSIVE in verdicts:
        return ExitCode.INCONCLUSIVE
    return ExitCode.OK


# -- rendering (values; the CLI prints them) ---------------------------------------------------

_STYLE = {
    HostVerdict.PASSED: "green",
    HostVerdict.FAILED: "bold red",
    HostVerdict.ACCEPTANCE_LOW: "bold magenta",
    HostVerdict.NOT_CHECKED: "yellow",
    HostVerdict.INCONCLUSIVE: "bold yellow",
}
_MARK = {"passed": "ok", "failed": "FAIL", "skipped": "-", "inconclusive": "??"}


def fleet_table(rows: Sequence[HostCheck]) -> TableSpec:
    """host, verdict, one column per stage, acceptance, detail."""
    columns = (
        Column("host", no_wrap=True),
        Column("verdict", no_wrap=True),
        *(Column(key, no_wrap=True) for key in STAGE_KEYS),
        Column("acceptance", no_wrap=True, justify="right"),
        Column("detail", overflow="fold"),
    )
    cells = []
    for row in rows:
        marks = []
        for key in STAGE_KEYS:
            stage = row.report.stage(key) if row.report else None
            marks.append(Cell(_MARK[stage.status.value] if stage else "?"))
        rate = row.report.acceptance if row.report else None
        verdict = row.unreachable_status or row.verdict.value
        cells.append(
            (
                Cell(row.name, markup=True),
                Cell(verdict, style=_STYLE[row.verdict]),
                *marks,
                Cell(f"{rate:.1%}" if rate is not None else "-"),
                Cell(row.detail),
            )
        )
    return TableSpec(columns, tuple(cells))


def summary_line(rows: Sequence[HostCheck], elapsed_s: float) -> str:
    counts = Counter(r.verdict for r in rows)
    parts = [f"{counts[v]} {v.value.replace('_', ' ')}" for v in HostVerdict if counts[v]]
    return (
        f"{len(rows)} host{'s' if len(rows) != 1 else ''}: {', '.join(parts)} ({elapsed_s:.1f} s)"
    )


def fleet_document(
    rows: Sequence[HostCheck], *, elapsed_s: float, exit_code: int
) -> dict[str, Any]:
    counts = Counter(r.verdict for r in rows)
    return {
        "summary": {
            "hosts": len(rows),
            "elapsed_s": round(elapsed_s, 3),
            "exit_code": exit_code,
            "by_verdict": {v.value: counts[v] for v in HostVerdict if counts[v]},
        },
        "hosts": [r.to_dict() for r in rows],
    }


def prometheus_text(rows: Sequence[HostCheck], *, timestamp: float) -> str:
    """The node_exporter textfile for one run (see the module docstring)."""
    up = MetricFamily(
        "dflash_runtime_check_up",
        "1 when the host was checked, 0 when it could not be (unreachable, deadline, error).",
    )
    passed = MetricFamily(
        "dflash_runtime_check_passed", "1 when every runtime-check stage passed, else 0."
    )
    undecided = MetricFamily(
        "dflash_runtime_check_inconclusive", "1 when no stage failed but one could not tell."
    )
    stages = MetricFamily(
        "dflash_runtime_stage_passed", "1 when the runtime-check stage passed, else 0."
    )
    rate = MetricFamily(
        "dflash_runtime_acceptance_rate", "Draft acceptance rate over the smoke prompts."
    )
    mean = MetricFamily("dflash_runtime_mean_acceptance_length", "1 + accepted tokens / drafts.")
    # Stage e's regression against the acceptance reference, for an alert on a drop that stays
    # above the gate (no series when there was no reference to compare with).
    regression = MetricFamily(
        "dflash_runtime_acceptance_regression",
        "Relative drop of the mean acceptance length vs the reference (0.12 = 12 %).",
    )
    duration = MetricFamily(
        "dflash_runtime_check_duration_seconds", "Seconds the runtime check spent on the host."
    )
    for row in rows:
        where = {"host": row.name, "group": row.group, "path": row.path}
        report = row.report
        up.add(report is not None, **where)
        passed.add(row.verdict is HostVerdict.PASSED, **where)
        undecided.add(row.verdict is HostVerdict.INCONCLUSIVE, **where)
        for key in STAGE_KEYS:
            stage = report.stage(key) if report else None
            stages.add(stage is not None and stage.passed, **where, stage=key)
        if report is not None and report.acceptance is not None:
            rate.add(report.acceptance, **where)
        verdict = report.acceptance_verdict if report else None
        if verdict is not None and verdict.mean_length is not None:
            mean.add(verdict.mean_length, **where)
        if verdict is not None and verdict.regression is not None:
            regression.add(verdict.regression, **where)
        duration.add(row.duration_s, **where)
    finished = MetricFamily(
        "dflash_runtime_check_timestamp_seconds",
        "Unix time when the runtime check finished.",
        digits=3,
    )
    finished.add(timestamp)
    return render([up, passed, undecided, stages, rate, mean, regression, duration, finished])
