"""Build the transport a Target needs: local or SSH, then sudo, then the container wrapper."""

from __future__ import annotations

from dflash_provision.target import Target
from dflash_provision.transport.base import Transport
from dflash_provision.transport.options import HostRoute, SshOptions


def open_transport(
    target: Target,
    options: SshOptions | None = None,
    *,
    lxc_path: str | None = None,
    route: HostRoute | None = None,
    sudo: bool = False,
) -> Transport:
    """A transport for ``target``; SSH connects lazily on the first ``run``.

    ``lxc_path`` is the classic-LXC container directory (``lxc-attach -P``) when it is not the
    default /var/lib/lxc. ``route``: the host's own SSH key and proxy settings (an inventory's).
    ``sudo``: this host needs ``sudo -n`` (an inventory's ``ansible_become``), as ``--sudo`` says
    for every host.
    """
    options = options or SshOptions()
    transport: Transport
    if target.host is None:
        from dflash_provision.transport.local import LocalTransport

        transport = LocalTransport()
    else:
        # paramiko loads in ~0.2 s: only pay for it when a target is remote.
        from dflash_provision.transport.ssh import SshTransport

        transport = SshTransport(
            target.host, user=target.user, port=target.port, options=options, route=route
        )
    if options.sudo or sudo:
        from dflash_provision.transport.sudo import SudoTransport

        transport = SudoTransport(transport)
    if target.container is not None:
        from dflash_provision.transport.container import ContainerTransport

        transport = ContainerTransport(
            transport, target.container.kind, target.container.name, lxc_path=lxc_path
        )
    return transport
