"""Which machine, container and file a rollout host IS: saved in the record when the rollout
begins and compared every time the rollout acts on the host again.

A host's name in the inventory is only a label: between a pause and ``--resume`` the inventory
may re-point it (another address), drop it, or the ssh_config may send its alias elsewhere. The
record therefore keeps where the name led when the rollout began (the address, port and user
after ssh_config, the container, the file's path) and, once connected, the SSH host key. An
entry that no longer leads there is refused before anything is written, never followed.
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError, ExitCode
from dflash_provision.transport.ssh.config import resolve_endpoint

if TYPE_CHECKING:
    from dflash_provision.inventory import FleetMember
    from dflash_provision.transport.options import SshOptions

_FIELDS = ("address", "port", "user", "container", "path")


class HostMismatch(DflashProvisionError):
    """A host no longer is what the rollout record saved (refused: exit 31)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.ROLLOUT_REFUSED)


@dataclass(frozen=True)
class Identity:
    """Where a rollout host is: the SSH endpoint after ssh_config (``local`` for this machine),
    the container (``lxc:c1``), the config file's path, and the host key once seen."""

    address: str
    port: int | None
    user: str | None
    container: str | None
    path: str
    host_key: str | None = None

    @property
    def place(self) -> tuple[Any, ...]:
        """What two inventory entries share when they are the same file on the same machine."""
        return (self.address, self.port, self.container, self.path)

    def show(self) -> str:
        where = self.address if self.port is None else f"{self.address} port {self.port}"
        who = f"{self.user}@" if self.user else ""
        inside = f" {self.container}" if self.container else ""
        return f"{who}{where}{inside} {self.path}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Identity:
        names = ("port", "user", "container", "host_key")
        port, user, container, key = (data.get(name) for name in names)
        return cls(
            str(data.get("address") or ""),
            int(port) if isinstance(port, int) else None,
            str(user) if user is not None else None,
            str(container) if container is not None else None,
            str(data.get("path") or ""),
            str(key) if key is not None else None,
        )

    def with_key(self, host_key: str | None) -> Identity:
        return replace(self, host_key=host_key)


def of_member(member: FleetMember, ssh: SshOptions) -> Identity:
    """Where ``member`` leads today, from the inventory and ssh_config alone (no connection)."""
    target = member.target
    container = target.container.display() if target.container else None
    if target.host is None:
        return Identity("local", None, getpass.getuser(), container, target.config_path)
    endpoint = resolve_endpoint(
        target.host, user=target.user, port=target.port, options=ssh, route=member.route
    )
    return Identity(endpoint.hostname, endpoint.port, endpoint.user, container, target.config_path)


def differences(saved: Identity, now: Identity) -> list[str]:
    """``field: saved → now`` for every field that changed (a host key not yet seen on either
    side is not a difference)."""
    changed = [
        f"{name} {getattr(saved, name)} → {getattr(now, name)}"
        for name in _FIELDS
        if getattr(saved, name) != getattr(now, name)
    ]
    if saved.host_key and now.host_key and saved.host_key != now.host_key:
        changed.append(f"host key {saved.host_key} → {now.host_key}")
    return changed


def same_place(named: Sequence[tuple[str, Identity]]) -> list[tuple[str, str, str]]:
    """(first name, second name, why) for every two entries that are the same file: the same
    endpoint and path, or the same host key, container and path (one machine reached under two
    addresses: an alias and its IP, two DNS names)."""
    found: list[tuple[str, str, str]] = []
    by_place: dict[tuple[Any, ...], str] = {}
    by_key: dict[tuple[Any, ...], str] = {}
    for name, ident in named:
        first = by_place.setdefault(ident.place, name)
        if first != name:
            found.append((first, name, ident.show()))
            continue
        if ident.host_key is None:
            continue
        key = (ident.host_key, ident.container, ident.path)
        first = by_key.setdefault(key, name)
        if first != name:
            found.append((first, name, f"host key {ident.host_key}, {ident.path}"))
    return found


def refuse_same_place(named: Sequence[tuple[str, Identity]]) -> None:
    """HostMismatch naming the first two entries that are one host and one drafter file: two
    workers would stop and start the same server at once."""
    pairs = same_place(named)
    if pairs:
        first, second, why = pairs[0]
        more = f" (and {len(pairs) - 1} more pair(s))" if len(pairs) > 1 else ""
        raise HostMismatch(
            f"{first} and {second} are the same host and drafter file ({why}){more}: "
            "keep one of them in the inventory or --limit"
        )
