"""Reach the server's port through the target's own transport, without exposing it.

- SSH host: an SSH direct-tcpip channel on the existing connection (what ``ssh -L`` does), one
  per request; the server keeps listening on 127.0.0.1 only.
- Container (lxc/pct/incus/lxd, locally or behind SSH): it may have no routable address (the
  test bed's have only a loopback), so the request is made INSIDE it by its Python (the one that
  runs vLLM is a good choice: ``python=``) with a short stdlib program passed as an argument;
  the reply comes back bounded.
- Another tool's connection (an Ansible play's, ``CallbackTransport``): no tunnel to ask it for,
  so the request is made ON the host by its Python, as in a container.
- This machine: plain HTTP to 127.0.0.1.

``open_server(transport, port)`` picks the way; ``request`` raises UnreachableError with
reason "refused" when nothing accepts on the port yet (readiness polls on that), and returns
every HTTP status, 5xx included, as an HttpReply.

Every request has ONE deadline, ``timeout`` seconds for the connection, the request, the headers
and the body together (a server that answers a byte every 2 s costs the deadline, not forever):
DeadlineReached says how many bytes had come. Inside a container the program ends itself at that
deadline too, and the transport's own timeout bounds the command. The body is read up to
``max_bytes`` + 1 bytes on the side that talks to the server (``HttpReply.truncated``).
"""

from __future__ import annotations

import abc
import http.client
import io
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import RemoteStepFailed, UnreachableError
from dflash_provision.server.bounded import run_bounded
from dflash_provision.transport.base import Transport
from dflash_provision.transport.callback import CallbackTransport
from dflash_provision.transport.container import ContainerTransport
from dflash_provision.transport.local import LocalTransport

DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_PYTHON = "python3"
SERVER_HOST = "127.0.0.1"
_HEADER_LIMIT = 64 * 1024


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False  # the body was longer than max_bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class ServerAccess(abc.ABC):
    """HTTP to one port on the target. Use as a context manager."""

    description: str = "server"

    @abc.abstractmethod
    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float = 10.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: dict[str, str] | None = None,
    ) -> HttpReply:
        """One request; ``path`` starts with ``/``. JSON bodies get their content type."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the access holds (the transport stays open: it is the caller's)."""

    def __enter__(self) -> ServerAccess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_server(transport: Transport, port: int, *, python: str | None = None) -> ServerAccess:
    """The way to reach ``port`` on ``transport``'s machine (see the module docstring)."""
    layers = list(_layers(transport))
    # Never plain HTTP to this machine's loopback for a host reached through another tool: that
    # would ask whatever listens HERE on the port and call it the host's server.
    if any(isinstance(layer, ContainerTransport | CallbackTransport) for layer in layers):
        return ContainerAccess(transport, port, python=python or DEFAULT_PYTHON)
    for layer in layers:
        if type(layer).__name__ == "SshTransport":  # no paramiko import for local targets
            return SshForwardAccess(layer, port)
        if isinstance(layer, LocalTransport):
            return LocalAccess(port)
    return LocalAccess(port)


def check_access(transport: Transport, port: int, *, python: str | None, timeout: float) -> None:
    """Make sure the port can be reached before anything starts: for a container, that its
    python runs (else RemoteStepFailed(step="access") naming --python). Nothing to check for
    SSH and local access."""
    access = open_server(transport, port, python=python)
    if isinstance(access, ContainerAccess):
        argv = [access.python, "-c", "import http.client, signal"]
        result = run_bounded(transport, argv, timeout=timeout)  # a hung python is ended there
        if result.exit_status != 0:
            raise access._no_python(result.exit_status, result.stderr)


def _layers(transport: Transport) -> Iterator[Transport]:
    current: Transport | None = transport
    while current is not None:
        yield current
        current = getattr(current, "inner", None)


def _headers(body: bytes | None, extra: dict[str, str] | None) -> dict[str, str]:
    headers = {"Connection": "close", "Accept": "*/*"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    headers.update(extra or {})
    return headers


class ReplyUnusable(RemoteStepFailed):
    """An endpoint's answer that cannot be used as evidence: it did not finish by the deadline,
    it was larger than the bound, or it was cut short. The message names the request."""


class DeadlineReached(ReplyUnusable):
    """A request's one deadline (headers and body together) passed before its answer was whole:
    a server that drips bytes costs the deadline, never more (step "timeout")."""

    def __init__(self, message: str, *, received: int) -> None:
        super().__init__(message, step="timeout")
        self.received = received


class NoProbePython(RemoteStepFailed):
    """The target has no such python to make a request with (exit 126/127, step "access"):
    the same on every try, so a wait for readiness stops at once (``--python`` names one)."""


def too_large(method: str, path: str, max_bytes: int) -> ReplyUnusable:
    """``GET /metrics: answer larger than 4 MiB: refused``."""
    return ReplyUnusable(
        f"{method} {path}: answer larger than {size_text(max_bytes)}: refused", step="http"
    )


def size_text(size: int) -> str:
    if size >= 1024 * 1024 and size % (1024 * 1024) == 0:
        return f"{size // (1024 * 1024)} MiB"
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} bytes"


def deadline_text(method: str, path: str, received: int, timeout: float) -> str:
    """``GET /metrics: the server sent 37 bytes in 30 s and did not finish: deadline reached``."""
    if received <= 0:
        return f"{method} {path}: no answer within {timeout:g} s: deadline reached"
    return (
        f"{method} {path}: the server sent {received} bytes in {timeout:g} s and did not "
        "finish: deadline reached"
    )


class _Expired(Exception):
    """Raised inside http.client's reads when the request's deadline has passed."""


class _DeadlineStream(io.RawIOBase):
    """The connection as http.client reads it: every recv waits at most until the request's one
    deadline (not a fresh timeout per read), and the bytes received are counted for the
    message. ``link`` is a socket or a paramiko channel (both have recv, sendall, settimeout)."""

    def __init__(self, link: Any, deadline: float) -> None:
        super().__init__()
        self.link = link
        self.deadline = deadline
        self.received = 0

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Expired
        return left

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.link.settimeout(self.remaining())
        try:
            chunk = self.link.recv(len(buffer))
        except TimeoutError:
            raise _Expired from None
        buffer[: len(chunk)] = chunk
        self.received += len(chunk)
        return len(chunk)

    # what http.client needs of its "socket"
    def sendall(self, data: bytes) -> None:
        self.link.settimeout(self.remaining())
        try:
            self.link.sendall(data)
        except TimeoutError:
            raise _Expired from None

    def makefile(self, *args: Any, **kwargs: Any) -> Any:
        return io.BufferedReader(self, _CHUNK)

    def close(self) -> None:
        # http.client closes its "socket" before the body of a "Connection: close" reply is read
        # (a real socket survives that through makefile's reference; a channel would not): the
        # request closes the link itself once the body is read.
        pass


_CHUNK = 64 * 1024


def _exchange(
    link: Any,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    max_bytes: int,
    deadline: float,
    timeout: float,
) -> HttpReply:
    """One request over ``link`` within ``deadline`` (time.monotonic()); at most ``max_bytes``
    + 1 bytes of body are read (``truncated`` then says the answer was longer)."""
    stream = _DeadlineStream(link, deadline)
    conn = http.client.HTTPConnection(SERVER_HOST, timeout=timeout)
    conn.sock = stream
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read(max_bytes + 1)
    except _Expired:
        raise DeadlineReached(
            deadline_text(method, path, stream.received, timeout), received=stream.received
        ) from None
    return HttpReply(
        status=response.status,
        headers={k.lower(): v for k, v in response.getheaders()},
        body=data[:max_bytes],
        truncated=len(data) > max_bytes,
    )


class LocalAccess(ServerAccess):
    def __init__(self, port: int) -> None:
        self.port = port
        self.description = f"{SERVER_HOST}:{port}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float = 10.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: dict[str, str] | None = None,
    ) -> HttpReply:
        deadline = time.monotonic() + timeout
        try:
            sock = socket.create_connection((SERVER_HOST, self.port), timeout=timeout)
        except ConnectionRefusedError:
            raise UnreachableError(
                f"nothing accepts connections on {self.description}", reason="refused"
            ) from None
        except OSError as exc:
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {exc}", step="http"
            ) from None
        try:
            return _exchange(
                sock, method, path, body, _headers(body, headers), max_bytes, deadline, timeout
            )
        except (OSError, http.client.HTTPException) as exc:
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {exc}", step="http"
            ) from None
        finally:
            sock.close()


class SshForwardAccess(ServerAccess):
    """One direct-tcpip channel per request over the SshTransport's connection."""

    def __init__(self, ssh: Any, port: int) -> None:
        self.ssh = ssh
        self.port = port
        self.description = f"{SERVER_HOST}:{port} on {ssh.description} (SSH forward)"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float = 10.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: dict[str, str] | None = None,
    ) -> HttpReply:
        deadline = time.monotonic() + timeout
        channel = self.ssh.open_direct_tcpip(SERVER_HOST, self.port, timeout)
        try:
            return _exchange(
                channel, method, path, body, _headers(body, headers), max_bytes, deadline, timeout
            )
        except (OSError, EOFError, http.client.HTTPException) as exc:
            # The server closing a forwarded connection before answering is how a port that
            # listens but is not serving yet looks from here.
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {exc or type(exc).__name__}",
                step="http",
            ) from None
        finally:
            channel.close()


# Runs inside the container: argv METHOD PORT PATH TIMEOUT MAX_BYTES, body on stdin (may be
# empty). Prints one JSON line (status, headers, or error), then the body bytes (at most
# MAX_BYTES+1). One deadline for the whole request (an interval timer: a read that drips a byte
# at a time is cut there, not given a fresh timeout per read), plus the socket's own timeout.
CONTAINER_PROGRAM = r"""
import http.client, json, signal, sys
method, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
timeout, limit = float(sys.argv[4]), int(sys.argv[5])
body = sys.stdin.buffer.read(16 * 1024 * 1024) or None
class Deadline(Exception):
    pass
def expire(*_):
    raise Deadline
signal.signal(signal.SIGALRM, expire)
signal.setitimer(signal.ITIMER_REAL, timeout)
headers = {"Connection": "close", "Accept": "*/*"}
if body is not None:
    headers["Content-Type"] = "application/json"
out = sys.stdout.buffer
data = b""
try:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    while len(data) <= limit:
        chunk = resp.read1(65536)
        if not chunk:
            break
        data += chunk
    signal.setitimer(signal.ITIMER_REAL, 0)
    head = {"status": resp.status, "headers": {k.lower(): v for k, v in resp.getheaders()}}
except Deadline:
    head, data = {"error": "deadline", "received": len(data)}, b""
except ConnectionRefusedError as err:
    head, data = {"error": "refused", "detail": str(err)}, b""
except Exception as err:
    signal.setitimer(signal.ITIMER_REAL, 0)
    kind = "timeout" if "timed out" in str(err) else "error"
    head, data = {"error": kind, "detail": f"{type(err).__name__}: {err}"}, b""
out.write(json.dumps(head).encode() + b"\n" + data[: limit + 1])
"""
#: The container's program ends itself at the request's deadline; the transport waits this much
#: longer (lxc-attach and the python's start-up) before it ends the command itself.
CONTAINER_MARGIN_S = 15.0


@dataclass
class ContainerAccess(ServerAccess):
    """Requests made on the target by its own Python (stdlib urllib): inside a container, or on
    a host reached through another tool's connection."""

    transport: Transport
    port: int
    python: str = DEFAULT_PYTHON
    description: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.description = f"{SERVER_HOST}:{self.port} in {self.transport.description}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float = 10.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: dict[str, str] | None = None,
    ) -> HttpReply:
        argv = [
            self.python,
            "-c",
            CONTAINER_PROGRAM,
            method,
            str(self.port),
            path,
            f"{timeout:g}",
            str(max_bytes),
        ]
        result = self.transport.run(argv, stdin=body or b"", timeout=timeout + CONTAINER_MARGIN_S)
        head_line, sep, data = result.stdout.partition(b"\n")
        try:
            head = json.loads(head_line) if sep else None
        except ValueError:
            head = None
        if not isinstance(head, dict):
            raise self._no_python(result.exit_status, result.stderr)
        error = head.get("error")
        if error == "refused":
            raise UnreachableError(
                f"nothing accepts connections on {self.description}", reason="refused"
            )
        if error == "deadline":
            received = head.get("received")
            received = received if isinstance(received, int) else 0
            raise DeadlineReached(
                deadline_text(method, path, received, timeout),
                received=received,
            )
        if error is not None:
            step = "timeout" if error == "timeout" else "http"
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {head.get('detail')}", step=step
            )
        return HttpReply(
            status=int(head["status"]),
            headers={str(k): str(v) for k, v in dict(head.get("headers") or {}).items()},
            body=data[:max_bytes],
            truncated=len(data) > max_bytes,
        )

    def _no_python(self, status: int, stderr: bytes) -> RemoteStepFailed:
        text = stderr.decode("utf-8", "replace").strip()
        last = text.splitlines()[-1] if text else f"exit status {status}"
        if status in (126, 127):
            return NoProbePython(
                f"{self.transport.description}: no {self.python} to reach the server's port "
                f"on the target ({last}); name one with --python",
                step="access",
            )
        return RemoteStepFailed(
            f"{self.transport.description}: {self.python} cannot make the request: {last[:300]}",
            step="access",
        )
