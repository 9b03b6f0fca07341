"""The fleet audit's read on real hosts: one exec of the read script in bytes mode for every
kind of file (the caller hashes the bytes), so every status and message is the script's.

- A real sshd host (bash as the login shell): each kind of file a host can hold gives the same
  status, bytes and message as the read script's answer with a remote hash, in one exec; a login
  that writes on stdout (a ``.bashrc`` echo) is a protocol error, not text taken for the file's.
- A FIFO at the path, with or without a writer holding it open, is reported ``not a regular
  file`` at once, and nothing is left on the host.
- A read that hangs (a ``head`` that never returns, bind-mounted first on the host's PATH, with
  a child of its own, as a tool stuck on a frozen disk) is ended at its deadline by the
  script's watchdog with its whole process group, and reported as a timeout.
- In a busybox LXC container: one exec per file too, with the same statuses.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from dflash_provision.errors import DflashProvisionError, RemoteStepFailed
from dflash_provision.fleet import FleetRun, audit, authority_loader
from dflash_provision.fleet.run import CountingTransport
from dflash_provision.host_state.file_status import HostStatus
from dflash_provision.inventory import FleetMember
from dflash_provision.remote.ops import ReadStatus, RemoteRead, read_remote_config
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.factory import Connector, open_transport
from testbed import samples
from testbed.hosts import Host
from testbed.lxc import Container
from tests.fixtures.after_rename import install_tool
from tests.fixtures.ssh import client_options

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
MODEL = "/root/models/X"
CONFIG = f"{MODEL}/config.json"
#: Sleeps no other test starts, so that a leftover is ours.
STUCK = "sleep 3598.5"
WRITER = "sleep 3597.5"


class Recording(CountingTransport):
    """The fleet's counting transport that also keeps every argv (the commands a read sent)."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self.commands: list[list[str]] = []

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.commands.append(list(argv))
        return super().run(argv, stdin=stdin, timeout=timeout)


@pytest.fixture
def host_transport(ssh_host: Host) -> Iterator[Recording]:
    (ssh_host.root_dir / "models" / "X").mkdir(parents=True)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        yield Recording(transport)


def audit_then_hashed(transport: Recording) -> tuple[object, object, list[list[str]]]:
    """The audit's read (remote_hash=False, read.sh in bytes mode) and the read script's with
    a remote hash (mode 0), each as what the judge uses of it, or as the error it raised; and
    the audit read's commands."""
    transport.commands.clear()
    plain = judged_or_error(lambda: read_remote_config(transport, CONFIG, remote_hash=False))
    commands = list(transport.commands)
    described = judged_or_error(lambda: read_remote_config(transport, CONFIG, metadata=False))
    return plain, described, commands


def judged_or_error(read: Callable[[], RemoteRead]) -> object:
    try:
        found = read()
    except DflashProvisionError as exc:
        return (type(exc).__name__, exc.message)
    return (found.status, found.data, found.sha256, found.size, found.message)


def files_in(host: Host) -> dict[str, Callable[[Path], object]]:
    """What a host's config path can be, made on the controller side of its /root."""
    return {
        "the reference config": lambda d: (d / "config.json").write_bytes(REFERENCE),
        "a symlink to it": lambda d: (
            (d / "real.json").write_bytes(REFERENCE),
            (d / "config.json").symlink_to("real.json"),
        ),
        "an empty file": lambda d: (d / "config.json").write_bytes(b""),
        "not JSON": lambda d: (d / "config.json").write_bytes(b"mask_token_id: 248064\n"),
        "missing": lambda d: None,
        "directory missing": lambda d: shutil.rmtree(d),
        "a directory": lambda d: (d / "config.json").mkdir(),
        "a FIFO": lambda d: host.exec(["mkfifo", f"{MODEL}/config.json"], check=True),
        "/dev/zero": lambda d: (d / "config.json").symlink_to("/dev/zero"),
        "too large": lambda d: (d / "config.json").write_bytes(b"{" + b" " * (1024 * 1024)),
    }


STATUS = {
    "the reference config": ReadStatus.PRESENT,
    "a symlink to it": ReadStatus.PRESENT,
    "an empty file": ReadStatus.PRESENT,
    "not JSON": ReadStatus.PRESENT,
    "missing": ReadStatus.MISSING,
    "directory missing": ReadStatus.DIR_MISSING,
    "a directory": ReadStatus.NOT_REGULAR,
    "a FIFO": ReadStatus.NOT_REGULAR,
    "/dev/zero": ReadStatus.NOT_REGULAR,
    "too large": ReadStatus.TOO_LARGE,
}


def reset(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def test_every_kind_of_file_reads_as_the_read_script_describes_it(ssh_host, host_transport):
    directory = ssh_host.root_dir / "models" / "X"
    for name, make in files_in(ssh_host).items():
        reset(directory)
        make(directory)
        started = time.monotonic()
        plain, described, commands = audit_then_hashed(host_transport)
        assert plain == described, name
        assert isinstance(plain, tuple) and plain[0] is STATUS[name], (name, plain)
        assert time.monotonic() - started < 10, f"{name}: nothing waits for a deadline"
        # Whatever is there: the one script.
        assert len(commands) == 1, (name, commands)
    assert left_behind(ssh_host) == []


def test_a_login_that_writes_on_stdout_is_a_protocol_error_not_the_files_bytes(
    ssh_host, host_transport
):
    directory = ssh_host.root_dir / "models" / "X"
    (directory / "config.json").write_bytes(REFERENCE)
    # bash reads ~/.bashrc for a command over ssh: its echo comes before any command's output.
    (ssh_host.root_dir / ".bashrc").write_text("echo 'Welcome to h01'\n")
    plain, described, commands = audit_then_hashed(host_transport)
    assert plain == described
    assert plain[0] == "RemoteProtocolError", plain
    assert len(commands) == 1


def test_a_fifo_at_the_path_is_not_a_regular_file_at_once_and_leaves_nothing_behind(ssh_host):
    (ssh_host.root_dir / "models" / "X").mkdir(parents=True)
    ssh_host.exec(["mkfifo", CONFIG], check=True)
    for with_writer in (False, True):
        writer = holding_open(ssh_host, CONFIG) if with_writer else None
        try:
            started = time.monotonic()
            [result] = audit_one(ssh_host)
            took = time.monotonic() - started
        finally:
            if writer is not None:
                writer.kill()
                writer.wait()
        assert (result.status, result.detail) == (
            HostStatus.ERROR,
            f"{CONFIG}: not a regular file",
        ), with_writer
        assert took < 10, "the FIFO did not hold the read until its deadline"
        assert result.execs == 1, "the one script, that says what is there"
        assert left_behind(ssh_host) == []


def test_a_read_that_hangs_is_ended_at_its_deadline_with_its_process_group(ssh_host):
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(REFERENCE)
    # A head that never returns and has a child of its own (as a tool stuck on a frozen disk).
    install_tool(ssh_host, "head", f"#!/bin/sh\n{STUCK} &\nwait\n")
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        recording = Recording(transport)
        started = time.monotonic()
        with pytest.raises(RemoteStepFailed) as raised:
            read_remote_config(recording, CONFIG, remote_hash=False, timeout=4)
        # Ended by the script's watchdog at its 3 s deadline (TERM to its group), or (on a slow
        # machine) given up on by the caller at 4 s: a timeout, never bytes taken for the file's.
        assert raised.value.step == "timeout"
        assert time.monotonic() - started < 4.5
        assert len(recording.commands) == 1
        until = time.monotonic() + 3  # the watchdog looks once a second
        while host_processes(ssh_host, STUCK) and time.monotonic() < until:
            time.sleep(0.2)
        assert host_processes(ssh_host, STUCK) == [], "the stuck head's child ended with it"
        ssh_host.exec(["umount", "/usr/local/bin"], check=True)
        assert read_remote_config(transport, CONFIG, remote_hash=False).data == REFERENCE


def test_in_a_busybox_container_the_script_describes_every_file(lxc_container_on_host):
    container: Container = lxc_container_on_host
    directory = container.rootfs / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(REFERENCE)
    target = parse_target(f"{container.host.alias}/lxc:{container.name}:/models/X")
    path = "/models/X/config.json"
    with open_transport(target, client_options(container.host)) as transport:
        recording = Recording(transport)
        read = read_remote_config(recording, path, remote_hash=False)
        assert (read.status, read.data) == (ReadStatus.PRESENT, REFERENCE)
        assert len(recording.commands) == 1
        (directory / "config.json").unlink()
        container.attach(["mkfifo", path])
        started = time.monotonic()
        assert read_remote_config(transport, path, remote_hash=False).status is (
            ReadStatus.NOT_REGULAR
        )
        assert time.monotonic() - started < 10
        # The script's watchdog looks once a second: gone a second after the script at most.
        until = time.monotonic() + 1.5
        while "head " in container.attach(["ps"]).stdout and time.monotonic() < until:
            time.sleep(0.1)
        assert "head " not in container.attach(["ps"]).stdout, container.attach(["ps"]).stdout


# ---------------------------------------------------------------------------------------------


def audit_one(host: Host) -> list:  # type: ignore[type-arg]
    """The fleet audit of ``host`` alone (its own connection, as `audit` makes it)."""
    authority = host.dir / "authority.json"
    authority.write_bytes(REFERENCE)
    member = FleetMember(
        host.name, parse_target(f"{host.alias}:{MODEL}"), SourceSpec(from_file=str(authority))
    )
    run = FleetRun(authority_loader(), connector=Connector(client_options(host)))
    return audit([member], run.authority_for, run=run)


def holding_open(host: Host, path: str) -> subprocess.Popen[bytes]:
    """A process in ``host`` holding the FIFO ``path`` open for writing, never writing
    (opened read-write, so that its own open does not wait for a reader)."""
    script = f'exec 3<>"$1"; exec {WRITER}'
    process = subprocess.Popen(
        ["nsenter", "-t", str(host.sshd_pid), "-m", "-u", "-p", "--", "sh", "-c", script, "-",
         path],
    )  # fmt: skip
    until = time.monotonic() + 5
    while not host_processes(host, WRITER) and time.monotonic() < until:
        time.sleep(0.05)
    return process


def left_behind(host: Host) -> list[str]:
    """The read's processes still in ``host`` after a second and a half: the describing
    script's watchdog looks once a second, so its ``sleep 1`` may outlive the script by that."""
    words = ("head ", "sleep 1")
    until = time.monotonic() + 1.5
    while host_processes(host, *words) and time.monotonic() < until:
        time.sleep(0.1)
    return host_processes(host, *words)


def host_processes(host: Host, *words: str) -> list[str]:
    """The command lines in ``host``'s PID namespace that contain one of ``words``."""
    out = host.exec(["ps", "-eo", "args"], check=True).stdout
    return [line for line in out.splitlines() if any(w in line for w in words)]
