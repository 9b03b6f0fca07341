"""Step 2, route: the socket an SSH session runs over, for each kind of ``Route``.

Straight: a TCP connection of our own (route_tcp.py). ProxyCommand: a local command's stdin and
stdout (route_proxy.py). Gateway: a ``direct-tcpip`` channel of the gateway's connection
(route_tunnel.py); the gateway connections themselves are shared by every transport of the
process that goes through them (route_pool.py).
"""

from __future__ import annotations

import socket

import paramiko

from dflash_provision.errors import UnreachableError
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh.config_route import Route
from dflash_provision.transport.ssh.login_errors import reason_text
from dflash_provision.transport.ssh.route_proxy import ProxyCommandSocket
from dflash_provision.transport.ssh.route_tcp import open_tcp
from dflash_provision.transport.ssh.route_tunnel import TunnelSocket

#: Everything paramiko.Transport can run over here.
Sock = socket.socket | TunnelSocket | ProxyCommandSocket


def open_socket(
    route: Route, options: SshOptions, gateway: paramiko.SSHClient | None = None
) -> Sock:
    """The socket to ``route.endpoint``; ``gateway`` is the connection to ``route.gateway``
    (required exactly when the route has one)."""
    endpoint = route.endpoint
    if route.gateway is not None:
        assert gateway is not None
        return _tunnel(gateway, route.gateway, route, options)
    if route.proxy_command is not None:
        return ProxyCommandSocket(route.proxy_command)
    where = f"{endpoint.alias} ({endpoint.hostname} port {endpoint.port})"
    return open_tcp(endpoint.hostname, endpoint.port, options.connect_timeout, where)


def _tunnel(
    gateway: paramiko.SSHClient, via: Route, dest: Route, options: SshOptions
) -> TunnelSocket:
    transport = gateway.get_transport()
    assert transport is not None
    try:
        channel = transport.open_channel(
            "direct-tcpip",
            (dest.endpoint.hostname, dest.endpoint.port),
            ("127.0.0.1", 0),
            timeout=options.connect_timeout,
        )
    except (paramiko.SSHException, OSError) as exc:
        raise UnreachableError(
            f"cannot reach {dest.endpoint.label} through jump host {via.endpoint.label}:"
            f" {reason_text(exc)}",
            reason="network",
        ) from None
    return TunnelSocket(channel)
