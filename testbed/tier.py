"""The fast tier's guard: a test that runs in `make test-fast` must not start a real host.

The fast tier is chosen by what a test asks for (tests/conftest.py marks ``fast`` every test
that uses none of the host fixtures and carries none of the root/lxc/docker/slow/vllm/hosts
markers). A test can still start a host by itself (a module's own fixture, a subprocess running
the demo); that one would make the tier slow and root-only without anyone noticing. So while a
fast test runs, this module's variable is set in the environment, and every place in the test
bed that starts a real host (an sshd, an LXC container, a dockerd) calls ``refuse_in_fast_tier``
first: the test fails, naming what it started and how to mark it. (The real vLLM runs on such
a host; the venv builder's own tests, with a stand-in pip, are fast and stay in the tier.)
The variable is inherited by subprocesses, so a CLI or ``python -m testbed.demo`` started by a
fast test is held to the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: Not DFLASH_*: tests that run the CLI or the demo strip those from the environment they pass.
FAST_TIER_ENV = "TESTBED_FAST_TIER"


class RealHostInFastTier(RuntimeError):
    """A test marked ``fast`` started a real host."""


def refuse_in_fast_tier(what: str) -> None:
    """Raise when a fast-tier test is running: ``what`` (an sshd, a container...) is a real host."""
    test = os.environ.get(FAST_TIER_ENV)
    if test:
        raise RealHostInFastTier(
            f"{test} is in the fast tier (marked fast) but started {what}: mark it "
            "@pytest.mark.hosts (or use a host fixture) so `make test-fast` leaves it out"
        )


@contextmanager
def fast_tier(test: str) -> Iterator[None]:
    """While inside, starting a real host raises ``RealHostInFastTier`` naming ``test``."""
    previous = os.environ.get(FAST_TIER_ENV)
    os.environ[FAST_TIER_ENV] = test
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(FAST_TIER_ENV, None)
        else:
            os.environ[FAST_TIER_ENV] = previous
