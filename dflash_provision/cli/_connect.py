"""Click options shared by the commands that reach targets (push, verify, rollback, ...).

``connection_options`` adds the SSH / container options and hands the command one
``connection: Connector`` (the core's: a target becomes a transport there) instead of a dozen
loose ones; ``authority_options`` adds ``--repo`` / ``--from`` / ``--lock`` and hands over
``authority_spec: SourceSpec`` (the core's: dflash_provision.source.authority).
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import click

from dflash_provision.cli._flags import source_option_list
from dflash_provision.errors import UsageError
from dflash_provision.source.authority import SourceSpec
from dflash_provision.transport.factory import Connector
from dflash_provision.transport.options import SshOptions, default_ssh_config_path

F = TypeVar("F", bound=Callable[..., Any])


SSH_CONFIG_ENV = "DFLASH_PROVISION_SSH_CONFIG"


def _connection_option_list() -> list[Callable[[F], F]]:
    return [
        click.option(
            "--connect-timeout",
            type=click.FloatRange(min=0.1),
            default=10.0,
            show_default=True,
            help="Seconds for each connection step: TCP connect, SSH banner, key exchange, "
            "authentication.",
        ),
        click.option(
            "--command-timeout",
            type=click.FloatRange(min=0.1),
            default=60.0,
            show_default=True,
            help="Seconds one remote command may run.",
        ),
        click.option(
            "--accept-new-host-key",
            is_flag=True,
            help="Record unknown host keys in known_hosts (like StrictHostKeyChecking=accept-new). "
            "Changed keys are always refused.",
        ),
        # An explicit --ssh-config or -i that does not exist is a typo: say so instead of silently
        # ignoring it (the host alias would then fail to resolve, or another key would be used).
        click.option(
            "--ssh-config",
            "-F",
            type=click.Path(exists=True, dir_okay=False),
            envvar=SSH_CONFIG_ENV,
            show_envvar=True,
            help="ssh_config file for host aliases, as ssh -F (default ~/.ssh/config when it "
            "exists).",
        ),
        click.option(
            "--known-hosts",
            type=click.Path(dir_okay=False),
            help="known_hosts file to check keys in.",
        ),
        click.option(
            "--identity",
            "--private-key",
            "identity",
            multiple=True,
            metavar="KEY",
            type=click.Path(exists=True, dir_okay=False),
            help="Private key file, as ssh -i or Ansible's --private-key (repeatable).",
        ),
        click.option("--no-agent", is_flag=True, help="Do not use keys from ssh-agent."),
        click.option(
            "--sudo",
            is_flag=True,
            help="Run remote commands through `sudo -n` (no password prompt).",
        ),
        click.option(
            "--lxc-path",
            help="Classic LXC container directory on the host (lxc-attach -P).",
        ),
        click.option(
            "--docker-host",
            metavar="URL",
            help="The Docker daemon of docker:NAME targets on the host, as docker -H "
            "(e.g. unix:///run/user/1000/docker.sock; default: docker's own there).",
        ),
    ]


_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PUBLIC_KEY = re.compile(rb"(ssh-|ecdsa-|sk-)[a-z0-9@.-]+ AAAA")


def is_private_key_file(path: object) -> bool:
    """Whether ``path`` is a regular file that starts like an OpenSSH or PEM private key (a
    bounded read; False for anything that cannot be read)."""
    try:
        if not stat.S_ISREG(os.stat(str(path)).st_mode):
            return False
        with open(str(path), "rb") as handle:
            return _PRIVATE_KEY.match(handle.read(4096).lstrip()) is not None
    except OSError:
        return False


def checked_key_file(path: str) -> str:
    """``path`` if it is a readable private key file, else a usage error (exit 2) that says
    what it is. Without this a public key or a typo'd file given to ``-i`` surfaces only as
    a failed login after the connection, or a "no route" for another reason."""
    try:
        # stat before open: opening a FIFO would wait for a writer.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UsageError(f"--identity {path}: not a regular file")
        with open(path, "rb") as handle:
            head = handle.read(64 * 1024).lstrip()
    except OSError as exc:
        raise UsageError(f"--identity {path}: cannot read the key ({exc.strerror})") from None
    if _PRIVATE_KEY.match(head):
        return path
    if _PUBLIC_KEY.match(head):
        raise UsageError(
            f"--identity {path}: this is a public key; give the private key file "
            f"({path.removesuffix('.pub')} if it is beside it)"
        )
    raise UsageError(
        f"--identity {path}: not a private key file (expected an OpenSSH or PEM private key, "
        "e.g. ~/.ssh/id_ed25519)"
    )


def connection_options(func: F) -> F:
    """Add the connection options; the command receives ``connection: Connector``. The key
    file is ``--identity`` / ``--private-key`` everywhere: ``-i`` is the inventory (Ansible's)."""
    return _with_connection_options(func)


def source_connection_options(func: F) -> F:
    """The same for a remote SOURCE of validate / diff."""
    return _with_connection_options(func)


def runtime_connection_options(func: F) -> F:
    """The same for the runtime commands on one target (launch, status, stop, logs, doctor)."""
    return _with_connection_options(func)


def fleet_connection_options(func: F) -> F:
    """The same for fleet commands, where ``-i`` is the inventory."""
    return _with_connection_options(func)


def _with_connection_options(func: F) -> F:

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        timeout = kwargs.pop("connect_timeout")
        ssh = SshOptions(
            connect_timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            command_timeout=kwargs.pop("command_timeout"),
            ssh_config_path=kwargs.pop("ssh_config") or default_ssh_config_path(),
            known_hosts_path=kwargs.pop("known_hosts"),
            host_key_policy="accept-new" if kwargs.pop("accept_new_host_key") else "reject",
            identity_files=tuple(checked_key_file(path) for path in kwargs.pop("identity")),
            use_agent=not kwargs.pop("no_agent"),
            sudo=kwargs.pop("sudo"),
        )
        kwargs["connection"] = Connector(
            ssh=ssh, lxc_path=kwargs.pop("lxc_path"), docker_host=kwargs.pop("docker_host")
        )
        return func(*args, **kwargs)

    for option in reversed(_connection_option_list()):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


_AUTHORITY_OPTIONS = [
    *source_option_list(fleet=False),
    click.option("--lock-repo", metavar="OWNER/NAME", help="Which repo's entry of the lock file."),
]


def authority_options(func: F) -> F:
    """Add --repo / --revision / --from / --lock / --lock-repo; the command receives
    ``authority_spec: SourceSpec``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["authority_spec"] = SourceSpec.from_options(
            kwargs.pop("repo"),
            kwargs.pop("from_file"),
            kwargs.pop("lock"),
            lock_repo=kwargs.pop("lock_repo"),
            revision=kwargs.pop("revision"),
        )
        return func(*args, **kwargs)

    for option in reversed(_AUTHORITY_OPTIONS):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]
