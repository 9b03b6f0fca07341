"""The fake hosts work on a machine whose own sshd listens on 0.0.0.0:22 (the usual machine).

The machine is played in a private network namespace (tests/fixtures/private_network.py), so the
wildcard listener never takes port 22 from other runs on this machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.hosts import skip_unless_testbed
from tests.fixtures.private_network import missing_tools, wildcard_sshd_run

pytestmark = [pytest.mark.integration, pytest.mark.root]


def test_a_fleet_starts_and_takes_a_push_beside_the_machines_sshd_on_all_addresses(
    tmp_path: Path,
) -> None:
    skip_unless_testbed()
    reason = missing_tools()
    if reason:
        pytest.skip(f"private network: {reason}")
    run = wildcard_sshd_run(tmp_path)
    assert run.fleet_error is None, run.fleet_error
    # The collision is real: h01's address answers on port 22, and it is the machine's sshd.
    assert run.port_22_banner.startswith("SSH-2.0-")
    assert run.fleet_port != 22
    assert run.push_exit == 0, run.push_stderr
    assert run.pushed_bytes_landed
