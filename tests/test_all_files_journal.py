"""Placements as a user audits them afterwards (issue 32, item 3's placements): each file that
``push --all-files`` puts in place is a ``place`` row in the history ("started" before its first
byte, then its outcome: the sha256 found there before, the pinned one after, the bytes sent),
and a placed file keeps the mode the directory's owner chose: the mode of the file it replaces,
else config.json's, never the 0644 of a fresh file where the directory keeps its files 0640 for
a service group. On a real sshd host, with the Hub stand-in serving the drafter as the Hub does
(LFS for the weights)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed.hosts import Host
from tests.fixtures.drafter_repo import INDEX, SHARDS, drafter_files
from tests.test_all_files_hosts import DIR, Controller, _place, pinned_lock

pytestmark = pytest.mark.integration
__all__ = ["pinned_lock"]  # the fixture, used by name


def _ssh(host: Host) -> list[str]:
    assert host.client is not None
    return ["--ssh-config", str(host.client.ssh_config), "--no-agent"]


def _mode(host: Host, name: str) -> str:
    done = host.exec(["stat", "-c", "%a", f"{DIR}/{name}"], b"", check=True)
    out = done.stdout
    return (out.decode() if isinstance(out, bytes) else str(out)).strip()


def _place_rows(controller: Controller) -> list[dict[str, Any]]:
    done = controller.run("history", "--op", "place", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


def test_each_placement_is_journaled_and_keeps_the_directorys_modes(
    pinned_lock: Controller, ssh_host: Host
) -> None:
    ssh = _ssh(ssh_host)
    target = f"{ssh_host.alias}:{DIR}"
    rev1, rev2 = drafter_files(1), drafter_files(2)

    def run(argv: list[str], data: bytes) -> object:
        return ssh_host.exec(argv, data, check=True)

    # The owner keeps the drafter 0640 (a service group reads it); one shard is of another
    # revision (0600 by its owner's choice), the index is missing.
    _place(run, {**rev1, SHARDS[1]: rev2[SHARDS[1]]})
    run(["rm", f"{DIR}/{INDEX}"], b"")
    run(["chmod", "640", f"{DIR}/config.json", f"{DIR}/{SHARDS[0]}"], b"")
    run(["chmod", "600", f"{DIR}/{SHARDS[1]}"], b"")

    code, doc = pinned_lock.json("push", target, "--all-files", *ssh)
    assert code == ExitCode.OK, doc
    placed = {p["path"]: p for p in doc["files"]["placed"]}
    assert set(placed) == {SHARDS[1], INDEX}
    assert (placed[SHARDS[1]]["mode"], placed[SHARDS[1]]["mode_from"]) == ("600", "replaced")
    assert (placed[INDEX]["mode"], placed[INDEX]["mode_from"]) == ("640", "config.json")
    # On the host itself: not the 0644 of a fresh file.
    assert _mode(ssh_host, SHARDS[1]) == "600"
    assert _mode(ssh_host, INDEX) == "640"

    rows = {row["path"]: row for row in _place_rows(pinned_lock)}
    shard, index = rows[f"{DIR}/{SHARDS[1]}"], rows[f"{DIR}/{INDEX}"]
    assert shard["status"] == "ok" and index["status"] == "ok"
    # The other revision's bytes were hashed on the host before: the row says what was there.
    assert shard["sha256_before"] == hashlib.sha256(rev2[SHARDS[1]]).hexdigest()
    assert shard["sha256_after"] == hashlib.sha256(rev1[SHARDS[1]]).hexdigest()
    assert f"{len(rev1[SHARDS[1]])} bytes" in shard["message"]
    assert "mode 600 (the replaced file's)" in shard["message"]
    # The index is a small file, pinned by its git blob id: named in the message, no sha256.
    assert index["sha256_before"] is None and index["sha256_after"] is None
    assert "git blob id" in index["message"] and "hash proved on the host" in index["message"]
    assert len(rows) == 2  # config.json is push's own (its row is a push row), nothing else

    # The same directory again: nothing to place, no row.
    code, doc = pinned_lock.json("push", target, "--all-files", *ssh)
    assert code == ExitCode.OK and doc["files"]["placed"] == []
    assert len(_place_rows(pinned_lock)) == 2


def test_a_placement_that_fails_stays_in_the_history(
    pinned_lock: Controller, ssh_host: Host
) -> None:
    ssh = _ssh(ssh_host)
    rev1 = drafter_files(1)
    _place(lambda argv, data: ssh_host.exec(argv, data, check=True), rev1)
    ssh_host.exec(["rm", f"{DIR}/{SHARDS[0]}"], b"", check=True)
    ssh_host.make_readonly(DIR)

    done = pinned_lock.run("push", f"{ssh_host.alias}:{DIR}", "--all-files", *ssh)
    assert done.returncode == ExitCode.REMOTE_FAILED, done.stdout + done.stderr
    [row] = _place_rows(pinned_lock)
    assert row["path"] == f"{DIR}/{SHARDS[0]}"
    assert row["status"] == "failed"
    assert "ead-only" in row["message"], row
