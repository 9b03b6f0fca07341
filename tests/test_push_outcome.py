"""The outcome a push reports is the truth (issue 11 item 6), on real sshd hosts.

A push cut off right after its rename (the new file is in place, the report not yet sent) reads
what happened on a FRESH connection and reports that, with history agreeing:

  connection lost     the session's sshd SIGKILLed by the fake ``sync`` the write runs next
  Ctrl-C              SIGINT to the CLI while the write is held right after its rename
  host frozen         the session (its sshd, the script, its watchdog) SIGSTOPped until the CLI
                      has timed out and its settle step is waiting on the host; then SIGCONT
  host gone           the host stopped after the rename: the outcome is unknown (exit 17) and
                      the message says how to check (`verify`)

And 8 simultaneous pushes of 8 different configs to one file: every push that landed and was
then replaced by a later one says "replaced", the last one "written"; none says "did not take
effect" (before: 84 of 160 in the stress run). How faults are made: tests/fixtures/after_rename.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.place.push import PushStatus, push_config
from dflash_provision.remote.proof import WriteOptions
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.after_rename import fault_after_rename, release, wait_renamed
from tests.fixtures.cli import CLI_TIMEOUT_S, cli_env, run_cli
from tests.fixtures.ssh import client_options, host_args, session_sshd_pids

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/X"


def model_dir(host: Host) -> Path:
    return host.root_dir / "models" / "X"


def seed(host: Host) -> Path:
    directory = model_dir(host)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_bytes(INCIDENT)
    return directory


def push_argv(host: Host, *extra: str) -> list[str]:
    return [
        "push",
        f"{host.alias}:{MODEL}",
        "--from",
        str(samples.REFERENCE_DRAFTER),
        *host_args(host),
        *extra,
    ]


def history_statuses(home: Path) -> list[str]:
    done = run_cli("history", "--json", home=home)
    assert done.returncode == 0, done.stderr
    return [row["status"] for row in json.loads(done.stdout)]


def start_cli(argv: list[str], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dflash_provision", *argv],
        env=cli_env(home=home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        todo += [int(c) for c in children]
    return found


def remote_processes(host: Host, needle: str) -> list[str]:
    out = host.exec(["ps", "-ww", "-eo", "args"], check=True).stdout
    return [line for line in out.splitlines() if needle in line and "ps -eo" not in line]


def test_connection_lost_after_rename_is_reported_written(ssh_host, tmp_path):
    directory = seed(ssh_host)
    fault_after_rename(ssh_host, "kill-session")
    done = run_cli(*push_argv(ssh_host), home=tmp_path)
    assert (directory / "config.json").read_bytes() == REFERENCE, "the new bytes landed"
    assert done.returncode == ExitCode.OK, done.stderr
    assert "written:" in done.stdout
    assert "left untouched" not in done.stdout + done.stderr
    assert history_statuses(tmp_path) == ["written"]


def test_ctrl_c_after_rename_is_reported_written(ssh_host, tmp_path):
    directory = seed(ssh_host)
    fault_after_rename(ssh_host, "hold")
    proc = start_cli(push_argv(ssh_host, "--json"), tmp_path)
    try:
        wait_renamed(ssh_host)
        proc.send_signal(signal.SIGINT)
        release(ssh_host)
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    assert (directory / "config.json").read_bytes() == REFERENCE
    assert proc.returncode == ExitCode.OK, stderr
    result = json.loads(stdout)
    assert (result["status"], result["interrupted"]) == ("written", True)
    assert history_statuses(tmp_path) == ["written"]


def test_host_frozen_past_timeout_after_rename_is_reported_written(ssh_host, tmp_path):
    directory = seed(ssh_host)
    fault_after_rename(ssh_host, "hold")
    proc = start_cli(push_argv(ssh_host, "--json", "--command-timeout", "4"), tmp_path)
    frozen: list[int] = []
    try:
        wait_renamed(ssh_host)
        for session in session_sshd_pids(ssh_host):
            for pid in [session, *descendants(session)]:
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        # The CLI gives up on the frozen session (its command timeout), then asks again on a
        # new connection, where its settle step waits for the frozen write's lock: thaw then.
        deadline = time.monotonic() + 60
        while not remote_processes(ssh_host, "dflash-settle"):
            assert proc.poll() is None, proc.communicate()[0][-900:]
            assert time.monotonic() < deadline, "no settle step on the host"
            time.sleep(0.1)
        release(ssh_host)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        proc.kill()
    assert (directory / "config.json").read_bytes() == REFERENCE
    assert proc.returncode == ExitCode.OK, stderr
    result = json.loads(stdout)
    assert result["status"] == "written"
    assert "did not finish within" in result["cut_off"]
    assert history_statuses(tmp_path) == ["written"]


def test_host_gone_after_rename_reports_unknown_and_names_verify(ssh_host, tmp_path):
    directory = seed(ssh_host)
    fault_after_rename(ssh_host, "hold")
    argv = push_argv(ssh_host, "--command-timeout", "3", "--connect-timeout", "2")
    proc = start_cli(argv, tmp_path)
    try:
        wait_renamed(ssh_host)
        ssh_host.stop()
        stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    assert (directory / "config.json").read_bytes() == REFERENCE, "it did land"
    assert proc.returncode == ExitCode.OUTCOME_UNKNOWN, stderr
    assert "outcome unknown" in stderr
    assert f"dflash-provision verify {ssh_host.alias}:{MODEL}" in stderr
    assert "left untouched" not in stdout + stderr
    assert history_statuses(tmp_path) == ["unknown"]


def test_concurrent_pushes_each_report_whether_they_landed(ssh_host):
    """8 threads, 8 configs (same JSON, different bytes), one file, every backup kept: every
    push landed (its bytes are the final file or a backup), so each says written or replaced,
    never "write did not take effect"."""
    directory = seed(ssh_host)
    pool = [REFERENCE + b"\n" * (i + 1) for i in range(8)]
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    barrier = threading.Barrier(len(pool))
    claims: dict[int, str] = {}

    def one(i: int) -> None:
        with open_transport(target, client_options(ssh_host)) as transport:
            transport.connect()
            barrier.wait(timeout=60)
            result = push_config(
                transport,
                target,
                Authority(label=f"writer {i}", data=pool[i]),
                validate=False,
                write=WriteOptions(keep_backups=50, timeout=60),
            )
        claims[i] = result.status.value

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(pool))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(claims) == len(pool), "a push raised"
    final = (directory / "config.json").read_bytes()
    kept = [p.read_bytes() for p in (directory / ".dflash-backups").glob("config.json.2*")]
    landed = {i for i, data in enumerate(pool) if data == final or data in kept}
    assert landed == set(range(len(pool))), "every push renamed its file in, one after another"
    # A push whose read-back still saw its bytes says written (it could not know of a later
    # one); one whose read-back saw a later push's bytes says replaced; the last one, written.
    assert {claims[i] for i in landed} <= {"written", "replaced"}, claims
    assert claims[pool.index(final)] == "written"
    assert PushStatus.NOT_APPLIED.value not in claims.values()


def test_repair_cut_off_after_rename_journals_written_and_does_not_guess_the_old_file(
    ssh_host, tmp_path
):
    # Repair writes first: when that write's report is lost, a read now would show the new file
    # as if it were the old one. The before column says it is not known; the row says written.
    from tests.fixtures.inventories import write_fleet_inventory

    directory = seed(ssh_host)
    fault_after_rename(ssh_host, "kill-session")
    inventory = write_fleet_inventory(tmp_path / "fleet.yaml", [ssh_host.alias], model=MODEL)
    done = run_cli("repair", "-i", str(inventory), "--json", *host_args(ssh_host), home=tmp_path)
    assert (directory / "config.json").read_bytes() == REFERENCE, "the new bytes landed"
    assert done.returncode == ExitCode.OK, done.stderr
    (host,) = json.loads(done.stdout)["hosts"]
    assert host["action"] == "wrote", host
    assert host["before"]["status"] == "error" and "cut off" in host["before"]["detail"], host
    assert host["after"]["status"] == "in_sync", host
    # --json says what the host showed when the write was settled, as history does.
    assert host["sha256_after"] == host["after"]["sha256"], host
    from dflash_provision.history.store import HistoryStore

    rows = HistoryStore(tmp_path / "history.sqlite3").query(op="repair", limit=None)
    assert [(r.status, r.sha256_after) for r in rows] == [("written", host["after"]["sha256"])]
