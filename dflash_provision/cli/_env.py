"""``--env NAME=VALUE``, as launch and rollout take it."""

from __future__ import annotations

from dflash_provision.errors import UsageError


def parse_env(items: tuple[str, ...]) -> dict[str, str]:
    """``--env NAME=VALUE`` options as a dict (launch's and rollout's); UsageError for an item
    without ``=`` or without a name."""
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--env {item.split('=')[0]!r}: expected NAME=VALUE")
        env[name] = value
    return env
