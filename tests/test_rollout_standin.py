"""``rollout`` on six real sshd "hosts" (five serve on the host itself, the sixth inside an LXC
container behind a host), each running the vLLM STAND-IN (a test double) started by
``launch``. The stand-in's acceptance follows from the config it LOADED: its control file says
which ``dflash_config.mask_token_id`` gets which behaviour (``by_mask_token``), so the
incident's wrong mask_token_id serves ~1 % and nothing else in the test tells the server what
to report.

One fleet for the module; the tests run in order and each leaves the hosts as its assertions
say (the old bytes after a rollback or an abort; the new ones after a completed rollout)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.cli import Cli, Done
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR
from tests.fixtures.standin_places import Place, launch_standin

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.lxc]

CONFIG = f"{DRAFTER_DIR}/config.json"
GOOD_MASK, BAD_MASK, UNSURE_MASK = 248070, 248064, 248071


def _variant(**changes: Any) -> bytes:
    doc = json.loads(REFERENCE)
    mask = changes.pop("mask_token_id", None)
    if mask is not None:
        doc["dflash_config"] = {**doc["dflash_config"], "mask_token_id": mask}
    doc.update(changes)
    return (json.dumps(doc, indent=2) + "\n").encode()


BAD = _variant(mask_token_id=BAD_MASK)  # the incident's wrong mask_token_id
UNSURE = _variant(mask_token_id=UNSURE_MASK)  # a server whose counters decide nothing
GOOD = _variant(max_position_embeddings=131072)
#: What the stand-ins do per loaded mask token; every other id serves the default 60 %.
RULES = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01},
                           str(UNSURE_MASK): {"impossible_counters": True}}}  # fmt: skip


@dataclass
class Bed:
    places: list[Place]
    cli: Cli
    tmp: Path
    ssh: list[str]
    inventory: Path

    def config_file(self, data: bytes, name: str) -> str:
        path = self.tmp / f"{name}.json"
        path.write_bytes(data)
        return str(path)

    def control(self, rules: dict[str, Any]) -> None:
        for place in self.places:
            write_control(place.where, CONTROL, rules)

    def inventory_of(self, name: str, places: list[Place]) -> str:
        """An inventory of some of the sshd hosts (in this order)."""
        path = self.tmp / f"{name}.yaml"
        hosts = "".join(f"  - {p.name}\n" for p in places)
        path.write_text(f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n{hosts}")
        return str(path)

    def rates(self, inventory: str, config: bytes) -> dict[str, float]:
        """What a fresh runtime-check measures on each host against ``config``."""
        check = self.cli.run(
            "runtime-check", "-i", inventory, "--from", self.config_file(config, "now"),
            "--json", *self.ssh,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        hosts = json.loads(check.stdout)["hosts"]
        return {h["name"]: h["check"]["acceptance_rate"] for h in hosts}

    def rollout(self, *args: str, env: dict[str, str] | None = None) -> Done:
        """The servers were launched with the stand-in's control env: its value is given again
        (the launch record keeps only the name)."""
        return self.cli.run(
            "rollout", *args, "--env", f"{CONTROL_ENV}={CONTROL}", *self.ssh, env=env
        )

    def rollout_json(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[Done, dict[str, Any]]:
        done = self.rollout(*args, "--json", env=env)
        assert done.stdout.strip(), done.stderr
        return done, json.loads(done.stdout)


@pytest.fixture(scope="module")
def bed(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    fleet = make_fleet(6)
    tmp = tmp_path_factory.mktemp("rollout")
    container = standin_container(fleet.hosts[5])
    try:
        places = [Place(h.alias, h, f"{h.alias}:{DRAFTER_DIR}") for h in fleet.hosts[:5]]
        target = f"{fleet.hosts[5].alias}/lxc:{container.name}:{DRAFTER_DIR}"
        places.append(Place("h06-ct", container, target))
        assert fleet.hosts[0].client is not None
        ssh = ["--ssh-config", str(fleet.hosts[0].client.ssh_config), "--no-agent"]
        (tmp / "work").mkdir()
        cli = Cli(tmp / "work")
        authority = tmp / "old.json"
        authority.write_bytes(REFERENCE)

        def prepare(place: Place) -> None:
            standin = install_standin(place.where, "/root/standin")
            place.put(CONFIG, REFERENCE)
            place.put(f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
            write_control(place.where, CONTROL, RULES)
            launch_standin(cli, place, standin, ssh, str(authority))

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(prepare, places))
        inventory = tmp / "fleet.yaml"
        lines = [f"      - {p.name}" for p in places[:5]]
        lines.append(
            f"      - {{name: h06-ct, address: {fleet.hosts[5].alias}, "
            f"container: 'lxc:{container.name}'}}"
        )
        inventory.write_text(
            f"defaults:\n  path: {DRAFTER_DIR}\ngroups:\n  serving:\n    hosts:\n"
            + "\n".join(lines)
            + "\n"
        )
        yield Bed(places, cli, tmp, ssh, inventory)
    finally:
        container.destroy()


def _hosts(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in document["hosts"]}


def test_dry_run_prints_the_plan_and_touches_nothing(bed: Bed) -> None:
    new = bed.config_file(BAD, "bad-dry")
    done = bed.rollout("-i", str(bed.inventory), "--from", new, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "batch 1: h01\n" in out and "batch 2: h02\n" in out
    assert "batch 3: h03, h04, h05, h06-ct" in out
    assert f"dflash_config.mask_token_id: {GOOD_MASK} → {BAD_MASK}" in out
    assert out.count("server restarted (port") == 6
    assert "gate: a host passes when stages a-d pass, acceptance >= 10%" in out
    assert all(p.config() == REFERENCE for p in bed.places)
    status = bed.rollout("--status")
    assert "no rollouts recorded" in status.stdout  # a dry run records nothing


def test_bad_config_fails_the_canary_and_every_host_ends_on_the_old_bytes(bed: Bed) -> None:
    new = bed.config_file(BAD, "bad")
    prom = bed.tmp / "rollout.prom"
    done, doc = bed.rollout_json("-i", str(bed.inventory), "--from", new, "--prometheus", str(prom))
    assert done.returncode == ExitCode.ROLLED_BACK, done.stdout + done.stderr
    text, rid = prom.read_text(), doc["id"]
    assert f'dflash_rollout_state{{rollout="{rid}",state="rolled_back"}} 1' in text
    gauges = {
        line.split('when="')[1].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(f'dflash_rollout_acceptance_rate{{rollout="{rid}",host="h01",')
    }
    assert gauges == {"baseline": pytest.approx(0.6, abs=0.02),
                      "new": pytest.approx(0.01, abs=0.02),
                      "after_rollback": pytest.approx(0.6, abs=0.02)}  # fmt: skip
    hosts = _hosts(doc)
    canary = hosts["h01"]
    assert canary["phase"] == "rolled_back", canary
    assert canary["baseline"]["rate"] == pytest.approx(0.6, abs=0.02)
    assert canary["new"]["rate"] == pytest.approx(0.01, abs=0.02)
    assert canary["after"]["rate"] == pytest.approx(canary["baseline"]["rate"], abs=0.02)
    assert all(h["phase"] == "pending" for n, h in hosts.items() if n != "h01")
    assert all(p.config() == REFERENCE for p in bed.places)  # on the hosts themselves
    check = bed.cli.run(
        "runtime-check", "-i", str(bed.inventory), "--from", bed.config_file(REFERENCE, "old"),
        "--json", *bed.ssh,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    rates = {h["name"]: h["check"]["acceptance_rate"] for h in json.loads(check.stdout)["hosts"]}
    assert rates == {p.name: pytest.approx(0.6, abs=0.02) for p in bed.places}
    # The canary's write and restore rows keep push's own outcome (status, sha256 after).
    rows = [
        r
        for op in ("rollout", "rollback")
        for r in json.loads(bed.cli.run("history", "--op", op, "--json").stdout)
        if r["host"] == "h01" and r["message"].startswith(f"rollout {rid}: ")
    ]
    steps = {r["message"].split(": ")[1]: r for r in rows}
    assert steps["write"]["status"] == steps["restore the old bytes"]["status"] == "written"
    assert steps["write"]["sha256_after"] == hashlib.sha256(BAD).hexdigest()
    assert steps["restore the old bytes"]["sha256_after"] == hashlib.sha256(REFERENCE).hexdigest()


def test_inconclusive_pauses_a_second_rollout_is_refused_and_abort_restores(bed: Bed) -> None:
    new = bed.config_file(UNSURE, "unsure")
    done = bed.rollout("-i", str(bed.inventory), "--from", new)
    assert done.returncode == ExitCode.PAUSED, done.stdout + done.stderr
    resume = next(line for line in done.stderr.splitlines() if "resume with:" in line)
    rollout_id = resume.split("--resume ")[1].split()[0]
    assert f"dflash-provision rollout --resume {rollout_id} --ssh-config" in resume
    assert bed.places[0].config() == UNSURE  # the canary holds the new bytes, not rolled back

    other = bed.rollout("-i", str(bed.inventory), "--from", bed.config_file(GOOD, "good0"))
    assert other.returncode == ExitCode.ROLLOUT_REFUSED, other.stdout + other.stderr
    assert f"rollout {rollout_id} (paused) still holds h01" in other.stderr

    aborted, doc = bed.rollout_json("--abort", rollout_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert _hosts(doc)["h01"]["phase"] == "rolled_back"
    assert _hosts(doc)["h01"]["after"]["rate"] == pytest.approx(0.6, abs=0.02)
    assert all(p.config() == REFERENCE for p in bed.places)


def test_paused_rollout_resumes_and_completes_in_three_batches(bed: Bed) -> None:
    new = bed.config_file(UNSURE, "unsure2")
    done = bed.rollout("-i", str(bed.inventory), "--from", new)
    assert done.returncode == ExitCode.PAUSED, done.stdout + done.stderr
    rollout_id = done.stderr.split("--resume ")[1].split()[0]
    bed.control({})  # whatever made the counters undecidable is gone
    try:
        resumed, doc = bed.rollout_json("--resume", rollout_id)
    finally:
        bed.control(RULES)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert doc["state"] == "completed"
    hosts = _hosts(doc)
    assert {n: h["batch"] for n, h in hosts.items()} == {
        "h01": 1, "h02": 2, "h03": 3, "h04": 3, "h05": 3, "h06-ct": 3,
    }  # fmt: skip
    assert all(h["phase"] == "passed" for h in hosts.values())
    assert all(p.config() == UNSURE for p in bed.places)


def test_healthy_rollout_completes_and_reports_timings(bed: Bed) -> None:
    new = bed.config_file(GOOD, "good")
    bed.control({})  # the hosts serve UNSURE now: let its counters be evidence for the baseline
    try:
        done, doc = bed.rollout_json("-i", str(bed.inventory), "--from", new)
    finally:
        bed.control(RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    # Progress names each batch once ("batch 1/3", not "batch: batch 1/3"); the state it ends in
    # is the result's to say (the table's last line, or the JSON), not a progress line too.
    assert f"rollout {doc['id']}: batch 1/3\n" in done.stderr, done.stderr
    assert "batch: batch" not in done.stderr and "completed" not in done.stderr, done.stderr
    hosts = _hosts(doc)
    assert all(h["phase"] == "passed" for h in hosts.values())
    assert all(h["new"]["rate"] == pytest.approx(0.6, abs=0.02) for h in hosts.values())
    assert all(p.config() == GOOD for p in bed.places)
    totals = {k: sum(h["timings"].get(k, 0.0) for h in hosts.values())
              for k in ("write_s", "restart_s", "check_s")}  # fmt: skip
    print(f"6-host rollout: per-host sums {totals}, walls {doc['walls']}")  # for the README
    table = bed.rollout("--status", doc["id"])
    assert "h06-ct  3      passed   60.0% → 60.0% → -" in table.stdout
    assert table.stdout.count(f"rollout {doc['id']}: completed: 3 batch(es) passed") == 1


def test_controller_killed_mid_batch_resumes_from_the_record(bed: Bed) -> None:
    import os
    import signal
    import subprocess
    import sys
    import threading

    from tests.fixtures.cli import cli_env

    new = bed.config_file(_variant(max_position_embeddings=65536), "next")
    argv = [sys.executable, "-m", "dflash_provision", "rollout", "-i", str(bed.inventory),
            "--from", new, "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh]  # fmt: skip
    environ = cli_env(home=bed.cli.workdir / "home")
    proc = subprocess.Popen(
        argv, cwd=bed.cli.workdir, env=environ, stderr=subprocess.PIPE, text=True
    )
    guard = threading.Timer(600, proc.kill)  # one overall deadline for the whole wait
    guard.start()
    rollout_id = ""
    try:
        assert proc.stderr is not None
        in_batch_3 = False
        for line in proc.stderr:
            rollout_id = rollout_id or line.split()[1].rstrip(":")
            in_batch_3 = in_batch_3 or "batch 3/3" in line
            if in_batch_3 and line.endswith(": restarting\n"):  # a server is being restarted
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait()
    finally:
        guard.cancel()
    assert proc.returncode == -signal.SIGKILL
    status = bed.rollout("--status", rollout_id)
    assert f"rollout {rollout_id}: batch 3/3" in status.stdout, status.stdout
    assert "batch: batch" not in status.stdout
    assert "  restarting  " in status.stdout  # killed in the middle of a host's step
    resumed, doc = bed.rollout_json("--resume", rollout_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert doc["state"] == "completed"
    assert all(h["phase"] == "passed" for h in doc["hosts"])
    assert all(p.config() == Path(new).read_bytes() for p in bed.places)


def test_a_host_that_dies_mid_batch_stops_the_rollout_and_abort_finishes_the_way_back(
    bed: Bed,
) -> None:
    import subprocess
    import sys
    import threading

    from tests.fixtures.cli import cli_env

    before = bed.places[0].config()  # what every host holds now (the previous test's config)
    assert all(p.config() == before for p in bed.places)
    new = bed.config_file(_variant(max_position_embeddings=32768), "last")
    argv = [sys.executable, "-m", "dflash_provision", "rollout", "-i", str(bed.inventory),
            "--from", new, "--max-fail-percentage", "20", "--env", f"{CONTROL_ENV}={CONTROL}",
            *bed.ssh]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=bed.cli.workdir, env=cli_env(home=bed.cli.workdir / "home"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    guard = threading.Timer(600, proc.kill)  # one overall deadline for the whole wait
    guard.start()
    h04 = bed.places[3].where
    assert isinstance(h04, Host)
    lines: list[str] = []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            lines.append(line)
            if "batch 3/3" in line:
                h04.stop()  # the host dies (its sshd and its server) as batch 3 starts
                break
        rest_out, rest_err = proc.communicate()
    finally:
        guard.cancel()
    stderr = "".join(lines) + rest_err
    # 1 of 4 hosts failed: 25 % > 20 %: batch 3 is rolled back; h04 cannot be proved back.
    assert proc.returncode == ExitCode.ROLLBACK_FAILED, rest_out + stderr
    rollout_id = lines[0].split()[1].rstrip(":")
    assert "ROLLBACK NOT PROVED: the rollback of h04 is NOT proved" in stderr
    assert f"dflash-provision rollout --abort {rollout_id}" in stderr
    new_bytes = Path(new).read_bytes()
    assert [p.config() for p in bed.places[:2]] == [new_bytes, new_bytes]  # batches 1-2 stay
    assert [p.config() for p in bed.places[4:]] == [before, before]  # batch 3 restored
    assert bed.places[2].config() == before

    h04.start()  # the host is back (its server is not: --abort restarts it)
    aborted, doc = bed.rollout_json("--abort", rollout_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert all(p.config() == before for p in bed.places)
    after = {h["name"]: h["after"]["rate"] for h in doc["hosts"]}
    assert after == {p.name: pytest.approx(0.6, abs=0.02) for p in bed.places}


def test_a_host_without_a_launched_server_only_gets_the_file(bed: Bed) -> None:
    spare_dir = "/root/models/spare-DFlash"
    h01 = bed.places[0]
    h01.put(f"{spare_dir}/config.json", REFERENCE)
    inventory = bed.tmp / "spare.yaml"
    inventory.write_text(
        f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n  - h01\n"
        f"  - {{name: h01-spare, address: h01, path: {spare_dir}}}\n"
    )
    new = bed.config_file(GOOD, "good-spare")
    # An earlier test may have left h01 on GOOD: its write then finds the bytes in place.
    h01_write = "unchanged" if h01.config() == GOOD else "written"
    plan = bed.rollout("-i", str(inventory), "--from", new, "--batches", "1", "--dry-run")
    assert "h01-spare: max_position_embeddings: 262144 → 131072; file only" in plan.stdout
    done, doc = bed.rollout_json("-i", str(inventory), "--from", new, "--batches", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    spare = _hosts(doc)["h01-spare"]
    assert (spare["batch"], spare["phase"], spare["restart"]) == (2, "passed", False)
    assert "no server started by launch" in spare["detail"]
    assert h01.run(["cat", f"{spare_dir}/config.json"]).encode() == GOOD
    rows = json.loads(bed.cli.run("history", "--op", "rollout", "--json").stdout)
    mine = sorted(
        (r["host"], r["message"].split(": ")[1], r["status"])
        for r in rows
        if r["message"].startswith(f"rollout {doc['id']}: ")
    )
    assert mine == [
        ("h01", "baseline", "ok"),
        ("h01", "check", "ok"),
        ("h01", "restart with the recorded launch", "ok"),
        ("h01", "write", h01_write),  # push's own outcome, as push's row says it
        ("h01-spare", "write", "written"),
    ]


def test_ctrl_c_mid_batch_lets_the_step_finish_and_prints_the_way_on(bed: Bed) -> None:
    import os
    import signal
    import subprocess
    import sys
    import threading

    from tests.fixtures.cli import cli_env

    new = bed.config_file(_variant(max_position_embeddings=16384), "ctrl-c")
    argv = [sys.executable, "-m", "dflash_provision", "rollout", "-i", str(bed.inventory),
            "--from", new, "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=bed.cli.workdir, env=cli_env(home=bed.cli.workdir / "home"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    guard = threading.Timer(600, proc.kill)  # one overall deadline for the whole wait
    guard.start()
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.endswith("h02: restarting\n"):  # batch 2's server is being restarted
                os.kill(proc.pid, signal.SIGINT)
                break
        table, rest = proc.communicate()
    finally:
        guard.cancel()
    assert proc.returncode == 130, "".join(lines) + rest
    rollout_id = lines[0].split()[1].rstrip(":")
    assert f"interrupted: rollout {rollout_id} is recorded at batch; continue with " in rest
    assert f"`dflash-provision rollout --resume {rollout_id} --ssh-config" in rest
    # The way on comes last, after the step in flight said it finished; the table says where
    # every host stands (the progress lines are not the record).
    assert rest.rstrip().splitlines()[-1].startswith(f"interrupted: rollout {rollout_id}"), rest
    assert "h02: passed" in rest.split("interrupted: rollout")[0] + "".join(lines), rest
    assert next(r for r in table.splitlines() if r.startswith("h02 ")).split()[2] == "passed"
    assert f"rollout {rollout_id}: batch 2/3, interrupted (Ctrl-C)" in table, table
    status = bed.rollout("--status", rollout_id)
    assert f"rollout {rollout_id}: batch 2/3, interrupted (Ctrl-C): resume or abort" in (
        status.stdout
    )
    row = next(line for line in status.stdout.splitlines() if line.startswith("h02 "))
    assert row.split()[2] == "passed"  # the step in flight was finished, not cut off
    assert all(p.config() != Path(new).read_bytes() for p in bed.places[2:])  # batch 3 not begun
    resumed, doc = bed.rollout_json("--resume", rollout_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert doc["state"] == "completed"
    assert all(p.config() == Path(new).read_bytes() for p in bed.places)


def test_a_host_failing_within_the_tolerance_is_restored_alone(bed: Bed) -> None:
    before = bed.places[0].config()
    odd = _variant(mask_token_id=248065)
    h04 = bed.places[3]
    write_control(h04.where, CONTROL, {"by_mask_token": {"248065": {"acceptance": 0.01}}})
    try:
        done, doc = bed.rollout_json(
            "-i", str(bed.inventory), "--from", bed.config_file(odd, "odd"),
            "--max-fail-percentage", "30",
        )  # fmt: skip
    finally:
        write_control(h04.where, CONTROL, RULES)
    assert done.returncode == 0, done.stdout + done.stderr  # 1 of 4 = 25 % <= 30 %
    assert "restored alone (failed within the tolerance): h04" in doc["message"]
    phases = {h["name"]: h["phase"] for h in doc["hosts"]}
    assert phases == {p.name: ("rolled_back" if p.name == "h04" else "passed") for p in bed.places}
    assert h04.config() == before
    assert all(p.config() == odd for p in bed.places if p.name != "h04")


def _mask_of(data: bytes) -> str:
    return str(json.loads(data)["dflash_config"]["mask_token_id"])


def _interrupt_at(bed: Bed, argv: list[str], marker: str) -> tuple[int, str]:
    """Run a rollout and send it SIGINT when a stderr line ends with ``marker``: the exit
    code and the whole stderr."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from tests.fixtures.cli import cli_env

    full = [sys.executable, "-m", "dflash_provision", "rollout", *argv,
            "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh]  # fmt: skip
    proc = subprocess.Popen(
        full, cwd=bed.cli.workdir, env=cli_env(home=bed.cli.workdir / "home"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    guard = threading.Timer(600, proc.kill)  # one overall deadline for the whole wait
    guard.start()
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.endswith(marker + "\n"):
                os.kill(proc.pid, signal.SIGINT)
                break
        _, rest = proc.communicate()
    finally:
        guard.cancel()
    return proc.returncode, "".join(lines) + rest


def test_rollback_all_puts_back_the_passed_batch_too(bed: Bed) -> None:
    three = bed.places[:3]
    before = three[0].config()
    assert all(p.config() == before for p in three)
    new = _variant(mask_token_id=248066)
    h02 = bed.places[1]
    write_control(h02.where, CONTROL, {"by_mask_token": {"248066": {"acceptance": 0.01}}})
    inventory = bed.inventory_of("rollback-all", three)
    try:
        done, doc = bed.rollout_json(
            "-i", inventory, "--from", bed.config_file(new, "rollback-all"),
            "--batches", "1,2", "--rollback-all",
        )  # fmt: skip
    finally:
        write_control(h02.where, CONTROL, RULES)
    assert done.returncode == ExitCode.ROLLED_BACK, done.stdout + done.stderr
    hosts = _hosts(doc)
    assert {n: (h["batch"], h["phase"]) for n, h in hosts.items()} == {
        "h01": (1, "rolled_back"), "h02": (2, "rolled_back"), "h03": (3, "pending"),
    }  # fmt: skip
    assert hosts["h01"]["new"]["rate"] == pytest.approx(0.6, abs=0.02)  # batch 1 had passed
    assert hosts["h02"]["new"]["rate"] == pytest.approx(0.01, abs=0.02)
    for name in ("h01", "h02"):
        assert hosts[name]["after"]["rate"] == pytest.approx(hosts[name]["baseline"]["rate"])
    assert [p.config() for p in three] == [before] * 3  # on the hosts themselves
    assert bed.rates(inventory, before) == {p.name: pytest.approx(0.6, abs=0.02) for p in three}


def _break_target(place: Place) -> bytes:
    """Give the host's target model another vocab_size (the new config no longer fits it);
    returns the target config's old bytes."""
    path = f"{TARGET_DIR}/config.json"
    old = place.run(["cat", path]).encode()
    doc = json.loads(old)
    doc.get("text_config", doc)["vocab_size"] = 1234
    place.put(path, json.dumps(doc).encode())
    return old


def test_a_host_failing_preflight_stops_the_rollout_or_is_left_out(bed: Bed) -> None:
    three = bed.places[:3]
    before = [p.config() for p in three]
    new = bed.config_file(_variant(mask_token_id=248068), "skip")
    inventory = bed.inventory_of("skip", three)
    h03 = bed.places[2]
    target = _break_target(h03)
    try:
        refused, doc = bed.rollout_json("-i", inventory, "--from", new)
        assert refused.returncode == ExitCode.ROLLOUT_REFUSED, refused.stdout + refused.stderr
        assert doc["state"] == "refused"
        assert "pre-flight failed on h03: nothing was written" in doc["message"]
        assert [p.config() for p in three] == before

        done, doc = bed.rollout_json("-i", inventory, "--from", new, "--skip-failed-hosts")
    finally:
        h03.put(f"{TARGET_DIR}/config.json", target)
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = _hosts(doc)
    assert {n: h["phase"] for n, h in hosts.items()} == {
        "h01": "passed", "h02": "passed", "h03": "excluded",
    }  # fmt: skip
    assert "vocab_size" in hosts["h03"]["detail"]  # reported: why it was left out
    assert ": h03: excluded\n" in done.stderr
    assert "left out (failed pre-flight or baseline, untouched): h03" in doc["message"]
    assert [p.config() for p in three[:2]] == [Path(new).read_bytes()] * 2
    assert h03.config() == before[2]  # untouched
    rates = bed.rates(bed.inventory_of("h03", [h03]), before[2])
    assert rates == {"h03": pytest.approx(0.6, abs=0.02)}


def test_a_lock_written_by_fetch_is_the_source(
    bed: Bed, hub_standin: Any, hub_env: dict[str, str]
) -> None:
    from tests.fixtures.cli import run_cli

    new = _variant(mask_token_id=248069)
    sha = hub_standin.add_repo("z-lab/rollout-drafter", {"config.json": new})
    work = bed.tmp / "lock-work"
    work.mkdir()
    fetched = run_cli("fetch", "z-lab/rollout-drafter", "-o", "config.json", cwd=work,
                      base_env=hub_env)  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    lock = work / "dflash.lock"
    assert sha in lock.read_text()
    h01 = bed.places[0]
    hf = {k: hub_env[k] for k in ("HF_ENDPOINT", "HF_HOME")}
    done, doc = bed.rollout_json(
        "-i", bed.inventory_of("lock", [h01]), "--lock", str(lock), "--batches", "1", env=hf
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert doc["source"].startswith(f"z-lab/rollout-drafter@{sha[:12]}")
    assert _hosts(doc)["h01"]["phase"] == "passed"
    assert h01.config() == new


def test_an_inconclusive_baseline_takes_the_recorded_acceptance_reference(bed: Bed) -> None:
    h01 = bed.places[0]
    current = h01.config()
    mask = _mask_of(current)
    inventory = bed.inventory_of("reference", [h01])
    write_control(h01.where, CONTROL, {"by_mask_token": {mask: {"acceptance": 0.45}}})
    try:
        recorded = bed.cli.run(
            "runtime-check", "-i", inventory, "--from", bed.config_file(current, "ref"),
            "--reset-reference", *bed.ssh,
        )  # fmt: skip
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
        # Now the live counters of the current config decide nothing; the new config's do.
        write_control(h01.where, CONTROL, {"by_mask_token": {mask: {"impossible_counters": True}}})
        new = _variant(mask_token_id=248072)
        done, doc = bed.rollout_json(
            "-i", inventory, "--from", bed.config_file(new, "after-ref"), "--batches", "1"
        )
    finally:
        write_control(h01.where, CONTROL, RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    host = _hosts(doc)["h01"]
    assert host["baseline"] == {"rate": pytest.approx(0.45, abs=0.02),
                                "mean_length": pytest.approx(host["baseline"]["mean_length"]),
                                "source": "reference"}  # fmt: skip
    assert "baseline from its acceptance reference 45." in done.stderr
    assert host["new"]["rate"] == pytest.approx(0.6, abs=0.02)
    assert h01.config() == new


def test_an_inconclusive_baseline_without_a_reference_refuses(bed: Bed) -> None:
    h02 = bed.places[1]
    current = h02.config()
    mask = _mask_of(current)
    write_control(h02.where, CONTROL, {"by_mask_token": {mask: {"impossible_counters": True}}})
    try:
        done, doc = bed.rollout_json(
            "-i", bed.inventory_of("noref", [h02]),
            "--from", bed.config_file(_variant(mask_token_id=248073), "noref"),
        )  # fmt: skip
    finally:
        write_control(h02.where, CONTROL, RULES)
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    assert "no baseline on h02: nothing was written" in doc["message"]
    assert h02.config() == current


def test_ctrl_c_during_baseline_writes_nothing_and_resume_completes(bed: Bed) -> None:
    three = bed.places[:3]
    before = [p.config() for p in three]
    inventory = bed.inventory_of("ctrl-c-baseline", three)
    new = bed.config_file(_variant(mask_token_id=248074), "ctrl-c-baseline")
    code, stderr = _interrupt_at(bed, ["-i", inventory, "--from", new], ": baseline")
    assert code == 130, stderr
    rollout_id = stderr.split()[1].rstrip(":")
    assert (
        f"interrupted: rollout {rollout_id}: Ctrl-C during baseline, before any write: nothing "
        f"was written; start it again with `dflash-provision rollout --resume {rollout_id} --ssh"
    ) in stderr
    assert [p.config() for p in three] == before  # nothing written
    _, doc = bed.rollout_json("--status", rollout_id)
    assert doc["state"] == "interrupted"
    assert doc["message"] == "Ctrl-C during baseline, before any write: nothing was written"
    assert all(h["phase"] in ("pending", "excluded") for h in doc["hosts"]), doc["hosts"]
    rows = json.loads(bed.cli.run("history", "--op", "rollout", "--json").stdout)
    writes = [r for r in rows if r["message"].startswith(f"rollout {rollout_id}: write")]
    assert writes == []
    resumed, doc = bed.rollout_json("--resume", rollout_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert doc["state"] == "completed"
    assert [p.config() for p in three] == [Path(new).read_bytes()] * 3


def test_ctrl_c_during_preflight_writes_nothing_and_a_new_rollout_runs(bed: Bed) -> None:
    three = bed.places[:3]
    before = [p.config() for p in three]
    inventory = bed.inventory_of("ctrl-c-preflight", three)
    new = bed.config_file(_variant(mask_token_id=248075), "ctrl-c-preflight")
    code, stderr = _interrupt_at(bed, ["-i", inventory, "--from", new], ": preflight")
    assert code == 130, stderr
    rollout_id = stderr.split()[1].rstrip(":")
    assert (
        f"interrupted: rollout {rollout_id}: Ctrl-C during preflight, before any write: nothing "
        f"was written; start it again with `dflash-provision rollout --resume {rollout_id} --ssh"
    ) in stderr
    assert [p.config() for p in three] == before
    _, doc = bed.rollout_json("--status", rollout_id)
    assert (doc["state"], doc["message"]) == (
        "interrupted",
        "Ctrl-C during preflight, before any write: nothing was written",
    )
    done, doc = bed.rollout_json("-i", inventory, "--from", new)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.config() for p in three] == [Path(new).read_bytes()] * 3
