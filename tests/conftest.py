"""Shared pytest set-up. Fixture families live in tests/fixtures/*; each module registers here."""

import importlib.util

_FIXTURE_MODULES = [
    "tests.fixtures.hub",
    "tests.fixtures.hosts",
    "tests.fixtures.configs",
    "tests.fixtures.cli",
    "tests.fixtures.standin",
    "tests.fixtures.docker",
]

pytest_plugins = [m for m in _FIXTURE_MODULES if importlib.util.find_spec(m) is not None]
