"""The whole drafter pinned and checked where it lies (issue 32, items 1-2), for real: the Hub
stand-in serves a drafter repo as the Hub does (the weights as LFS objects, a few MB of real
safetensors shards, their index, a generation config, a README vLLM never reads);
``fetch --all-files`` pins its files from the tree listing without downloading a weight; then
``verify --all-files`` and ``audit --all-files`` check a real sshd host and an LXC busybox
container behind one: every file proved by a hash computed there, then relied on (not hashed
again) while unchanged, then a truncated shard, a shard of another revision with the same
shapes, a stray mask_embedding.pt, a missing index and a file that is a symlink out of the
directory (with the right bytes) each named with its verdict."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.source.lockfile import read_lock, read_pinned_files
from testbed.hosts import Host
from testbed.hub_standin import HubStandin, git_blob_sha
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.drafter_repo import INDEX, REPO, SHARDS, drafter_files

pytestmark = pytest.mark.integration

DIR = "/root/models/tiny-drafter"
PINNED = {"config.json", "generation_config.json", INDEX, *SHARDS}
Run = Callable[[list[str], bytes], object]  # a host's or a container's exec


class Controller:
    """The CLI on this machine: the stand-in's environment, one lock, one history."""

    def __init__(self, hub_env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = hub_env, tmp

    def run(self, *args: str) -> Done:
        return run_cli(*args, cwd=self.tmp, base_env=self.env, home=self.tmp / "home")

    def json(self, *args: str) -> tuple[int, dict[str, Any]]:
        done = self.run(*args, "--json")
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)


def _verdicts(files: dict[str, Any]) -> dict[str, str]:
    return {f["path"]: f["verdict"] for f in files["files"]}


@pytest.fixture
def pinned_lock(hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path) -> Controller:
    """A drafter repo on the stand-in (revision 1 on main) and a lock of all its files."""
    hub_standin.add_repo(REPO, drafter_files(1))
    controller = Controller(hub_env, tmp_path)
    done = controller.run("fetch", REPO, "--all-files")
    assert done.returncode == 0, done.stdout + done.stderr
    return controller


def test_fetch_all_files_pins_every_file_vllm_reads_without_downloading_a_weight(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    files = drafter_files(1)
    sha = hub_standin.add_repo(REPO, files)
    controller = Controller(hub_env, tmp_path)
    lock = tmp_path / "dflash.lock"

    # Today's lock: the config alone. It keeps working, and fetch adds the rest to it.
    assert controller.run("fetch", REPO).returncode == 0
    config_only = lock.read_bytes()
    assert read_pinned_files(lock) == []
    assert b'"files"' not in config_only
    done = controller.run("fetch", "--all-files")
    assert done.returncode == 0, done.stderr
    assert "5 pinned" in done.stdout and "no weights downloaded" in done.stdout

    assert read_lock(lock)[0].commit_sha == sha  # the config's entry did not move
    pinned = {f.path: f for f in read_pinned_files(lock)}
    assert set(pinned) == PINNED  # README.md is not read by vLLM: not pinned
    for shard in SHARDS:  # LFS files: the sha256 of the content, as the Hub declares it
        assert (pinned[shard].algorithm, pinned[shard].size) == ("sha256", len(files[shard]))
        assert pinned[shard].digest == hashlib.sha256(files[shard]).hexdigest()
    for small in ("config.json", "generation_config.json", INDEX):  # the git blob id
        assert (pinned[small].algorithm, pinned[small].digest) == (
            "git-blob-sha1",
            git_blob_sha(files[small]),
        )
    assert {p.commit_sha for p in pinned.values()} == {sha}
    # Listed, not downloaded: no shard was resolved, no LFS object served.
    assert hub_standin.count("/lfs-cdn/") == 0
    resolved = [path for (_, path) in hub_standin.requests if "/resolve/" in path]
    assert resolved and all(path.endswith("/config.json") for path in resolved)

    # A later plain fetch of the same commit keeps the pinned files; the config check works.
    assert controller.run("fetch", REPO).returncode == 0
    assert {f.path for f in read_pinned_files(lock)} == PINNED


def _put(run: Run, path: str, data: bytes) -> None:
    run(["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", path], data)


def _place(run: Run, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        _put(run, f"{DIR}/{name}", data)


def _exercise(controller: Controller, target: str, run: Run, ssh: list[str]) -> None:
    rev1, rev2 = drafter_files(1), drafter_files(2)
    _place(run, rev1)
    # A proof is kept only for a file older than the second its hash began (file_proofs.py).
    time.sleep(1.1)

    # Too short a time to hash anything (the host's deadline is 1 s): it cannot tell, and says
    # so with 26, never a pass.
    code, doc = controller.json("verify", target, "--all-files", "--command-timeout", "2", *ssh)
    assert code == ExitCode.INCONCLUSIVE, doc
    assert doc["files"]["status"] == "inconclusive"
    assert _verdicts(doc["files"]) == dict.fromkeys(PINNED, "not_checked")

    code, doc = controller.json("verify", target, "--all-files", *ssh)
    assert code == ExitCode.OK, doc
    files = doc["files"]
    assert files["status"] == "in_sync"
    assert _verdicts(files) == dict.fromkeys(PINNED, "proved")
    assert all(f["hashed_on_host"] for f in files["files"])

    # Unchanged since that proof: not hashed again, and it says so.
    done = controller.run("verify", target, "--all-files", *ssh)
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert "5 unchanged since a recorded proof (not hashed again)" in done.stdout
    assert "relied on recorded proofs" in done.stdout
    code, doc = controller.json("verify", target, "--all-files", *ssh)
    assert _verdicts(doc["files"]) == dict.fromkeys(PINNED, "unchanged")
    assert all(f["relied_on_proof_of"] for f in doc["files"]["files"])
    # ... and the proofs make the check fit the budget that could not hash a file.
    code, doc = controller.json("verify", target, "--all-files", "--command-timeout", "2", *ssh)
    assert code == ExitCode.OK, doc

    # Everything that goes wrong with a directory, at once.
    first, second = SHARDS
    run(["sh", "-c", 'head -c 100000 "$1" > "$1.t" && mv "$1.t" "$1"', "sh", f"{DIR}/{first}"], b"")
    _place(run, {second: rev2[second]})  # same shapes, same size, other weights
    _place(run, {"mask_embedding.pt": b"PK\x03\x04 a mask embedding of some other training"})
    run(["rm", f"{DIR}/{INDEX}"], b"")
    # The right bytes, but behind a link out of the directory: refused, not followed.
    outside = "/root/elsewhere/generation_config.json"
    _put(run, outside, rev1["generation_config.json"])
    run(["sh", "-c", 'rm "$2" && ln -s "$1" "$2"', "sh", outside,
         f"{DIR}/generation_config.json"], b"")  # fmt: skip

    expected = {
        "config.json": "unchanged",
        "generation_config.json": "symlink_outside",
        INDEX: "missing",
        first: "wrong_size",
        second: "wrong_bytes",
        "mask_embedding.pt": "stray",
    }
    code, doc = controller.json("verify", target, "--all-files", *ssh)
    assert code == ExitCode.DRIFT, doc
    assert doc["status"] == "in_sync"  # config.json itself is right: the files are not
    assert doc["files"]["status"] == "drifted"
    assert _verdicts(doc["files"]) == expected
    by_name = {f["path"]: f for f in doc["files"]["files"]}
    assert by_name[first]["size"] == 100000 and by_name[first]["pinned"]["size"] == len(rev1[first])
    assert by_name[second]["size"] == len(rev1[second])
    assert by_name[second]["digest"] != by_name[second]["pinned"]["digest"]

    done = controller.run("verify", target, "--all-files", *ssh)
    assert done.returncode == ExitCode.DRIFT
    assert f"wrong_size: {first}: 100000 bytes" in done.stdout
    assert f"wrong_bytes: {second}: other bytes: sha256" in done.stdout
    assert "stray: mask_embedding.pt: vLLM would load it" in done.stdout
    assert f"missing: {INDEX}: no such file" in done.stdout
    assert "symlink_outside: generation_config.json: a symlink that points outside" in done.stdout

    code, report = controller.json("audit", target, "--all-files", *ssh)
    assert code == ExitCode.DRIFT, report
    [host] = report["hosts"]
    assert host["status"] == "in_sync" and host["files"]["status"] == "drifted"
    assert _verdicts(host["files"]) == expected
    # The history does not show the host as all right: its files' row says drifted.
    history = controller.run("history", "--op", "audit-files", "--json")
    rows = json.loads(history.stdout)
    assert rows and rows[0]["status"] == "drifted" and rows[0]["path"] == DIR


def test_all_files_checked_where_they_lie_on_an_sshd_host(
    pinned_lock: Controller, ssh_host: Host
) -> None:
    assert ssh_host.client is not None
    ssh = ["--ssh-config", str(ssh_host.client.ssh_config), "--no-agent"]
    _exercise(
        pinned_lock,
        f"{ssh_host.alias}:{DIR}",
        lambda argv, data: ssh_host.exec(argv, data, check=True),
        ssh,
    )


@pytest.mark.lxc
def test_all_files_checked_where_they_lie_in_a_busybox_container(
    pinned_lock: Controller, lxc_container_on_host: Any
) -> None:
    container = lxc_container_on_host
    host = container.host
    ssh = ["--ssh-config", str(host.client.ssh_config), "--no-agent"]

    def run(argv: list[str], data: bytes) -> object:
        done = container.attach(argv, data)
        assert done.returncode == 0, done
        return done

    _exercise(pinned_lock, f"{host.alias}/lxc:{container.name}:{DIR}", run, ssh)


def test_no_weights_travel_to_the_controller(ssh_host: Host) -> None:
    """What crosses the connection for a 5 MB drafter, as the transport carries it: the
    script, the pinned names, the facts: a few KB, never the files."""
    from dflash_provision.history.host_key import HostKey
    from dflash_provision.host_state.pinned_check import check_pinned_files
    from dflash_provision.source.pinned_files import GIT_BLOB, SHA256, PinnedFile
    from dflash_provision.target import parse_target
    from dflash_provision.transport.base import CommandResult, Transport
    from dflash_provision.transport.factory import Connector
    from dflash_provision.transport.options import SshOptions

    files = drafter_files(1)
    _place(lambda argv, data: ssh_host.exec(argv, data, check=True), files)
    pinned = [
        PinnedFile(REPO, "a" * 40, name, len(data), SHA256, hashlib.sha256(data).hexdigest())
        if name.endswith(".safetensors")
        else PinnedFile(REPO, "a" * 40, name, len(data), GIT_BLOB, git_blob_sha(data))
        for name, data in files.items()
        if name != "README.md"
    ]
    assert ssh_host.client is not None
    options = SshOptions(ssh_config_path=str(ssh_host.client.ssh_config), use_agent=False)
    inner = Connector(options).open(parse_target(f"{ssh_host.alias}:{DIR}"))
    carried: list[int] = []

    class Measured(Transport):
        description = inner.description

        @property
        def command_timeout(self) -> float:
            return inner.command_timeout

        def run(
            self, argv: Any, *, stdin: bytes | None = None, timeout: float | None = None
        ) -> CommandResult:
            result = inner.run(argv, stdin=stdin, timeout=timeout)
            carried.append(len(stdin or b"") + len(result.stdout) + len(result.stderr))
            return result

        def connect(self) -> None:
            inner.connect()

        def close(self) -> None:
            inner.close()

    try:
        judgement = check_pinned_files(
            Measured(), DIR, pinned, host=HostKey(ssh_host.alias), history=None
        )
    finally:
        inner.close()
    assert judgement.status.value == "in_sync", judgement.to_dict()
    weights = sum(len(data) for data in files.values())
    assert weights > 5_000_000
    assert len(carried) == 1 and carried[0] < 4096, carried  # one exec, its lines only
