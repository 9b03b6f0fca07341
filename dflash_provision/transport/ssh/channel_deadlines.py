"""Step 4, channel: the deadlines of exec requests, kept by one thread for the whole process.

paramiko waits for the answer to an exec request without a deadline, and only another thread
can end that wait (by closing the channel). A ``threading.Timer`` per request did that, but
starting and ending a thread per exec cost the controller ~0.3 ms of CPU per command (measured
serially on one test host: 5.0 ms of controller CPU per host audited with it, 4.7 without), as
much as the rest of our exec path. Here one daemon thread, started on first use, sleeps until
the earliest live deadline; a request that is answered in time only marks its entry done.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from collections.abc import Callable


class Deadline:
    """One request's deadline: ``expire`` runs (in the deadline thread) unless ``cancel`` came
    first; ``fired`` says whether it ran."""

    __slots__ = ("_expire", "_lock", "fired")

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire: Callable[[], None] | None = expire
        self._lock = threading.Lock()
        self.fired = False

    def cancel(self) -> None:
        with self._lock:
            self._expire = None  # nor is the channel kept alive by the queue until its time

    @property
    def live(self) -> bool:
        return self._expire is not None

    def fire(self) -> None:
        with self._lock:
            expire, self._expire = self._expire, None
            if expire is None:
                return
            self.fired = True
        expire()  # outside the lock: closing a channel may wait on paramiko's own locks


class Deadlines:
    """The process's queue of deadlines and the one thread that fires them."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._queue: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # equal times: first added, first fired
        self._thread: threading.Thread | None = None

    def add(self, seconds: float, expire: Callable[[], None]) -> Deadline:
        """``expire`` runs ``seconds`` from now unless the returned Deadline is cancelled."""
        entry = Deadline(expire)
        when = time.monotonic() + max(0.0, seconds)
        with self._wake:
            heapq.heappush(self._queue, (when, next(self._order), entry))
            # Not there yet, or not in this process (a fork keeps the object, not the thread).
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="dflash exec deadlines", daemon=True
                )
                self._thread.start()
            if self._queue[0][2] is entry:
                self._wake.notify()  # it is now the earliest: the thread sleeps until it
        return entry

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    # Answered requests leave their entries behind; they go when they surface.
                    while self._queue and not self._queue[0][2].live:
                        heapq.heappop(self._queue)
                    if not self._queue:
                        self._wake.wait()
                        continue
                    left = self._queue[0][0] - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                _, _, due = heapq.heappop(self._queue)
            try:
                due.fire()
            except Exception:  # reported as a thread's error is; the other deadlines go on
                kind, error, trace = sys.exc_info()
                threading.excepthook(
                    threading.ExceptHookArgs([kind, error, trace, threading.current_thread()])
                )


#: The process's one deadline thread (exec requests on every connection share it).
EXEC_DEADLINES = Deadlines()
