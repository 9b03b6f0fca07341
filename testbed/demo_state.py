"""What every demo step works with: the transcript, the demo directory and the hosts (shared by
``demo.py`` and ``demo_runtime.py``, so neither imports the other for it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.demo_transcript import Transcript

if TYPE_CHECKING:
    from testbed.hosts import Host
    from testbed.hub_standin import HubStandin
    from testbed.lxc import Container


@dataclass(frozen=True)
class DemoMember:
    """One place the demo keeps a drafter config: a host alias and a model directory on it."""

    name: str  # inventory name
    alias: str  # ssh_config alias
    model_dir: str  # the real path
    shown_dir: str  # the same as typed, through the shell variable $M

    @property
    def target(self) -> str:
        return f'"{self.alias}:{self.shown_dir}"'

    @property
    def config_path(self) -> str:
        return f"{self.model_dir}/config.json"


@dataclass(frozen=True)
class DemoHosts:
    """The throwaway SSH hosts the demo works on."""

    ssh_config: Path
    members: list[DemoMember]
    model_var: str  # what $M is set to, as typed
    note: str
    # The LXC step's busybox container, inside the last member's host and up as long as the
    # hosts (so its lines can be pasted with --keep); None when containers cannot run inside
    # the hosts (not root, or LXC missing).
    container: Container | None = None
    # Each member's namespaced sshd host by member name (as root), for set-up a `$` line
    # cannot do (the rollout step installs the vLLM stand-in there); empty as a normal user.
    host_of: dict[str, Host] = field(default_factory=dict)


@dataclass
class Demo:
    """What every step works with: the terminal, the demo directory and the hosts."""

    t: Transcript
    workdir: Path
    hosts: DemoHosts
    hub: HubStandin | None = None  # the runtime part publishes the tiny drafter's config there
    # What a step starts that must stay up as long as the Hub stand-in and the hosts (through
    # --keep's prompt, so its lines can be pasted): the runtime step's host gpu01. Closed by
    # the demo after the prompt, before the hosts.
    kept: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
