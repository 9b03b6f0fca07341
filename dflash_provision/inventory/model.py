"""What a fleet command works on: members, their drafter source, command-line overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_provision.target import Target
from dflash_provision.transport.options import HostRoute

UNGROUPED = "ungrouped"


@dataclass(frozen=True)
class DrafterSpec:
    """Where the authoritative config comes from: one of repo(+revision), lock, from_file."""

    repo: str | None = None
    revision: str | None = None
    lock: str | None = None
    from_file: str | None = None

    @property
    def is_set(self) -> bool:
        return bool(self.repo or self.lock or self.from_file)

    def describe(self) -> str:
        if self.lock:
            return f"lock {self.lock}"
        if self.from_file:
            return f"file {self.from_file}"
        if self.repo:
            return f"{self.repo}@{self.revision}" if self.revision else self.repo
        return "(none)"


@dataclass(frozen=True)
class FleetMember:
    """One host (and path) a fleet command works on."""

    name: str  # inventory name, unique in the fleet: report rows and history use it
    target: Target
    source: DrafterSpec
    group: str = UNGROUPED
    origin: str = ""  # "fleet.yaml:12" or "command line", for messages
    route: HostRoute | None = None  # the host's own SSH key / proxy (Ansible inventories)
    # Every group the host is in, parents through ``children`` included (for --limit); the
    # single ``group`` above is the one reports show.
    groups: tuple[str, ...] = ()
    become: bool = False  # run its commands through sudo -n (Ansible's ansible_become)

    @property
    def all_groups(self) -> tuple[str, ...]:
        return self.groups or (self.group,)


@dataclass(frozen=True)
class Overrides:
    """Command-line settings that beat (or complete) the inventory's."""

    source: DrafterSpec = field(default_factory=DrafterSpec)
    path: str | None = None
