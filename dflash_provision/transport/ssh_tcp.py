"""The TCP connection under an SSH session: name lookup and connect, each within the timeout.

``socket.create_connection`` bounds the connect but not the name lookup before it: with a
resolver that does not answer, ``getaddrinfo`` blocks for the resolver's own retries (glibc:
5 s x 2 attempts per nameserver) whatever ``--connect-timeout`` says. Here the lookup runs in a
daemon thread that the caller stops waiting for when the connect timeout runs out; the thread
ends by itself when the resolver gives up. IP literals skip the thread.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

from dflash_provision.errors import UnreachableError

_AddrInfo = list[tuple[Any, ...]]  # getaddrinfo results: (family, type, proto, name, address)


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


def resolve(hostname: str, port: int, timeout: float) -> _AddrInfo:
    """``getaddrinfo`` for a TCP stream, given up after ``timeout`` seconds."""
    try:
        ipaddress.ip_address(hostname.split("%", 1)[0])  # "fe80::1%eth0" carries a scope
    except ValueError:
        pass
    else:
        return _lookup(hostname, port)  # a literal: no resolver involved, returns at once
    outcome: list[_AddrInfo | BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome.append(_lookup(hostname, port))
        except BaseException as exc:
            outcome.append(exc)
        done.set()

    threading.Thread(target=lookup, name=f"resolve {hostname}", daemon=True).start()
    if not done.wait(timeout):
        raise UnreachableError(
            f"cannot resolve host {hostname!r}: no answer from the resolver within {timeout:g} s",
            reason="timeout",
        )
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _lookup(hostname: str, port: int) -> _AddrInfo:
    try:
        return socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
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
