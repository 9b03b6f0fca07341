"""Step 2, route: gateway (jump-host) connections shared by every transport of a process that goes
through them.

A fleet behind one bastion would otherwise open one bastion connection per host, all at once:
64 workers make 64 simultaneous unauthenticated connections, and OpenSSH's default
``MaxStartups 10:30:100`` starts dropping them at random after the tenth. Like OpenSSH's
ControlMaster, one authenticated connection to the jump host(s) carries a ``direct-tcpip``
channel per target instead.

A lease is keyed by the SSH options and the gateway's route (config_route.Route). The connection
stays open for ``LINGER_S`` after its last lease is released (like a short ControlPersist), so a
fleet whose
workers all happen to finish a host at once, or a command that opens hosts in batches, does not
log in to the bastion again; it is closed at exit in any case. A failure to connect is kept while
leases are held, so the hosts waiting on a bastion that is down all get its error at once instead
of each waiting out its own timeout; once every lease is released, the next one tries again.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import paramiko

_V = TypeVar("_V")


LINGER_S = 2.0


@dataclass
class _Entry(Generic[_V]):
    connecting: threading.Lock = field(default_factory=threading.Lock)
    value: _V | None = None
    error: Exception | None = None
    leases: int = 0
    closer: threading.Timer | None = None  # pending close after the last release


class Lease(Generic[_V]):
    """One user's hold on a shared connection; ``release()`` exactly once."""

    def __init__(self, pool: JumpPool[_V], key: Hashable, entry: _Entry[_V], value: _V) -> None:
        self._pool = pool
        self._key = key
        self._entry = entry
        self.value = value
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._key, self._entry)


class JumpPool(Generic[_V]):
    """``lease(key, connect)``: the value ``connect()`` made for ``key``, made once and shared.

    ``alive(value)`` says whether a kept value can still be used; ``close(value)`` ends it.
    """

    def __init__(
        self, alive: Callable[[_V], bool], close: Callable[[_V], None], linger_s: float = 0.0
    ) -> None:
        self._alive = alive
        self._close = close
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry[_V]] = {}
        self.connects = 0  # how many times connect() ran (tests)

    def lease(self, key: Hashable, connect: Callable[[], _V]) -> Lease[_V]:
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.leases += 1
            if entry.closer is not None:  # back before the linger ran out: keep it
                entry.closer.cancel()
                entry.closer = None
        try:
            with entry.connecting:  # one thread connects; the others wait for its outcome
                if entry.value is not None and not self._alive(entry.value):
                    self._close(entry.value)
                    entry.value = None
                if entry.value is None:
                    if entry.error is not None:
                        raise entry.error.with_traceback(None)
                    self.connects += 1
                    try:
                        entry.value = connect()
                    except Exception as exc:
                        entry.error = exc
                        raise
                value = entry.value
        except BaseException:
            self._release(key, entry)
            raise
        return Lease(self, key, entry, value)

    def _release(self, key: Hashable, entry: _Entry[_V]) -> None:
        with self._lock:
            entry.leases -= 1
            if entry.leases > 0:
                return
            entry.error = None  # the next lease tries again
            if entry.value is not None and self._linger_s > 0:
                entry.closer = threading.Timer(self._linger_s, self._expire, (key, entry))
                entry.closer.daemon = True
                entry.closer.start()
                return
            value = self._forget(key, entry)
        if value is not None:
            self._close(value)

    def _expire(self, key: Hashable, entry: _Entry[_V]) -> None:
        with self._lock:
            if entry.leases > 0 or entry.closer is None:
                return  # leased again meanwhile
            entry.closer = None
            value = self._forget(key, entry)
        if value is not None:
            self._close(value)

    def close_all(self) -> None:
        """Close every kept connection (at exit: the bastion sees a clean goodbye)."""
        with self._lock:
            entries = list(self._entries.items())
            values = []
            for key, entry in entries:
                if entry.closer is not None:
                    entry.closer.cancel()
                    entry.closer = None
                values.append(self._forget(key, entry))
        for value in values:
            if value is not None:
                self._close(value)

    def _forget(self, key: Hashable, entry: _Entry[_V]) -> _V | None:
        """Drop ``entry`` from the pool (under the lock); its value, for the caller to close."""
        if self._entries.get(key) is entry:
            del self._entries[key]
        value, entry.value = entry.value, None
        return value


def _gateway_alive(clients: list[paramiko.SSHClient]) -> bool:
    transport = clients[-1].get_transport()
    return transport is not None and transport.is_active()


def _close_gateway(clients: list[paramiko.SSHClient]) -> None:
    for client in reversed(clients):
        client.close()


#: The connections along a gateway's route (the gateway itself last), per (options, route).
JUMPS: JumpPool[list[paramiko.SSHClient]] = JumpPool(
    _gateway_alive, _close_gateway, linger_s=LINGER_S
)
atexit.register(JUMPS.close_all)
