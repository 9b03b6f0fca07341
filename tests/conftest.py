"""Shared pytest set-up. Fixture families live in tests/fixtures/*; each module registers here.

The fast tier (`make test-fast`, `pytest -m fast`): every test that uses none of the host
fixtures below and carries none of the markers in ``NOT_FAST_MARKERS`` is marked ``fast`` at
collection; one that uses a host fixture is marked ``hosts``. While a fast test runs, the test
bed refuses to start a real host (testbed/tier.py), so a test that starts one by itself fails
in the fast tier instead of silently making it slow: mark it ``@pytest.mark.hosts``.
"""

import importlib.util
from collections.abc import Iterator

import pytest

from testbed.tier import fast_tier

_FIXTURE_MODULES = [
    "tests.fixtures.hub",
    "tests.fixtures.hosts",
    "tests.fixtures.configs",
    "tests.fixtures.cli",
    "tests.fixtures.standin",
    "tests.fixtures.docker",
]

pytest_plugins = [m for m in _FIXTURE_MODULES if importlib.util.find_spec(m) is not None]

#: Fixtures that start a real host: sshd hosts, LXC containers, a dockerd (tests/fixtures/).
HOST_FIXTURES = frozenset(
    {
        "make_fleet",
        "fleet",
        "ssh_host",
        "lxc_container_on_host",
        "bed",
        "container_bed",
        "docker_daemon",
        "docker_models",
    }
)
#: Markers of tests that need root, a host or minutes: never in the fast tier.
NOT_FAST_MARKERS = ("hosts", "root", "lxc", "docker", "slow", "vllm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.hosts)
        if not any(item.get_closest_marker(m) for m in NOT_FAST_MARKERS):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # Setup, call and teardown all run inside: a fixture of a fast test starts no host either.
    if item.get_closest_marker("fast") is None:
        return (yield)
    with fast_tier(item.nodeid):
        return (yield)
