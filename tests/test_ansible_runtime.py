"""The collection's other modules and its example playbook, run by real ansible-playbook over its
ssh connection against real sshd hosts of the test bed: h01 and h02 serve on the host itself,
h03's drafter and server are inside an LXC busybox container behind it (``container:``). Each
runs the vLLM STAND-IN (a test double) started by ``dflash-provision launch``; its acceptance
follows from the config it LOADED (the incident's mask_token_id serves ~1 %).

- ``drafter_facts`` gives audit --json's row for each host (compared with the CLI's own);
- ``runtime_check`` passes a healthy server, fails below the gate (exit 25) and fails as
  "cannot tell" when the counters decide nothing (exit 26, never a pass); its requests are
  made on the host (the hosts live in network namespaces: the controller's loopback has no
  such server);
- ``server`` restarts with the recorded launch keeping each server's env (read on the host),
  proves the new process, fails (leaving the server running) behind a site wrapper whose
  argv is not the recorded one, and changes nothing in check mode;
- the example playbook ``dflash.provision.provision`` repairs a drifted host batch by batch,
  and a bad config fails the first batch and stops the play before the next.

One bed for the module; the tests run in order and each leaves every host serving REFERENCE.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.history.store import HistoryStore
from testbed import samples
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.ansible_play import Play, Played
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, INCIDENT, REFERENCE, TARGET_DIR
from tests.fixtures.standin_places import Place, launch_standin

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.lxc]

CONFIG = f"{DRAFTER_DIR}/config.json"
BAD_MASK = 248064  # the incident's wrong mask_token_id
RULES = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01}}}


def server_pid(place: Place) -> str:
    """The pid in the launch's pidfile (its one port's state directory)."""
    script = "cat /root/.local/state/dflash-provision/vllm/*/pid"
    return place.run(["sh", "-c", script]).split()[0]


@dataclass
class Bed:
    places: list[Place]
    play: Play
    cli: Cli
    ssh: list[str]
    inventory: Path  # the CLI's inventory of the same three

    def task(self, module: str, options: str, *, name: str = "t", hosts: str = "fleet") -> str:
        """A one-task playbook; ``options`` are YAML lines at the module's indentation."""
        lines = "".join(f"        {line}\n" for line in options.splitlines())
        if "container:" not in options:  # h03's, from its inventory variable
            lines += '        container: "{{ dflash_container | default(omit) }}"\n'
        return (
            f"- hosts: {hosts}\n  gather_facts: false\n  tasks:\n"
            f"    - name: {name}\n      dflash.provision.{module}:\n"
            f"        path: {DRAFTER_DIR}\n" + lines
        )

    def results(self, done: Played, task: str = "t") -> dict[str, dict[str, Any]]:
        return {p.name: done.of(p.name, task) for p in self.places}


@pytest.fixture(scope="module")
def bed(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    fleet = make_fleet(3)
    tmp = tmp_path_factory.mktemp("ansible-runtime")
    container = standin_container(fleet.hosts[2])
    try:
        h01, h02, h03 = fleet.hosts
        places = [Place(h.alias, h, f"{h.alias}:{DRAFTER_DIR}") for h in (h01, h02)]
        places.append(
            Place(h03.alias, container, f"{h03.alias}/lxc:{container.name}:{DRAFTER_DIR}")
        )
        assert h01.client is not None
        ssh = ["--ssh-config", str(h01.client.ssh_config), "--no-agent"]
        (tmp / "work").mkdir()
        cli = Cli(tmp / "work")
        (tmp / "authoritative.json").write_bytes(REFERENCE)
        doc = json.loads(REFERENCE)
        doc["dflash_config"]["mask_token_id"] = BAD_MASK
        (tmp / "bad.json").write_text(json.dumps(doc, indent=2) + "\n")

        def prepare(place: Place) -> None:
            standin = install_standin(place.where, "/root/standin")
            place.put(CONFIG, REFERENCE)
            place.put(f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
            write_control(place.where, CONTROL, RULES)
            launch_standin(cli, place, standin, ssh, str(tmp / "authoritative.json"))

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(prepare, places))
        play = Play(fleet, tmp, host_vars={h03.alias: f"dflash_container=lxc:{container.name}"})
        inventory = tmp / "fleet.yaml"
        inventory.write_text(
            f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n  - {h01.alias}\n  - {h02.alias}\n"
            f"  - {{name: {h03.alias}, address: {h03.alias}, container: 'lxc:{container.name}'}}\n"
        )
        yield Bed(places, play, cli, ssh, inventory)
    finally:
        container.destroy()


#: The audit row's fields that are evidence (timings and exec counts differ by nature).
EVIDENCE = ("name", "target", "path", "status", "detail", "authority", "expected_sha256",
            "sha256", "diff", "findings")  # fmt: skip


def test_drafter_facts_gives_audits_own_row_for_each_host(bed: Bed) -> None:
    h01, h02, h03 = bed.places
    h01.put(CONFIG, INCIDENT)
    h02.put(CONFIG, json.dumps(json.loads(REFERENCE), indent=4).encode())  # same values
    try:
        done = bed.play.run(bed.task("drafter_facts", "src: authoritative.json"))
        assert done.returncode == 0, done.output[-3000:]  # a drifted file is no failed task
        rows = {name: r["result"] for name, r in bed.results(done).items()}
        assert [rows[p.name]["status"] for p in bed.places] == ["drifted", "same_values", "in_sync"]
        assert [rows[p.name]["needs_write"] for p in bed.places] == [True, True, False]
        assert all(r["changed"] is False for r in rows.values())
        assert "dflash_config.mask_token_id: 248064 → 248070" in rows[h01.name]["diff"]
        assert rows[h03.name]["ansible_facts"]["dflash_drafter"]["status"] == "in_sync"
        audit = bed.cli.run(
            "audit", "-i", str(bed.inventory), "--from", str(bed.play.tmp / "authoritative.json"),
            "--json", *bed.ssh,
        )  # fmt: skip
        assert audit.returncode == 4, audit.stdout + audit.stderr
        cli_rows = {h["name"]: h for h in json.loads(audit.stdout)["hosts"]}
        for place in bed.places:
            want = {k: cli_rows[place.name][k] for k in EVIDENCE}
            assert {k: rows[place.name][k] for k in EVIDENCE} == want
        store = HistoryStore(bed.play.tmp / "state" / "history.sqlite3")
        assert len(store.query(op="audit", limit=None)) == 3  # recorded as audit records them
    finally:
        h01.put(CONFIG, REFERENCE)
        h02.put(CONFIG, REFERENCE)


def test_drafter_facts_fails_only_when_the_file_cannot_be_judged(bed: Bed) -> None:
    h01 = bed.places[0]
    h01.run(["mv", CONFIG, f"{CONFIG}.away"])
    try:
        missing = bed.play.run(bed.task("drafter_facts", "src: authoritative.json", hosts=h01.name))
    finally:
        h01.run(["mv", f"{CONFIG}.away", CONFIG])
    row = missing.of(h01.name, "t")
    assert row["outcome"] == "ok" and row["result"]["status"] == "missing", row  # a fact
    nowhere = bed.play.run(
        bed.task("drafter_facts", "src: authoritative.json\ncontainer: lxc:no-such", hosts=h01.name)
    )
    row = nowhere.of(h01.name, "t")
    assert row["outcome"] == "failed", row  # nothing was judged: no fact to act on
    assert row["result"]["status"] == "container_not_running", row["result"]
    stopped = bed.play.run(bed.task("drafter_facts", "src: authoritative.json\nlock: dflash.lock"))
    assert stopped.returncode != 0
    assert "give exactly one source: lock, repo (with revision) or src" in stopped.output


def test_runtime_check_passes_a_healthy_server_with_every_stage_on_the_host(bed: Bed) -> None:
    done = bed.play.run(bed.task("runtime_check", "src: authoritative.json"))
    assert done.returncode == 0, done.output[-3000:]
    for name, row in bed.results(done).items():
        result = row["result"]
        assert row["outcome"] == "ok" and result["ok"] is True, (name, result["msg"])
        assert result["exit_code"] == 0 and result["inconclusive"] is False
        assert [s["status"] for s in result["stages"]] == ["passed"] * 5, result["stages"]
        assert result["acceptance_rate"] == pytest.approx(0.6, abs=0.05)
        assert "every stage passed" in result["msg"]


def test_runtime_check_fails_below_the_gate_and_when_it_cannot_tell(bed: Bed) -> None:
    low = bed.play.run(
        bed.task("runtime_check", "src: authoritative.json\nmin_acceptance: 0.9\nskip_loader: true")
    )
    assert low.returncode != 0
    for name, row in bed.results(low).items():
        assert row["outcome"] == "failed", (name, row)
        assert row["result"]["exit_code"] == 25, row["result"]["msg"]
        assert row["result"]["msg"].startswith("stage e"), row["result"]["msg"]
    unsure = bed.play.run(
        bed.task(
            "runtime_check",
            "src: authoritative.json\nmin_draft_tokens: 1000000\nskip_loader: true",
        )
    )
    assert unsure.returncode != 0
    for name, row in bed.results(unsure).items():
        result = row["result"]
        assert row["outcome"] == "failed", (name, row)  # never a pass
        assert result["exit_code"] == 26 and result["inconclusive"] is True, result["msg"]
        assert result["msg"].startswith("cannot tell: stage e"), result["msg"]


def test_runtime_check_with_a_bad_option_is_one_clear_line(bed: Bed) -> None:
    done = bed.play.run(bed.task("runtime_check", "src: authoritative.json\nmax_regression: lots"))
    assert done.returncode != 0
    assert "max_regression: 'lots' is not a fraction such as 10% or 0.1" in done.output


def server_env(place: Place) -> dict[str, str]:
    """The running server's own environment, as the user would look at it."""
    text = place.run(["sh", "-c", f"tr '\\000' '\\n' </proc/{server_pid(place)}/environ"])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_server_restart_keeps_the_servers_env_and_proves_the_new_process(bed: Bed) -> None:
    before = {p.name: server_pid(p) for p in bed.places}
    checked = bed.play.run(bed.task("server", "state: restarted"), "--check")
    assert checked.returncode == 0, checked.output[-3000:]
    assert all(r["result"]["changed"] for r in bed.results(checked).values())
    assert {p.name: server_pid(p) for p in bed.places} == before  # nothing was restarted
    # No env given: the values are read from each running server, on its host.
    done = bed.play.run(bed.task("server", "state: restarted"))
    assert done.returncode == 0, done.output[-3000:]
    for place in bed.places:
        result = done.of(place.name, "t")["result"]
        assert result["changed"] is True and "proved" in result["msg"], result
        assert f"pid {before[place.name]} gone" in result["evidence"], result
        assert result["drafter_sha256"] == hashlib.sha256(REFERENCE).hexdigest()
        assert server_pid(place) != before[place.name]
        assert server_env(place).get(CONTROL_ENV) == CONTROL


def test_server_restart_behind_a_site_wrapper_fails_and_leaves_the_old_server(bed: Bed) -> None:
    """A wrapper that appends arguments: the running argv is not the recorded one, so stop is
    refused; the module must fail saying so, never report the old server as restarted."""
    h01 = bed.places[0]
    standin = install_standin(h01.where, "/root/standin")
    wrapper = "/root/standin/vllm-site"
    h01.put(wrapper, f'#!/bin/sh\nexec {standin.vllm} "$@" --max-model-len 4096\n'.encode())
    h01.run(["chmod", "755", wrapper])
    _end_server(h01)
    wrapped = Standin(wrapper, standin.python)
    launch_standin(bed.cli, h01, wrapped, bed.ssh, str(bed.play.tmp / "authoritative.json"))
    try:
        before = server_pid(h01)
        done = bed.play.run(bed.task("server", "state: restarted", hosts=h01.name))
        assert done.returncode != 0, done.output[-3000:]
        row = done.of(h01.name, "t")
        assert row["outcome"] == "failed", row
        assert "stop would be refused" in row["result"]["msg"], row["result"]["msg"]
        assert "the server was left running" in row["result"]["msg"]
        assert server_pid(h01) == before
    finally:
        _end_server(h01)
        launch_standin(bed.cli, h01, standin, bed.ssh, str(bed.play.tmp / "authoritative.json"))


def _end_server(place: Place) -> None:
    """End the launched server by its process group (stop refuses a wrapper's pidfile)."""
    state = "/root/.local/state/dflash-provision/vllm"
    place.run(["sh", "-c", f"kill -KILL -$(cut -d' ' -f1 {state}/*/pid); rm -rf {state}/*"])
    place.run(["sleep", "0.5"])


@dataclass
class Standin:
    """What launch_standin reads of a stand-in install."""

    vllm: str
    python: str


def test_the_example_playbook_repairs_restarts_and_proves_in_batches(bed: Bed) -> None:
    h01, h02, h03 = bed.places
    h02.put(CONFIG, INCIDENT)
    pids = {p.name: server_pid(p) for p in bed.places}
    extra = json.dumps(
        {
            "dflash_hosts": "fleet",
            "dflash_path": DRAFTER_DIR,
            "dflash_src": str(bed.play.tmp / "authoritative.json"),
            "dflash_serial": [1, 1, "100%"],
            "dflash_server_env": {CONTROL_ENV: CONTROL},
        }
    )
    done = bed.play.run_book("dflash.provision.provision", "-e", extra)
    assert done.returncode == 0, done.output[-3000:]
    assert all(p.config() == REFERENCE for p in bed.places)
    written = {p.name: done.of(p.name, "Write and prove the authoritative config where it is not")
               for p in bed.places}  # fmt: skip
    assert [written[p.name]["outcome"] for p in bed.places] == ["skipped", "ok", "skipped"]
    assert written[h02.name]["result"]["status"] == "written"
    assert server_pid(h02) != pids[h02.name]  # restarted to read the new bytes
    assert server_pid(h01) == pids[h01.name] and server_pid(h03) == pids[h03.name]
    checked = [done.of(p.name, "Prove the server runs the drafter and accepts its drafts")
               for p in bed.places]  # fmt: skip
    assert [c["outcome"] for c in checked] == ["ok", "ok", "ok"]
    # serial: 1, 1, rest: each host's check ends before the next batch's audit starts
    order = [r["host"] for r in done.results if r["task"] == "Audit the drafter config"]
    assert order == [h01.name, h02.name, h03.name]


def test_a_bad_config_fails_the_first_batch_and_the_play_stops_there(bed: Bed) -> None:
    h01, h02, h03 = bed.places
    extra = json.dumps(
        {
            "dflash_hosts": "fleet",
            "dflash_path": DRAFTER_DIR,
            "dflash_src": str(bed.play.tmp / "bad.json"),
            "dflash_serial": [1, "100%"],
            "dflash_server_env": {CONTROL_ENV: CONTROL},
            "dflash_min_acceptance": 0.3,
        }
    )
    try:
        done = bed.play.run_book("dflash.provision.provision", "-e", extra)
        assert done.returncode != 0, done.output[-3000:]
        check = done.of(h01.name, "Prove the server runs the drafter and accepts its drafts")
        assert check["outcome"] == "failed" and check["result"]["exit_code"] == 25, check
        assert check["result"]["acceptance_rate"] == pytest.approx(0.01, abs=0.02)
        assert {r["host"] for r in done.results} == {h01.name}  # batch 2 never started
        assert h02.config() == REFERENCE and h03.config() == REFERENCE
    finally:
        restore = bed.cli.run("rollback", h01.target, *bed.ssh)
        assert restore.returncode == 0, restore.stdout + restore.stderr
        assert h01.config() == REFERENCE
        again = bed.play.run(
            bed.task("server", f"env:\n  {CONTROL_ENV}: {CONTROL}", hosts=h01.name)
        )
        assert again.returncode == 0, again.output[-3000:]
