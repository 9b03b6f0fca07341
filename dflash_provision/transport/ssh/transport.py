"""``SshTransport``: the steps of an SSH connection composed, behaving the way OpenSSH users expect.

1. config (config.py, config_route.py; Include in config_include.py, file caches in
   config_files.py): ``~/.ssh/config`` applied to the host (Host aliases, HostName, User, Port,
   IdentityFile, IdentitiesOnly, UserKnownHostsFile, HostKeyAlias, Include, ProxyJump,
   ProxyCommand), and the way to it resolved as data: a ``Route``.
2. route (route.py): the socket for that route: TCP, a ProxyCommand, or a tunnel through a
   gateway connection shared by every transport going through it (route_pool.py).
3. login (login.py): host key check and authentication over that socket.
4. channel (channel.py): one command with its deadline.

One connection per transport, opened on the first ``run`` and reused; ``close`` ends it. Jump
hosts are the exception: their connections are shared by every transport of the process that
goes through them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence

import paramiko

from dflash_provision.errors import RemoteStepFailed, UnreachableError
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.options import HostRoute, SshOptions
from dflash_provision.transport.ssh.channel import ExecRequestTimeout, run_command
from dflash_provision.transport.ssh.config_route import Route, resolve_route
from dflash_provision.transport.ssh.login import login
from dflash_provision.transport.ssh.login_errors import reason_text
from dflash_provision.transport.ssh.route import open_socket
from dflash_provision.transport.ssh.route_pool import JUMPS, Lease

# paramiko's transport thread logs tracebacks (e.g. a banner timeout) at ERROR; without a handler
# Python prints them on stderr. We turn those failures into one-line errors instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SshTransport(Transport):
    """A Transport over one paramiko connection (plus a lease on a shared gateway connection)."""

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        options: SshOptions | None = None,
        route: HostRoute | None = None,
    ) -> None:
        self.host = host
        self.user = user
        self.port = port
        self.options = options or SshOptions()
        self.route = route  # this host's own key / proxy settings (not its jump hosts')
        self.description = f"{user}@{host}" if user else host
        self._client: paramiko.SSHClient | None = None  # this transport's own: the target
        self._gateway: Lease[list[paramiko.SSHClient]] | None = None  # shared
        self._lock = threading.Lock()
        #: How many SSH connections this transport has opened to the target (tests, metrics).
        self.connections_opened = 0

    @property
    def command_timeout(self) -> float:
        return self.options.command_timeout

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> None:
        self._connected()

    def _connected(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None:
                active = self._client.get_transport()
                if active is not None and active.is_active():
                    return self._client
                self._close_clients()
            route = resolve_route(
                self.host, user=self.user, port=self.port, options=self.options, route=self.route
            )
            self._client = self._connect(route)
            self.connections_opened += 1
            return self._client

    def _connect(self, route: Route) -> paramiko.SSHClient:
        """The target's connection: through its gateway (a connection shared with every
        transport of this process that goes the same way, see route_pool.py), or on its own."""
        if route.gateway is None:
            return login(route.endpoint, open_socket(route, self.options), self.options)
        gateway = route.gateway
        lease = JUMPS.lease((self.options, gateway), lambda: connect_along(gateway, self.options))
        try:
            sock = open_socket(route, self.options, gateway=lease.value[-1])
            client = login(route.endpoint, sock, self.options)
        except BaseException:
            lease.release()
            raise
        self._gateway = lease
        return client

    def close(self) -> None:
        with self._lock:
            self._close_clients()

    def host_key(self) -> str | None:
        active = self._connected().get_transport()
        if active is None:  # closed under us: cannot tell (the caller's next run says why)
            return None
        key = active.get_remote_server_key()
        return f"{key.get_name()} {key.fingerprint}"

    def _close_clients(self) -> None:
        client, self._client = self._client, None
        gateway, self._gateway = self._gateway, None
        try:
            if client is not None:
                # The outcome is decided by now: a connection that breaks while saying goodbye
                # (EOF from a jump host that went away) must not fail the command.
                with contextlib.suppress(Exception):
                    client.close()
        finally:
            if gateway is not None:
                gateway.release()  # the gateway connection closes with its last user

    # -- port forwarding -----------------------------------------------------------------------

    def open_direct_tcpip(self, host: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to ``host:port`` as the target sees it (``ssh -L``'s
        mechanism, on this transport's connection): the port is reached, never exposed.

        UnreachableError(reason="refused") when the target says nothing accepts there.
        """
        transport = self._connected().get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise UnreachableError(
                f"{self.description}: nothing accepts connections on {host}:{port} ({exc.text})",
                reason="refused",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise UnreachableError(
                f"{self.description}: cannot open a forward to {host}:{port}: {reason_text(exc)}",
                reason="network",
            ) from None

    # -- commands -----------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        timeout = self.options.command_timeout if timeout is None else timeout
        client = self._connected()
        try:
            return run_command(
                client,
                argv,
                stdin=stdin,
                timeout=timeout,
                open_timeout=self.options.connect_timeout,
                description=self.description,
            )
        except RemoteStepFailed as exc:
            if exc.step == "connection" or isinstance(exc, ExecRequestTimeout):
                self.close()  # the next run connects again
            raise


def connect_along(route: Route, options: SshOptions) -> list[paramiko.SSHClient]:
    """Connections along ``route``, its own endpoint last: each gateway is connected first (by
    its own route, recursively) and then used to reach the next."""
    if route.gateway is None:
        return [login(route.endpoint, open_socket(route, options), options)]
    clients = connect_along(route.gateway, options)
    try:
        sock = open_socket(route, options, gateway=clients[-1])
        clients.append(login(route.endpoint, sock, options))
    except BaseException:
        for client in reversed(clients):
            client.close()
        raise
    return clients
