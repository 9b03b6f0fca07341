"""Failures on the controller itself, seen through the real CLI: the command's own outcome is still
reported (the file is written, the audit printed), and what went wrong locally is one ``error:``
line that says how to fix it, with exit 9 (LOCAL_WRITE) unless the command has more urgent news.

How each failure is made:
  --prometheus dir missing   a path under a directory nobody created
  corrupt history            garbage bytes in history.sqlite3
  home is a file             DFLASH_PROVISION_HOME pointing at a regular file
  unwritable history         a read-only bind mount over the history directory, in a private
                             mount namespace of the CLI process (root: no permission bits stop it)
  full disk                  a 64 KiB tmpfs holding the history directory, filled, in a private
                             mount namespace of the CLI process
Pushes go to a local model directory (the local transport: a real write, no sshd needed). The
CLI runs in-process, except under a private mount namespace, which needs a process of its own.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from tests.fixtures.cli import Done, run_cli, run_cli_in_process

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()

# Run "$@" in a private mount namespace after a setup step; $1 is the directory to set up.
_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'
_FULL_DISK = (
    'mount -t tmpfs -o size=64k tmpfs "$1" && mkdir "$1/home" && '
    '{ dd if=/dev/zero of="$1/fill" bs=4k 2>/dev/null; true; } && shift && exec "$@"'
)


def cli(
    *args: str, home: Path, cwd: Path, namespace: tuple[str, Path] | None = None, **env: str
) -> Done:
    """The CLI in-process, or in a private mount namespace set up by ``namespace`` (script,
    directory): a subprocess under ``unshare -m``."""
    if namespace is None:
        return run_cli_in_process(*args, cwd=cwd, home=home, env=env)
    script, directory = namespace
    prefix = ["unshare", "-m", "sh", "-c", script, "sh", str(directory)]
    return run_cli(*args, cwd=cwd, home=home, env=env, prefix=prefix)


def error_lines(proc: Done) -> list[str]:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert all(line.startswith("error: ") for line in lines), proc.stderr
    return lines


def model(tmp_path: Path, data: bytes = INCIDENT) -> Path:
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_bytes(data)
    return directory


def push(
    directory: Path, home: Path, namespace: tuple[str, Path] | None = None, **env: str
) -> Done:
    ref = str(samples.REFERENCE_DRAFTER)
    args = ("push", str(directory), "--from", ref)
    return cli(*args, home=home, cwd=directory.parent, namespace=namespace, **env)


def assert_pushed_and_reported(proc: Done, directory: Path) -> None:
    assert "written: " in proc.stdout, proc.stdout + proc.stderr
    assert (directory / "config.json").read_bytes() == REFERENCE


# ---------------------------------------------------------------------------------------------
# --prometheus


@pytest.mark.parametrize(
    ("data", "code"), [(REFERENCE, ExitCode.LOCAL_WRITE), (INCIDENT, ExitCode.DRIFT)]
)
def test_prometheus_file_in_a_missing_directory_is_one_line_and_the_audit_is_still_printed(
    tmp_path: Path, data: bytes, code: ExitCode
) -> None:
    directory = model(tmp_path, data)
    prom = tmp_path / "no-such-dir" / "dflash.prom"
    ref = str(samples.REFERENCE_DRAFTER)
    done = cli(
        "audit", str(directory), "--from", ref, "--json", "--prometheus", str(prom),
        home=tmp_path / "home", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    (host,) = json.loads(done.stdout)["hosts"]
    assert host["status"] == ("in_sync" if data == REFERENCE else "drifted")
    (line,) = error_lines(done)
    assert (
        line
        == f"error: --prometheus {prom}: directory {prom.parent} does not exist; create it first"
    )
    assert not prom.parent.exists()


# ---------------------------------------------------------------------------------------------
# history


def test_a_corrupt_history_database_does_not_stop_the_push_and_says_how_to_move_it_aside(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    database = home / "history.sqlite3"
    database.write_bytes(b"this is not sqlite\n" * 100)
    directory = model(tmp_path)

    pushed = push(directory, home)
    assert pushed.returncode == ExitCode.LOCAL_WRITE
    assert_pushed_and_reported(pushed, directory)
    (line,) = error_lines(pushed)
    assert "not recorded in the history" in line and "is corrupt" in line
    assert f"mv {database} {database}.broken" in line

    shown = cli("history", home=home, cwd=tmp_path)
    assert shown.returncode == ExitCode.LOCAL_WRITE
    (line,) = error_lines(shown)
    assert "is corrupt" in line and f"mv {database} {database}.broken" in line

    # Doing what the message says is enough: the next push is recorded in a new database.
    database.rename(f"{database}.broken")
    model(tmp_path)
    again = push(directory, home)
    assert again.returncode == 0, again.stderr
    assert [
        e["status"] for e in json.loads(cli("history", "--json", home=home, cwd=tmp_path).stdout)
    ] == ["written"]


def test_a_failed_push_keeps_its_own_exit_code_when_the_history_is_broken_too(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "history.sqlite3").write_bytes(b"garbage")
    missing = tmp_path / "no-model-dir"
    done = push(missing, home)
    assert done.returncode == ExitCode.REMOTE_FAILED
    step, history = error_lines(done)
    assert "directory" in step and "--mkdir" in step
    assert history.startswith("error: not recorded in the history:")


def test_a_home_that_is_a_file_is_one_line_for_push_and_history(tmp_path: Path) -> None:
    home = tmp_path / "home-file"
    home.write_text("not a directory\n")
    directory = model(tmp_path)
    pushed = push(directory, home)
    assert pushed.returncode == ExitCode.LOCAL_WRITE
    assert_pushed_and_reported(pushed, directory)
    expected = (
        f"history directory DFLASH_PROVISION_HOME={home} is not a directory: "
        "point DFLASH_PROVISION_HOME at a directory"
    )
    assert error_lines(pushed) == [f"error: not recorded in the history: {expected}"]
    shown = cli("history", home=home, cwd=tmp_path)
    assert shown.returncode == ExitCode.LOCAL_WRITE
    assert error_lines(shown) == [f"error: {expected}"]
    assert home.read_text() == "not a directory\n"


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_an_unwritable_history_does_not_stop_the_push(tmp_path: Path) -> None:
    home = tmp_path / "home"
    directory = model(tmp_path, REFERENCE)
    assert push(directory, home).returncode == 0  # "unchanged": creates a database with a row
    model(tmp_path)
    pushed = push(directory, home, namespace=(_READ_ONLY, home))
    assert pushed.returncode == ExitCode.LOCAL_WRITE
    assert_pushed_and_reported(pushed, directory)
    (line,) = error_lines(pushed)
    assert "read-only filesystem" in line and "DFLASH_PROVISION_HOME" in line


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_a_history_on_a_full_disk_does_not_stop_push_or_audit(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    home = disk / "home"
    directory = model(tmp_path)
    pushed = push(directory, home, namespace=(_FULL_DISK, disk))
    assert pushed.returncode == ExitCode.LOCAL_WRITE
    assert_pushed_and_reported(pushed, directory)
    (line,) = error_lines(pushed)
    assert "the disk is full" in line and "free some space" in line

    ref = str(samples.REFERENCE_DRAFTER)
    audited = cli(
        "audit", str(directory), "--from", ref, "--json",
        home=home, cwd=tmp_path, namespace=(_FULL_DISK, disk),
    )  # fmt: skip
    assert audited.returncode == ExitCode.LOCAL_WRITE
    assert json.loads(audited.stdout)["hosts"][0]["status"] == "in_sync"
    (line,) = error_lines(audited)
    assert "the disk is full" in line


def test_history_records_the_real_user_not_logname(tmp_path: Path) -> None:
    home = tmp_path / "home"
    directory = model(tmp_path)
    real = pwd.getpwuid(os.getuid()).pw_name
    impostor = "mallory" if real != "mallory" else "eve"
    assert push(directory, home, LOGNAME=impostor, USER=impostor).returncode == 0
    with sqlite3.connect(home / "history.sqlite3") as db:
        (who,) = db.execute("SELECT who FROM events").fetchone()
    assert who.split("@")[0] == real
