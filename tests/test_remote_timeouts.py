"""A remote command that times out leaves nothing behind, and every wait has a deadline.

- A write whose step hangs (a ``sha256sum`` that never returns, bind-mounted first on the host's
  PATH; it inherits the flock descriptor, as a tool stuck on a frozen disk would) is ended by
  its own watchdog before the caller's timeout: temp file removed, lock released, no process
  left, and the next push works at once. On a real sshd host, and in a busybox LXC container
  (the mkdir lock).
- A read whose ``head`` hangs (what a FIFO swapped in for the file after the read's checks, or a
  frozen disk, does) is ended by the same watchdog: no process is left on the host.
- A host that freezes after the session channel opened (its per-connection sshd SIGSTOPped just
  before the exec request) does not hold the caller past its timeout.
- An mkdir lock whose recorded pid now names another process (a container restarted mid-push
  gives the next script the same pid) is stale: planted tokens, and the real sequence (a push
  holding the lock in a busybox container that is killed and started again; before the fix the
  next push waited on its own pid).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import paramiko
import pytest

from dflash_provision.errors import RemoteStepFailed
from dflash_provision.remote.ops import WriteStatus, read_remote_config, write_remote_config
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import open_transport
from testbed import samples
from testbed.hosts import Host
from testbed.lxc import Container
from tests.fixtures.after_rename import install_tool
from tests.fixtures.ssh import client_options, session_sshd_pids
from tests.fixtures.transports import busybox_transport

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/X"
HANGING_TOOL = (
    "#!/bin/sh\n# a tool that never returns (a frozen disk, a stuck mount)\nexec sleep 3600\n"
)


def leftovers(directory: Path) -> list[str]:
    backups = directory / ".dflash-backups"
    names = os.listdir(backups) if backups.is_dir() else []
    return [n for n in names if "dflash-tmp" in n or n.endswith(".lockdir")]


def hanging_processes(host: Host) -> list[str]:
    out = host.exec(["ps", "-eo", "args"], check=True).stdout
    return [line for line in out.splitlines() if "sleep 3600" in line]


def write_or_timeout(transport, path: str, data: bytes, timeout: float):  # type: ignore[no-untyped-def]
    """The outcome, or the transport's timeout error: either way the caller gave up in time."""
    try:
        return write_remote_config(transport, path, data, timeout=timeout)
    except RemoteStepFailed as exc:
        assert exc.step == "timeout"
        return exc


@pytest.mark.integration
@pytest.mark.root
def test_write_that_hangs_is_ended_at_its_deadline_and_leaves_nothing_behind(ssh_host):
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    install_tool(ssh_host, "sha256sum", HANGING_TOOL)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        outcome = write_or_timeout(transport, target.config_path, REFERENCE, timeout=6)
        if not isinstance(outcome, Exception):
            assert (outcome.status, outcome.failed_step) == (WriteStatus.FAILED, "deadline")
            assert "deadline" in outcome.message
        ssh_host.exec(["umount", "/usr/local/bin"], check=True)
        assert (directory / "config.json").read_bytes() == INCIDENT
        assert leftovers(directory) == []
        assert hanging_processes(ssh_host) == [], "the stuck tool was ended with the script"
        # The lock was released: the next push does not wait for it.
        again = write_remote_config(transport, target.config_path, REFERENCE, lock_timeout=1)
        assert again.status is WriteStatus.WRITTEN, again.failure_text()
    assert (directory / "config.json").read_bytes() == REFERENCE


@pytest.mark.integration
@pytest.mark.root
def test_read_that_hangs_is_ended_at_its_deadline_and_leaves_no_process(ssh_host):
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    install_tool(ssh_host, "head", HANGING_TOOL)
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    with open_transport(target, client_options(ssh_host)) as transport:
        with pytest.raises(RemoteStepFailed) as raised:
            read_remote_config(transport, target.config_path, timeout=4)
        # Ended by its watchdog at its 3 s deadline, or (on a slow machine) given up on by the
        # caller at 4 s: either way a timeout, never bytes taken for the file's.
        assert raised.value.step == "timeout"
        # The watchdog looks once a second: give it that second before looking for the tool.
        until = time.monotonic() + 3
        while hanging_processes(ssh_host) and time.monotonic() < until:
            time.sleep(0.2)
        assert hanging_processes(ssh_host) == [], "the stuck read was ended at its deadline"
        ssh_host.exec(["umount", "/usr/local/bin"], check=True)
        read = read_remote_config(transport, target.config_path)
        assert read.data == INCIDENT


def hang_sha256sum_in(container: Container) -> tuple[Path, Path]:
    """Seed /models/X/config.json in ``container`` and put a sha256sum that hangs first on its
    PATH; returns the model directory and the tool (controller-side paths)."""
    directory = container.rootfs / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    tool = container.rootfs / "usr" / "local" / "bin" / "sha256sum"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(HANGING_TOOL)
    tool.chmod(0o755)
    return directory, tool


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.lxc
def test_write_that_hangs_in_a_busybox_container_is_ended_and_its_mkdir_lock_released(
    lxc_container_on_host,
):
    container = lxc_container_on_host
    directory, tool = hang_sha256sum_in(container)
    target = parse_target(f"{container.host.alias}/lxc:{container.name}:/models/X")
    with open_transport(target, client_options(container.host)) as transport:
        outcome = write_or_timeout(transport, target.config_path, REFERENCE, timeout=6)
        if not isinstance(outcome, Exception):
            assert outcome.failed_step == "deadline", outcome.failure_text()
        tool.unlink()
        assert leftovers(directory) == [], "no temp file, no mkdir lock"
        ps = container.attach(["ps"]).stdout
        assert "sleep 3600" not in ps
        again = write_remote_config(transport, target.config_path, REFERENCE, lock_timeout=1)
        assert again.status is WriteStatus.WRITTEN, again.failure_text()
        assert again.lock_method == "mkdir"


@pytest.mark.integration
@pytest.mark.root
def test_host_that_freezes_after_the_session_opens_does_not_hold_the_command(ssh_host, monkeypatch):
    target = parse_target(f"{ssh_host.alias}:{MODEL}")
    transport = open_transport(target, client_options(ssh_host))
    assert transport.run(["true"], timeout=5).exit_status == 0  # connected and authenticated
    frozen: list[int] = []
    real_exec = paramiko.Channel.exec_command

    def freeze_then_exec(channel: paramiko.Channel, command: str) -> None:
        # The session channel is open; the host now stops before answering the exec request.
        for pid in session_sshd_pids(ssh_host):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        real_exec(channel, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", freeze_then_exec)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            transport.run(["true"], timeout=3)
        except BaseException as exc:  # handed to the test thread
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)  # a bound for a broken build only; the command's own limit is 3 s
    try:
        assert frozen, "the session sshd was frozen"
        assert not thread.is_alive(), "the exec request waited without a deadline"
        [error] = caught
        assert isinstance(error, RemoteStepFailed) and error.step == "timeout"
        assert "did not start" in error.message
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        transport.close()


# ---------------------------------------------------------------------------------------------
# stale mkdir locks (busybox has no flock)


def start_time(pid: int) -> str:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return fields[19]


BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def bb(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import shutil

    if shutil.which("busybox") is None:
        pytest.skip("busybox not installed")
    return busybox_transport(tmp_path_factory.mktemp("bb"))


def locked_dir(tmp_path: Path, token: str) -> Path:
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    lockdir = tmp_path / ".dflash-backups" / "config.json.lockdir"
    lockdir.mkdir(parents=True)
    (tmp_path / ".dflash-backups").chmod(0o700)
    (lockdir / "pid").write_text(token + "\n")
    return config


def test_mkdir_lock_of_a_pid_now_used_by_another_process_is_stale(bb, tmp_path):
    # The recorded pid is alive (this test process), but it started at another time: the pid
    # came round again, as after a container restart. The lock is broken and the write goes on.
    config = locked_dir(tmp_path, f"{os.getpid()} 1 {BOOT_ID}")
    outcome = write_remote_config(bb, str(config), REFERENCE, lock_timeout=1)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    assert outcome.lock_method == "mkdir"
    assert config.read_bytes() == REFERENCE


def test_mkdir_lock_recorded_before_a_reboot_is_stale(bb, tmp_path):
    config = locked_dir(tmp_path, f"{os.getpid()} {start_time(os.getpid())} another-boot")
    outcome = write_remote_config(bb, str(config), REFERENCE, lock_timeout=1)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()


def test_mkdir_lock_of_its_live_holder_is_respected(bb, tmp_path):
    config = locked_dir(tmp_path, f"{os.getpid()} {start_time(os.getpid())} {BOOT_ID}")
    outcome = write_remote_config(bb, str(config), REFERENCE, lock_timeout=1)
    assert (outcome.failed_step, outcome.reason) == ("lock", "lock-timeout")
    assert config.read_bytes() == INCIDENT


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.lxc
def test_mkdir_lock_left_by_a_container_restart_does_not_block_the_next_push(
    lxc_container_on_host,
):
    # After a restart, pid 1 (the container's init) is alive again, but it is not the process
    # that took the lock: its start time differs from the recorded one.
    container = lxc_container_on_host
    directory = container.rootfs / "models" / "X"
    lockdir = directory / ".dflash-backups" / "config.json.lockdir"
    lockdir.mkdir(parents=True)
    (directory / ".dflash-backups").chmod(0o700)
    (directory / "config.json").write_bytes(INCIDENT)
    (lockdir / "pid").write_text(f"1 1 {BOOT_ID}\n")
    target = parse_target(f"{container.host.alias}/lxc:{container.name}:/models/X")
    with open_transport(target, client_options(container.host)) as transport:
        outcome = write_remote_config(transport, target.config_path, REFERENCE, lock_timeout=1)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    assert not lockdir.exists()


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.lxc
def test_container_killed_mid_push_leaves_a_lock_that_the_next_push_breaks(lxc_container_on_host):
    # The real sequence: a push holds the mkdir lock (its step hangs), the container is killed
    # and started again, and the next push's script is started the same way in a fresh PID
    # namespace, so it typically gets the very pid recorded in the lock, which is then alive.
    container = lxc_container_on_host
    directory, tool = hang_sha256sum_in(container)
    lockdir = directory / ".dflash-backups" / "config.json.lockdir"
    target = parse_target(f"{container.host.alias}/lxc:{container.name}:/models/X")
    first: list[object] = []

    def hanging_push() -> None:
        with open_transport(target, client_options(container.host)) as transport:
            try:
                first.append(write_remote_config(transport, target.config_path, REFERENCE))
            except Exception as exc:  # the container dies under it
                first.append(exc)

    thread = threading.Thread(target=hanging_push, daemon=True)
    thread.start()
    for _ in range(600):
        if (lockdir / "pid").exists():
            break
        thread.join(0.05)
    assert (lockdir / "pid").exists(), "the first push took the lock"
    container.stop()
    thread.join(60)
    assert lockdir.exists(), "the killed push could not clean up: its lock is left"
    tool.unlink()
    container.start()
    with open_transport(target, client_options(container.host)) as transport:
        outcome = write_remote_config(transport, target.config_path, REFERENCE, lock_timeout=2)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    assert (directory / "config.json").read_bytes() == REFERENCE
    assert not lockdir.exists()
