"""Reach the server's port through the target's own transport, without exposing it.

- SSH host: an SSH direct-tcpip channel on the existing connection (what ``ssh -L`` does), one
  per request; the server keeps listening on 127.0.0.1 only.
- Container (lxc/pct/incus/lxd, locally or behind SSH): it may have no routable address (the
  test bed's have only a loopback), so the request is made INSIDE it by its Python (the one that
  runs vLLM is a good choice: ``python=``) with a short stdlib program passed as an argument;
  the reply comes back bounded.
- This machine: plain HTTP to 127.0.0.1.

``open_server(transport, port)`` picks the way; ``request`` raises UnreachableError with
reason "refused" when nothing accepts on the port yet (readiness polls on that), and returns
every HTTP status, 5xx included, as an HttpReply.
"""

from __future__ import annotations

import abc
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import RemoteStepFailed, UnreachableError
from dflash_provision.transport.base import Transport

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
    from dflash_provision.transport.container import ContainerTransport
    from dflash_provision.transport.local import LocalTransport

    layers = list(_layers(transport))
    if any(isinstance(layer, ContainerTransport) for layer in layers):
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
        result = transport.run([access.python, "-c", "import urllib.request"], timeout=timeout)
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


def _exchange(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    max_bytes: int,
) -> HttpReply:
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read(max_bytes + 1)
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
        conn = http.client.HTTPConnection(SERVER_HOST, self.port, timeout=timeout)
        try:
            return _exchange(conn, method, path, body, _headers(body, headers), max_bytes)
        except ConnectionRefusedError:
            raise UnreachableError(
                f"nothing accepts connections on {self.description}", reason="refused"
            ) from None
        except TimeoutError:
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: no reply within {timeout:g} s",
                step="timeout",
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {exc}", step="http"
            ) from None
        finally:
            conn.close()


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
        channel = self.ssh.open_direct_tcpip(SERVER_HOST, self.port, timeout)
        channel.settimeout(timeout)
        conn = http.client.HTTPConnection(SERVER_HOST, self.port, timeout=timeout)
        conn.sock = _HeldChannel(channel)
        try:
            return _exchange(conn, method, path, body, _headers(body, headers), max_bytes)
        except TimeoutError:
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: no reply within {timeout:g} s",
                step="timeout",
            ) from None
        except (OSError, EOFError, http.client.HTTPException) as exc:
            # The server closing a forwarded connection before answering is how a port that
            # listens but is not serving yet looks from here.
            raise RemoteStepFailed(
                f"{method} {path} on {self.description}: {exc or type(exc).__name__}",
                step="http",
            ) from None
        finally:
            conn.close()
            channel.close()


class _HeldChannel:
    """The channel as http.client sees it (sendall, makefile), except that its close() does
    nothing: on a "Connection: close" reply getresponse() closes its socket before the body is
    read, which a real socket survives (makefile holds it open) but a paramiko channel does
    not: the rest of the body was lost (seen with real vLLM's ~60 KB /metrics; found by the
    real-vLLM tier). The request closes the channel itself once the body is read."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def sendall(self, data: bytes) -> None:
        self._channel.sendall(data)

    def makefile(self, *args: Any) -> Any:
        return self._channel.makefile(*args)

    def close(self) -> None:
        pass


# Runs inside the container: argv METHOD URL TIMEOUT MAX_BYTES, body on stdin (may be empty).
# Prints one JSON line (status, headers, or error), then the body bytes (at most MAX_BYTES+1).
CONTAINER_PROGRAM = r"""
import json, sys, urllib.request, urllib.error
method, url, timeout, limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
body = sys.stdin.buffer.read(16 * 1024 * 1024) or None
req = urllib.request.Request(url, data=body, method=method)
req.add_header("Connection", "close")
if body is not None:
    req.add_header("Content-Type", "application/json")
out = sys.stdout.buffer
try:
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        resp = err
    data = resp.read(limit + 1)
    head = {"status": resp.status, "headers": {k.lower(): v for k, v in resp.headers.items()}}
except urllib.error.URLError as err:
    reason = err.reason
    refused = isinstance(reason, ConnectionRefusedError)
    head, data = {"error": "refused" if refused else "error", "detail": str(reason)}, b""
except Exception as err:
    kind = "timeout" if "timed out" in str(err) else "error"
    head, data = {"error": kind, "detail": f"{type(err).__name__}: {err}"}, b""
out.write(json.dumps(head).encode() + b"\n" + data)
"""


@dataclass
class ContainerAccess(ServerAccess):
    """Requests made inside the container by its own Python (stdlib urllib)."""

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
        url = f"http://{SERVER_HOST}:{self.port}{path}"
        argv = [self.python, "-c", CONTAINER_PROGRAM, method, url, f"{timeout:g}", str(max_bytes)]
        result = self.transport.run(argv, stdin=body or b"", timeout=timeout + 30.0)
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
            return RemoteStepFailed(
                f"{self.transport.description}: no {self.python} to reach the server's port "
                f"inside the container ({last}); name one with --python",
                step="access",
            )
        return RemoteStepFailed(
            f"{self.transport.description}: {self.python} cannot make the request: {last[:300]}",
            step="access",
        )
