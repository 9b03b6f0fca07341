"""Name lookup before an SSH connection: bounded by --connect-timeout, failures named.

The real resolver (glibc, /etc/resolv.conf) runs inside a private network and mount namespace
whose resolv.conf points at 127.0.0.1: either nothing listens there (the lookup fails at once)
or a UDP socket that reads queries and never answers (a dead DNS server: glibc alone would wait
5 s x 2 attempts).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_provision.testbed.samples import REFERENCE_DRAFTER
from dflash_provision.transport.ssh_tcp import resolve

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip (private network namespace with its own resolv.conf)",
)

_SILENT_DNS = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.bind(('127.0.0.1', 53))\n"
    "open(sys.argv[1], 'w').close()\n"
    "while True:\n"
    "    s.recv(4096)\n"
)


def audit_in_private_network(tmp_path: Path, *, dns_answers_nothing: bool) -> tuple[int, dict]:
    """``dflash-provision audit --json`` of an unknown name, run under its own resolv.conf."""
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
    ready = tmp_path / "dns-ready"
    audit = [
        sys.executable, "-m", "dflash_provision", "audit", "gpu7.example.com:/root/models/d",
        "--from", str(REFERENCE_DRAFTER), "--connect-timeout", "1", "--json",
    ]  # fmt: skip
    lines = ["ip link set lo up"]
    if dns_answers_nothing:
        lines += [
            shlex.join([sys.executable, "-c", _SILENT_DNS, str(ready)]) + " &",
            f"while [ ! -e {shlex.quote(str(ready))} ]; do sleep 0.01; done",
        ]
    lines += [
        f"mount --bind {shlex.quote(str(tmp_path / 'resolv.conf'))} /etc/resolv.conf",
        f"{shlex.join(audit)}; status=$?",
        "kill $! 2>/dev/null",
        "exit $status",
    ]
    env = {**os.environ, "DFLASH_PROVISION_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.integration
@pytest.mark.root
@needs_namespaces
def test_a_dead_dns_server_is_unreachable_within_the_connect_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    status, report = audit_in_private_network(tmp_path, dns_answers_nothing=True)
    elapsed = time.monotonic() - started
    (host,) = report["hosts"]
    assert status == 5, report
    assert host["status"] == "unreachable_timeout"
    assert "cannot resolve host 'gpu7.example.com'" in host["detail"]
    assert "no answer from the resolver within 1 s" in host["detail"]
    # Not a speed assertion: glibc alone waits 10 s here (5 s x 2 attempts); this proves the
    # lookup was abandoned rather than waited out.
    assert elapsed < 9


@pytest.mark.integration
@pytest.mark.root
@needs_namespaces
def test_a_name_no_resolver_knows_is_unreachable_and_named(tmp_path: Path) -> None:
    status, report = audit_in_private_network(tmp_path, dns_answers_nothing=False)
    (host,) = report["hosts"]
    assert status == 5, report
    assert host["status"] == "unreachable"
    assert host["detail"].startswith("cannot resolve host 'gpu7.example.com': ")


def test_ip_literals_are_not_sent_to_the_resolver() -> None:
    # A zero budget would fail any lookup that waits for a thread; literals never start one.
    assert resolve("127.0.0.1", 22, 0.0)[0][4] == ("127.0.0.1", 22)
    assert resolve("::1", 2222, 0.0)[0][4][:2] == ("::1", 2222)
