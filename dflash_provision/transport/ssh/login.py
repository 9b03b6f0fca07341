"""Step 3, login: the SSH handshake over a socket, host key check and authentication.

Host keys (login_hostkeys.py): known_hosts entries, unknown hosts refused unless the policy is
accept-new, a changed key always refused. Keys: the first identity file parsed once per process,
then paramiko's own loading of the others, then the agent (OpenSSH's order). Failures become
one-line errors that name the cause (login_errors.py).
"""

from __future__ import annotations

from collections.abc import Callable

import paramiko

from dflash_provision.errors import UnreachableError
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh.config import Endpoint
from dflash_provision.transport.ssh.config_files import cached_key
from dflash_provision.transport.ssh.login_errors import (
    handshake_budget,
    handshake_phase,
    map_connect_error,
)
from dflash_provision.transport.ssh.login_hostkeys import AcceptNew, RejectUnknown, add_known_keys
from dflash_provision.transport.ssh.route import Sock
from dflash_provision.transport.ssh.route_proxy import ProxyCommandSocket


def login(endpoint: Endpoint, sock: Sock, opts: SshOptions) -> paramiko.SSHClient:
    """An authenticated connection to ``endpoint`` over ``sock`` (closed on failure)."""
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
            sock=sock,  # type: ignore[arg-type]  # paramiko accepts any socket-like object
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
            key_filename=key_files or None,  # type: ignore[arg-type]  # paramiko takes a list
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


def _transport_factory(opts: SshOptions) -> Callable[..., paramiko.Transport]:
    def make(sock: object, **kwargs: object) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)  # type: ignore[arg-type]
        # paramiko's own key-exchange limit (15 s, counted from the banner) must not end before
        # start_client()'s wait, or a stalled key exchange surfaces as a bare EOFError.
        transport.handshake_timeout = handshake_budget(opts) + 1.0
        return transport

    return make
