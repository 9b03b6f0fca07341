"""Jump-host connections shared by every transport of a process that goes through them.

A fleet behind one bastion would otherwise open one bastion connection per host, all at once:
64 workers make 64 simultaneous unauthenticated connections, and OpenSSH's default
``MaxStartups 10:30:100`` starts dropping them at random after the tenth. Like OpenSSH's
ControlMaster, one authenticated connection to the jump host(s) carries a ``direct-tcpip``
channel per target instead.

A lease is keyed by the SSH options and the ProxyJump hops as written; the connection closes when
its last lease is released. A failure to connect is kept while leases are held, so the hosts
waiting on a bastion that is down all get its error at once instead of each waiting out its own
timeout; once every lease is released, the next one tries again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import paramiko

_V = TypeVar("_V")


@dataclass
class _Entry(Generic[_V]):
    connecting: threading.Lock = field(default_factory=threading.Lock)
    value: _V | None = None
    error: Exception | None = None
    leases: int = 0


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

    def __init__(self, alive: Callable[[_V], bool], close: Callable[[_V], None]) -> None:
        self._alive = alive
        self._close = close
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry[_V]] = {}
        self.connects = 0  # how many times connect() ran (tests)

    def lease(self, key: Hashable, connect: Callable[[], _V]) -> Lease[_V]:
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.leases += 1
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
            if self._entries.get(key) is entry:
                del self._entries[key]
            value, entry.value = entry.value, None
        if value is not None:
            self._close(value)


def _clients_alive(value: tuple[list[paramiko.SSHClient], object]) -> bool:
    transport = value[0][-1].get_transport()
    return transport is not None and transport.is_active()


def _close_clients(value: tuple[list[paramiko.SSHClient], object]) -> None:
    for client in reversed(value[0]):
        client.close()


#: The jump clients (the last hop last) and the last hop's Endpoint, per (options, hops).
JUMPS: JumpPool[tuple[list[paramiko.SSHClient], object]] = JumpPool(_clients_alive, _close_clients)
