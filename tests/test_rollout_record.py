"""The rollout record is the truth about its hosts, on three real sshd hosts serving the vLLM
STAND-IN (started by ``launch``; its acceptance follows from the config it loaded, see
test_rollout_standin.py): an inventory changed between a pause and ``--resume`` / ``--abort``
is refused (never followed to another machine, never a traceback), holds are taken in one
transaction, one host under two names is refused before anything runs, and ``--abort`` of a
finished rollout leaves a newer rollout's hosts alone.

One fleet for the module; every test leaves each host on the config it found (a paused rollout
is aborted at its end)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from testbed.vllm_standin_install import CONTROL_ENV, install_standin, write_control
from tests.fixtures.cli import Cli, Done, cli_env
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR
from tests.fixtures.standin_places import Place, launch_standin
from tests.test_rollout_standin import GOOD, RULES, UNSURE, Bed, _variant

pytestmark = [pytest.mark.integration, pytest.mark.root]


@pytest.fixture(scope="module")
def bed(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    fleet = make_fleet(3)
    tmp = tmp_path_factory.mktemp("rollout-record")
    places = [Place(h.alias, h, f"{h.alias}:{DRAFTER_DIR}") for h in fleet.hosts]
    assert fleet.hosts[0].client is not None
    ssh = ["--ssh-config", str(fleet.hosts[0].client.ssh_config), "--no-agent"]
    (tmp / "work").mkdir()
    cli = Cli(tmp / "work")
    authority = tmp / "old.json"
    authority.write_bytes(REFERENCE)

    def prepare(place: Place) -> None:
        standin = install_standin(place.where, "/root/standin")
        place.put(f"{DRAFTER_DIR}/config.json", REFERENCE)
        place.put(f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
        write_control(place.where, CONTROL, RULES)
        launch_standin(cli, place, standin, ssh, str(authority))

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(prepare, places))
    inventory = tmp / "fleet.yaml"
    yield Bed(places, cli, tmp, ssh, inventory)


def _address(place: Place) -> str:
    assert isinstance(place.where, Host)
    return str(place.where.address)


def _option(block: str, name: str) -> str:
    return next(line.split()[1] for line in block.splitlines() if line.split()[0] == name)


def _write_inventory(path: Path, entries: list[str]) -> str:
    path.write_text(f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n" + "".join(
        f"  - {e}\n" for e in entries))  # fmt: skip
    return str(path)


def _paused(bed: Bed, inventory: str, name: str) -> str:
    """A rollout of UNSURE (its counters decide nothing) paused on its canary: its id."""
    done = bed.rollout("-i", inventory, "--from", bed.config_file(UNSURE, name), "--batches", "1")
    assert done.returncode == ExitCode.PAUSED, done.stdout + done.stderr
    return done.stderr.split("--resume ")[1].split()[0]


def _state(bed: Bed, rollout_id: str) -> dict[str, Any]:
    done = bed.rollout("--status", rollout_id, "--json")
    return dict(json.loads(done.stdout))


def _refused_in_one_line(done: Done) -> str:
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_resume_and_abort_refuse_an_inventory_that_re_points_or_drops_a_host(bed: Bed) -> None:
    h01, h02, h03 = bed.places
    before = [p.config() for p in bed.places]
    inventory = bed.tmp / "moving.yaml"
    _write_inventory(inventory, ["h01", "h02", "h03"])
    rollout_id = _paused(bed, str(inventory), "moving")
    assert h01.config() == UNSURE  # the canary holds the new bytes

    # The inventory now sends the name h01 to the machine h03 is.
    _write_inventory(inventory, ["{name: h01, address: h03}", "h02", "h03"])
    for verb in ("--resume", "--abort"):
        line = _refused_in_one_line(bed.rollout(verb, rollout_id))
        assert line.startswith(f"error: rollout {rollout_id}: refused, nothing was done: "), line
        moved = f"h01 leads elsewhere now (address {_address(h01)} → {_address(h03)})"
        assert moved in line, line
        assert "put those entries back as they were" in line
    assert [h01.config(), h02.config(), h03.config()] == [UNSURE, *before[1:]]
    assert _state(bed, rollout_id)["state"] == "paused"

    # h02 (batch 2, not yet written) is gone from the inventory.
    _write_inventory(inventory, ["h01", "h03"])
    line = _refused_in_one_line(bed.rollout("--resume", rollout_id))
    gone = f"h02 is no longer in the inventory (the rollout began with it as root@{_address(h02)}"
    assert gone in line, line
    assert [h01.config(), h02.config(), h03.config()] == [UNSURE, *before[1:]]

    _write_inventory(inventory, ["h01", "h02", "h03"])  # as it was: the way back works
    aborted = bed.rollout("--abort", rollout_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert [p.config() for p in bed.places] == before


def _db_path(bed: Bed) -> Path:
    from dflash_provision.history.store import DB_FILENAME

    return bed.cli.workdir / "home" / DB_FILENAME


def _waiting_on_the_database(pid: int, db: Path) -> bool:
    """The process has the database open and sleeps in SQLite's busy handler (the only sleep
    a rollout makes before it contacts a host): it waits for the write lock."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        opened = any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(db) for fd in fds)
        return opened and Path(f"/proc/{pid}/wchan").read_text() == "hrtimer_nanosleep"
    except OSError:
        return False


def test_two_rollouts_aligned_on_the_database_write_lock_take_the_host_once(bed: Bed) -> None:
    h01 = bed.places[0]
    before = h01.config()
    inventory = _write_inventory(bed.tmp / "race.yaml", ["h01"])
    new = bed.config_file(UNSURE, "race")
    assert bed.rollout("--status").returncode == 0  # the database and its tables exist
    db = _db_path(bed)
    argv = [sys.executable, "-m", "dflash_provision", "rollout", "-i", inventory, "--from", new,
            "--batches", "1", "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh]  # fmt: skip
    environ = cli_env(home=bed.cli.workdir / "home")
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the write lock: both rollouts line up behind it
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(
                argv, cwd=bed.cli.workdir, env=environ, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            ))  # fmt: skip
        deadline = time.monotonic() + 25  # within SQLite's busy timeout (30 s) of each
        while not all(_waiting_on_the_database(p.pid, db) for p in procs):
            assert time.monotonic() < deadline, "the rollouts never waited for the database"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
    finally:
        lock.execute("COMMIT")
        lock.close()
    outcomes = []
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        outcomes.append((proc.returncode, err))
    codes = sorted(code for code, _ in outcomes)
    assert codes == [ExitCode.PAUSED, ExitCode.ROLLOUT_REFUSED], outcomes
    paused = next(err for code, err in outcomes if code == ExitCode.PAUSED)
    refused = next(err for code, err in outcomes if code == ExitCode.ROLLOUT_REFUSED)
    rollout_id = paused.split("--resume ")[1].split()[0]
    assert f"error: rollout {rollout_id} (" in refused, refused  # in whatever step it was
    assert ") still holds h01: finish it with `dflash-provision rollout --resume" in refused
    aborted = bed.rollout("--abort", rollout_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert h01.config() == before


def test_one_host_under_two_names_is_refused_before_anything_runs(bed: Bed) -> None:
    h01 = bed.places[0]
    old = h01.config()
    new = bed.config_file(GOOD, "twice")
    before = bed.rollout("--status", "--json").stdout
    # The same alias under two names: refused from the inventory and ssh_config alone.
    twice = _write_inventory(bed.tmp / "twice.yaml", ["h01", "{name: h01-again, address: h01}"])
    line = _refused_in_one_line(bed.rollout("-i", twice, "--from", new))
    same = f"h01 and h01-again are the same host and drafter file (root@{_address(h01)} port"
    assert same in line, line
    assert bed.rollout("--status", "--json").stdout == before  # nothing recorded
    # Another name of the same address (as a second DNS name would be): the host key tells.
    config = Path(bed.ssh[1])
    number = int(ipaddress.ip_address(_address(h01)))  # e.g. 2130706945: the resolver takes it
    h01_block = config.read_text().split("\n\n")[0]
    known = bed.tmp / "dns-known_hosts"
    known.write_bytes(Path(_option(h01_block, "UserKnownHostsFile")).read_bytes())
    second = (
        h01_block.replace("Host h01", "Host h01-dns")
        .replace(f"HostName {_address(h01)}", f"HostName {number}")
        .replace(_option(h01_block, "UserKnownHostsFile"), str(known))
    )
    dns_config = bed.tmp / "dns-ssh_config"
    dns_config.write_text(config.read_text() + "\n\n" + second + "\n")
    spelled = _write_inventory(bed.tmp / "spelled.yaml", ["h01", "h01-dns"])
    done = bed.cli.run(
        "rollout", "-i", spelled, "--from", new, "--json", "--accept-new-host-key",
        "--env", f"{CONTROL_ENV}={CONTROL}", "--ssh-config", str(dns_config), "--no-agent",
    )  # fmt: skip
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    message = json.loads(done.stdout)["message"]
    assert "h01 and h01-dns are the same host and drafter file (host key ssh-ed25519 SHA256:" in (
        message
    )
    assert message.endswith("nothing was written")
    assert h01.config() == old


def test_abort_of_a_completed_rollout_leaves_a_newer_paused_rollouts_hosts_alone(
    bed: Bed,
) -> None:
    h02 = bed.places[1]
    inventory = _write_inventory(bed.tmp / "older-newer.yaml", ["h02"])
    older, doc = bed.rollout_json("-i", inventory, "--from", bed.config_file(GOOD, "older"))
    assert older.returncode == 0, older.stdout + older.stderr
    older_id = doc["id"]
    assert h02.config() == GOOD
    newer_id = _paused(bed, inventory, "newer")
    assert h02.config() == UNSURE

    line = _refused_in_one_line(bed.rollout("--abort", older_id))
    expected = (
        f"error: rollout {older_id} is completed: --abort undoes only an open rollout; a "
        "completed one is undone by a new rollout"
    )
    assert line.startswith(expected), line
    assert f"`dflash-provision rollout -i {inventory} --from PREVIOUS.json`" in line
    assert h02.config() == UNSURE  # the newer rollout's bytes, untouched
    assert _state(bed, newer_id)["state"] == "paused"

    aborted = bed.rollout("--abort", newer_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert h02.config() == GOOD


def _pid(bed: Bed, place: Place) -> int:
    done = bed.cli.run("status", place.target, "--json", *bed.ssh)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(json.loads(done.stdout)["pid"])


def test_a_config_every_host_already_runs_restarts_nothing(bed: Bed) -> None:
    current = bed.places[0].config()
    same = [p for p in bed.places if p.config() == current]
    inventory = _write_inventory(bed.tmp / "same.yaml", [p.name for p in same])
    pids = [_pid(bed, p) for p in same]
    done, doc = bed.rollout_json("-i", inventory, "--from", bed.config_file(current, "same"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["message"] == (
        "every host already holds and runs this config: nothing written, no server restarted"
    )
    assert all(h["phase"] == "unchanged" for h in doc["hosts"])
    assert [_pid(bed, p) for p in same] == pids  # the same processes serve: none restarted
    rows = json.loads(bed.cli.run("history", "--op", "rollout", "--json").stdout)
    steps = {r["message"].split(": ")[1] for r in rows
             if r["message"].startswith(f"rollout {doc['id']}: ")}  # fmt: skip
    assert steps == {"baseline"}  # measured, never written nor restarted


def test_a_write_cut_off_by_a_controller_kill_has_its_row_completed_at_resume(bed: Bed) -> None:
    import signal

    from tests.fixtures.after_rename import fault_after_rename, release, wait_renamed

    h01 = bed.places[0]
    host = h01.where
    assert isinstance(host, Host)
    inventory = _write_inventory(bed.tmp / "cut.yaml", ["h01"])
    new = bed.config_file(_variant(max_position_embeddings=65536), "cut")
    argv = [sys.executable, "-m", "dflash_provision", "rollout", "-i", inventory, "--from", new,
            "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh]  # fmt: skip
    for flag in (".renamed", ".release"):
        (host.root_dir / flag).unlink(missing_ok=True)
    fault_after_rename(host, "hold")  # the write renames its file into place, then waits
    try:
        proc = subprocess.Popen(
            argv, cwd=bed.cli.workdir, env=cli_env(home=bed.cli.workdir / "home"), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_renamed(host, timeout=300)
            proc.send_signal(signal.SIGKILL)  # the controller dies inside the write
        finally:
            _, err = proc.communicate(timeout=120)
    finally:
        release(host)
        host.exec(["umount", "-l", "/usr/local/bin"], check=True)  # the held sync may linger
    rollout_id = err.split()[1].rstrip(":")
    assert h01.config() == Path(new).read_bytes()  # the rename had happened

    def write_row() -> dict[str, Any]:
        """The row of the rollout's write to h01: "started" until closed."""
        created = _state(bed, rollout_id)["created_at"]
        rows = json.loads(bed.cli.run("history", "--op", "rollout", "--json").stdout)
        write = f"rollout {rollout_id}: write"
        mine = [
            r for r in rows
            if r["host"] == "h01" and r["started_at"] >= created
            and (r["status"] == "started" or r["message"].startswith(write))
        ]  # fmt: skip
        assert len(mine) == 1, mine
        return dict(mine[0])

    assert write_row()["status"] == "started"  # left as the kill found it
    resumed = bed.rollout("--resume", rollout_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    row = write_row()
    assert row["status"] == "written", row
    assert row["sha256_after"] == hashlib.sha256(Path(new).read_bytes()).hexdigest()
    assert row["message"].startswith(
        f"rollout {rollout_id}: write: cut off (the controller stopped); --resume found the new "
        "config ("
    ), row


def test_a_host_whose_launched_server_died_fails_pre_flight(bed: Bed) -> None:
    """Last in the module: h03's server is left stopped."""
    h03 = bed.places[2]
    before = h03.config()
    h03.run(["kill", "-KILL", str(_pid(bed, h03))])  # it crashes: its pidfile stays
    inventory = _write_inventory(bed.tmp / "dead.yaml", ["h03"])
    new = bed.config_file(_variant(max_position_embeddings=40960), "dead")
    done, doc = bed.rollout_json("-i", inventory, "--from", new)
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    assert doc["message"] == "pre-flight failed on h03: nothing was written"
    detail = doc["hosts"][0]["detail"]
    assert f"the server launched for {DRAFTER_DIR} on port " in detail
    assert " is dead (its pidfile names a process that is gone" in detail
    assert h03.config() == before
    # The fix the detail gives when the server is meant to stay down, pasted as printed.
    stop = detail.split("`")[1]
    assert stop.startswith("dflash-provision stop h03:")
    stopped = bed.cli.run(*shlex.split(stop)[1:], *bed.ssh)
    assert stopped.returncode in (0, ExitCode.NOT_RUNNING), stopped.stdout + stopped.stderr
    done, doc = bed.rollout_json("-i", inventory, "--from", new)
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["hosts"][0]["restart"] is False  # now a host without a server: the file only
    assert h03.config() == Path(new).read_bytes()
