"""Ctrl-C in a fleet command while hosts hang at the SSH banner (issue 30 item 6), on real sshd
hosts: h01 answers, h02's and h03's sshd are SIGSTOPped (TCP accepts, no banner comes), and the
connect timeout is far longer than the test waits. The first Ctrl-C says which hosts it waits
for and for how long; the second abandons them and the process ends at once, with the table,
exit 130 and no Python traceback (before: the first said nothing, the second printed the table
and held the prompt for the whole connect timeout, a third printed a traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testbed.hosts import Fleet
from tests.fixtures.cli import CLI_TIMEOUT_S, cli_env
from tests.fixtures.inventories import write_fleet_inventory
from tests.fixtures.ssh import accepted_logins

pytestmark = [pytest.mark.integration, pytest.mark.root]

MODEL = "/root/models/X"
CONNECT_TIMEOUT = "600"  # far beyond CLI_TIMEOUT_S: a CLI that waits for it fails the test


def _connected_to(pid: int, addresses: set[str]) -> set[str]:
    """The addresses among ``addresses`` that process ``pid`` has an established TCP
    connection to (its sockets, looked up in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state != "01" or inode not in inodes:
            continue
        address = ".".join(str(b) for b in reversed(bytes.fromhex(remote.split(":")[0])))
        if address in addresses:
            found.add(address)
    return found


def test_ctrl_c_with_hosts_hung_at_the_banner_says_what_it_waits_for_then_ends_at_once(
    make_fleet: object, tmp_path: Path
) -> None:
    fleet: Fleet = make_fleet(3)  # type: ignore[operator]
    assert fleet.client is not None
    for host in fleet.hosts:
        (host.root_dir / "models" / "X").mkdir(parents=True, exist_ok=True)
        (host.root_dir / "models" / "X" / "config.json").write_text("{}")
    inventory = write_fleet_inventory(tmp_path / "fleet.yaml", (h.name for h in fleet.hosts),
                                      model=MODEL)  # fmt: skip
    hung = [fleet.host("h02"), fleet.host("h03")]
    argv = [sys.executable, "-m", "dflash_provision", "audit", "-i", str(inventory),
            "--ssh-config", str(fleet.client.ssh_config), "--no-agent", "--workers", "3",
            "--connect-timeout", CONNECT_TIMEOUT]  # fmt: skip
    for host in hung:
        host.hang()
    proc = subprocess.Popen(
        argv, env=cli_env(home=tmp_path / "home", env={"COLUMNS": "200"}), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    guard = threading.Timer(CLI_TIMEOUT_S, proc.kill)  # one deadline for every wait below
    guard.start()
    try:
        addresses = {str(h.address) for h in hung}
        h01 = fleet.host("h01")

        def h01_done() -> bool:  # it logged in and its connection is closed again
            gone = not _connected_to(proc.pid, {str(h01.address)})
            return accepted_logins(h01) == 1 and gone

        # Both hung hosts wait for their banner, and h01 has been audited.
        while _connected_to(proc.pid, addresses) != addresses or not h01_done():
            assert proc.poll() is None, proc.communicate()
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(
            "Ctrl-C: no new host is contacted; waiting for 2 host(s) in flight (h02, h03) to "
            "end their step, at most "
        ), first
        assert f"(--connect-timeout {CONNECT_TIMEOUT} s per connection step, " in first
        assert first.endswith("; Ctrl-C again to abandon them\n"), first
        proc.send_signal(signal.SIGINT)
        stdout, rest = proc.communicate()  # the guard kills a process that holds on
    finally:
        guard.cancel()
        proc.kill()
        for host in hung:
            host.resume()
    stderr = first + rest
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted: 1 of 3 hosts audited, 2 abandoned in flight" in stderr
    assert "h01" in stdout  # the host that answered is reported
