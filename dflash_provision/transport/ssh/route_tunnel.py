"""The socket a tunneled SSH connection runs over: a jump host's direct-tcpip channel.

paramiko's ``Channel.send`` builds a data message under the channel's lock but sends it after
letting go of the lock, so a ``close`` from another thread can get its CHANNEL_CLOSE out first;
the data that follows then names a channel the jump host has already freed. OpenSSH treats that
as a protocol error and drops the whole connection ("data packet referred to nonexistent
channel"), and with it the tunnel of every other host behind the same shared jump connection
(route_pool.py). Seen here: 19 failures in 40 rounds of 5 hosts closing at once. Sending and
closing through this wrapper are serialised, so no data can follow the close.
"""

from __future__ import annotations

import threading

import paramiko


class TunnelSocket:
    """The socket-like object paramiko.Transport reads and writes, over a Channel."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self._sending = threading.Lock()

    def send(self, data: bytes) -> int:
        with self._sending:
            return self.channel.send(data)

    def close(self) -> None:
        with self._sending:  # waits for a send in flight (bounded by the channel's timeout)
            self.channel.close()

    def recv(self, size: int) -> bytes:
        return self.channel.recv(size)

    def settimeout(self, timeout: float | None) -> None:
        self.channel.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self.channel.gettimeout()

    def getpeername(self) -> object:
        return self.channel.getpeername()

    @property
    def closed(self) -> bool:
        return bool(self.channel.closed)

    @property
    def _closed(self) -> bool:  # what paramiko's Transport.stop_thread looks at
        return bool(self.channel.closed)
