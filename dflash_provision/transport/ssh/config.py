"""Step 1, config: where and as whom to connect to one host, after ``~/.ssh/config``.

OpenSSH's precedence: what the target spec says (user, port) wins over a host's own inventory
settings (``HostRoute``), which win over the config file, which wins over defaults. How the host
is reached (straight, ProxyCommand, jump hosts) is resolved from this in config_route.py.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import cast

import paramiko

from dflash_provision.errors import UsageError
from dflash_provision.transport.options import HostRoute, SshOptions, default_known_hosts_path
from dflash_provision.transport.ssh.config_files import SSH_CONFIGS

DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")


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
    proxy_command: str | None = None  # as written in ssh_config, tokens not yet expanded
    host_key_alias: str | None = None  # ssh_config HostKeyAlias: the name its key is filed under

    @property
    def label(self) -> str:
        where = self.hostname if self.hostname == self.alias else f"{self.alias} ({self.hostname})"
        return f"{self.user}@{where} port {self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is filed under, as OpenSSH writes it (a HostKeyAlias as it is,
        without the port)."""
        host, port = self.host_key_lookup
        return host if port == 22 else f"[{host}]:{port}"

    @property
    def host_key_lookup(self) -> tuple[str, int]:
        """(host, port) to give paramiko for its host key check; it files the key under
        ``host`` alone when the port is 22."""
        if self.host_key_alias:
            return self.host_key_alias, 22
        return self.hostname, self.port


def resolve_endpoint(
    host: str,
    *,
    user: str | None,
    port: int | None,
    options: SshOptions,
    route: HostRoute | None = None,
) -> Endpoint:
    """Apply the ssh_config file to ``host`` (an alias or a real name); ``route`` (this host's
    own key and proxy settings) wins over the file, as ``ssh -i``/``-o`` do."""
    route = route or HostRoute()
    entry: dict[str, object] = {}
    if options.ssh_config_path and os.path.isfile(options.ssh_config_path):
        try:
            entry = SSH_CONFIGS.get(options.ssh_config_path).lookup(host)
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
    keys = [os.path.expanduser(p) for p in route.identity_files + options.identity_files]
    keys += config_keys
    if not identities_only:
        keys += [os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEY_NAMES]
    existing = tuple(dict.fromkeys(k for k in keys if os.path.isfile(k)))
    known_hosts = options.known_hosts_path
    if known_hosts is None:
        config_known = str(entry.get("userknownhostsfile") or "").split()
        known_hosts = (
            os.path.expanduser(config_known[0]) if config_known else default_known_hosts_path()
        )
    if route.sets_proxy:
        entry = {**entry, "proxyjump": route.proxy_jump, "proxycommand": route.proxy_command}
    jump = str(entry.get("proxyjump") or "")
    hops = (
        ()
        if jump.lower() in ("", "none")
        else tuple(h.strip() for h in jump.split(",") if h.strip())
    )
    proxy_command = entry.get("proxycommand")  # paramiko reads "ProxyCommand none" as None
    if proxy_command is not None and hops:
        # OpenSSH takes whichever of the two comes first in the file; paramiko's lookup does
        # not say which that was, so guessing could silently take the wrong route.
        raise UsageError(
            f"ssh config: both ProxyJump and ProxyCommand apply to {host}; keep one of them"
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
        proxy_command=str(proxy_command) if proxy_command is not None else None,
        host_key_alias=str(entry.get("hostkeyalias") or "") or None,
    )
