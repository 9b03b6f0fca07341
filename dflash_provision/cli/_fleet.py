"""Click options shared by the fleet commands (audit, repair) and what they build from them.

``fleet_options`` adds TARGETs, the inventory, the authority overrides, ``--limit``,
``--workers`` and the shared SSH options, and hands the command ``selection: FleetSelection``
and ``connection: Connector``; ``make_run`` builds the FleetRun they share.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dflash_provision.cli._connect import fleet_connection_options, is_private_key_file
from dflash_provision.cli._flags import source_option_list
from dflash_provision.errors import UsageError
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.fleet import FleetRun
    from dflash_provision.inventory import FleetMember
    from dflash_provision.source.authority import SourceSpec

F = TypeVar("F", bound=Callable[..., Any])

_FLEET_OPTIONS = [
    click.option(
        "--inventory",
        "-i",
        "inventory",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Inventory file: dflash-provision YAML, or an Ansible inventory (YAML or INI).",
    ),
    *source_option_list(fleet=True),
    click.option(
        "--path",
        "model_path",
        metavar="PATH",
        help="Model directory (or .json file) on every host (overrides the inventory).",
    ),
    click.option(
        "--limit",
        "-l",
        "limit",
        metavar="PATTERN",
        help="Only these hosts of the inventory, as Ansible's --limit: names, groups, wildcards,"
        " ~regex, &group (also in), !group (not in), separated by commas.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=1, max=1024),
        default=64,
        show_default=True,
        help="Hosts handled at the same time.",
    ),
]


@dataclass(frozen=True)
class FleetSelection:
    """Which hosts a fleet command works on and what they must hold, as the options gave it."""

    targets: tuple[str, ...]
    inventory: Path | None
    repo: str | None
    revision: str | None
    from_file: str | None
    lock: str | None
    model_path: str | None
    limit: str | None
    workers: int

    def source(self, lock_repo: str | None = None) -> SourceSpec:
        """The authoritative source the options name (none named: the inventory's, or the
        default lock); UsageError for two sources or --revision without --repo."""
        return SourceSpec.from_options(
            self.repo, self.from_file, self.lock, lock_repo=lock_repo, revision=self.revision
        )

    def members(self, default: SourceSpec | None = None) -> list[FleetMember]:
        """The hosts; ``default`` is the source of plain TARGETs when the options name none
        (else ./dflash.lock, as for push). An inventory's hosts keep their own drafters."""
        from dflash_provision.inventory import Overrides, load_members
        from dflash_provision.inventory.common import check_unique

        source = self.source()
        overrides = Overrides(source=source.absolute(), path=self.model_path)
        members: list[FleetMember] = []
        if self.inventory is not None:
            refuse_key_as_inventory(self.inventory)
            members += load_members(self.inventory, (), overrides)
        if self.targets or not members:  # no hosts at all: load_members says so
            _check_targets(self.targets)  # a mistyped TARGET is the news, not a missing lock
            if self.targets and not source.is_set:
                # The same rule and message as push (SourceSpec.or_default_lock).
                source = default if default is not None else source.or_default_lock()
            plain = Overrides(source=source.absolute(), path=self.model_path)
            members += load_members(None, self.targets, plain)
        check_unique(members)
        if self.limit is None:
            return members
        from dflash_provision.inventory.limit import select

        return select(members, self.limit)


def refuse_key_as_inventory(path: Path) -> None:
    """UsageError when ``-i FILE`` is an SSH private key: ``-i`` is the inventory in the fleet
    commands (Ansible's), while push took it for the key (OpenSSH's); say which flag to use."""
    if is_private_key_file(path):
        raise UsageError(
            f"-i {path}: this is an SSH private key, not an inventory (-i names the inventory "
            f"here, as in Ansible); give the key with --identity {path}"
        )


def fleet_options(func: F) -> F:
    """TARGETs, inventory, authority overrides, --workers and the shared SSH options; the
    command receives ``selection: FleetSelection`` and ``connection: Connector``.

    ``-i`` is the inventory here (Ansible's convention); the key file is ``--identity``.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["selection"] = FleetSelection(
            **{name: kwargs.pop(name) for name in FleetSelection.__dataclass_fields__}
        )
        return func(*args, **kwargs)

    decorated = fleet_connection_options(wrapper)
    for option in reversed(_FLEET_OPTIONS):
        decorated = option(decorated)
    return click.argument("targets", nargs=-1, metavar="[TARGET]...")(decorated)  # type: ignore[return-value]


def _check_targets(targets: Sequence[str]) -> None:
    """Each TARGET parses; an inventory file given as one (``audit fleet.yaml``, -i forgotten)
    says how to give it."""
    for spec in targets:
        if ":" not in spec and not spec.startswith(("/", "./", "../")) and Path(spec).is_file():
            raise UsageError(
                f"{spec} is a file, not a TARGET (host:/path or /dir): an inventory is given "
                f"with -i {spec}"
            )
        parse_target(spec)


def make_run(connection: Connector) -> FleetRun:
    from dflash_provision.fleet import FleetRun, authority_loader

    run = FleetRun(authority_loader(), connector=connection)
    run.stopping.announce = lambda line: click.echo(line, err=True)  # what Ctrl-C waits for
    return run


class ProgressDisplay:
    """A transient rich progress bar on a terminal; nothing otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self.enabled = sys.stdout.isatty()
        self._progress: Any = None
        self._task: Any = None
        self.total, self.label = total, label

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[last]}"),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total, last="")
        return self

    def advance(self, name: str, status: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, last=f"{name}: {status}")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
