"""The pinned files on the runtime side (issue 32, item 4), for real: a drafter repo on the Hub
stand-in whose files vLLM reads beside the config (a generation config, and a
``mask_embedding.pt`` that vLLM's qwen3_dflash loads whenever present: the MiMo incident's file),
a lock of all of them (``fetch --all-files``), an sshd host with the vLLM STAND-IN (a test
double) started by ``launch --lock``. ``launch``'s pre-flight, runtime-check's stage a,
``doctor`` and ``rollout``'s pre-flight each check every pinned file where it lies: relied on
while unchanged since a recorded proof, hashed again with ``--rehash-files``; a mask embedding
of another training (same size, other bytes) or a truncated one is named with its verdict, and
``launch --restart`` refuses before the running server is stopped.

The repo has no safetensors: the tiny shards of tests/fixtures/drafter_repo.py do not fit the
reference config the stand-in serves, and the shapes check would refuse them before any of
this. The shards' own checks are in test_all_files_hosts.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed.hub_standin import HubStandin
from testbed.vllm_standin_install import CONTROL_ENV
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, REFERENCE, TARGET_DIR, put
from tests.fixtures.standin import Bed, ContainerBed, stages

pytestmark = [pytest.mark.integration, pytest.mark.root]

REPO = "z-lab/Tiny-DFlash-Runtime"
MASK = "mask_embedding.pt"
PINNED = {"config.json", "generation_config.json", MASK}


def _mask(training: int) -> bytes:
    """A mask embedding of one training: the same size for every training, other bytes."""
    import random

    return b"PK\x03\x04" + random.Random(training).randbytes(64 * 1024)


FILES = {
    "config.json": REFERENCE,
    "generation_config.json": b'{"_from_model_config": true, "transformers_version": "5.0"}\n',
    MASK: _mask(1),
    "README.md": b"# a drafter with a mask embedding\n",
}


class Locked:
    """The bed's CLI with the Hub stand-in's environment, its lock in the work directory."""

    def __init__(self, bed: Bed, hub_env: dict[str, str], target: str | None = None) -> None:
        self.bed, self.env = bed, hub_env
        self.work = bed.tmp / "work"
        self.lock = str(self.work / "dflash.lock")
        self._target = target or f"{bed.host.alias}:{DRAFTER_DIR}"

    def run(self, *args: str) -> Done:
        return run_cli(*args, cwd=self.work, base_env=self.env, home=self.work / "home")

    def json(self, *args: str) -> tuple[int, dict[str, Any]]:
        done = self.run(*args, "--json")
        assert done.stdout.strip(), done.stdout + done.stderr
        return done.returncode, json.loads(done.stdout)

    @property
    def target(self) -> str:
        return self._target

    def launch(self, *extra: str) -> Done:
        b = self.bed
        return self.run(
            "launch", self.target, "--model", TARGET_DIR, "--lock", self.lock,
            "--vllm", b.standin.vllm, "--python", b.standin.python, "--port", str(b.port),
            "--env", f"{CONTROL_ENV}={CONTROL}", "--ready-timeout", "300", "--no-check",
            *b.ssh(), *extra,
        )  # fmt: skip

    def check(self, *extra: str) -> tuple[int, dict[str, Any]]:
        b = self.bed
        return self.json(
            "runtime-check", self.target, "--lock", self.lock, "--port", str(b.port),
            *b.ssh(), *extra,
        )  # fmt: skip

    def pid(self) -> int:
        code, doc = self.json("status", self.target, "--port", str(self.bed.port), *self.bed.ssh())
        assert code == 0, doc
        pid = doc.get("pid")
        assert isinstance(pid, int), doc
        return pid


@pytest.fixture
def locked(bed: Bed, hub_standin: HubStandin, hub_env: dict[str, str]) -> Locked:
    hub_standin.add_repo(REPO, FILES)
    here = Locked(bed, hub_env)
    done = here.run("fetch", REPO, "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, data in FILES.items():
        put(bed.host, f"{DRAFTER_DIR}/{name}", data)
    # A proof is kept only for a file older than the second its hash began (file_proofs.py).
    time.sleep(1.1)
    return here


def _verdicts(files: dict[str, Any]) -> dict[str, str]:
    return {f["path"]: f["verdict"] for f in files["files"]}


def test_launch_runtime_check_and_doctor_check_every_pinned_file(locked: Locked) -> None:
    done = locked.launch("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    preflight = json.loads(done.stdout)["launch"]["preflight"]
    assert preflight["files"]["status"] == "in_sync"
    assert _verdicts(preflight["files"]) == dict.fromkeys(PINNED, "proved")
    pid = locked.pid()

    # Stage a relies on the proofs launch recorded (each file unchanged), and says so ...
    code, report = locked.check()
    assert code == ExitCode.OK, report
    a = stages(report)["a"]
    assert a["status"] == "passed"
    assert _verdicts(a["data"]["files"]) == dict.fromkeys(PINNED, "unchanged")
    assert any(line.startswith("relied on recorded proofs") for line in a["evidence"])
    # ... and --rehash-files hashes each one on the host again.
    code, report = locked.check("--rehash-files")
    assert code == ExitCode.OK, report
    assert _verdicts(stages(report)["a"]["data"]["files"]) == dict.fromkeys(PINNED, "proved")

    # The MiMo incident: a mask embedding of another training, the same size. The config is
    # the lock's, the shapes check has nothing to read: only the pinned hash tells.
    put(locked.bed.host, f"{DRAFTER_DIR}/{MASK}", _mask(2))
    code, report = locked.check()
    assert code == ExitCode.RUNTIME_CHECK_FAILED, report
    a = stages(report)["a"]
    assert a["status"] == "failed"
    assert f"{MASK} wrong_bytes" in a["summary"]
    assert a["data"]["files"]["status"] == "drifted"
    assert _verdicts(a["data"]["files"])[MASK] == "wrong_bytes"
    assert a["fix"].startswith(f"dflash-provision push {locked.target}")
    assert "--all-files" in a["fix"]

    # doctor: the file-on-disk link is the first broken one, its fix places the files and
    # restarts the server (it read the mask embedding at start-up).
    code, trace = locked.json(
        "doctor", locked.target, "--lock", locked.lock, "--port", str(locked.bed.port),
        *locked.bed.ssh(),
    )  # fmt: skip
    assert code == ExitCode.DRIFT, trace
    text = json.dumps(trace)
    assert f"{MASK} wrong_bytes" in text
    assert "--all-files && dflash-provision launch" in text and "--restart" in text

    # launch --restart refuses before it stops anything: the server keeps running.
    done = locked.launch("--restart")
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    assert "pre-flight: the drafter's files on" in done.stderr
    assert f"{MASK} wrong_bytes" in done.stderr and "--all-files" in done.stderr
    assert "--restart stopped nothing" in done.stderr
    assert locked.pid() == pid

    # A truncated one: its size tells, no hash needed.
    put(locked.bed.host, f"{DRAFTER_DIR}/{MASK}", _mask(1)[:1000])
    done = locked.launch("--restart")
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    assert f"{MASK} wrong_size (1000 bytes" in done.stderr
    assert locked.pid() == pid

    # The config wrong as well: stage a names both, and its one push fix places the files too.
    other = {**json.loads(REFERENCE), "max_position_embeddings": 4096}
    put(locked.bed.host, f"{DRAFTER_DIR}/config.json", json.dumps(other).encode())
    code, report = locked.check("--skip-loader")
    a = stages(report)["a"]
    assert code == ExitCode.RUNTIME_CHECK_FAILED and a["status"] == "failed", a
    assert "differs from" in a["summary"] and "and the drafter's files" in a["summary"]
    assert a["fix"].startswith("dflash-provision push") and a["fix"].endswith("--all-files")


def test_files_that_cannot_be_told_in_time_are_never_a_pass(locked: Locked) -> None:
    assert locked.launch().returncode == 0
    pid = locked.pid()
    # The host's deadline is 1 s: no file may begin a hash. launch cannot tell: 26, nothing
    # stopped; stage a is inconclusive, never passed.
    done = locked.launch("--restart", "--rehash-files", "--command-timeout", "2")
    assert done.returncode == ExitCode.INCONCLUSIVE, done.stdout + done.stderr
    assert "cannot tell whether the drafter's files" in done.stderr
    assert locked.pid() == pid
    code, report = locked.check("--rehash-files", "--skip-loader", "--command-timeout", "2")
    a = stages(report)["a"]
    assert a["status"] == "inconclusive", a
    assert a["summary"].startswith("cannot tell whether the drafter's files")
    assert set(_verdicts(a["data"]["files"]).values()) == {"not_checked"}
    assert code in (ExitCode.INCONCLUSIVE, ExitCode.RUNTIME_CHECK_FAILED), report
    if code == ExitCode.RUNTIME_CHECK_FAILED:  # only another stage's failure may outrank it
        assert any(s["status"] == "failed" for s in report["stages"]), report
    # Without the rehash, the proofs make the same deadline enough.
    code, report = locked.check("--skip-loader", "--command-timeout", "2")
    assert stages(report)["a"]["status"] == "passed", report


def test_rollout_preflight_refuses_a_host_whose_pinned_files_are_wrong(locked: Locked) -> None:
    assert locked.launch().returncode == 0
    bed = locked.bed
    inventory = bed.tmp / "fleet.yaml"
    inventory.write_text(f"defaults:\n  path: {DRAFTER_DIR}\nhosts:\n  - {bed.host.alias}\n")
    put(bed.host, f"{DRAFTER_DIR}/{MASK}", _mask(2))
    config_before = bed.host.exec(["cat", f"{DRAFTER_DIR}/config.json"], b"", check=True)

    common = ["-i", str(inventory), "--lock", locked.lock, "--env", f"{CONTROL_ENV}={CONTROL}"]
    done = locked.run("rollout", *common, "--dry-run", *bed.ssh())
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    assert f"pre-flight failed: {bed.host.alias}: the drafter's files" in done.stdout
    assert f"{MASK} wrong_bytes" in done.stdout

    code, doc = locked.json("rollout", *common, *bed.ssh())
    assert code == ExitCode.ROLLOUT_REFUSED, doc
    assert doc["state"] == "refused"
    assert f"pre-flight failed on {bed.host.alias}" in doc["message"]
    [host] = doc["hosts"]
    assert host["phase"] == "preflight_failed"
    assert f"{MASK} wrong_bytes" in host["detail"] and "--all-files" in host["detail"]
    after = bed.host.exec(["cat", f"{DRAFTER_DIR}/config.json"], b"", check=True)
    assert after.stdout == config_before.stdout  # nothing written

    # --resume checks the files the record kept (the lock is not read again): still refused,
    # then, with the lock's mask embedding back in place, it goes on.
    resume = ["rollout", "--resume", doc["id"], "--env", f"{CONTROL_ENV}={CONTROL}", *bed.ssh()]
    code, again = locked.json(*resume)
    assert code == ExitCode.ROLLOUT_REFUSED, again
    assert f"{MASK} wrong_bytes" in again["hosts"][0]["detail"]
    put(bed.host, f"{DRAFTER_DIR}/{MASK}", _mask(1))
    code, done_doc = locked.json(*resume)
    assert code == ExitCode.OK, done_doc
    assert done_doc["state"] == "completed", done_doc


@pytest.mark.lxc
def test_inside_an_lxc_container_behind_ssh_the_pinned_files_are_checked_there(
    container_bed: ContainerBed, hub_standin: HubStandin, hub_env: dict[str, str]
) -> None:
    hub_standin.add_repo(REPO, FILES)
    here = Locked(container_bed.bed, hub_env, container_bed.target)
    done = here.run("fetch", REPO, "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, data in FILES.items():
        container_bed.put(f"{DRAFTER_DIR}/{name}", data)
    time.sleep(1.1)

    done = here.launch("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    files = json.loads(done.stdout)["launch"]["preflight"]["files"]
    assert files["status"] == "in_sync", files
    # Checked inside the container, where vLLM reads them (not on the host behind it).
    assert files["directory"].startswith(f"lxc:{container_bed.container.name} on "), files
    code, report = here.check()
    assert code == ExitCode.OK, report
    assert stages(report)["a"]["data"]["files"]["status"] == "in_sync"

    container_bed.put(f"{DRAFTER_DIR}/{MASK}", _mask(2))
    code, report = here.check()
    assert code == ExitCode.RUNTIME_CHECK_FAILED, report
    a = stages(report)["a"]
    assert a["status"] == "failed" and f"{MASK} wrong_bytes" in a["summary"]
    done = here.launch("--restart")
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    assert f"{MASK} wrong_bytes" in done.stderr and "--restart stopped nothing" in done.stderr
