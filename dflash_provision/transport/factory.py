"""The one place a target becomes a transport: local or SSH, then sudo, then the container
wrapper, with the connection options every command and the fleet share."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_provision.target import Target
from dflash_provision.transport.base import Transport
from dflash_provision.transport.options import HostRoute, SshOptions


@dataclass(frozen=True)
class Connector:
    """How to reach targets: the SSH options (timeouts, keys, known_hosts, ``--sudo``...),
    where classic LXC keeps its containers on the hosts (``lxc-attach -P``) when it is not the
    default /var/lib/lxc, and the Docker daemon docker:NAME targets use (``docker -H``) when it
    is not docker's default there."""

    ssh: SshOptions = field(default_factory=SshOptions)
    lxc_path: str | None = None
    docker_host: str | None = None

    def open(
        self, target: Target, route: HostRoute | None = None, *, sudo: bool = False
    ) -> Transport:
        """A transport for ``target``; SSH connects lazily on the first ``run``.

        ``route``: the host's own SSH key and proxy settings (an inventory's). ``sudo``: this
        host needs ``sudo -n`` (an inventory's ``ansible_become``), as ``--sudo`` says for
        every host.
        """
        transport: Transport
        if target.host is None:
            from dflash_provision.transport.local import LocalTransport

            transport = LocalTransport(self.ssh.command_timeout)
        else:
            # paramiko loads in ~0.2 s: only pay for it when a target is remote.
            from dflash_provision.transport.ssh import SshTransport

            transport = SshTransport(
                target.host, user=target.user, port=target.port, options=self.ssh, route=route
            )
        if self.ssh.sudo or sudo:
            from dflash_provision.transport.sudo import SudoTransport

            transport = SudoTransport(transport)
        if target.container is not None:
            from dflash_provision.transport.container import ContainerTransport

            transport = ContainerTransport(
                transport,
                target.container.kind,
                target.container.name,
                lxc_path=self.lxc_path,
                docker_host=self.docker_host,
            )
        return transport


def open_transport(
    target: Target,
    options: SshOptions | None = None,
    *,
    lxc_path: str | None = None,
    docker_host: str | None = None,
    route: HostRoute | None = None,
    sudo: bool = False,
) -> Transport:
    """``Connector(options, lxc_path, docker_host).open(target, route, sudo=sudo)``, in one
    call."""
    connector = Connector(options or SshOptions(), lxc_path, docker_host)
    return connector.open(target, route, sudo=sudo)
