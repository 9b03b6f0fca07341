"""Ctrl-C during `audit` / `repair` stops at once (issue 11 item 7), on a real 4-host fleet.

`--workers 1` keeps h02..h04 queued while h01 is in flight, held by a fake tool on h01
(tests/fixtures/after_rename.py): its read (`head`, in the audit's read script) for audit, its write
right after the rename (`sync`) for repair. SIGINT goes to the real CLI process then; h01 is
released at once, and so is every other host, so that a CLI that went on would contact them (as
it did before: the thread pool's exit waited for every queued host). Then: exit 130, h02..h04
never logged in (their sshd logs), the summary printed, history holding exactly what was done,
no process left in the CLI's session, no --prometheus file nor temp file beside it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision.history.store import HistoryStore
from testbed import samples
from testbed.hosts import Fleet
from tests.fixtures.after_rename import fault_after_rename, hold_tool, release, wait_renamed
from tests.fixtures.cli import CLI_TIMEOUT_S, cli_env
from tests.fixtures.inventories import write_fleet_inventory
from tests.fixtures.ssh import accepted_logins

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/X"


def set_up(fleet: Fleet, base: Path) -> Path:
    for host in fleet.hosts:
        model = host.root_dir / "models" / "X"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_bytes(INCIDENT)
    inventory = base / "fleet.yaml"
    write_fleet_inventory(inventory, (h.name for h in fleet.hosts), model=MODEL)
    return inventory


def interrupt_cli(
    fleet: Fleet, base: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI in its own session; SIGINT it once h01 is held, then release every host.
    Returns what it printed and the session id (= its pid)."""
    assert fleet.client is not None
    argv = [
        *args,
        "-i", str(set_up(fleet, base)),
        "--ssh-config", str(fleet.client.ssh_config),
        "--no-agent", "--workers", "1", "--command-timeout", "20",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_provision", *argv],
        env=cli_env(home=base / "home", env={"COLUMNS": "200"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_renamed(fleet.host("h01"))
        proc.send_signal(signal.SIGINT)
        for host in fleet.hosts:
            release(host)
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr), proc.pid


def session_processes(sid: int) -> list[str]:
    """Processes still in session ``sid`` (the CLI's children: ssh, ProxyCommand...)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            left.append(stat.parent.name)
    return left


def test_ctrl_c_during_audit_contacts_no_queued_host(make_fleet, tmp_path):
    fleet = make_fleet(4)
    hold_tool(fleet.host("h01"), "head", "/usr/bin/head")
    prom = tmp_path / "metrics" / "dflash.prom"
    prom.parent.mkdir()
    done, sid = interrupt_cli(fleet, tmp_path, "audit", "--prometheus", str(prom))
    assert done.returncode == 130, done.stderr
    assert [accepted_logins(fleet.host(n)) for n in ("h02", "h03", "h04")] == [0, 0, 0]
    assert "interrupted: 1 of 4 hosts audited, 3 not contacted" in done.stderr
    assert "h01" in done.stdout and "drifted" in done.stdout
    rows = HistoryStore(tmp_path / "home" / "history.sqlite3").query(op="audit", limit=None)
    assert [(r.host, r.status) for r in rows] == [("h01", "drifted")]
    assert session_processes(sid) == []
    assert list(prom.parent.iterdir()) == [], "no --prometheus file, whole or partial"


def test_ctrl_c_during_repair_finishes_the_write_in_flight_and_starts_no_other(
    make_fleet, tmp_path
):
    fleet = make_fleet(4)
    fault_after_rename(fleet.host("h01"), "hold")
    done, sid = interrupt_cli(fleet, tmp_path, "repair", "--json")
    assert done.returncode == 130, done.stderr
    files = [(h.root_dir / "models/X/config.json").read_bytes() for h in fleet.hosts]
    assert files == [REFERENCE, INCIDENT, INCIDENT, INCIDENT], "h01 written, no other"
    assert [accepted_logins(fleet.host(n)) for n in ("h02", "h03", "h04")] == [0, 0, 0]
    document = json.loads(done.stdout)
    assert document["summary"]["interrupted"] is True
    assert document["summary"]["not_contacted"] == ["h02", "h03", "h04"]
    assert [(h["name"], h["action"]) for h in document["hosts"]] == [("h01", "wrote")]
    store = HistoryStore(tmp_path / "home" / "history.sqlite3")
    assert [(r.host, r.status) for r in store.query(op="repair", limit=None)] == [
        ("h01", "written")
    ]
    assert session_processes(sid) == []
