"""SSH transport (paramiko), one file per step of a connection: config -> route -> login ->
channel, composed by ``SshTransport`` (transport.py)."""

from dflash_provision.transport.ssh.config import Endpoint, resolve_endpoint
from dflash_provision.transport.ssh.config_route import Route, resolve_route
from dflash_provision.transport.ssh.transport import SshTransport

__all__ = ["Endpoint", "Route", "SshTransport", "resolve_endpoint", "resolve_route"]
