"""Run commands over SSH with paramiko, behaving the way OpenSSH users expect.

What this honours from ``~/.ssh/config`` (via paramiko.SSHConfig): Host aliases, HostName, User,
Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile and ProxyJump (a comma-separated chain of
``[user@]host[:port]`` hops; each hop gets its own config block, but a hop's own ProxyJump is not
followed). ProxyCommand is not supported. Precedence is OpenSSH's: what the target spec says
(user, port) wins over the config file, which wins over defaults.

One connection per transport, opened on the first ``run`` and reused; ``close`` ends it.

Per process, the ssh_config file (and each host's lookup in it), known_hosts files and private
keys are parsed once per version of the file (see _FileCache): a fleet of N hosts would otherwise
re-parse them N times (known_hosts parsing is quadratic in its length in paramiko). A file that
changes (an edit, an accept-new append) is read again by the next connection. TCP_NODELAY is set
on every connection (see _tcp_connect).

Each ``run`` opens one exec channel, no PTY, runs ``shlex.join(argv)`` in the remote user's
shell, writes stdin then EOF, drains stdout and stderr concurrently and returns the exit status.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import paramiko

from dflash_provision.errors import AuthError, RemoteStepFailed, UnreachableError, UsageError
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.options import SshOptions, default_known_hosts_path

# paramiko's transport thread logs tracebacks (e.g. a banner timeout) at ERROR; without a handler
# Python prints them on stderr. We turn those failures into one-line errors instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
_POLL_S = 0.2  # how often blocked channel reads/writes look at the deadline
_CHUNK = 64 * 1024
# Input up to this size is sent before the output is read (the channel window is 2 MiB).
_INLINE_STDIN = 512 * 1024
# OpenSSH's ssh exits 255 when the remote command died by a signal; paramiko drops exit-signal.
_NO_EXIT_STATUS = 255


@dataclass(frozen=True)
class Endpoint:
    """One SSH server after applying ssh_config: where to connect and as whom."""

    alias: str  # what the user typed, for messages
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts_path: str
    proxy_jump: tuple[str, ...]

    @property
    def label(self) -> str:
        where = self.hostname if self.hostname == self.alias else f"{self.alias} ({self.hostname})"
        return f"{self.user}@{where} port {self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is filed under, as OpenSSH writes it."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_endpoint(
    host: str, *, user: str | None, port: int | None, options: SshOptions
) -> Endpoint:
    """Apply the ssh_config file to ``host`` (an alias or a real name)."""
    entry: dict[str, object] = {}
    if options.ssh_config_path and os.path.isfile(options.ssh_config_path):
        try:
            entry = _SSH_CONFIGS.get(options.ssh_config_path).lookup(host)
        except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
            raise UsageError(f"cannot read ssh config {options.ssh_config_path}: {exc}") from None
    hostname = str(entry.get("hostname") or host)
    config_port = str(entry.get("port") or "22")
    if port is None and not config_port.isdigit():
        raise UsageError(f"ssh config: bad Port {config_port!r} for {host}")
    resolved_port = port if port is not None else int(config_port)
    resolved_user = user or str(entry.get("user") or "") or getpass.getuser()
    identities_only = (
        options.identities_only or str(entry.get("identitiesonly", "")).lower() == "yes"
    )
    raw_keys = cast("list[str]", entry.get("identityfile") or [])  # paramiko gives a list
    config_keys = [os.path.expanduser(p) for p in raw_keys]
    keys = [os.path.expanduser(p) for p in options.identity_files] + config_keys
    if not identities_only:
        keys += [os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEY_NAMES]
    existing = tuple(dict.fromkeys(k for k in keys if os.path.isfile(k)))
    known_hosts = options.known_hosts_path
    if known_hosts is None:
        config_known = str(entry.get("userknownhostsfile") or "").split()
        known_hosts = (
            os.path.expanduser(config_known[0]) if config_known else default_known_hosts_path()
        )
    jump = str(entry.get("proxyjump") or "")
    hops = (
        ()
        if jump.lower() in ("", "none")
        else tuple(h.strip() for h in jump.split(",") if h.strip())
    )
    return Endpoint(
        alias=host,
        hostname=hostname,
        port=resolved_port,
        user=resolved_user,
        identity_files=existing,
        identities_only=identities_only,
        known_hosts_path=known_hosts,
        proxy_jump=hops,
    )


# -- per-process caches of the files every connection reads ------------------------------------

_T = TypeVar("_T")
_Stamp = bytes | None


def _stamp(path: str) -> _Stamp:
    """What identifies one version of a file: the sha256 of its bytes (None when it does not
    exist). Reading and hashing a few kilobytes costs microseconds; parsing is what costs. Unlike
    size + mtime, a digest cannot miss an in-place rewrite of the same length within one clock
    tick (known_hosts lines for one key type all have the same length)."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).digest()
    except FileNotFoundError:
        return None


class _FileCache(Generic[_T]):
    """``parse(path)`` once per version of the file(s) it depends on, shared by all threads.

    ``depends(path)`` lists the files whose versions decide the value (default: ``path``).
    Parsing happens under the lock so a fleet's first N connections do not all parse at once;
    the stamp is taken before parsing, so a file that changes meanwhile is parsed again next time
    (a file whose bytes change in between is parsed at least as new as its stamp).
    """

    def __init__(
        self,
        parse: Callable[[str], _T],
        depends: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        self._parse = parse
        self._depends = depends or (lambda path: (path,))
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[tuple[_Stamp, ...], _T]] = {}

    def get(self, path: str) -> _T:
        stamps = tuple(_stamp(p) for p in self._depends(path))
        with self._lock:
            hit = self._entries.get(path)
            if hit is not None and hit[0] == stamps:
                return hit[1]
            value = self._parse(path)
            self._entries[path] = (stamps, value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class _ParsedSshConfig:
    """One ssh_config file, with each host's lookup remembered (a config with one block per host
    makes every lookup walk the whole file)."""

    def __init__(self, path: str) -> None:
        self._config = paramiko.SSHConfig.from_path(path)
        self._lock = threading.Lock()
        self._lookups: dict[str, dict[str, object]] = {}

    def lookup(self, host: str) -> dict[str, object]:
        with self._lock:
            entry = self._lookups.get(host)
            if entry is None:
                entry = dict(self._config.lookup(host))
                self._lookups[host] = entry
        # A copy with copied lists: callers may not change what other threads read.
        return {k: list(v) if isinstance(v, list) else v for k, v in entry.items()}


def _load_private_key(path: str) -> paramiko.PKey | None:
    """The key (with its ``-cert.pub`` certificate, as paramiko loads it), or None when it cannot
    be loaded without a passphrase or is of an unknown type: paramiko then tries the file itself,
    as before, and reports what is wrong with it."""
    try:
        return paramiko.PKey.from_path(path)
    except (OSError, ValueError, TypeError, paramiko.SSHException):
        return None


_SSH_CONFIGS: _FileCache[_ParsedSshConfig] = _FileCache(_ParsedSshConfig)
_KNOWN_HOSTS: _FileCache[paramiko.HostKeys] = _FileCache(paramiko.HostKeys)
_PRIVATE_KEYS: _FileCache[paramiko.PKey | None] = _FileCache(
    _load_private_key, depends=lambda path: (path, path + "-cert.pub")
)


def _cached_key(path: str) -> paramiko.PKey | None:
    try:
        return _PRIVATE_KEYS.get(path)
    except OSError:
        return None  # unreadable: paramiko tries the file and reports it as before


def clear_caches() -> None:
    """Forget every parsed ssh_config, known_hosts and key file (tests)."""
    for cache in (_SSH_CONFIGS, _KNOWN_HOSTS, _PRIVATE_KEYS):
        cache.clear()


def _add_known_keys(client: paramiko.SSHClient, endpoint: Endpoint) -> None:
    """Give ``client`` the known_hosts keys filed for this endpoint (paramiko's own check then
    compares them with the server's key exactly as after load_host_keys)."""
    if not os.path.isfile(endpoint.known_hosts_path):
        return
    name = endpoint.known_hosts_name
    found = _KNOWN_HOSTS.get(endpoint.known_hosts_path).lookup(name)
    if found:
        keys = client.get_host_keys()
        for key_type, key in found.items():
            keys.add(name, key_type, key)


def parse_jump(hop: str, endpoint: Endpoint) -> tuple[str, str | None, int | None]:
    """``[user@]host[:port]`` (host may be ``[v6]``) -> (host, user, port)."""
    user, _, rest = hop.rpartition("@")
    port_text = ""
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port_text = tail[1:]
    else:
        host, _, port_text = rest.partition(":")
    if not host or (port_text and not port_text.isdigit()):
        raise UsageError(f"ssh config: bad ProxyJump hop {hop!r} for {endpoint.alias}")
    return host, user or None, int(port_text) if port_text else None


class _UnknownHostKey(paramiko.SSHException):
    pass


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise _UnknownHostKey(hostname)


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Record an unknown host's key by appending one line to known_hosts (OpenSSH accept-new).

    Appending (rather than paramiko's save_host_keys rewrite) keeps the user's comments, hashed
    entries and markers intact.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="ascii") as handle:
            handle.write(line)


class SshTransport(Transport):
    """A Transport over one paramiko connection (plus jump-host connections, if any)."""

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        options: SshOptions | None = None,
    ) -> None:
        self.host = host
        self.user = user
        self.port = port
        self.options = options or SshOptions()
        self.description = f"{user}@{host}" if user else host
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the target last
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
                self.host, user=self.user, port=self.port, options=self.options
            )
            self._clients = self._connect_chain(endpoint)
            self.connections_opened += 1
            return self._clients[-1]

    def _connect_chain(self, endpoint: Endpoint) -> list[paramiko.SSHClient]:
        clients: list[paramiko.SSHClient] = []
        try:
            sock: socket.socket | paramiko.Channel | None = None
            via: Endpoint | None = None
            for hop in endpoint.proxy_jump:
                hop_host, hop_user, hop_port = parse_jump(hop, endpoint)
                hop_endpoint = resolve_endpoint(
                    hop_host, user=hop_user, port=hop_port, options=self.options
                )
                if via is not None:
                    sock = self._tunnel(clients[-1], via, hop_endpoint)
                clients.append(self._connect(hop_endpoint, sock))
                via = hop_endpoint
            if clients and via is not None:
                sock = self._tunnel(clients[-1], via, endpoint)
            clients.append(self._connect(endpoint, sock))
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        return clients

    def _tunnel(self, jump: paramiko.SSHClient, via: Endpoint, dest: Endpoint) -> paramiko.Channel:
        transport = jump.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip",
                (dest.hostname, dest.port),
                ("127.0.0.1", 0),
                timeout=self.options.connect_timeout,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise UnreachableError(
                f"cannot reach {dest.label} through jump host {via.label}: {_reason(exc)}",
                reason="network",
            ) from None

    def _connect(
        self, endpoint: Endpoint, sock: socket.socket | paramiko.Channel | None
    ) -> paramiko.SSHClient:
        opts = self.options
        if sock is None:
            sock = _tcp_connect(endpoint, opts.connect_timeout)
        client = paramiko.SSHClient()
        try:
            _add_known_keys(client, endpoint)
            client.set_missing_host_key_policy(
                _AcceptNew(endpoint.known_hosts_path)
                if opts.host_key_policy == "accept-new"
                else _RejectUnknown()
            )
            use_agent = opts.use_agent and not endpoint.identities_only
            # The first key, parsed once per process; paramiko tries it before the other files
            # (which it only loads if this one is refused), then the agent: the same order.
            key_files = list(endpoint.identity_files)
            first_key = _cached_key(key_files[0]) if key_files else None
            if first_key is not None:
                key_files = key_files[1:]
            client.connect(
                endpoint.hostname,
                port=endpoint.port,
                username=endpoint.user,
                sock=sock,
                # With our own socket, paramiko uses ``timeout`` only as start_client()'s wait
                # for the whole handshake (banner + key exchange), and when it runs out it
                # returns WITHOUT an error. Equal to the banner timeout, it races it; longer,
                # the banner timeout always fires first for a silent host.
                timeout=_handshake_budget(opts),
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
            phase = _handshake_phase(client)  # read before close() tears the transport down
            client.close()
            sock.close()
            raise _map_connect_error(exc, endpoint, opts, phase) from None
        return client

    def close(self) -> None:
        with self._lock:
            self._close_clients()

    def _close_clients(self) -> None:
        for client in reversed(self._clients):
            client.close()
        self._clients = []

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
                f"{self.description}: could not start a command: {_reason(exc)}", step="connection"
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


def _tcp_connect(endpoint: Endpoint, timeout: float) -> socket.socket:
    where = f"{endpoint.alias} ({endpoint.hostname} port {endpoint.port})"
    try:
        sock = socket.create_connection((endpoint.hostname, endpoint.port), timeout=timeout)
    except socket.gaierror as exc:
        raise UnreachableError(
            f"cannot resolve host {endpoint.hostname!r}: {exc.strerror}", reason="network"
        ) from None
    except TimeoutError:
        raise UnreachableError(
            f"connecting to {where} timed out after {timeout:g}s (tcp connect)", reason="timeout"
        ) from None
    except ConnectionRefusedError:
        raise UnreachableError(f"connection to {where} refused", reason="refused") from None
    except OSError as exc:
        raise UnreachableError(
            f"cannot connect to {where}: {exc.strerror or exc}", reason="network"
        ) from None
    # SSH packets are small and each exec waits for the answer to the last one: without
    # TCP_NODELAY, Nagle's algorithm holds a packet back until the peer's delayed ACK (~40 ms)
    # on every request/response turn (channel open, exec, EOF), per command.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _handshake_budget(opts: SshOptions) -> float:
    """How long start_client() may wait: the banner timeout, then connect_timeout for the key
    exchange (paramiko's only other limit on it is a fixed 15 s, see _transport_factory)."""
    return opts.banner_timeout + opts.connect_timeout


def _transport_factory(opts: SshOptions) -> Callable[..., paramiko.Transport]:
    def make(sock: socket.socket | paramiko.Channel, **kwargs: object) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)  # type: ignore[arg-type]
        # paramiko's own key-exchange limit (15 s, counted from the banner) must not end before
        # start_client()'s wait, or a stalled key exchange surfaces as a bare EOFError.
        transport.handshake_timeout = _handshake_budget(opts) + 1.0
        return transport

    return make


def _handshake_phase(client: paramiko.SSHClient) -> str | None:
    """Where the SSH handshake stopped: "banner", "key exchange", or None (it completed, or
    never started)."""
    transport = client.get_transport()
    if transport is None or transport.initial_kex_done:
        return None
    return "key exchange" if transport.remote_version else "banner"


def _handshake_timeout(exc: BaseException, phase: str | None, opts: SshOptions) -> float | None:
    """Seconds after which the handshake gave up, when ``exc`` means it timed out (else None).

    Two shapes, depending on which timer fires first: paramiko's transport thread raises
    "Error reading SSH protocol banner" caused by a socket timeout; or start_client() stops
    waiting silently and the next call fails with "No existing session".
    """
    if phase is None or not isinstance(exc, paramiko.SSHException):
        return None
    if "No existing session" in str(exc):
        return _handshake_budget(opts)  # start_client()'s own wait ran out
    if "protocol banner" in str(exc) and (
        isinstance(exc.__context__, TimeoutError) or "timed out" in str(exc).lower()
    ):
        return opts.banner_timeout
    return None


def _host_key_name(endpoint: Endpoint) -> str:
    """The host as the user typed it plus the name its key is filed under, e.g.
    "h01 (127.0.1.1)"; just the latter when they are the same."""
    filed = endpoint.known_hosts_name
    return filed if endpoint.alias in (filed, endpoint.hostname) else f"{endpoint.alias} ({filed})"


def _map_connect_error(
    exc: BaseException, endpoint: Endpoint, opts: SshOptions, phase: str | None = None
) -> BaseException:
    label = endpoint.label
    if isinstance(exc, _UnknownHostKey):
        return AuthError(
            f"host key for {_host_key_name(endpoint)} is unknown; add it to "
            f"{endpoint.known_hosts_path} or use --accept-new-host-key",
            reason="host-key-unknown",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return AuthError(
            f"host key for {_host_key_name(endpoint)} has CHANGED (known_hosts "
            f"{endpoint.known_hosts_path} has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint}, the server sent {exc.key.fingerprint}); refusing to "
            "connect. If the change is expected, remove the old key with "
            f"ssh-keygen -R {shlex.quote(endpoint.known_hosts_name)} -f "
            f"{shlex.quote(endpoint.known_hosts_path)}",
            reason="host-key-changed",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        if "timeout" in str(exc).lower():
            return UnreachableError(
                f"ssh to {label} timed out after {opts.auth_timeout:g}s (auth)", reason="timeout"
            )
        tried = ", ".join(endpoint.identity_files) or "no key files"
        agent = " and the ssh agent" if opts.use_agent and not endpoint.identities_only else ""
        return AuthError(
            f"authentication to {label} failed (tried {tried}{agent}); check the key (-i KEY), "
            f"the user, and authorized_keys on {endpoint.alias}",
            reason="auth",
        )
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        # paramiko's words when it had no key at all to offer (no -i, no default key, no agent).
        return AuthError(
            f"no SSH key to log in to {label} with: give one with -i KEY or IdentityFile, put "
            "one in ~/.ssh (id_ed25519, id_ecdsa, id_rsa), or load it into ssh-agent",
            reason="auth",
        )
    waited = _handshake_timeout(exc, phase, opts)
    if waited is not None:
        return UnreachableError(
            f"ssh to {label} timed out after {waited:g}s ({phase})", reason="timeout"
        )
    if isinstance(exc, paramiko.SSHException) and "protocol banner" in str(exc):
        return UnreachableError(f"ssh to {label}: no SSH banner ({_reason(exc)})", reason="network")
    if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
        return UnreachableError(
            f"ssh handshake with {label} failed: {_reason(exc)}", reason="network"
        )
    return exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
