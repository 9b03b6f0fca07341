"""Two test runs at once: one run's fleet never stops another run's live hosts.

The other run is a real second process (tests/fixtures/fleet_process.py) owning a real Fleet.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from testbed.hosts import (
    BlackholeHost,
    Fleet,
    FleetError,
    _pid_alive,
    fleet_port,
    kill_stale,
)
from tests.fixtures.fleet_process import OtherFleet, fleet_in_other_process, unused_block
from tests.fixtures.hosts import skip_unless_testbed

pytestmark = [pytest.mark.integration, pytest.mark.root]


def answers_over_ssh(other: OtherFleet) -> bool:
    for alias in other.aliases:
        argv = ["ssh", "-F", str(other.ssh_config), alias, "hostname"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0 or done.stdout.strip() != alias:
            return False
    return True


def test_a_fleet_on_a_block_another_run_once_recorded_leaves_that_runs_hosts_alive(
    tmp_path: Path,
) -> None:
    skip_unless_testbed()
    block = unused_block()
    # The other run first meets this block busy (its start fails there, its record stays in the
    # block's lock file), then runs its hosts on another block.
    with contextlib.ExitStack() as stack:
        # The other run first meets this block busy (its start fails there, its record stays in
        # the block's lock file), then runs its hosts on another block.
        with BlackholeHost(f"{block}1", fleet_port()):
            other = stack.enter_context(
                fleet_in_other_process(tmp_path / "other", 2, first_try_prefix=block)
            )
        assert other.first_try_error is not None and "in use" in other.first_try_error
        assert other.prefix != block
        # This run now takes that block: its lock file still names the other run's base_dir.
        with Fleet(tmp_path / "mine", 1, address_prefix=block) as mine:
            assert mine.address_prefix == block
            assert all(_pid_alive(pid) for pid in other.sshd_pids), "other run's sshd killed"
            assert answers_over_ssh(other)


def test_a_second_fleet_on_the_same_base_dir_is_refused_not_allowed_to_kill_the_first(
    tmp_path: Path,
) -> None:
    skip_unless_testbed()
    with fleet_in_other_process(tmp_path / "shared", 1) as other:
        with pytest.raises(FleetError, match=rf"in use by a running process \(pid {other.pid}\)"):
            Fleet(tmp_path / "shared", 1, address_prefix=None).start()
        with pytest.raises(FleetError, match=rf"pid {other.pid}"):
            kill_stale(tmp_path / "shared")  # what `python -m testbed down` runs
        assert all(_pid_alive(pid) for pid in other.sshd_pids)
        assert answers_over_ssh(other)
