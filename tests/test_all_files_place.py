"""Missing or wrong files placed without a second copy (issue 32, item 3), for real: on an sshd
host and in a busybox container behind one, ``push --all-files`` streams each missing or wrong
file from the controller's Hub cache (filled from the Hub stand-in, LFS for the weights), writes
it beside its name, proves its hash on the host and renames it; a placement interrupted earlier
resumes from its part; a host whose directory cannot be written fails with 7 and names it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed.hosts import Host
from tests.fixtures.drafter_repo import INDEX, SHARDS, drafter_files
from tests.test_all_files_hosts import DIR, PINNED, Controller, _place, _verdicts, pinned_lock

pytestmark = pytest.mark.integration
__all__ = ["pinned_lock"]  # the fixture, used by name
Run = Callable[[list[str], bytes], object]
PART_PREFIX = 1_000_000


def _break_and_interrupt(run: Run) -> None:
    """Another revision's shard, a missing index, a truncated shard, and a placement of the
    first shard that was interrupted after its first million bytes."""
    rev1, rev2 = drafter_files(1), drafter_files(2)
    _place(run, {**rev1, SHARDS[1]: rev2[SHARDS[1]], SHARDS[0]: rev1[SHARDS[0]][:5000]})
    run(["rm", f"{DIR}/{INDEX}"], b"")
    run(["mkdir", "-m", "700", f"{DIR}/.dflash-backups"], b"")
    part = f"{DIR}/.dflash-backups/{SHARDS[0]}.dflash-part"
    run(["sh", "-c", 'cat > "$1"', "sh", part], rev1[SHARDS[0]][:PART_PREFIX])


def _exercise(controller: Controller, target: str, run: Run, ssh: list[str]) -> None:
    _break_and_interrupt(run)
    rev1 = drafter_files(1)

    done = controller.run("push", target, "--all-files", *ssh)
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    size = len(rev1[SHARDS[0]])
    assert (
        f"placed {SHARDS[0]}: {size} bytes, {size - PART_PREFIX} sent, "
        f"resumed at {PART_PREFIX} bytes" in done.stdout
    )
    assert f"placed {SHARDS[1]}: " in done.stdout and f"placed {INDEX}: " in done.stdout
    assert f"placing {SHARDS[1]}: {len(rev1[SHARDS[1]])}/{len(rev1[SHARDS[1]])} bytes" in (
        done.stderr
    )
    assert "files in_sync" in done.stdout

    code, doc = controller.json("verify", target, "--all-files", *ssh)
    assert code == ExitCode.OK, doc
    assert set(_verdicts(doc["files"])) == PINNED
    listing = run(["ls", "-a", f"{DIR}/.dflash-backups"], b"")
    assert ".dflash-part" not in str(getattr(listing, "stdout", "")), listing

    # Nothing wrong: nothing placed.
    code, doc = controller.json("push", target, "--all-files", *ssh)
    assert code == ExitCode.OK, doc
    assert doc["files"]["placed"] == []


def test_push_all_files_places_and_resumes_on_an_sshd_host(
    pinned_lock: Controller, ssh_host: Host
) -> None:
    assert ssh_host.client is not None
    ssh = ["--ssh-config", str(ssh_host.client.ssh_config), "--no-agent"]

    def run(argv: list[str], data: bytes) -> object:
        return ssh_host.exec(argv, data, check=True)

    _exercise(pinned_lock, f"{ssh_host.alias}:{DIR}", run, ssh)


@pytest.mark.lxc
def test_push_all_files_places_and_resumes_in_a_busybox_container(
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


def test_a_directory_that_cannot_be_written_fails_with_7_and_names_it(
    pinned_lock: Controller, ssh_host: Host
) -> None:
    assert ssh_host.client is not None
    ssh = ["--ssh-config", str(ssh_host.client.ssh_config), "--no-agent"]
    rev1 = drafter_files(1)
    _place(lambda argv, data: ssh_host.exec(argv, data, check=True), rev1)
    ssh_host.exec(["rm", f"{DIR}/{SHARDS[0]}"], b"", check=True)
    ssh_host.make_readonly(DIR)

    done = pinned_lock.run("push", f"{ssh_host.alias}:{DIR}", "--all-files", "--json", *ssh)
    assert done.returncode == ExitCode.REMOTE_FAILED, done.stdout + done.stderr
    assert "Read-only" in done.stderr or "read-only" in done.stderr, done.stderr
    assert DIR in done.stderr
    code, doc = pinned_lock.json("verify", f"{ssh_host.alias}:{DIR}", "--all-files", *ssh)
    assert code == ExitCode.DRIFT and _verdicts(doc["files"])[SHARDS[0]] == "missing"


@pytest.mark.lxc
def test_repair_all_files_makes_a_host_and_a_container_right(
    pinned_lock: Controller, lxc_container_on_host: Any
) -> None:
    container = lxc_container_on_host
    host = container.host
    ssh = ["--ssh-config", str(host.client.ssh_config), "--no-agent"]

    def in_container(argv: list[str], data: bytes) -> object:
        done = container.attach(argv, data)
        assert done.returncode == 0, done
        return done

    _break_and_interrupt(lambda argv, data: host.exec(argv, data, check=True))
    _break_and_interrupt(in_container)
    targets = [f"{host.alias}:{DIR}", f"{host.alias}/lxc:{container.name}:{DIR}"]

    code, dry = pinned_lock.json("repair", *targets, "--all-files", "--dry-run", *ssh)
    assert code == ExitCode.DRIFT, dry
    for entry in dry["hosts"]:
        assert entry["files"]["placed"] == []
        assert _verdicts(entry["files"]["before"])[INDEX] == "missing"

    code, doc = pinned_lock.json("repair", *targets, "--all-files", *ssh)
    assert code == ExitCode.OK, doc
    for entry in doc["hosts"]:
        files = entry["files"]
        assert {p["path"] for p in files["placed"]} == {SHARDS[0], SHARDS[1], INDEX}
        [resumed] = [p for p in files["placed"] if p["path"] == SHARDS[0]]
        assert resumed["resumed_at"] == PART_PREFIX
        assert files["after"]["status"] == "in_sync"

    code, report = pinned_lock.json("audit", *targets, "--all-files", *ssh)
    assert code == ExitCode.OK, report
    assert {h["files"]["status"] for h in report["hosts"]} == {"in_sync"}


def test_a_placement_cut_off_mid_file_resumes_where_the_host_stopped(ssh_host: Host) -> None:
    """The connection dies after two chunks of a shard; the next placement asks the host what
    its part holds and sends only the rest (1 MiB chunks here, so that a 3 MB shard has some)."""
    import hashlib

    from dflash_provision.errors import DflashProvisionError
    from dflash_provision.remote.place_files import place_file
    from dflash_provision.source.pinned_files import SHA256, PinnedFile
    from dflash_provision.target import parse_target
    from dflash_provision.transport.base import CommandResult, Transport
    from dflash_provision.transport.factory import Connector
    from dflash_provision.transport.options import SshOptions

    data = drafter_files(1)[SHARDS[0]]
    ssh_host.exec(["mkdir", "-p", DIR], b"", check=True)
    source = ssh_host.dir / "controller-copy.safetensors"  # the controller's cached copy
    source.write_bytes(data)
    pinned = PinnedFile(
        "o/r", "a" * 40, SHARDS[0], len(data), SHA256, hashlib.sha256(data).hexdigest()
    )
    assert ssh_host.client is not None
    options = SshOptions(ssh_config_path=str(ssh_host.client.ssh_config), use_agent=False)
    target = parse_target(f"{ssh_host.alias}:{DIR}")
    chunk = 1024 * 1024

    class DiesAfter(Transport):
        """A real connection that is cut (closed) when the next command would be the Nth."""

        def __init__(self, inner: Transport, allowed: int) -> None:
            self.inner, self.allowed = inner, allowed
            self.description = inner.description

        @property
        def command_timeout(self) -> float:
            return self.inner.command_timeout

        def run(
            self, argv: Any, *, stdin: bytes | None = None, timeout: float | None = None
        ) -> CommandResult:
            if self.allowed == 0:
                self.inner.close()
                raise DflashProvisionError("connection lost")
            self.allowed -= 1
            return self.inner.run(argv, stdin=stdin, timeout=timeout)

        def connect(self) -> None:
            self.inner.connect()

        def close(self) -> None:
            self.inner.close()

    cut = DiesAfter(Connector(options).open(target), allowed=3)  # the probe, then 2 chunks
    with pytest.raises(DflashProvisionError):
        place_file(cut, DIR, pinned, source, chunk_bytes=chunk)
    assert ssh_host.exec(["test", "-e", f"{DIR}/{SHARDS[0]}"], b"").returncode != 0  # no half file

    again = Connector(options).open(target)
    try:
        placed = place_file(again, DIR, pinned, source, chunk_bytes=chunk)
    finally:
        again.close()
    assert (placed.resumed_at, placed.sent) == (2 * chunk, len(data) - 2 * chunk)
    got = ssh_host.exec(["sha256sum", f"{DIR}/{SHARDS[0]}"], b"", check=True).stdout
    assert str(got).split()[0] == pinned.digest
