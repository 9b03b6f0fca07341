"""The testbed is real: OpenSSH clients, namespaced sshd hosts, LXC containers, real faults."""

from __future__ import annotations

import errno
import socket
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from testbed.hosts import (
    DEFAULT_PORT,
    SSHD,
    BlackholeHost,
    Fleet,
    Host,
    SingleUserSshd,
    kill_stale,
    refused_address,
)
from testbed.lxc import Container, busybox_container

pytestmark = [pytest.mark.integration, pytest.mark.root]


def ssh(
    host: Host | SingleUserSshd,
    argv: list[str],
    stdin: str | None = None,
    options: tuple[str, ...] = (),
    timeout: float = 20,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        host.ssh_argv(argv, options=options),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_errno(host: Host, path: str) -> int:
    """errno of writing 100 bytes to ``path`` inside the host (0 when it worked)."""
    code = f"""
import sys
try:
    with open({path!r}, "wb") as f:
        f.write(b"x" * 100)
        f.flush()
except OSError as e:
    sys.exit(e.errno)
"""
    return host.exec(["python3", "-c", code]).returncode


# -- hosts and the OpenSSH client --------------------------------------------------------------


def test_openssh_client_reaches_each_host_by_alias_and_sees_its_hostname(fleet: Fleet) -> None:
    for host in fleet.hosts[:2]:
        result = ssh(host, ["hostname"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == host.name


def test_host_target_string_uses_root_address_and_the_non_22_port(fleet: Fleet) -> None:
    h1 = fleet.hosts[0]
    assert h1.port == DEFAULT_PORT != 22  # the machine's own sshd may hold port 22 everywhere
    assert h1.ssh_target("/root/models/x") == f"ssh://root@{h1.address}:2222/root/models/x"
    assert h1.address.startswith("127.0.")


def test_each_host_has_a_private_root(fleet: Fleet) -> None:
    h1, h2 = fleet.hosts[0], fleet.hosts[1]
    assert ssh(h2, ["sh", "-c", "echo from-h02 > /root/only-on-h02"]).returncode == 0
    try:
        assert (h2.root_dir / "only-on-h02").read_text() == "from-h02\n"
        assert ssh(h1, ["test", "-e", "/root/only-on-h02"]).returncode == 1
        assert not Path("/root/only-on-h02").exists()
    finally:
        (h2.root_dir / "only-on-h02").unlink()


def test_strict_host_key_checking_rejects_an_unknown_host_key(fleet: Fleet) -> None:
    result = ssh(fleet.hosts[0], ["true"], options=("UserKnownHostsFile=/dev/null",))
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_paramiko_connects_with_the_fleet_key_and_known_hosts(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    assert host.client is not None
    client = paramiko.SSHClient()
    client.load_host_keys(str(host.client.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            host.address,
            port=host.port,
            username="root",
            key_filename=str(host.client.identity),
            timeout=5,
            banner_timeout=5,
            auth_timeout=5,
            allow_agent=False,
            look_for_keys=False,
        )
        _, stdout, _ = client.exec_command("hostname", timeout=10)
        assert stdout.read().decode().strip() == host.name
    finally:
        client.close()


def test_exec_runs_inside_the_hosts_namespaces(ssh_host: Host) -> None:
    result = ssh_host.exec(["sh", "-c", "hostname; echo $$; ls /root"], check=True)
    name, pid, *_ = result.stdout.split()
    assert name == ssh_host.name
    assert int(pid) > 1  # a process of the host's own PID namespace, where sshd is 1


# -- faults ------------------------------------------------------------------------------------


def test_stopped_host_refuses_connections_and_restarts(ssh_host: Host) -> None:
    ssh_host.stop()
    began = time.monotonic()
    result = ssh(ssh_host, ["true"])
    assert result.returncode == 255
    assert "Connection refused" in result.stderr
    assert time.monotonic() - began < 2
    ssh_host.start()
    assert ssh(ssh_host, ["hostname"]).stdout.strip() == ssh_host.name


def test_hung_host_accepts_tcp_but_never_sends_a_banner(ssh_host: Host) -> None:
    ssh_host.hang()
    try:
        with socket.create_connection((ssh_host.address, ssh_host.port), timeout=2) as sock:
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(64)
        result = ssh(ssh_host, ["true"], options=("ConnectTimeout=1",))
        assert result.returncode == 255
        assert "timed out during banner exchange" in result.stderr
    finally:
        ssh_host.resume()
    assert ssh(ssh_host, ["true"]).returncode == 0


def test_blackhole_host_accepts_but_never_speaks() -> None:
    address, _ = refused_address()
    with (
        BlackholeHost(address) as hole,
        socket.create_connection((hole.address, hole.port), timeout=2) as sock,
    ):
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(64)


def test_refused_address_refuses_at_once() -> None:
    address, port = refused_address()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, port), timeout=2)


def test_fill_disk_keeps_existing_files_and_makes_writes_fail_with_enospc(ssh_host: Host) -> None:
    ssh_host.exec(["sh", "-c", "mkdir -p /root/models && echo old > /root/models/c.json"])
    ssh_host.fill_disk("/root/models")
    assert ssh(ssh_host, ["cat", "/root/models/c.json"]).stdout == "old\n"
    assert write_errno(ssh_host, "/root/models/new.json") == errno.ENOSPC
    result = ssh(ssh_host, ["sh", "-c", "printf data | cat > /root/models/new2"])
    assert "No space left on device" in result.stderr
    ssh_host.undo_mounts()
    assert write_errno(ssh_host, "/root/models/new.json") == 0
    assert (ssh_host.root_dir / "models" / "c.json").read_text() == "old\n"


def test_make_readonly_makes_writes_fail_with_erofs(ssh_host: Host) -> None:
    ssh_host.make_readonly("/root/models")
    assert write_errno(ssh_host, "/root/models/c.json") == errno.EROFS
    result = ssh(ssh_host, ["sh", "-c", "echo x > /root/models/c.json"])
    assert "Read-only file system" in result.stderr
    ssh_host.undo_mounts()
    assert write_errno(ssh_host, "/root/models/c.json") == 0


def test_fleet_start_kills_sshd_left_over_from_a_killed_run(tmp_path: Path) -> None:
    base = tmp_path / "fleet"
    with Fleet(base, 1, address_prefix=None) as fleet:
        host = fleet.hosts[0]
        prefix = fleet.address_prefix
    # What a killed run can leave: an sshd on the host's address that nobody will stop.
    leftover = subprocess.Popen(
        [SSHD, "-D", "-f", str(host.config_path), "-E", str(tmp_path / "leftover.log")]
    )
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host.address, host.port), timeout=1).close()
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        with Fleet(base, 1, address_prefix=prefix) as again:
            assert leftover.wait(5) == -9
            assert ssh(again.hosts[0], ["hostname"]).stdout == "h01\n"
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_kill_stale_leaves_other_base_dirs_alone(fleet: Fleet, tmp_path: Path) -> None:
    assert kill_stale(tmp_path) == []
    assert ssh(fleet.hosts[0], ["true"]).returncode == 0


@pytest.mark.parametrize("count", [8, 32])
def test_fleet_starts_many_hosts_concurrently(tmp_path: Path, count: int) -> None:
    began = time.monotonic()
    with Fleet(tmp_path, count, address_prefix=None) as fleet:
        elapsed = time.monotonic() - began
        assert len({h.sshd_pid for h in fleet}) == count
        assert ssh(fleet.hosts[-1], ["hostname"]).stdout.strip() == fleet.hosts[-1].name
    print(f"{count} hosts started in {elapsed:.2f}s")
    assert elapsed < 10  # ~0.4 s for 32 on an idle 2-core machine


# -- LXC ---------------------------------------------------------------------------------------


@pytest.mark.lxc
def test_container_in_host_is_reachable_over_ssh_with_lxc_attach(
    lxc_container_on_host: Container,
) -> None:
    container = lxc_container_on_host
    assert container.host is not None
    script = "cat > /root/f; cat /root/f; exit 3"
    result = ssh(
        container.host, ["lxc-attach", "-n", container.name, "--", "sh", "-c", script], "hi\n"
    )
    assert (result.returncode, result.stdout) == (3, "hi\n")
    # the file is inside the container's rootfs, in the host's own /var/lib/lxc
    assert (container.rootfs / "root" / "f").read_text() == "hi\n"
    assert container.rootfs.is_relative_to(container.host.lxc_dir)


@pytest.mark.lxc
def test_busybox_container_has_no_python_or_bash(lxc_container_on_host: Container) -> None:
    result = lxc_container_on_host.attach(["sh", "-c", "command -v python3 bash; echo done"])
    assert result.stdout == "done\n"


@pytest.mark.lxc
def test_container_on_controller_under_a_test_lxcpath(tmp_path: Path) -> None:
    with busybox_container(lxcpath=tmp_path / "lxc") as container:
        assert container.state() == "RUNNING"
        result = container.attach(["sh", "-c", "cat > /root/x && cat /root/x"], stdin="data")
        assert (result.returncode, result.stdout) == (0, "data")
        container.stop()
        assert container.state() == "STOPPED"
    assert container.state() == "MISSING"


@pytest.mark.lxc
def test_pct_emulator_execs_reports_status_and_fails_like_pct(ssh_host: Host) -> None:
    ssh_host.install_container_cli_emulators()
    container = busybox_container(ssh_host.container_name(101), host=ssh_host)
    assert ssh(ssh_host, ["pct", "status", "101"]).stdout == "status: running\n"
    result = ssh(ssh_host, ["pct", "exec", "101", "--", "sh", "-c", "cat; exit 4"], "in\n")
    assert (result.returncode, result.stdout) == (4, "in\n")
    missing = ssh(ssh_host, ["pct", "exec", "999", "--", "true"])
    assert missing.returncode == 2
    assert "999.conf' does not exist" in missing.stderr
    container.stop()
    assert ssh(ssh_host, ["pct", "status", "101"]).stdout == "status: stopped\n"
    stopped = ssh(ssh_host, ["pct", "exec", "101", "--", "true"])
    assert (stopped.returncode, stopped.stderr) == (255, "container '101' not running!\n")


@pytest.mark.lxc
@pytest.mark.parametrize("prog", ["incus", "lxc"])
def test_incus_and_lxd_emulators_exec_and_fail_like_incus(ssh_host: Host, prog: str) -> None:
    ssh_host.install_container_cli_emulators()
    container = busybox_container(ssh_host.container_name("web"), host=ssh_host)
    result = ssh(ssh_host, [prog, "exec", "web", "--", "sh", "-c", "cat; exit 5"], "in\n")
    assert (result.returncode, result.stdout) == (5, "in\n")
    assert ssh(ssh_host, [prog, "exec", "nope", "--", "true"]).stderr == (
        "Error: Instance not found\n"
    )
    container.stop()
    stopped = ssh(ssh_host, [prog, "exec", "web", "--", "true"])
    assert (stopped.returncode, stopped.stderr) == (1, "Error: Instance is not running\n")
