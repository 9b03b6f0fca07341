"""Step 3, login: host key checking as OpenSSH does it: known_hosts entries, refuse unknown or
accept-new."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import paramiko

from dflash_provision.transport.ssh.config_files import KNOWN_HOSTS

if TYPE_CHECKING:
    from dflash_provision.transport.ssh.config import Endpoint


def add_known_keys(client: paramiko.SSHClient, endpoint: Endpoint) -> None:
    """Give ``client`` the known_hosts keys filed for this endpoint (paramiko's own check then
    compares them with the server's key exactly as after load_host_keys)."""
    if not os.path.isfile(endpoint.known_hosts_path):
        return
    name = endpoint.known_hosts_name
    found = KNOWN_HOSTS.get(endpoint.known_hosts_path).lookup(name)
    if found:
        keys = client.get_host_keys()
        for key_type, key in found.items():
            keys.add(name, key_type, key)


class UnknownHostKey(paramiko.SSHException):
    pass


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise UnknownHostKey(hostname)


class AcceptNew(paramiko.MissingHostKeyPolicy):
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
