"""What a fleet command works on: members, their drafter source, command-line overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import Target
from dflash_provision.transport.options import HostRoute

UNGROUPED = "ungrouped"


@dataclass(frozen=True)
class FleetMember:
    """One host (and path) a fleet command works on."""

    name: str  # inventory name, unique in the fleet: report rows and history use it
    target: Target
    source: SourceSpec  # the drafter config it must hold
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

    source: SourceSpec = field(default_factory=SourceSpec)
    path: str | None = None
