"""The single-user fallback: one real sshd as the current user on a high port (no root needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed.hosts import SingleUserSshd, _pid_alive, single_user_sshd

pytestmark = [pytest.mark.integration, pytest.mark.hosts]  # a real sshd, as this user


def ssh(server: SingleUserSshd, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(server.ssh_argv(argv), capture_output=True, text=True, timeout=20)


@pytest.fixture(autouse=True)
def _needs_sshd() -> None:
    from testbed.hosts import missing_prerequisites

    reason = missing_prerequisites(need_root=False)
    if reason:
        pytest.skip(f"testbed: {reason}")


def test_single_user_sshd_accepts_key_login_on_a_high_port(tmp_path: Path) -> None:
    with SingleUserSshd(tmp_path) as server:
        assert server.port > 1024
        assert server.client is not None
        assert server.client.known_hosts.read_text().startswith(f"[127.0.0.1]:{server.port} ")
        result = ssh(server, ["sh", "-c", "echo ok"])
        assert (result.returncode, result.stdout) == (0, "ok\n")
    refused = ssh(server, ["true"])
    assert "Connection refused" in refused.stderr


def test_with_single_user_sshd_keeps_the_sshd_it_started(tmp_path: Path) -> None:
    # single_user_sshd() starts it and `with` enters it: the demo's non-root path does this.
    started = single_user_sshd(tmp_path)
    assert started._proc is not None
    first = started._proc.pid
    with started as server:
        assert server._proc is not None and server._proc.pid == first
        assert ssh(server, ["true"]).returncode == 0
    assert not _pid_alive(first)
