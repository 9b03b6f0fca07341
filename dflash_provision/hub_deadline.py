"""One deadline for a whole Hub fetch, enforced inside huggingface_hub's own HTTP client.

The client's timeouts are per operation: a server that sends one byte every 2 s never trips a
10 s read timeout, and ``http_get`` then retries a timed-out body five more times. So every
request made while a deadline is set (in this thread) gets its connect/read/write timeouts cut to
the time left, and its body stream checks the clock between chunks. Past the deadline the request
fails with ``DeadlinePassed``, which is none of the exceptions the client retries on, so the
fetch ends within the deadline plus one chunk.

Installed through ``huggingface_hub.set_client_factory`` (its documented hook for customising the
shared client): the library's default client plus two event hooks, which also cover requests
through a proxy from the environment (the hooks run before the transport is chosen).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

_state = threading.local()
_install_lock = threading.Lock()
_installed = False
_SLACK_S = 0.05


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
