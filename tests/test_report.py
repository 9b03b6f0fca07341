"""Renderers for fleet results: table, JSON, Prometheus textfile; exit-code rules."""

from __future__ import annotations

import json
import random
import re
import threading
from pathlib import Path

from rich.console import Console

from dflash_provision.cli._json_document import render_document
from dflash_provision.errors import ExitCode
from dflash_provision.fleet import (
    HostAudit,
    HostRepair,
    HostStatus,
    RepairAction,
    Timings,
    audit_exit_code,
    repair_exit_code,
    report,
)
from dflash_provision.plain_table import (
    Cell,
    Column,
    TableSpec,
    plain_lines,
    rich_table,
    stacked_lines,
)


def make(name: str, status: HostStatus, **kw) -> HostAudit:
    return HostAudit(
        name=name,
        group=kw.pop("group", "gpu"),
        target=f"{name}:/m",
        path=kw.pop("path", "/m/config.json"),
        status=status,
        detail=kw.pop("detail", status.value),
        authority="z-lab/Qwen3.6-27B-DFlash@abc",
        expected_sha256="e" * 64,
        timings=Timings(read_s=0.01, total_s=0.02),
        **kw,
    )


FLEET = [
    make("h01", HostStatus.IN_SYNC),
    make(
        "h02",
        HostStatus.DRIFTED,
        diff=["dflash_config.mask_token_id: 248064 → 248070", "sliding_window: null → 2048"],
    ),
    make("h03", HostStatus.UNREACHABLE_TIMEOUT, detail="timed out after 10s (banner)"),
]


def render(renderable) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_table_lists_every_host_with_status_and_each_drifted_field():
    text = render(rich_table(report.audit_spec(FLEET)))
    assert re.search(r"h01\s+in_sync", text)
    assert re.search(r"h02\s+drifted\s+dflash_config.mask_token_id: 248064 → 248070", text)
    assert "sliding_window: null → 2048" in text
    assert re.search(r"h03\s+unreachable_timeout\s+timed out after 10s", text)


def test_summary_line_counts_statuses_in_a_stable_order():
    line = report.summary_line(FLEET, 1.25)
    assert line == "3 hosts: 1 in sync, 1 drifted, 1 unreachable timeout (1.2 s)"


def test_json_document_carries_summary_and_per_host_evidence():
    document = json.loads(render_document(report.audit_document(FLEET, elapsed_s=1.0, exit_code=4)))
    assert document["summary"] == {
        "hosts": 3,
        "elapsed_s": 1.0,
        "exit_code": 4,
        "by_status": {"in_sync": 1, "drifted": 1, "unreachable_timeout": 1},
    }
    h02 = document["hosts"][1]
    assert h02["status"] == "drifted" and len(h02["diff"]) == 2
    assert h02["timings"]["total_s"] == 0.02


def test_prometheus_text_is_valid_exposition_with_escaped_labels():
    odd = make('h"4', HostStatus.MISSING, path='/m/we"ird\\dir\n/config.json')
    text = report.prometheus_text([*FLEET, odd], timestamp=1700000000.5, run_duration_s=2.5)
    assert 'dflash_config_in_sync{host="h01",group="gpu",path="/m/config.json"} 1' in text
    assert 'dflash_config_in_sync{host="h02",group="gpu",path="/m/config.json"} 0' in text
    assert (
        'dflash_config_status{host="h02",group="gpu",path="/m/config.json",status="drifted"} 1'
        in text
    )
    assert (
        'dflash_config_status{host="h02",group="gpu",path="/m/config.json",status="in_sync"} 0'
        in text
    )
    assert r'host="h\"4"' in text and r'path="/m/we\"ird\\dir\n/config.json"' in text
    assert "dflash_config_audit_timestamp_seconds 1700000000.500" in text
    assert 'dflash_config_audit_hosts{status="missing"} 1' in text
    # Every sample line: name{labels} value, and each metric has HELP and TYPE before it.
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names == {
        "dflash_config_in_sync",
        "dflash_config_status",
        "dflash_config_audit_duration_seconds",
        "dflash_config_audit_hosts",
        "dflash_config_audit_timestamp_seconds",
        "dflash_config_audit_run_duration_seconds",
    }
    # One status series per known status per host.
    assert text.count('dflash_config_status{host="h01"') == len(HostStatus)


def test_textfile_is_replaced_atomically_and_readable_by_others(tmp_path: Path):
    target = tmp_path / "dflash.prom"
    target.write_text("old\n")
    seen: set[str] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(target.read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            report.write_textfile(target, f"generation {i}\n" * 50)
    finally:
        stop.set()
        thread.join()
    # A reader only ever saw whole files, never a half-written one.
    whole = re.compile(r"(generation (\d+)\n)\1{49}")
    assert all(t == "old\n" or whole.fullmatch(t) for t in seen)
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["dflash.prom"]  # no temp files left


def test_audit_exit_code_drift_wins_over_unreachable():
    assert audit_exit_code([FLEET[0]]) is ExitCode.OK
    assert audit_exit_code([FLEET[0], FLEET[2]]) is ExitCode.UNREACHABLE
    assert audit_exit_code(FLEET) is ExitCode.DRIFT
    # A host whose file cannot be read exits as `verify` of it would (7), not as unreachable.
    assert audit_exit_code([make("x", HostStatus.PERMISSION_DENIED)]) is ExitCode.REMOTE_FAILED
    assert audit_exit_code([FLEET[2], make("x", HostStatus.AUTH_FAILED)]) is ExitCode.AUTH
    assert (
        audit_exit_code([make("y", HostStatus.CONTAINER_NOT_RUNNING), FLEET[2]])
        is ExitCode.CONTAINER
    )


def test_repair_exit_code_zero_only_when_every_host_ends_in_sync():
    fixed = HostRepair(FLEET[1], RepairAction.WROTE, after=make("h02", HostStatus.IN_SYNC))
    in_sync = HostRepair(FLEET[0], RepairAction.SKIPPED_IN_SYNC)
    unreachable = HostRepair(FLEET[2], RepairAction.SKIPPED_NOT_AUDITED)
    failed = HostRepair(
        make("h04", HostStatus.DRIFTED),
        RepairAction.FAILED,
        after=make("h04", HostStatus.DRIFTED),
    )
    assert repair_exit_code([fixed, in_sync], dry_run=False) is ExitCode.OK
    assert repair_exit_code([fixed, unreachable], dry_run=False) is ExitCode.UNREACHABLE
    # A failed write is a remote step that failed (7), as for push; exit 1 is kept for bugs.
    assert repair_exit_code([fixed, failed, unreachable], dry_run=False) is ExitCode.REMOTE_FAILED
    would = HostRepair(FLEET[1], RepairAction.WOULD_WRITE)
    assert repair_exit_code([would, in_sync], dry_run=True) is ExitCode.DRIFT


def test_repair_table_shows_before_action_and_after():
    fixed = HostRepair(
        FLEET[1],
        RepairAction.WROTE,
        message="fixed 2 field(s)",
        after=make("h02", HostStatus.IN_SYNC),
    )
    text = render(rich_table(report.repair_spec([fixed])))
    assert re.search(r"h02\s+drifted\s+wrote\s+in_sync\s+fixed 2 field\(s\)", text)
    assert report.repair_summary_line([fixed]) == "1 host: 1 wrote; 1 in sync now"


# -- piped tables without rich (plain_table.py) --------------------------------------------------


def rich_in_a_pipe(table: TableSpec, width: int) -> list[str]:
    """What the CLI printed into a pipe before plain_table existed: rich, lines right-stripped."""
    console = Console(width=width, soft_wrap=False, no_color=True, highlight=False)
    with console.capture() as captured:
        console.print(rich_table(table))
    return [line.rstrip() for line in captured.get().splitlines()]


def test_a_piped_table_that_fits_is_printed_as_rich_prints_it():
    drifted = report.audit_spec(FLEET)
    repaired = report.repair_spec(
        [HostRepair(FLEET[1], RepairAction.WROTE, message="fixed", after=FLEET[0])]
    )
    for table in (drifted, repaired):
        plain = plain_lines(table, 200)
        assert plain is not None  # what audit and repair print: no rich needed
        assert plain == rich_in_a_pipe(table, 200)
    assert plain_lines(drifted, 30) is None  # too narrow: rich folds the detail column


def test_a_right_justified_column_lines_up_piped_stacked_and_in_rich():
    """runtime-check's fleet table right-aligns acceptance: piped as rich prints it, and the
    same alignment when the detail goes under each row."""
    columns = (Column("host"), Column("acceptance", justify="right"), Column("detail"))
    rows = (
        (Cell("gpu1"), Cell("60.0%"), Cell("ok")),
        (Cell("gpu22"), Cell("-"), Cell("unreachable")),
    )
    table = TableSpec(columns, rows)
    plain = plain_lines(table, 200)
    assert plain == rich_in_a_pipe(table, 200)
    assert plain[1:] == ["gpu1        60.0%  ok", "gpu22           -  unreachable"]
    stacked = stacked_lines(table, 200)
    assert stacked[:2] == ["host   acceptance", "gpu1        60.0%"]


def test_plain_lines_print_what_rich_prints_or_decline():
    # Cells built from awkward pieces: blanks at either end, line breaks, markup and emoji
    # codes in a host name, wide and control characters, words longer than the width.
    pieces = ["a", "bb", " ", "  x", "y  ", "\n", "→", "…", "h01:/m", "[b]", ":smile:", "é"]
    pieces += ["\t", "", "a-long-word-here", "x\n", "\ny", "漢"]
    columns = report.AUDIT_COLUMNS
    chooser = random.Random(10)
    agreed = 0
    for _ in range(3000):
        rows = tuple(
            tuple(
                Cell("".join(chooser.choices(pieces, k=chooser.randint(0, 4))), markup=i == 0)
                for i in range(len(columns))
            )
            for _ in range(chooser.randint(0, 3))
        )
        table = TableSpec(columns, rows)
        width = chooser.choice([20, 40, 200])
        plain = plain_lines(table, width)
        if plain is not None:
            assert plain == rich_in_a_pipe(table, width), rows
            agreed += 1
    assert agreed > 500  # most tables are printed without rich
