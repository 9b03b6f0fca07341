"""Name lookup before an SSH connection or a Hub request: bounded by the command's timeout.

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

from dflash_provision.netlookup import lookup_within
from dflash_provision.source import hub
from testbed.samples import REFERENCE_DRAFTER
from tests.fixtures.cli import Done, run_cli


def _private_network_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = ["unshare", "--net", "--mount", "ip", "link", "set", "lo", "up"]
    return subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _private_network_works(),
    reason="needs root, unshare and ip, and a kernel that allows a private network namespace",
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
    audit = [
        "audit", "gpu7.example.com:/root/models/d",
        "--from", str(REFERENCE_DRAFTER), "--connect-timeout", "1", "--json",
    ]  # fmt: skip
    proc = run_in_private_network(tmp_path, audit, dns_answers_nothing=dns_answers_nothing)
    return proc.returncode, json.loads(proc.stdout)


def run_in_private_network(tmp_path: Path, args: list[str], *, dns_answers_nothing: bool) -> Done:
    """``dflash-provision ARGS`` in a private network whose only DNS server is 127.0.0.1."""
    (tmp_path / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
    ready = tmp_path / "dns-ready"
    lines = ["ip link set lo up"]
    if dns_answers_nothing:
        lines += [
            shlex.join([sys.executable, "-c", _SILENT_DNS, str(ready)]) + " &",
            f"while [ ! -e {shlex.quote(str(ready))} ]; do sleep 0.01; done",
        ]
    lines += [
        f"mount --bind {shlex.quote(str(tmp_path / 'resolv.conf'))} /etc/resolv.conf",
        '"$@"; status=$?',  # the CLI, appended by run_cli
        "kill $! 2>/dev/null",
        "exit $status",
    ]
    env = {
        **{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
        "DFLASH_PROVISION_HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "hf"),  # an empty cache
    }
    env.pop("HF_ENDPOINT", None)
    prefix = ["unshare", "--net", "--mount", "sh", "-c", "\n".join(lines), "sh"]
    return run_cli(*args, base_env=env, prefix=prefix, timeout=60)


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


@pytest.mark.integration
@pytest.mark.root
@needs_namespaces
def test_fetch_with_a_dead_dns_server_fails_within_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = run_in_private_network(
        tmp_path,
        ["fetch", "z-lab/Qwen3.6-27B-DFlash", "--no-lock", "--timeout", "2"],
        dns_answers_nothing=True,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 14, proc.stderr  # Hub unreachable, nothing cached
    assert "cannot resolve huggingface.co: no answer from the resolver within 2 s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # glibc alone took 20 s here: the probe's lookup, then huggingface_hub's own side request
    # (agent registry) while reading the cache.
    assert elapsed < 9


def test_hub_lookup_is_left_to_a_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "https://hub.invalid/z/r/resolve/main/config.json"
    assert hub._lookup_failure(url, 5.0) is not None  # .invalid never resolves (RFC 6761)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert hub._lookup_failure(url, 5.0) is None  # the proxy resolves it, not this machine
    monkeypatch.setenv("NO_PROXY", "hub.invalid")
    assert hub._lookup_failure(url, 5.0) is not None


def test_ip_literals_are_not_sent_to_the_resolver() -> None:
    # A zero budget would fail any lookup that waits for a thread; literals never start one.
    assert lookup_within("127.0.0.1", 22, 0.0)[0][4] == ("127.0.0.1", 22)
    assert lookup_within("::1", 2222, 0.0)[0][4][:2] == ("::1", 2222)
