"""Ctrl-C during audit or repair: stop at once, keep what was done.

The first Ctrl-C sets the run's ``stopping`` event (no worker contacts a new host, and repair
starts no new write: it checks the event between its audit and its write), cancels the hosts
still queued, and waits for the hosts in flight: their writes finish (each bounded by the
command timeout) and are reported. A second Ctrl-C stops that wait: the hosts still in flight
are reported as abandoned (their threads still end within their timeouts, closing their
connections and proxy processes, before the process exits).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any


class FleetInterrupted(KeyboardInterrupt):
    """A fleet run stopped by Ctrl-C. ``done``: the results of the hosts that finished, in the
    members' order; ``not_started`` / ``abandoned``: names of the hosts never contacted / still
    in flight when a second Ctrl-C stopped the wait."""

    def __init__(self, done: list[Any], not_started: list[str], abandoned: list[str]) -> None:
        super().__init__("interrupted")
        self.done = done
        self.not_started = not_started
        self.abandoned = abandoned

    def to_dict(self) -> dict[str, Any]:
        """For --json: the interruption, beside the hosts done."""
        return {
            "interrupted": True,
            "not_contacted": self.not_started,
            "abandoned": self.abandoned,
        }

    def summary(self, total: int, verb: str) -> str:
        """One line, e.g. "interrupted: 3 of 10 hosts audited, 7 not contacted"."""
        parts = [f"interrupted: {len(self.done)} of {total} hosts {verb}"]
        if self.not_started:
            parts.append(f"{len(self.not_started)} not contacted")
        if self.abandoned:
            parts.append(f"{len(self.abandoned)} abandoned in flight")
        return ", ".join(parts)


#: What a worker returns for a host it did not start because the run is stopping.
NOT_STARTED: Any = object()


def collect_after_interrupt(
    names: Sequence[str], futures: dict[Future[Any], int]
) -> FleetInterrupted:
    """Wait for the futures still running (a second Ctrl-C stops waiting) and sort every host
    into done / not started / abandoned. The queued ones must already be cancelled."""
    running = [f for f in futures if not f.done()]
    with contextlib.suppress(KeyboardInterrupt):  # the second Ctrl-C: abandon those in flight
        concurrent.futures.wait(running)
    done: dict[int, Any] = {}
    not_started: list[str] = []
    abandoned: list[str] = []
    for future, index in sorted(futures.items(), key=lambda item: item[1]):
        if future.cancelled():
            not_started.append(names[index])
        elif not future.done() or future.exception() is not None:
            abandoned.append(names[index])
        elif future.result() is NOT_STARTED:
            not_started.append(names[index])
        else:
            done[index] = future.result()
    return FleetInterrupted([done[i] for i in sorted(done)], not_started, abandoned)
