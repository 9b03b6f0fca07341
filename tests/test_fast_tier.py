"""`make test-fast`: which tests it runs (tests/conftest.py marks them) and its guard (a fast
test that starts a real host fails, naming itself: testbed/tier.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.hosts import Fleet, single_user_sshd
from testbed.lxc import Container
from testbed.tier import FAST_TIER_ENV, RealHostInFastTier, fast_tier

REPO = Path(__file__).resolve().parents[1]
HERE = "tests/test_fast_tier.py"


def test_a_fast_test_that_starts_a_fleet_fails_naming_itself(tmp_path: Path) -> None:
    with fast_tier("tests/test_x.py::test_y"), pytest.raises(RealHostInFastTier) as caught:
        Fleet(tmp_path / "fleet", 2).start()
    assert "tests/test_x.py::test_y" in str(caught.value)
    assert "a fleet of 2 sshd hosts" in str(caught.value)
    assert "@pytest.mark.hosts" in str(caught.value)


def test_a_fast_test_may_not_start_an_sshd_or_a_container_either(tmp_path: Path) -> None:
    with fast_tier("t"):
        with pytest.raises(RealHostInFastTier, match="single-user sshd"):
            single_user_sshd(tmp_path / "one")
        with pytest.raises(RealHostInFastTier, match="LXC container c1"):
            Container("c1").create()


def test_the_guard_reaches_the_processes_a_fast_test_starts() -> None:
    # A fast test that runs `python -m testbed.demo` (or any helper process) is held to it too.
    with fast_tier("t"):
        done = subprocess.run(
            [sys.executable, "-c", "from testbed.tier import refuse_in_fast_tier as r; r('x')"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert done.returncode != 0 and "RealHostInFastTier" in done.stderr


def test_a_fast_test_runs_under_the_guard(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
    assert os.environ.get(FAST_TIER_ENV) == request.node.nodeid


@pytest.mark.skip(reason="collected, never run: test_the_tiers_are_chosen_by_fixtures checks it")
def test_uses_a_host_fixture(ssh_host: object) -> None:
    raise AssertionError("never run")


def _collected(marker: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", marker, HERE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )  # fmt: skip
    return [line.split("::")[-1] for line in done.stdout.splitlines() if "::" in line]


def test_the_tiers_are_chosen_by_fixtures() -> None:
    fast, hosts = _collected("fast"), _collected("hosts")
    assert "test_uses_a_host_fixture" in hosts
    assert "test_uses_a_host_fixture" not in fast
    assert "test_a_fast_test_runs_under_the_guard" in fast
    assert "test_a_fast_test_runs_under_the_guard" not in hosts
