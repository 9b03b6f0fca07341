"""One deadline for a whole Hub fetch, enforced inside huggingface_hub's own HTTP client.

The client's timeouts are per operation: a server that sends one byte every 2 s never trips a
10 s read timeout, and ``http_get`` then retries a timed-out body five more times. So every
request made while a deadline is set (in this thread) gets its connect/read/write timeouts cut to
the time left, and its body stream checks the clock between chunks. Past the deadline the request
fails with ``DeadlinePassed``, which is none of the exceptions the client retries on, so the
fetch ends within the deadline plus one chunk.

Per-read timeouts cannot end a response whose HEADERS arrive a byte at a time (every byte starts
the read timeout again, and the header parser has no clock of its own), so ``run_within`` runs the
whole fetch in a worker thread and gives up on it when the deadline finds it waiting for headers.
Anywhere else (a body, whose reads end by the deadline; a read of the cache) the worker ends by
itself and cleans up after itself (no partial download left), so it is waited for.

Installed through ``huggingface_hub.set_client_factory`` (its documented hook for customising the
shared client): the library's default client plus two event hooks, which also cover requests
through a proxy from the environment (the hooks run before the transport is chosen).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import httpx2

_state = threading.local()
_install_lock = threading.Lock()
_installed = False
_SLACK_S = 0.05
# How long past the deadline the caller waits before it looks at what the worker is doing.
_GRACE_S = 0.5
# The most the caller waits past that for a worker that is not waiting for headers: a body's
# last read (its read timeout is at most the budget) or a read of the cache.
_LOCAL_READ_S = 30.0
_T = TypeVar("_T")


class DeadlinePassed(Exception):
    """The fetch's time is up; ``seconds`` is the budget it had."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not finish within {seconds:g} s")
        self.seconds = seconds


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound every Hub request this thread makes inside the block to ``seconds`` in total."""
    _install()
    previous = getattr(_state, "deadline", None)
    _state.deadline = (time.monotonic() + seconds, seconds)
    try:
        yield
    finally:
        _state.deadline = previous


def run_within(seconds: float, action: Callable[[], _T]) -> _T:
    """``action()`` under ``deadline(seconds)``, in a worker thread. Past the deadline (plus a short
    grace) a worker still waiting for a response's headers, which may trickle in for hours, is
    given up on: DeadlinePassed here, and the worker is left behind as a daemon thread, which does
    not hold the process open (nothing was downloaded yet, so nothing is left in the cache)."""
    outcome: list[tuple[bool, object]] = []
    awaiting_headers = threading.Event()

    def work() -> None:
        _state.awaiting_headers = awaiting_headers
        try:
            with deadline(seconds):
                outcome.append((True, action()))
        except BaseException as exc:  # handed to the caller, who raises it
            outcome.append((False, exc))
        finally:
            _state.awaiting_headers = None

    worker = threading.Thread(target=work, name="hub-fetch", daemon=True)
    worker.start()
    worker.join(seconds + _GRACE_S)
    patience = time.monotonic() + seconds + _LOCAL_READ_S
    while worker.is_alive() and not awaiting_headers.is_set() and time.monotonic() < patience:
        worker.join(0.05)
    if not outcome:
        raise DeadlinePassed(seconds)
    finished, value = outcome[0]
    if not finished:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]  # what action() returned


def _awaiting_headers(waiting: bool) -> None:
    event: threading.Event | None = getattr(_state, "awaiting_headers", None)
    if event is not None:
        (event.set if waiting else event.clear)()


def network_done() -> None:
    """Say (from inside ``run_within``) that what is left is a local read of the cache: a request
    that failed before its headers came is no longer waited on."""
    _awaiting_headers(False)


def remaining() -> float | None:
    """Seconds left in this thread's deadline (None: no deadline); raises once it has passed."""
    current: tuple[float, float] | None = getattr(_state, "deadline", None)
    if current is None:
        return None
    left = current[0] - time.monotonic()
    if left <= 0:
        raise DeadlinePassed(current[1])
    return left


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils._http import default_client_factory

        def factory() -> httpx2.Client:
            client = default_client_factory()
            hooks = client.event_hooks
            client.event_hooks = {
                "request": [*hooks.get("request", []), _cap_request],
                "response": [*hooks.get("response", []), _bound_body],
            }
            return client

        set_client_factory(factory)
        _installed = True


def _cap_request(request: httpx2.Request) -> None:
    _awaiting_headers(True)
    left = remaining()
    if left is None:
        return
    timeouts = dict(request.extensions.get("timeout") or {})
    for phase in ("connect", "read", "write", "pool"):
        value = timeouts.get(phase)
        timeouts[phase] = left if value is None else min(value, left)
    request.extensions = {**request.extensions, "timeout": timeouts}


def _bound_body(response: httpx2.Response) -> None:
    import httpx2

    _awaiting_headers(False)

    if getattr(_state, "deadline", None) is not None and isinstance(
        response.stream, httpx2.SyncByteStream
    ):
        response.stream = _DeadlineStream(response.stream)


def _stream_base() -> type:
    import httpx2

    return httpx2.SyncByteStream


class _DeadlineStream(_stream_base()):  # type: ignore[misc]
    """A response body that stops at the deadline, between chunks or inside a timed-out read."""

    def __init__(self, inner: httpx2.SyncByteStream) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[bytes]:
        import httpx2

        try:
            for chunk in self.inner:
                remaining()
                yield chunk
        except httpx2.TimeoutException:
            current: tuple[float, float] | None = getattr(_state, "deadline", None)
            # The read's timeout was the time left, so a timeout this close to the end is the
            # deadline's (and must not reach http_get, which would retry it).
            if current is not None and current[0] - time.monotonic() < _SLACK_S:
                raise DeadlinePassed(current[1]) from None
            raise

    def close(self) -> None:
        self.inner.close()
