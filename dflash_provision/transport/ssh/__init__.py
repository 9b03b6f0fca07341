"""SSH transport (paramiko), one file per step of a connection: config -> route -> login ->
channel, composed by ``SshTransport`` (transport.py)."""

# First, before any module here imports paramiko: paramiko without invoke (paramiko_import.py).
from dflash_provision.transport.ssh.paramiko_import import import_paramiko

import_paramiko()

from dflash_provision.transport.ssh.config import Endpoint, resolve_endpoint  # noqa: E402
from dflash_provision.transport.ssh.config_route import Route, resolve_route  # noqa: E402
from dflash_provision.transport.ssh.transport import SshTransport  # noqa: E402

__all__ = ["Endpoint", "Route", "SshTransport", "resolve_endpoint", "resolve_route"]
