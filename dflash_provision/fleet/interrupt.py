"""Ctrl-C during audit or repair: stop at once, keep what was done.

The first Ctrl-C sets the run's ``stopping`` event (no worker contacts a new host, and repair
starts no new write: it checks the event between its audit and its write), cancels the hosts
still queued, says which hosts are in flight and how long it waits for them (``Stopping``: at
most one step of each, bounded by the connection and command timeouts), and waits: their writes
finish and are reported. A second Ctrl-C stops that wait, and so does its deadline: the hosts
still in flight are reported as abandoned, and the console script ends the process at once
(cli/entry.py) instead of waiting for their threads (a host hung at the SSH banner would hold
the prompt for its whole timeout).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any


class Stopping(threading.Event):
    """A fleet run's stop flag, set by the first Ctrl-C, with how long that Ctrl-C waits for the
    hosts in flight (``wait_s``, ``bound`` says where the figure comes from) and how it tells
    the user (``announce``: the CLI's stderr; None: silent)."""

    def __init__(self, wait_s: float, bound: str) -> None:
        super().__init__()
        self.wait_s, self.bound = wait_s, bound
        self.announce: Callable[[str], None] | None = None

    def waiting_line(self, in_flight: Sequence[str]) -> str:
        more = f" and {len(in_flight) - 5} more" if len(in_flight) > 5 else ""
        names = ", ".join(in_flight[:5]) + more
        return (
            f"Ctrl-C: no new host is contacted; waiting for {len(in_flight)} host(s) in flight "
            f"({names}) to end their step, at most {self.wait_s:.0f} s ({self.bound}); "
            "Ctrl-C again to abandon them"
        )


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
        hosts = "host" if total == 1 else "hosts"
        parts = [f"interrupted: {len(self.done)} of {total} {hosts} {verb}"]
        if self.not_started:
            parts.append(f"{len(self.not_started)} not contacted")
        if self.abandoned:
            parts.append(f"{len(self.abandoned)} abandoned in flight")
        return ", ".join(parts)


#: What a worker returns for a host it did not start because the run is stopping.
NOT_STARTED: Any = object()


def collect_after_interrupt(
    names: Sequence[str], futures: dict[Future[Any], int], stopping: Stopping | None = None
) -> FleetInterrupted:
    """Wait for the futures still running (at most ``stopping.wait_s``; a second Ctrl-C stops
    waiting) and sort every host into done / not started / abandoned. The queued ones must
    already be cancelled."""
    running = sorted((f for f in futures if not f.done()), key=lambda f: futures[f])
    wait_s = stopping.wait_s if stopping is not None else None
    # The second Ctrl-C abandons those in flight. It may come as soon as the line is out, while
    # the announce is still returning: the suppress must already be in force then.
    with contextlib.suppress(KeyboardInterrupt):
        if running and stopping is not None and stopping.announce is not None:
            stopping.announce(stopping.waiting_line([names[futures[f]] for f in running]))
        concurrent.futures.wait(running, timeout=wait_s)
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
