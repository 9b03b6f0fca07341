"""Host name lookup that gives up when the caller's timeout runs out.

``getaddrinfo`` has no timeout of its own: with a DNS server that does not answer, glibc waits
``timeout:5`` x ``attempts:2`` per nameserver (per address family), whatever timeout the SSH or
HTTP connection behind it was given. Here the lookup runs in a daemon thread that the caller
stops waiting for when its timeout runs out; the thread ends by itself when the resolver gives
up. IP literals never start a thread.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

AddrInfo = list[tuple[Any, ...]]  # getaddrinfo's (family, type, proto, canonname, address)


class LookupTimedOut(TimeoutError):
    """The resolver did not answer within the timeout."""


def lookup_within(hostname: str, port: int, timeout: float) -> AddrInfo:
    """``getaddrinfo(hostname, port)`` for a TCP stream, given up after ``timeout`` seconds.

    Raises ``socket.gaierror`` when the resolver answers that it cannot resolve the name, and
    LookupTimedOut when it does not answer in time.
    """
    if is_ip_literal(hostname):
        return _getaddrinfo(hostname, port)  # no resolver involved: returns at once
    outcome: list[AddrInfo | BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome.append(_getaddrinfo(hostname, port))
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)
        done.set()

    threading.Thread(target=lookup, name=f"lookup {hostname}", daemon=True).start()
    if not done.wait(timeout):
        raise LookupTimedOut(f"no answer from the resolver within {timeout:g} s")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def is_ip_literal(hostname: str) -> bool:
    try:
        ipaddress.ip_address(hostname.split("%", 1)[0])  # "fe80::1%eth0" carries a scope
    except ValueError:
        return False
    return True


def _getaddrinfo(hostname: str, port: int) -> AddrInfo:
    return socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
