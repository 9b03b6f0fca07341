"""Every outcome word means what docs/commands.md says, also when another writer comes between
a write's steps (issue 35 finding 1), on a real sshd host.

A push that finds its own bytes already in place takes write.sh's unchanged path, which takes no
lock (a read-only directory holding the right file is fine), then reads the file back. Another
push that renames its file in before that read-back made the first one report `not-applied`
("write did not take effect", exit 7) and repair `failed`, though no rename was tried. What
happened: the file was right, nothing was written, then another writer replaced it.

Deterministic: a fake ``head`` (the read-back's tool) holds the FIRST read-back until the test
has run the other push to its end; every later ``head`` is the real one.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.history.store import HistoryStore
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.after_rename import install_tool, release, wait_renamed
from tests.fixtures.cli import CLI_TIMEOUT_S, cli_env, run_cli
from tests.fixtures.inventories import write_fleet_inventory
from tests.fixtures.ssh import host_args

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
MODEL = "/root/models/X"

# The first head on the host waits (at most 120 s) for the test's go; any other is the real one.
_HOLD_FIRST_HEAD = """#!/bin/sh
if mkdir /root/.head-held 2>/dev/null; then
	: >/root/.renamed
	n=0
	while [ ! -e /root/.release ] && [ "$n" -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done
fi
exec /usr/bin/head "$@"
"""


def other_config(tmp_path: Path) -> Path:
    """The same valid config in other bytes: what the other writer puts in place."""
    path = tmp_path / "other.json"
    path.write_text(json.dumps(json.loads(REFERENCE), indent=3) + "\n")
    return path


def start(argv: list[str], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_provision", *argv],
        env=cli_env(home=home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def right_file_then_held(host: Host) -> Path:
    """The host's file already holds REFERENCE; the next read-back on the host will hold."""
    directory = host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(REFERENCE)
    install_tool(host, "head", _HOLD_FIRST_HEAD)
    return directory


def other_writer_pushes(host: Host, other: Path, home: Path) -> None:
    done = run_cli(
        "push", f"{host.alias}:{MODEL}", "--from", str(other), *host_args(host), home=home
    )
    assert done.returncode == ExitCode.OK, done.stderr
    assert "written:" in done.stdout


def test_push_that_found_its_bytes_then_saw_another_writer_is_not_not_applied(ssh_host, tmp_path):
    directory = right_file_then_held(ssh_host)
    other = other_config(tmp_path)
    argv = ["push", f"{ssh_host.alias}:{MODEL}", "--from", str(samples.REFERENCE_DRAFTER)]
    proc = start([*argv, *host_args(ssh_host), "--json"], tmp_path / "first")
    try:
        wait_renamed(ssh_host)  # here: in its unchanged path's read-back
        other_writer_pushes(ssh_host, other, tmp_path / "second")
        release(ssh_host)
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    assert (directory / "config.json").read_bytes() == other.read_bytes()
    result = json.loads(stdout)
    # Not "write did not take effect" (no rename was tried): it found the file right, wrote
    # nothing, and the file was then replaced by another writer: the file differs, exit 4.
    assert result["status"] == "replaced", result
    assert proc.returncode == ExitCode.DRIFT, stderr
    assert "did not take effect" not in result["message"]
    assert "nothing was written" in result["message"]
    assert "another writer" in result["message"]
    assert result["backup"] is None  # it wrote nothing, kept nothing
    rows = HistoryStore(tmp_path / "first" / "history.sqlite3").query(op="push", limit=None)
    assert [(r.status, r.sha256_after) for r in rows] == [
        ("replaced", hashlib.sha256(other.read_bytes()).hexdigest())
    ]


def test_repair_that_found_the_host_in_sync_then_saw_another_writer_is_not_failed(
    ssh_host, tmp_path
):
    right_file_then_held(ssh_host)
    other = other_config(tmp_path)
    inventory = write_fleet_inventory(tmp_path / "fleet.yaml", [ssh_host.alias], model=MODEL)
    proc = start(
        ["repair", "-i", str(inventory), "--json", *host_args(ssh_host)], tmp_path / "first"
    )
    try:
        wait_renamed(ssh_host)
        other_writer_pushes(ssh_host, other, tmp_path / "second")
        release(ssh_host)
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    (host,) = json.loads(stdout)["hosts"]
    # The write found the host in sync and wrote nothing; the host then changed under it.
    assert host["action"] == "in_sync", host
    assert host["before"]["status"] == "in_sync", host
    assert host["after"]["status"] == "same_values", host
    assert "another writer" in host["message"], host
    # Repair exits 0 only when every host ends in sync: this one does not (7, documented).
    assert proc.returncode == ExitCode.REMOTE_FAILED, stderr
    rows = HistoryStore(tmp_path / "first" / "history.sqlite3").query(op="repair", limit=None)
    assert rows == [], "nothing was written: no write row"


# The first flock on the host waits (at most 120 s) until a second write has also asked for the
# lock: both writes then found the file missing before either created it.
_FIRST_FLOCK_WAITS_FOR_A_SECOND = """#!/bin/sh
if mkdir /root/.flock-first 2>/dev/null; then
	n=0
	while [ ! -e /root/.flock-second ] && [ "$n" -lt 1200 ]; do sleep 0.1; n=$((n + 1)); done
else
	: >/root/.flock-second
fi
exec /usr/bin/flock "$@"
"""


def test_two_repairs_of_one_missing_file_report_created_once(ssh_host, tmp_path):
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)  # the directory is there, its config.json is not
    install_tool(ssh_host, "flock", _FIRST_FLOCK_WAITS_FOR_A_SECOND)
    inventory = write_fleet_inventory(tmp_path / "fleet.yaml", [ssh_host.alias], model=MODEL)
    argv = ["repair", "-i", str(inventory), "--json", *host_args(ssh_host)]
    procs = [start(argv, tmp_path / name) for name in ("first", "second")]
    try:
        outputs = [proc.communicate(timeout=CLI_TIMEOUT_S) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    hosts = [json.loads(stdout)["hosts"][0] for stdout, _ in outputs]
    assert (directory / "config.json").read_bytes() == REFERENCE
    assert [proc.returncode for proc in procs] == [ExitCode.OK, ExitCode.OK], outputs
    # Only one of them created the file: the other found it there, with these very bytes.
    messages = sorted(str(h["message"]) for h in hosts)
    assert sum("created" in m for m in messages) == 1, messages
    other = next(h for h in hosts if "created" not in str(h["message"]))
    assert other["action"] == "in_sync", other
    assert other["before"]["status"] == "in_sync", other
