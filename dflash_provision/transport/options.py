"""Settings for SSH connections: timeouts, config and known_hosts files, keys, host-key policy."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from dflash_provision.transport.base import DEFAULT_COMMAND_TIMEOUT

HostKeyPolicy = Literal["reject", "accept-new"]


def default_ssh_config_path() -> str | None:
    """``~/.ssh/config`` when it exists (as OpenSSH reads it), else None."""
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


def default_known_hosts_path() -> str:
    return os.path.expanduser("~/.ssh/known_hosts")


@dataclass(frozen=True)
class SshOptions:
    """How to open SSH connections. Every blocking step has its own timeout (seconds).

    ``known_hosts_path`` None means OpenSSH's choice: the ``UserKnownHostsFile`` of the matching
    ssh_config block, else ``~/.ssh/known_hosts``; a path set here wins over the config file.
    ``host_key_policy`` "reject" refuses hosts missing from known_hosts; "accept-new" records them
    (like ``StrictHostKeyChecking=accept-new``). A changed host key is refused under both.
    ``identities_only`` uses only ``identity_files`` and the config's IdentityFile entries (no
    agent, no default keys), like ``IdentitiesOnly=yes``.
    """

    connect_timeout: float = 10.0
    banner_timeout: float = 10.0
    auth_timeout: float = 10.0
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT  # what run() waits when given no timeout
    ssh_config_path: str | None = field(default_factory=default_ssh_config_path)
    known_hosts_path: str | None = None
    host_key_policy: HostKeyPolicy = "reject"
    identity_files: tuple[str, ...] = ()
    use_agent: bool = True
    identities_only: bool = False
    sudo: bool = False

    def __post_init__(self) -> None:
        if self.host_key_policy not in ("reject", "accept-new"):
            raise ValueError(
                f"host_key_policy must be 'reject' or 'accept-new', got {self.host_key_policy!r}"
            )
        for name in ("connect_timeout", "banner_timeout", "auth_timeout", "command_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True)
class HostRoute:
    """One host's own SSH settings that beat ssh_config, as ``ssh -i KEY -o ProxyJump=...`` on a
    command line does (from an Ansible inventory's ``ansible_ssh_private_key_file`` and
    ``ansible_ssh_common_args``/``ansible_ssh_extra_args``).

    ``proxy_jump`` "none" turns off a ProxyJump/ProxyCommand the config file would give. When
    either proxy is set here, the config file's proxies are not used.
    """

    identity_files: tuple[str, ...] = ()
    proxy_jump: str | None = None
    proxy_command: str | None = None

    @property
    def sets_proxy(self) -> bool:
        return self.proxy_jump is not None or self.proxy_command is not None
