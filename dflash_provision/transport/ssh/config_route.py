"""Step 1, config: how a host is reached, as data. A ``Route`` is an endpoint plus the way to it:
straight over TCP, through a ProxyCommand, or through a gateway, which is itself a ``Route``
(a jump host is a connection used as a gateway: one recursive idea for every hop).

As OpenSSH routes ``ProxyJump a,b``: ``a`` is reached by its own ssh_config (its own ProxyJump
or ProxyCommand, followed recursively), ``b`` through ``a``, the target through ``b``; ``b``'s
own proxy settings do not apply.

ProxyCommand's ``%`` tokens are expanded as OpenSSH does (``%h`` host name after HostName, ``%p``
port, ``%r`` remote user, ``%n`` the name as typed, ``%u`` local user, ``%d`` local home, ``%%``
a percent sign). OpenSSH puts the values in unquoted; so does this, but only values made of
characters that mean nothing to a shell (a host name, a user name, a port): anything else is
refused rather than run.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass

from dflash_provision.errors import UsageError
from dflash_provision.transport.options import HostRoute, SshOptions
from dflash_provision.transport.ssh.config import Endpoint, resolve_endpoint

# OpenSSH has no limit (a loop runs until it runs out of file descriptors); this is plenty.
MAX_PROXY_DEPTH = 8
_TOKEN = re.compile(r"%(.)")
_SHELL_NEUTRAL = re.compile(r"[A-Za-z0-9._:@\[\]/+=,-]+")


@dataclass(frozen=True)
class Route:
    """``endpoint`` and the way to it: ``gateway`` (the connection to tunnel through), else
    ``proxy_command`` (expanded, run locally), else a TCP connection of our own."""

    endpoint: Endpoint
    proxy_command: str | None = None
    gateway: Route | None = None

    @property
    def kind(self) -> str:
        if self.gateway is not None:
            return "gateway"
        return "proxy-command" if self.proxy_command is not None else "direct"


def resolve_route(
    host: str,
    *,
    user: str | None,
    port: int | None,
    options: SshOptions,
    route: HostRoute | None = None,
) -> Route:
    """The route to ``host`` after ssh_config (``route``: the host's own settings, which win)."""
    endpoint = resolve_endpoint(host, user=user, port=port, options=options, route=route)
    return _route_to(endpoint, options, depth=0)


def _route_to(endpoint: Endpoint, options: SshOptions, depth: int) -> Route:
    if not endpoint.proxy_jump:
        return Route(endpoint, proxy_command=_expanded_proxy_command(endpoint))
    if depth >= MAX_PROXY_DEPTH:
        raise UsageError(
            f"ssh config: more than {MAX_PROXY_DEPTH} proxy hops before {endpoint.alias}"
            " (a ProxyJump that leads back to itself? exclude the jump host from it)"
        )
    first, *rest = (_hop(hop, endpoint, options) for hop in endpoint.proxy_jump)
    gateway = _route_to(first, options, depth + 1)  # the first hop by its own config
    for hop in rest:
        gateway = Route(hop, gateway=gateway)  # the later hops through the one before
    return Route(endpoint, gateway=gateway)


def _hop(hop: str, target: Endpoint, options: SshOptions) -> Endpoint:
    host, user, port = parse_jump(hop, target)
    return resolve_endpoint(host, user=user, port=port, options=options)


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


def _expanded_proxy_command(endpoint: Endpoint) -> str | None:
    if endpoint.proxy_command is None:
        return None
    return expand_proxy_command(
        endpoint.proxy_command,
        hostname=endpoint.hostname,
        port=endpoint.port,
        user=endpoint.user,
        alias=endpoint.alias,
    )


def expand_proxy_command(template: str, *, hostname: str, port: int, user: str, alias: str) -> str:
    """``template`` with OpenSSH's ``%`` tokens replaced (UsageError on an unknown token or a
    value that a shell would read as more than a word)."""
    values = {
        "h": hostname,
        "p": str(port),
        "r": user,
        "n": alias,
        "u": _local_user(),
        "d": os.path.expanduser("~"),
        "%": "%",
    }

    def substitute(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter not in values:
            raise UsageError(f"ssh config: ProxyCommand for {alias}: unknown token %{letter}")
        value = values[letter]
        if letter != "%" and not _SHELL_NEUTRAL.fullmatch(value):
            raise UsageError(
                f"ssh config: ProxyCommand for {alias}: refusing to put {value!r} (%{letter})"
                " into a shell command"
            )
        return value

    return _TOKEN.sub(substitute, template)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
