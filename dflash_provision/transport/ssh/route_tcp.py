"""Step 2, route: the TCP connection under an SSH session: name lookup and connect, each within
the timeout.

``socket.create_connection`` bounds the connect but not the name lookup before it (see
netlookup.py): a DNS server that does not answer would cost glibc's own 10 s or more whatever
``--connect-timeout`` says.
"""

from __future__ import annotations

import socket

from dflash_provision.errors import UnreachableError
from dflash_provision.netlookup import AddrInfo, LookupTimedOut, lookup_within


def open_tcp(hostname: str, port: int, timeout: float, where: str) -> socket.socket:
    """A connected TCP socket to ``hostname:port`` with TCP_NODELAY, or an UnreachableError."""
    addresses = resolve(hostname, port, timeout)
    last_error: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError as exc:  # try the next address, as OpenSSH and create_connection do
            sock.close()
            last_error = exc
            continue
        # SSH packets are small and each exec waits for the answer to the last one: without
        # TCP_NODELAY, Nagle's algorithm holds a packet back until the peer's delayed ACK
        # (~40 ms) on every request/response turn (channel open, exec, EOF), per command.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise _connect_error(last_error, where, timeout)


def resolve(hostname: str, port: int, timeout: float) -> AddrInfo:
    """The addresses of ``hostname``, or an UnreachableError naming why there are none."""
    try:
        return lookup_within(hostname, port, timeout)
    except LookupTimedOut as exc:
        message = f"cannot resolve host {hostname!r}: {exc}"
        raise UnreachableError(message, reason="timeout") from None
    except socket.gaierror as exc:
        raise UnreachableError(
            f"cannot resolve host {hostname!r}: {exc.strerror}", reason="network"
        ) from None


def _connect_error(exc: OSError | None, where: str, timeout: float) -> UnreachableError:
    if isinstance(exc, TimeoutError):
        return UnreachableError(
            f"connecting to {where} timed out after {timeout:g}s (tcp connect)", reason="timeout"
        )
    if isinstance(exc, ConnectionRefusedError):
        return UnreachableError(f"connection to {where} refused", reason="refused")
    detail = (exc.strerror or str(exc)) if exc is not None else "no address to connect to"
    return UnreachableError(f"cannot connect to {where}: {detail}", reason="network")
