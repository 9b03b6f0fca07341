"""Run commands over SSH with paramiko, behaving the way OpenSSH users expect.

What this honours from ``~/.ssh/config`` (via paramiko.SSHConfig): Host aliases, HostName, User,
Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile, HostKeyAlias, Include (ssh_include.py;
paramiko ignores it), ProxyJump (a comma-separated chain of ``[user@]host[:port]`` hops, each
with its own config block; the first hop's own ProxyJump or ProxyCommand is followed, as OpenSSH
does) and ProxyCommand (see ssh_proxy.py). Precedence is OpenSSH's: what the target spec says
(user, port) wins over the config file, which wins over defaults.

One connection per transport, opened on the first ``run`` and reused; ``close`` ends it. Jump
hosts are the exception: their connections are shared by every transport of the process that
goes through them (ssh_jumps.py).

The pieces around it: ssh_endpoint.py applies ~/.ssh/config, ssh_files.py caches the parsed
ssh_config, known_hosts and key files per process (once per version of each file),
ssh_hostkeys.py checks host keys, ssh_errors.py turns paramiko's failures into one-line errors.
ssh_tcp.py opens the TCP connection (name lookup and connect within the connect timeout).

Each ``run`` opens one exec channel, no PTY, runs ``shlex.join(argv)`` in the remote user's
shell, writes stdin then EOF, reads stdout and stderr (one loop) and returns the exit status.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence

import paramiko

from dflash_provision.errors import RemoteStepFailed, UnreachableError, UsageError
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.options import HostRoute, SshOptions
from dflash_provision.transport.ssh_endpoint import Endpoint, parse_jump, resolve_endpoint
from dflash_provision.transport.ssh_errors import (
    handshake_budget,
    handshake_phase,
    map_connect_error,
    reason_text,
)
from dflash_provision.transport.ssh_files import cached_key
from dflash_provision.transport.ssh_hostkeys import AcceptNew, RejectUnknown, add_known_keys
from dflash_provision.transport.ssh_jumps import JUMPS, Lease
from dflash_provision.transport.ssh_proxy import ProxyCommandSocket, expand_proxy_command
from dflash_provision.transport.ssh_tcp import open_tcp
from dflash_provision.transport.ssh_tunnel import TunnelSocket

__all__ = ["SshTransport", "resolve_endpoint"]

# paramiko's transport thread logs tracebacks (e.g. a banner timeout) at ERROR; without a handler
# Python prints them on stderr. We turn those failures into one-line errors instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# OpenSSH has no limit (a loop runs until it runs out of file descriptors); this is plenty.
_MAX_PROXY_DEPTH = 8
_POLL_S = 0.2  # how often blocked channel reads/writes look at the deadline
_CHUNK = 64 * 1024
# Input up to this size is sent before the output is read (the channel window is 2 MiB).
_INLINE_STDIN = 512 * 1024
# OpenSSH's ssh exits 255 when the remote command died by a signal; paramiko drops exit-signal.
_NO_EXIT_STATUS = 255


class SshTransport(Transport):
    """A Transport over one paramiko connection (plus a lease on shared jump-host connections)."""

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
        self._clients: list[paramiko.SSHClient] = []  # this transport's own: the target
        self._jumps: Lease[tuple[list[paramiko.SSHClient], object]] | None = None  # shared
        self._lock = threading.Lock()
        #: How many SSH connections this transport has opened to the target (tests, metrics).
        self.connections_opened = 0

    # -- connection ---------------------------------------------------------------------------

    def _client(self) -> paramiko.SSHClient:
        with self._lock:
            if self._clients:
                active = self._clients[-1].get_transport()
                if active is not None and active.is_active():
                    return self._clients[-1]
                self._close_clients()
            endpoint = resolve_endpoint(
                self.host, user=self.user, port=self.port, options=self.options, route=self.route
            )
            self._clients = [self._connect_target(endpoint)]
            self.connections_opened += 1
            return self._clients[-1]

    def _connect_target(self, endpoint: Endpoint) -> paramiko.SSHClient:
        """The target's connection: through its jump hosts (a connection shared with every
        transport of this process that uses the same ones, see ssh_jumps.py), its
        ProxyCommand, or straight."""
        if not endpoint.proxy_jump:
            return self._connect(endpoint, self._proxy_socket(endpoint))
        lease = JUMPS.lease((self.options, endpoint.proxy_jump), lambda: self._jumps_to(endpoint))
        try:
            jump_clients, via = lease.value
            assert isinstance(via, Endpoint)
            client = self._connect(endpoint, self._tunnel(jump_clients[-1], via, endpoint))
        except BaseException:
            lease.release()
            raise
        self._jumps = lease
        return client

    def _jumps_to(
        self, endpoint: Endpoint, depth: int = 0
    ) -> tuple[list[paramiko.SSHClient], Endpoint]:
        """Connections to ``endpoint``'s jump hosts, the last hop last, and that hop.

        As OpenSSH routes ``ProxyJump a,b``: ``a`` is reached by its own ssh_config (its own
        ProxyJump or ProxyCommand, followed recursively), ``b`` through ``a``, the target
        through ``b``; ``b``'s own proxy settings do not apply.
        """
        if depth >= _MAX_PROXY_DEPTH:
            raise UsageError(
                f"ssh config: more than {_MAX_PROXY_DEPTH} proxy hops before {endpoint.alias}"
                " (a ProxyJump that leads back to itself? exclude the jump host from it)"
            )
        first, *rest = (self._hop(hop, endpoint) for hop in endpoint.proxy_jump)
        clients: list[paramiko.SSHClient] = []
        try:
            if first.proxy_jump:
                clients, via = self._jumps_to(first, depth + 1)
                clients.append(self._connect(first, self._tunnel(clients[-1], via, first)))
            else:
                clients.append(self._connect(first, self._proxy_socket(first)))
            via = first
            for hop in rest:
                clients.append(self._connect(hop, self._tunnel(clients[-1], via, hop)))
                via = hop
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        return clients, via

    def _proxy_socket(self, endpoint: Endpoint) -> ProxyCommandSocket | None:
        if endpoint.proxy_command is None:
            return None  # _connect opens the TCP connection
        return ProxyCommandSocket(
            expand_proxy_command(
                endpoint.proxy_command,
                hostname=endpoint.hostname,
                port=endpoint.port,
                user=endpoint.user,
                alias=endpoint.alias,
            )
        )

    def _hop(self, hop: str, target: Endpoint) -> Endpoint:
        host, user, port = parse_jump(hop, target)
        return resolve_endpoint(host, user=user, port=port, options=self.options)

    def _tunnel(self, jump: paramiko.SSHClient, via: Endpoint, dest: Endpoint) -> TunnelSocket:
        transport = jump.get_transport()
        assert transport is not None
        try:
            channel = transport.open_channel(
                "direct-tcpip",
                (dest.hostname, dest.port),
                ("127.0.0.1", 0),
                timeout=self.options.connect_timeout,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise UnreachableError(
                f"cannot reach {dest.label} through jump host {via.label}: {reason_text(exc)}",
                reason="network",
            ) from None
        return TunnelSocket(channel)

    def _connect(
        self,
        endpoint: Endpoint,
        sock: socket.socket | TunnelSocket | ProxyCommandSocket | None,
    ) -> paramiko.SSHClient:
        opts = self.options
        if sock is None:
            where = f"{endpoint.alias} ({endpoint.hostname} port {endpoint.port})"
            sock = open_tcp(endpoint.hostname, endpoint.port, opts.connect_timeout, where)
        client = paramiko.SSHClient()
        try:
            add_known_keys(client, endpoint)
            client.set_missing_host_key_policy(
                AcceptNew(endpoint.known_hosts_path)
                if opts.host_key_policy == "accept-new"
                else RejectUnknown()
            )
            use_agent = opts.use_agent and not endpoint.identities_only
            # The first key, parsed once per process; paramiko tries it before the other files
            # (which it only loads if this one is refused), then the agent: the same order.
            key_files = list(endpoint.identity_files)
            first_key = cached_key(key_files[0]) if key_files else None
            if first_key is not None:
                key_files = key_files[1:]
            # With our own socket, paramiko uses the host and port only to look the host key up.
            key_host, key_port = endpoint.host_key_lookup
            client.connect(
                key_host,
                port=key_port,
                username=endpoint.user,
                sock=sock,
                # With our own socket, paramiko uses ``timeout`` only as start_client()'s wait
                # for the whole handshake (banner + key exchange), and when it runs out it
                # returns WITHOUT an error. Equal to the banner timeout, it races it; longer,
                # the banner timeout always fires first for a silent host.
                timeout=handshake_budget(opts),
                transport_factory=_transport_factory(opts),
                banner_timeout=opts.banner_timeout,
                auth_timeout=opts.auth_timeout,
                channel_timeout=opts.connect_timeout,
                pkey=first_key,
                key_filename=key_files or None,
                allow_agent=use_agent,
                look_for_keys=False,
            )
        except BaseException as exc:
            phase = handshake_phase(client)  # read before close() tears the transport down
            proxy_failure = sock.failure() if isinstance(sock, ProxyCommandSocket) else None
            client.close()
            sock.close()
            if proxy_failure is not None:
                raise UnreachableError(
                    f"cannot reach {endpoint.label}: {proxy_failure}", reason="network"
                ) from None
            raise map_connect_error(exc, endpoint, opts, phase) from None
        return client

    def close(self) -> None:
        with self._lock:
            self._close_clients()

    def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        jumps, self._jumps = self._jumps, None
        try:
            for client in reversed(clients):
                # The outcome is decided by now: a connection that breaks while saying goodbye
                # (EOF from a jump host that went away) must not fail the command.
                with contextlib.suppress(Exception):
                    client.close()
        finally:
            if jumps is not None:
                jumps.release()  # the jump connection closes with its last user

    # -- port forwarding -----------------------------------------------------------------------

    def open_direct_tcpip(self, host: str, port: int, timeout: float) -> paramiko.Channel:
        """A direct-tcpip channel to ``host:port`` as the target sees it (``ssh -L``'s
        mechanism, on this transport's connection): the port is reached, never exposed.

        UnreachableError(reason="refused") when the target says nothing accepts there.
        """
        transport = self._client().get_transport()
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
        client = self._client()
        started = time.monotonic()
        deadline = started + timeout
        transport = client.get_transport()
        assert transport is not None
        try:
            channel = transport.open_session(timeout=self.options.connect_timeout)
            channel.settimeout(_POLL_S)
            channel.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise RemoteStepFailed(
                f"{self.description}: could not start a command: {reason_text(exc)}",
                step="connection",
            ) from None
        try:
            return self._exchange(channel, stdin, started, deadline, timeout, argv)
        finally:
            channel.close()

    def _exchange(
        self,
        channel: paramiko.Channel,
        stdin: bytes | None,
        started: float,
        deadline: float,
        timeout: float,
        argv: Sequence[str],
    ) -> CommandResult:
        # One thread reads both streams (stderr whenever some has arrived, so a chatty command
        # can never fill the channel window and stall). Input that fits well inside the window
        # is sent before reading, from this thread; only a bigger one gets a writer thread, so
        # the command's output can flow while it is still being sent. Threads cost more of the
        # controller's CPU per exec than a config-sized command does in total.
        stdout_chunks: list[bytes] = []
        stderr_chunks: list[bytes] = []
        writer_error: list[BaseException] = []
        writer: threading.Thread | None = None
        data = stdin or b""
        if len(data) <= _INLINE_STDIN:
            _write_stdin(channel, data, deadline, writer_error)
        else:
            writer = threading.Thread(
                target=_write_stdin, args=(channel, data, deadline, writer_error), daemon=True
            )
            writer.start()
        stdout_done = stderr_done = False
        while not (stdout_done and stderr_done) and time.monotonic() < deadline:
            if not stderr_done and (stdout_done or channel.recv_stderr_ready()):
                stderr_done = _read_some(channel.recv_stderr, stderr_chunks)
            if not stdout_done:
                stdout_done = _read_some(channel.recv, stdout_chunks)
        finished = channel.status_event.wait(max(0.0, deadline - time.monotonic()))
        if not finished or not (stdout_done and stderr_done):
            channel.close()  # unblocks the writer; the remote command gets SIGHUP-like EOF
            raise RemoteStepFailed(
                f"{self.description}: command {argv[0]!r} did not finish within {timeout:g} s",
                step="timeout",
            )
        if writer is not None:
            writer.join(1.0)
        stdout, stderr = b"".join(stdout_chunks), b"".join(stderr_chunks)
        if not channel.exit_status_ready() or channel.exit_status < 0:
            live = channel.get_transport()
            if live is None or not live.is_active():
                self.close()
                raise RemoteStepFailed(
                    f"connection to {self.description} was lost during {argv[0]!r}",
                    step="connection",
                )
            return CommandResult(
                _NO_EXIT_STATUS,
                stdout,
                stderr + b"\n[remote command ended without an exit status (killed by a signal?)]\n",
                time.monotonic() - started,
            )
        return CommandResult(channel.exit_status, stdout, stderr, time.monotonic() - started)


def _write_stdin(
    channel: paramiko.Channel, data: bytes, deadline: float, errors: list[BaseException]
) -> None:
    view = memoryview(data)
    try:
        while view and time.monotonic() < deadline:
            try:
                sent = channel.send(view[:_CHUNK])
            except TimeoutError:
                continue
            if sent <= 0:
                return  # channel closed: the command stopped reading; its exit status says why
            view = view[sent:]
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        errors.append(exc)


def _read_some(recv: Callable[[int], bytes], chunks: list[bytes]) -> bool:
    """One read from a channel stream (channel.recv or recv_stderr, which wait at most the
    channel's poll timeout); True at end of stream."""
    try:
        chunk = recv(_CHUNK)
    except TimeoutError:
        return False
    if not chunk:
        return True
    chunks.append(chunk)
    return False


def _transport_factory(opts: SshOptions) -> Callable[..., paramiko.Transport]:
    def make(sock: object, **kwargs: object) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)  # type: ignore[arg-type]
        # paramiko's own key-exchange limit (15 s, counted from the banner) must not end before
        # start_client()'s wait, or a stalled key exchange surfaces as a bare EOFError.
        transport.handshake_timeout = handshake_budget(opts) + 1.0
        return transport

    return make
