"""A restart is proved or it failed; a rollback returns to what the server ran and is judged; a
restart keeps the server's environment (issue 30 items 1-3), on real sshd hosts of the test bed
(h01, h02) and an LXC busybox container behind one (h03-ct), each serving the vLLM STAND-IN (a
test double) started by ``dflash-provision launch``; its acceptance follows from the config it
LOADED (the incident's mask_token_id serves ~1 %).

Every test starts from every host serving REFERENCE through ``fresh``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.cli._connect import SSH_CONFIG_ENV
from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.vllm_standin_install import (
    CONTROL_ENV,
    StandinInstall,
    install_standin,
    standin_container,
    write_control,
)
from tests.fixtures.cli import ENTRY_POINT, Cli, Done, cli_env, run_cli
from tests.fixtures.fix_lines import fix_lines
from tests.fixtures.fix_lines import parse as parse_fix
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR, free_port
from tests.fixtures.standin_places import CONFIG, Place

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.lxc]

BAD_MASK, UNSURE_MASK = 248064, 248071
RULES = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01},
                           str(UNSURE_MASK): {"impossible_counters": True}}}  # fmt: skip
STATE = "/root/.local/state/dflash-provision/vllm"
#: A site's wrapper: runs vLLM with the arguments it is given, plus two of its own.
WRAPPER = "/root/standin/vllm-site"


def _variant(mask: int) -> bytes:
    doc = json.loads(REFERENCE)
    doc["dflash_config"] = {**doc["dflash_config"], "mask_token_id": mask}
    return (json.dumps(doc, indent=2) + "\n").encode()


BAD, UNSURE = _variant(BAD_MASK), _variant(UNSURE_MASK)
#: A harmless change (the stand-in serves its default 60 %).
GOOD = (
    json.dumps({**json.loads(REFERENCE), "max_position_embeddings": 131072}, indent=2) + "\n"
).encode()


@dataclass
class Bed:
    places: list[Place]
    standins: dict[str, StandinInstall]
    cli: Cli
    tmp: Path
    ssh: list[str]

    def file(self, data: bytes, name: str) -> str:
        path = self.tmp / f"{name}.json"
        path.write_bytes(data)
        return str(path)

    def inventory(self, name: str, places: list[Place]) -> str:
        path = self.tmp / f"{name}.yaml"
        lines = []
        for place in places:
            if place.name.endswith("-ct"):
                host, rest = place.target.split("/lxc:", 1)
                lines.append(
                    f"  - {{name: {place.name}, address: {host}, "
                    f"container: 'lxc:{rest.split(':')[0]}'}}\n"
                )
            else:
                lines.append(f"  - {place.name}\n")
        path.write_text(f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n{''.join(lines)}")
        return str(path)

    def run(self, *args: str, cli: Cli | None = None) -> Done:
        return (cli or self.cli).run(*args, *self.ssh)

    def fresh(
        self,
        place: Place,
        *,
        vllm: str | None = None,
        loaded: bytes = REFERENCE,
        on_disk: bytes | None = None,
    ) -> None:
        """Whatever ran is ended (by its process group: a wrapper's pidfile is refused by
        stop), the file is ``loaded`` (or ``on_disk``: other bytes launch lets pass), and
        ``launch --from loaded`` starts the stand-in with its control env on it."""
        kill = (
            f'for f in {STATE}/*/pid; do [ -f "$f" ] || continue; '
            'p=$(cut -d" " -f1 "$f"); kill -KILL -"$p" 2>/dev/null; rm -f "$f"; done; '
            f"rm -rf {DRAFTER_DIR}/.dflash-backups; sleep 0.5"
        )
        place.run(["sh", "-c", kill])
        place.put(CONFIG, on_disk or loaded)
        write_control(place.where, CONTROL, RULES)
        standin = self.standins[place.name]
        done = self.run(
            "launch", place.target, "--model", TARGET_DIR, "--from", self.file(loaded, "loaded"),
            "--vllm", vllm or standin.vllm, "--python", standin.python,
            "--port", str(free_port()), "--env", f"{CONTROL_ENV}={CONTROL}",
            "--ready-timeout", "300", "--no-check",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def server_pid(place: Place) -> str:
    return place.run(["sh", "-c", f"cat {STATE}/*/pid"]).split()[0]


def running_record(place: Place) -> dict[str, Any]:
    """The launch record of the port whose server runs (the one with a pidfile)."""
    script = f'for d in {STATE}/*; do [ -f "$d/pid" ] && cat "$d/launch.json"; done; true'
    return dict(json.loads(place.run(["sh", "-c", script])))


def server_env(place: Place) -> dict[str, str]:
    """The running server's own environment, as the user would look at it."""
    text = place.run(["sh", "-c", f"tr '\\000' '\\n' </proc/{server_pid(place)}/environ"])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def bed(make_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    fleet = make_fleet(2)
    tmp = tmp_path_factory.mktemp("restart-proof")
    container = standin_container(fleet.hosts[1])
    try:
        places = [Place(h.alias, h, f"{h.alias}:{DRAFTER_DIR}") for h in fleet.hosts]
        places.append(
            Place("h03-ct", container, f"{fleet.hosts[1].alias}/lxc:{container.name}:{DRAFTER_DIR}")
        )
        assert fleet.hosts[0].client is not None
        ssh = ["--ssh-config", str(fleet.hosts[0].client.ssh_config), "--no-agent"]
        (tmp / "work").mkdir()
        bed = Bed(places, {}, Cli(tmp / "work"), tmp, ssh)

        def prepare(place: Place) -> None:
            bed.standins[place.name] = install_standin(place.where, "/root/standin")
            place.put(f"{TARGET_DIR}/config.json", samples.REFERENCE_TARGET.read_bytes())
            bed.fresh(place)

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(prepare, places))
        yield bed
    finally:
        container.destroy()


def test_a_site_wrapper_that_appends_words_is_never_taken_for_a_restart(bed: Bed) -> None:
    h01 = bed.places[0]
    vllm = bed.standins[h01.name].vllm
    h01.put(WRAPPER, f'#!/bin/sh\nexec {vllm} "$@" --max-model-len 4096\n'.encode())
    h01.run(["chmod", "755", WRAPPER])
    bed.fresh(h01, vllm=WRAPPER)
    try:
        before = server_pid(h01)
        done = bed.run(
            "rollout", "-i", bed.inventory("wrapped", [h01]), "--from", bed.file(BAD, "bad"),
            "--env", f"{CONTROL_ENV}={CONTROL}",
        )  # fmt: skip
        assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
        assert "stop would be refused" in done.stderr, done.stderr
        assert "not the command line its launch record holds" in done.stderr
        assert server_pid(h01) == before  # the old server, untouched
        assert h01.config() == REFERENCE  # and the bad config never written
    finally:
        bed.fresh(h01)


def test_a_canary_pushed_without_a_restart_is_named_and_rolled_back_to_what_ran(
    bed: Bed,
) -> None:
    h01, h02 = bed.places[:2]
    pushed = bed.run("push", h01.target, "--from", bed.file(BAD, "bad"))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert h01.config() == BAD  # on disk; its server still runs REFERENCE (60 %)
    done = bed.run(
        "rollout", "-i", bed.inventory("pushed", [h01, h02]), "--from", bed.file(BAD, "bad"),
        "--batches", "1,100%", "--json", "--env", f"{CONTROL_ENV}={CONTROL}",
    )  # fmt: skip
    assert done.returncode == ExitCode.ROLLED_BACK, done.stdout + done.stderr
    assert "h01: pre-flight ok" in done.stderr and "is not the config its server loaded" in (
        done.stderr
    )
    assert h01.config() == REFERENCE  # what its server ran, not the bytes before the write
    check = bed.run("runtime-check", h01.target, "--from", bed.file(REFERENCE, "ref"), "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    stages = {s["stage"]: s for s in json.loads(check.stdout)["stages"]}
    assert stages["e"]["data"]["acceptance_rate"] == pytest.approx(0.6, abs=0.02)
    host = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}["h01"]
    assert host["phase"] == "rolled_back"
    assert host["after"]["rate"] == pytest.approx(0.6, abs=0.02)


def test_launch_records_the_file_it_started_on_and_a_rollback_returns_to_those_bytes(
    bed: Bed,
) -> None:
    h02 = bed.places[1]
    # The same values in other bytes: launch lets it pass (a warning); vLLM loads THESE bytes.
    compact = (json.dumps(json.loads(REFERENCE), separators=(",", ":")) + "\n").encode()
    bed.fresh(h02, on_disk=compact)
    try:
        assert running_record(h02)["file_sha256"] == hashlib.sha256(compact).hexdigest()
        done = bed.run(
            "rollout", "-i", bed.inventory("compact", [h02]), "--from", bed.file(BAD, "bad"),
            "--json", "--env", f"{CONTROL_ENV}={CONTROL}",
        )  # fmt: skip
        assert done.returncode == ExitCode.ROLLED_BACK, done.stdout + done.stderr
        assert "is not the config its server loaded" not in done.stderr  # it is what ran
        assert h02.config() == compact
        assert json.loads(done.stdout)["hosts"][0]["after"]["rate"] == pytest.approx(0.6, abs=0.02)
    finally:
        bed.fresh(h02)


def test_what_ran_comes_from_the_controllers_store_when_the_host_kept_no_backup(
    bed: Bed,
) -> None:
    h01 = bed.places[0]
    inventory = bed.inventory("stored", [h01])
    (bed.tmp / "stored").mkdir()
    own = Cli(bed.tmp / "stored")  # a history (and rollout store) of its own
    control = f"{CONTROL_ENV}={CONTROL}"
    try:
        good = bed.run("rollout", "-i", inventory, "--from", bed.file(GOOD, "good"), cli=own)
        assert good.returncode == 0, good.stdout + good.stderr
        # By hand, without a restart, and no backup left: only the store has GOOD's bytes.
        h01.put(CONFIG, BAD)
        h01.run(["rm", "-rf", f"{DRAFTER_DIR}/.dflash-backups"])
        done = bed.run(
            "rollout", "-i", inventory, "--from", bed.file(BAD, "bad"), "--json",
            "--env", control, cli=own,
        )  # fmt: skip
        assert done.returncode == ExitCode.ROLLED_BACK, done.stdout + done.stderr
        assert "found in this controller's rollout store" in done.stderr, done.stderr
        assert h01.config() == GOOD  # what its server ran, not the bytes before the write
        host = json.loads(done.stdout)["hosts"][0]
        assert host["phase"] == "rolled_back"
        # The host line names what was restored (the journal's step): GOOD, not BAD's old bytes.
        ran = hashlib.sha256(GOOD).hexdigest()[:12]
        assert host["detail"].startswith(f"restored what the server ran (sha256 {ran}), proved")
        assert host["after"]["rate"] == pytest.approx(0.6, abs=0.02)
    finally:
        bed.fresh(h01)


def test_what_ran_found_nowhere_is_rollback_failed_with_the_command_that_finishes_it(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    h01 = bed.places[0]
    (bed.tmp / "nowhere").mkdir()
    own = Cli(bed.tmp / "nowhere")  # an empty rollout store: it never saw REFERENCE
    h01.put(CONFIG, BAD)  # by hand: no backup of what its server runs
    h01.run(["rm", "-rf", f"{DRAFTER_DIR}/.dflash-backups"])
    try:
        done = bed.run(
            "rollout", "-i", bed.inventory("nowhere", [h01]), "--from", bed.file(BAD, "bad"),
            "--json", "--env", f"{CONTROL_ENV}={CONTROL}", cli=own,
        )  # fmt: skip
        assert done.returncode == ExitCode.ROLLBACK_FAILED, done.stdout + done.stderr
        assert "a rollback cannot return to what ran" in done.stderr, done.stderr
        assert "rolled back, proved" not in done.stdout + done.stderr
        host = json.loads(done.stdout)["hosts"][0]
        assert host["phase"] == "rollback_failed", host
        assert "nothing was restored" in host["detail"]
        rollout_id = json.loads(done.stdout)["id"]
        abort = f"dflash-provision rollout --abort {rollout_id}"
        assert abort in host["detail"], host["detail"]
        # The fix line: the write-back and the --abort, pasteable once the one step no command
        # can do (saving what ran, named by its sha256) is done, as its comment says.
        (fix,) = fix_lines(host["detail"])
        ran = hashlib.sha256(REFERENCE).hexdigest()
        saved = own.workdir / f"what-ran-{ran[:12]}.json"
        assert f"# first save the config with sha256 {ran} (what the server ran) as ./" in fix
        saved.write_bytes(REFERENCE)
        monkeypatch.chdir(own.workdir)  # where it is pasted: --from's file is there
        parse_fix(fix)
        pasted = _paste(bed, fix, cli=own)
        assert pasted.returncode == ExitCode.ABORTED, fix + "\n" + pasted.stdout + pasted.stderr
        assert h01.config() == REFERENCE
        check = bed.run("runtime-check", h01.target, "--from", bed.file(REFERENCE, "ref"))
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        bed.fresh(h01)


def test_a_rollback_the_gate_cannot_prove_is_rollback_failed(bed: Bed) -> None:
    h02 = bed.places[1]
    ref_mask = str(json.loads(REFERENCE)["dflash_config"]["mask_token_id"])
    inventory = bed.inventory("unproved", [h02])
    # A history of its own: the rollout this test leaves open holds h02 only there.
    (bed.tmp / "unproved").mkdir()
    own = Cli(bed.tmp / "unproved")
    write_control(h02.where, CONTROL, {"by_mask_token": {ref_mask: {"acceptance": 0.45}}})
    try:
        recorded = bed.run(
            "runtime-check", "-i", inventory, "--from", bed.file(REFERENCE, "ref"),
            "--reset-reference", cli=own,
        )  # fmt: skip
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
        # From now on the counters of REFERENCE decide nothing: the baseline is the recorded
        # reference, and after the rollback nothing can prove the host is back.
        write_control(
            h02.where,
            CONTROL,
            {"by_mask_token": {**RULES["by_mask_token"], ref_mask: {"impossible_counters": True}}},
        )
        done = bed.run(
            "rollout", "-i", inventory, "--from", bed.file(BAD, "bad"), "--json",
            "--env", f"{CONTROL_ENV}={CONTROL}", cli=own,
        )  # fmt: skip
    finally:
        bed.fresh(h02)
    assert done.returncode == ExitCode.ROLLBACK_FAILED, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    host = doc["hosts"][0]
    assert host["phase"] == "rollback_failed", host
    assert "gate after rollback" in host["detail"] and "rollout --abort" in host["detail"]
    assert "rolled back, proved" not in done.stdout + done.stderr


def test_a_rollout_without_env_keeps_each_servers_environment(bed: Bed) -> None:
    inventory = bed.inventory("noenv", bed.places)
    before = {p.name: server_pid(p) for p in bed.places}
    done = bed.run("rollout", "-i", inventory, "--from", bed.file(GOOD, "good"))
    assert done.returncode == 0, done.stdout + done.stderr
    for place in bed.places:
        assert server_pid(place) != before[place.name]
        assert server_env(place).get(CONTROL_ENV) == CONTROL, place.name
    for place in bed.places:
        bed.fresh(place)


def test_resume_and_abort_without_env_keep_each_servers_environment(bed: Bed) -> None:
    inventory = bed.inventory("resume", bed.places)
    control = f"{CONTROL_ENV}={CONTROL}"
    try:
        paused = bed.run("rollout", "-i", inventory, "--from", bed.file(UNSURE, "unsure"),
                         "--env", control, "--batches", "1,100%")  # fmt: skip
        assert paused.returncode == ExitCode.PAUSED, paused.stdout + paused.stderr
        rollout_id = paused.stderr.split("--resume ")[1].split()[0]
        for place in bed.places:  # whatever made the counters undecidable is gone
            write_control(place.where, CONTROL, {})
        resumed = bed.run("rollout", "--resume", rollout_id)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        for place in bed.places:
            assert place.config() == UNSURE
            assert server_env(place).get(CONTROL_ENV) == CONTROL, place.name
    finally:
        for place in bed.places:
            bed.fresh(place)
    h03 = bed.places[2]
    paused = bed.run("rollout", "-i", bed.inventory("abort", [h03]), "--from",
                     bed.file(UNSURE, "unsure"), "--env", control)  # fmt: skip
    assert paused.returncode == ExitCode.PAUSED, paused.stdout + paused.stderr
    rollout_id = paused.stderr.split("--resume ")[1].split()[0]
    before = server_pid(h03)
    aborted = bed.run("rollout", "--abort", rollout_id)
    assert aborted.returncode == ExitCode.ABORTED, aborted.stdout + aborted.stderr
    assert h03.config() == REFERENCE
    assert server_pid(h03) != before
    assert server_env(h03).get(CONTROL_ENV) == CONTROL


def _paste(
    bed: Bed, line: str, extra: dict[str, str] | None = None, *, cli: Cli | None = None
) -> subprocess.CompletedProcess[str]:
    """``line`` run by a shell as a user pastes it: the installed ``dflash-provision`` on PATH,
    the test bed's ssh_config from the environment (fix lines carry no connection options), in
    ``cli``'s working directory and history (default: the bed's)."""
    workdir = (cli or bed.cli).workdir
    env = cli_env(
        home=workdir / "home",
        env={
            "PATH": f"{Path(ENTRY_POINT).parent}:{os.environ['PATH']}",
            SSH_CONFIG_ENV: bed.ssh[1],
            **(extra or {}),
        },
    )
    return subprocess.run(
        ["sh", "-c", line], cwd=workdir, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["doctor", "runtime-check"])
def test_every_fix_line_pasted_does_what_it_says(bed: Bed, command: str) -> None:
    h01 = bed.places[0]
    ref = bed.file(REFERENCE, "ref")
    h01.put(CONFIG, GOOD)  # put there by hand: not what its server loaded
    before = server_pid(h01)
    done = bed.run(command, h01.target, "--from", ref)
    assert done.returncode != 0, done.stdout
    fixes = [line.split("fix: ", 1)[1] for line in done.stdout.splitlines() if "fix: " in line]
    assert fixes, done.stdout
    for fix in fixes:
        assert fix.startswith("dflash-provision ") and "MODEL" not in fix, fix
        parse_fix(fix)
        pasted = _paste(bed, fix)
        assert pasted.returncode == 0, fix + "\n" + pasted.stdout + pasted.stderr
    assert h01.config() == REFERENCE
    if command == "doctor":  # the file link: push, then restart so the server reads it
        assert any("--restart" in fix for fix in fixes), fixes
        assert server_pid(h01) != before  # restarted, keeping its environment
        assert server_env(h01).get(CONTROL_ENV) == CONTROL
    again = bed.run(command, h01.target, "--from", ref)
    assert again.returncode == 0, again.stdout + again.stderr


def test_every_fix_line_doctor_and_runtime_check_print_parses_with_the_clis_own_parser(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stand-in scenarios: a file put there by hand (the file link breaks) and the
    incident's config served (1 % acceptance: every open cause prints its fix)."""
    h01 = bed.places[0]
    monkeypatch.setenv(SSH_CONFIG_ENV, bed.ssh[1])
    seen: list[str] = []
    try:
        for loaded, by_hand in ((REFERENCE, GOOD), (BAD, None)):
            bed.fresh(h01, loaded=loaded)
            if by_hand:
                h01.put(CONFIG, by_hand)
            source = bed.file(loaded, "authority")
            for command in ("doctor", "runtime-check"):
                done = bed.run(command, h01.target, "--from", source)
                assert done.returncode != 0, done.stdout
                lines = fix_lines(done.stdout)
                assert lines, done.stdout
                for line in lines:
                    parse_fix(line)
                seen += lines
    finally:
        bed.fresh(h01)
    assert any("--restart" in line for line in seen)
    assert any("dflash-provision validate" in line for line in seen), seen


def test_a_fix_line_from_a_lock_pasted_pushes_the_locked_bytes_and_restarts(
    bed: Bed, hub_standin: Any, hub_env: dict[str, str]
) -> None:
    h02 = bed.places[1]
    sha = hub_standin.add_repo("z-lab/fix-line-drafter", {"config.json": REFERENCE})
    fetched = run_cli("fetch", "z-lab/fix-line-drafter", "-o", "config.json",
                      cwd=bed.cli.workdir, base_env=hub_env)  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    lock = str(bed.cli.workdir / "dflash.lock")
    assert sha in Path(lock).read_text()
    hf = {k: hub_env[k] for k in ("HF_ENDPOINT", "HF_HOME")}
    h02.put(CONFIG, GOOD)  # by hand: not what the lock pins, nor what the server loaded
    before = server_pid(h02)
    try:
        done = bed.cli.run("doctor", h02.target, "--lock", lock, *bed.ssh, env=hf)
        assert done.returncode != 0, done.stdout
        fixes = fix_lines(done.stdout)
        pushes = [f for f in fixes if f.startswith("dflash-provision push ")]
        assert pushes and all("--lock" in f and "--restart" in f for f in pushes), fixes
        for fix in pushes:
            parse_fix(fix)
            pasted = _paste(bed, fix, hf)
            assert pasted.returncode == 0, fix + "\n" + pasted.stdout + pasted.stderr
        assert h02.config() == REFERENCE  # the locked bytes
        assert server_pid(h02) != before  # restarted on them, keeping its environment
        assert server_env(h02).get(CONTROL_ENV) == CONTROL
        again = bed.cli.run("doctor", h02.target, "--lock", lock, *bed.ssh, env=hf)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        # The bed's working directory is shared by the module's tests: a dflash.lock left there
        # would become the default authority of every later command that names none.
        Path(lock).unlink(missing_ok=True)
        bed.fresh(h02)


def test_launch_restart_alone_reuses_the_recorded_launch_and_refuses_a_missing_model(
    bed: Bed,
) -> None:
    h03 = bed.places[2]  # in the container
    before = server_pid(h03)
    record = running_record(h03)
    wrong = bed.run(
        "launch", h03.target, "--model", "/root/models/Qwen3.6-27B-typo",
        "--from", bed.file(REFERENCE, "ref"), "--vllm", record["vllm_cmd"][0],
        "--python", record["python"], "--port", str(record["port"]), "--restart", "--no-check",
    )  # fmt: skip
    assert wrong.returncode == ExitCode.USAGE, wrong.stdout + wrong.stderr
    assert "/root/models/Qwen3.6-27B-typo: no such directory" in wrong.stderr
    assert server_pid(h03) == before  # nothing was stopped
    done = bed.run("launch", h03.target, "--restart")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "proved: pid " in done.stdout
    assert f"num_spec_tokens {record['num_speculative_tokens']}" in done.stdout
    after = running_record(h03)
    assert after["argv"] == record["argv"]
    assert server_pid(h03) != before
    assert server_env(h03).get(CONTROL_ENV) == CONTROL
