"""Fleet audit and repair on 22 real sshd hosts with every kind of fault a fleet meets.

Layout (set up fresh before each test through the hosts' /root on the controller side):

    h01-h06  in sync              the reference drafter config
    h07-h09  drifted              the incident's wrong file (INCIDENT_DRAFTER)
    h10-h11  missing              model directory without config.json
    h12-h13  invalid              not JSON
    h14-h15  loader_normalised    reference with use_sliding_window false
    h16      in sync
    h17      unreachable_refused  sshd stopped
    h18      unreachable_timeout  sshd SIGSTOPped: TCP accepts, no banner
    h19-h20  drifted, read-only   model directory remounted read-only: repair must fail there
    h21      host_key_changed     known_hosts holds another host's key for it
    h22      host_key_unknown     known_hosts has no line for it
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.fleet import (
    FleetRun,
    HostStatus,
    RepairAction,
    audit,
    audit_exit_code,
    authority_loader,
    repair,
    repair_exit_code,
)
from dflash_provision.history.store import HistoryStore
from dflash_provision.inventory import load_members
from dflash_provision.transport.factory import Connector
from dflash_provision.transport.options import SshOptions
from testbed import samples
from testbed.hosts import Fleet, known_hosts_name
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.inventories import write_fleet_inventory

pytestmark = [pytest.mark.integration, pytest.mark.root]

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
INVALID = b'{"architectures": ["DFlashDraftModel"], "block_size": 16,\n'
NORMALISED = (
    json.dumps({**json.loads(REFERENCE), "use_sliding_window": False}, indent=2) + "\n"
).encode()

EXPECTED = {
    **{f"h{i:02d}": HostStatus.IN_SYNC for i in (1, 2, 3, 4, 5, 6, 16)},
    **{f"h{i:02d}": HostStatus.DRIFTED for i in (7, 8, 9, 19, 20)},
    "h10": HostStatus.MISSING,
    "h11": HostStatus.MISSING,
    "h12": HostStatus.INVALID,
    "h13": HostStatus.INVALID,
    "h14": HostStatus.LOADER_NORMALISED,
    "h15": HostStatus.LOADER_NORMALISED,
    "h17": HostStatus.UNREACHABLE_REFUSED,
    "h18": HostStatus.UNREACHABLE_TIMEOUT,
    "h21": HostStatus.HOST_KEY_CHANGED,
    "h22": HostStatus.HOST_KEY_UNKNOWN,
}
WRITABLE_BAD = {"h07", "h08", "h09", "h10", "h11", "h12", "h13", "h14", "h15"}
READ_ONLY = {"h19", "h20"}
NOT_REACHED = {"h17", "h18", "h21", "h22"}


class Scenario:
    def __init__(self, fleet: Fleet, base: Path) -> None:
        self.fleet = fleet
        assert fleet.client is not None
        self.base = base
        self.known_hosts = base / "known_hosts"
        self.inventory = base / "fleet.yaml"
        self.home = base / "home"

    def host(self, name: str):
        return self.fleet.host(name)

    def model_dir(self, name: str) -> Path:
        return self.host(name).root_dir / "models" / "Qwen3.6-27B-DFlash"

    def file_bytes(self, name: str) -> bytes | None:
        path = self.model_dir(name) / "config.json"
        return path.read_bytes() if path.exists() else None

    def seed(self) -> None:
        """Put every host's files back to the layout in the module docstring."""
        contents = {
            **{n: REFERENCE for n, s in EXPECTED.items() if s is HostStatus.IN_SYNC},
            **{n: INCIDENT for n in ("h07", "h08", "h09", "h19", "h20")},
            "h12": INVALID,
            "h13": INVALID,
            "h14": NORMALISED,
            "h15": NORMALISED,
            "h17": REFERENCE,
            "h18": REFERENCE,
            "h21": REFERENCE,
            "h22": REFERENCE,
        }
        for host in self.fleet.hosts:
            model = self.model_dir(host.name)
            model.mkdir(parents=True, exist_ok=True)
            config = model / "config.json"
            config.unlink(missing_ok=True)
            if host.name in contents:
                config.write_bytes(contents[host.name])

    def options(self) -> SshOptions:
        assert self.fleet.client is not None
        return SshOptions(
            connect_timeout=1.5,
            banner_timeout=1.5,
            auth_timeout=3.0,
            command_timeout=20.0,
            ssh_config_path=str(self.fleet.client.ssh_config),
            known_hosts_path=str(self.known_hosts),
            use_agent=False,
        )

    def cli(self, *args: str) -> Done:
        assert self.fleet.client is not None
        return run_cli(
            *args, "-i", str(self.inventory),
            "--ssh-config", str(self.fleet.client.ssh_config),
            "--known-hosts", str(self.known_hosts), "--connect-timeout", "1.5", "--no-agent",
            home=self.home, env={"COLUMNS": "200"},
        )  # fmt: skip


@pytest.fixture(scope="module")
def scenario(make_fleet, tmp_path_factory) -> Iterator[Scenario]:
    fleet = make_fleet(22)
    base = tmp_path_factory.mktemp("fleet-scenario")
    sc = Scenario(fleet, base)
    assert fleet.client is not None
    # known_hosts: h21 gets h01's key (a "changed" key), h22 is left out ("unknown").
    lines = []
    h01_key = fleet.host("h01").host_public_key
    for host in fleet.hosts:
        name = known_hosts_name(host.address, host.port)
        if host.name == "h22":
            continue
        key = h01_key if host.name == "h21" else host.host_public_key
        lines.append(f"{name} {key}")
    sc.known_hosts.write_text("\n".join(lines) + "\n")
    write_fleet_inventory(sc.inventory, (h.name for h in fleet.hosts), model=MODEL)
    sc.seed()
    for name in READ_ONLY:
        fleet.host(name).make_readonly(f"{MODEL}")
    fleet.host("h17").stop()
    fleet.host("h18").hang()
    yield sc
    fleet.host("h18").resume()


@pytest.fixture
def fresh(scenario: Scenario) -> Scenario:
    scenario.seed()
    return scenario


def members(sc: Scenario):
    return load_members(sc.inventory)


def test_audit_classifies_every_host_with_one_read_each(fresh: Scenario):
    run = FleetRun(authority_loader(), connector=Connector(fresh.options()))
    audits = audit(members(fresh), run.authority_for, workers=32, run=run)
    assert {a.name: a.status for a in audits} == EXPECTED, [
        a.detail for a in audits if a.name == "h18"
    ]
    by_name = {a.name: a for a in audits}
    drifted = by_name["h07"]
    assert any(
        line.startswith("dflash_config.mask_token_id: 248064 → 248070") for line in drifted.diff
    )
    assert drifted.sha256 is not None and drifted.sha256 != drifted.expected_sha256
    assert by_name["h12"].findings[0]["layer"] == "parse"
    assert any(f["layer"] == "effective" for f in by_name["h14"].findings)
    assert "refused" in by_name["h17"].detail
    assert "CHANGED" in by_name["h21"].detail
    # One remote command per host, a missing file too (the read script in bytes mode).
    # Transformers ran once per distinct bad file.
    missing = {n for n, s in EXPECTED.items() if s is HostStatus.MISSING}
    assert {a.execs for a in audits if a.status.audited} == {1}
    assert missing
    assert run.validations == 3
    assert audit_exit_code(audits) is ExitCode.DRIFT
    assert all(a.timings.total_s > 0 for a in audits)


def test_repair_fixes_exactly_the_writable_bad_hosts(fresh: Scenario, tmp_path: Path):
    history = HistoryStore(tmp_path / "history.sqlite3")
    run = FleetRun(authority_loader(), connector=Connector(fresh.options()))
    repairs = repair(members(fresh), run.authority_for, workers=32, history=history, run=run)
    actions = {r.name: r.action for r in repairs}
    assert {n for n, a in actions.items() if a is RepairAction.WROTE} == WRITABLE_BAD
    assert {n for n, a in actions.items() if a is RepairAction.FAILED} == READ_ONLY
    assert {n for n, a in actions.items() if a is RepairAction.SKIPPED_NOT_AUDITED} == NOT_REACHED
    by_name = {r.name: r for r in repairs}
    for name in WRITABLE_BAD:
        assert by_name[name].final.status is HostStatus.IN_SYNC, by_name[name].to_dict()
        assert fresh.file_bytes(name) == REFERENCE
    for name in READ_ONLY:
        assert "read-only" in by_name[name].message
        assert fresh.file_bytes(name) == INCIDENT  # the old file is untouched
    assert fresh.file_bytes("h17") == REFERENCE
    assert repair_exit_code(repairs, dry_run=False) is ExitCode.REMOTE_FAILED
    # Every write went into the history, started before and finished after.
    rows = history.query(op="repair", limit=None)
    # The row is push's own: its status word ("written"), as `history --op push` shows it.
    assert {r.host for r in rows if r.status == "written"} == WRITABLE_BAD
    assert {r.host for r in rows if r.status == "failed"} == READ_ONLY
    assert not any(r.incomplete for r in rows)
    h07 = next(r for r in rows if r.host == "h07")
    assert h07.sha256_after == by_name["h07"].before.expected_sha256

    # A second audit: in sync everywhere except the hosts that cannot be reached or written.
    again = audit(members(fresh), run.authority_for, connector=Connector(fresh.options()))
    bad = {a.name: a.status for a in again if a.status is not HostStatus.IN_SYNC}
    assert bad == {n: EXPECTED[n] for n in NOT_REACHED | READ_ONLY}


def test_repair_writes_first_and_judges_the_old_bytes_as_audit_would(
    fresh: Scenario, tmp_path: Path
):
    history = HistoryStore(tmp_path / "history.sqlite3")
    run = FleetRun(authority_loader(), connector=Connector(fresh.options()))
    repairs = repair(members(fresh), run.authority_for, workers=32, history=history, run=run)
    by_name = {r.name: r for r in repairs}
    # The "before" column is what an audit of the fleet says, host for host, although no host
    # was read before its write: the old bytes came back with the write and were judged here.
    assert {r.name: r.before.status for r in repairs} == EXPECTED
    assert any(
        line.startswith("dflash_config.mask_token_id: 248064 → 248070")
        for line in by_name["h07"].before.diff
    )
    assert by_name["h12"].before.findings[0]["layer"] == "parse"
    assert by_name["h10"].message.startswith("created")
    # Round trips: one exec per host, in sync (the write found the bytes and sent them) or
    # written (the write read the file back and sent the old bytes after it).
    in_sync = {n for n, s in EXPECTED.items() if s is HostStatus.IN_SYNC}
    assert {by_name[n].execs for n in in_sync | WRITABLE_BAD} == {1}
    # Only changes are journaled: no write row for a host that was already right or not
    # reached; a written host's row has the hash of the file it replaced.
    rows = history.query(op="repair", limit=None)
    assert {r.host for r in rows} == WRITABLE_BAD | READ_ONLY
    h07 = next(r for r in rows if r.host == "h07")
    assert h07.sha256_before == hashlib.sha256(INCIDENT).hexdigest()
    assert by_name["h07"].sha256_before == h07.sha256_before


def test_repair_max_failures_stops_starting_writes(fresh: Scenario):
    chosen = [m for m in members(fresh) if m.name in ("h19", "h20", "h07")]
    chosen.sort(key=lambda m: ["h19", "h20", "h07"].index(m.name))
    repairs = repair(
        chosen, authority_loader(), workers=1, max_failures=1, connector=Connector(fresh.options())
    )
    actions = {r.name: r.action for r in repairs}
    assert actions == {
        "h19": RepairAction.FAILED,
        "h20": RepairAction.SKIPPED_MAX_FAILURES,
        "h07": RepairAction.SKIPPED_MAX_FAILURES,
    }
    assert fresh.file_bytes("h07") == INCIDENT
    assert repair_exit_code(repairs, dry_run=False) is ExitCode.REMOTE_FAILED


def test_cli_audit_json_prometheus_and_exit_code(fresh: Scenario, tmp_path: Path):
    prom = tmp_path / "dflash.prom"
    proc = fresh.cli("audit", "--json", "--prometheus", str(prom))
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    document = json.loads(proc.stdout)
    assert {h["name"]: h["status"] for h in document["hosts"]} == {
        n: s.value for n, s in EXPECTED.items()
    }
    assert document["summary"]["exit_code"] == 4
    text = prom.read_text()
    assert f'dflash_config_in_sync{{host="h01",group="gpu",path="{MODEL}/config.json"}} 1' in text
    assert f'dflash_config_in_sync{{host="h07",group="gpu",path="{MODEL}/config.json"}} 0' in text
    assert (
        f'dflash_config_status{{host="h18",group="gpu",path="{MODEL}/config.json",'
        'status="unreachable_timeout"} 1'
    ) in text
    assert 'dflash_config_audit_hosts{status="drifted"} 5' in text
    assert "dflash_config_audit_timestamp_seconds " in text
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    # The audit landed in the history the CLI keeps under DFLASH_PROVISION_HOME.
    entries = HistoryStore(fresh.home / "history.sqlite3").query(op="audit", limit=None)
    assert len(entries) >= 22


def test_cli_repair_dry_run_writes_nothing_then_repair_exit_codes(fresh: Scenario):
    dry = fresh.cli("repair", "--dry-run")
    assert dry.returncode == ExitCode.DRIFT, dry.stderr
    assert "would_write" in dry.stdout
    assert "mask_token_id" in dry.stdout  # the dry run shows what would change
    assert fresh.file_bytes("h07") == INCIDENT

    real = fresh.cli("repair", "--json")
    assert real.returncode == ExitCode.REMOTE_FAILED, real.stderr  # h19/h20 are read-only
    document = json.loads(real.stdout)
    actions = {h["name"]: h["action"] for h in document["hosts"]}
    assert {n for n, a in actions.items() if a == "wrote"} == WRITABLE_BAD
    assert document["summary"]["in_sync_now"] == 7 + len(WRITABLE_BAD)

    after = fresh.cli("audit")
    assert after.returncode == ExitCode.DRIFT  # h19/h20 still hold the incident file
    assert "h19" in after.stdout and "drifted" in after.stdout


def test_cli_exit_codes_for_in_sync_and_unreachable_only_fleets(fresh: Scenario, tmp_path: Path):
    def sub_inventory(names: list[str]) -> Path:
        path = tmp_path / f"{'-'.join(names)}.yaml"
        path.write_text(
            f"defaults: {{path: {MODEL}, drafter: {{from: {samples.REFERENCE_DRAFTER}}}}}\n"
            f"hosts: [{', '.join(names)}]\n"
        )
        return path

    original = fresh.inventory
    try:
        fresh.inventory = sub_inventory(["h01", "h02"])
        ok = fresh.cli("audit")
        assert ok.returncode == ExitCode.OK, ok.stdout + ok.stderr
        assert "2 hosts: 2 in sync" in ok.stdout
        fresh.inventory = sub_inventory(["h01", "h17"])
        unreachable = fresh.cli("audit")
        assert unreachable.returncode == ExitCode.UNREACHABLE
        unreachable_repair = fresh.cli("repair")
        assert unreachable_repair.returncode == ExitCode.UNREACHABLE
        fresh.inventory = sub_inventory(["h07", "h17"])
        both = fresh.cli("audit")
        assert both.returncode == ExitCode.DRIFT  # drift wins over unreachable
    finally:
        fresh.inventory = original
