"""How the history names a host: one key for a target spec's machine and a fleet member's name,
stored in its own columns (machine, login, port, container) so ``history --host`` is one match."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_provision.errors import DflashProvisionError

if TYPE_CHECKING:
    from dflash_provision.target import Target


@dataclass(frozen=True)
class HostKey:
    """How the history names a host: the machine as the user named it (a target spec's host, or
    an inventory name), and the login, port and container (``lxc:c1``) when they were given.

    ``str()`` is the text shown in ``history``, e.g. ``root@gpu1:2222/lxc:c1``.
    """

    machine: str
    login: str | None = None
    port: int | None = None
    container: str | None = None

    @classmethod
    def of_target(cls, target: Target) -> HostKey:
        """The key of a target spec's machine (``local`` for this one)."""
        return cls(
            target.host or "local",
            target.user if target.host else None,
            target.port if target.host else None,
            target.container.display() if target.container else None,
        )

    @classmethod
    def of_name(cls, name: str) -> HostKey:
        """The key of a fleet member's name: a plain TARGET given on the command line (its name
        is the spec, ``root@h01:/root/models/X``) is keyed by its machine, as push keys it, so
        ``history --host h01`` finds it; an inventory name is the machine itself."""
        from dflash_provision.target import parse_target

        if ":" in name or "@" in name:
            try:
                target = parse_target(name)
            except DflashProvisionError:
                return cls(name)
            if target.host is not None:
                return cls.of_target(target)
        return cls(name)

    @classmethod
    def parse(cls, text: str) -> HostKey:
        """``[user@]machine[:port][/container]`` (machine may be ``[v6]``): what ``history
        --host`` takes, and what schema 1 stored as text."""
        where, slash, container = text.partition("/")
        login, at, machine = where.rpartition("@")
        port = ""
        if machine.startswith("[") and "]" in machine:  # [v6::addr]:port
            inside, _, rest = machine[1:].partition("]")
            machine, port = inside, rest[1:]
        elif machine.count(":") == 1:
            machine, port = machine.split(":")
        return cls(
            machine,
            login if at else None,
            int(port) if port.isdigit() else None,
            container if slash else None,
        )

    def __str__(self) -> str:
        host = f"[{self.machine}]" if ":" in self.machine else self.machine
        text = f"{self.login}@{host}" if self.login else host
        text += f":{self.port}" if self.port is not None else ""
        return text + (f"/{self.container}" if self.container else "")

    def columns(self) -> tuple[str, str | None, int | None, str | None]:
        return self.machine, self.login, self.port, self.container
