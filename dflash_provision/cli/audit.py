"""``dflash-provision audit``: check a whole fleet for drift in parallel.

Hosts come from ``-i INVENTORY`` (our YAML, or an Ansible YAML/INI inventory: see
dflash_provision.inventory) and/or TARGET arguments. ``--repo/--revision``, ``--from``,
``--lock`` and ``--path`` override what the inventory says (and are needed for bare TARGETs).

Each host gets one SSH connection and one remote command; ``--workers`` bounds the parallelism.
Every result is recorded in the local history (``dflash-provision history``).

Exit codes:

    0  every host's config is the authoritative one (in_sync)
    4  (DRIFT) at least one host answered and its file is wrong: drifted, missing, invalid or
       loader_normalised. Takes precedence: a known-wrong host is the more urgent news.
    7, 8, 6, 5  no host is known to be wrong, but at least one could not be checked; the code is
       the one ``verify`` gives for such a host, the first of this order present: 7 the file
       could not be read (permission denied, another error), 8 container not running, 6
       authentication or host key, 5 refused, timed out, other network failure. ``--json``
       says which host is which.
    2  bad arguments or inventory; other codes as for single-target commands when the
       authoritative config cannot be loaded (e.g. 10-15 for Hub errors).

``--prometheus FILE`` writes a node_exporter textfile-collector file atomically (metrics in
dflash_provision.report). Progress is shown only when stdout is a terminal.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dflash_provision.cli._connect import Connection, fleet_connection_options
from dflash_provision.cli._render import echo_rich

if TYPE_CHECKING:
    from dflash_provision.fleet import FleetRun
    from dflash_provision.inventory import FleetMember

F = TypeVar("F", bound=Callable[..., Any])

_FLEET_OPTIONS = [
    click.option(
        "--inventory",
        "-i",
        "inventory",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Inventory file: dflash-provision YAML, or an Ansible inventory (YAML or INI).",
    ),
    click.option(
        "--repo",
        metavar="OWNER/NAME[@REV]",
        help="Authoritative config from the Hub (overrides the inventory).",
    ),
    click.option("--revision", metavar="REV", help="Revision for --repo (commit sha or tag)."),
    click.option(
        "--from", "from_file", type=click.Path(exists=True), help="Authoritative config file."
    ),
    click.option(
        "--lock", type=click.Path(dir_okay=False), help="Authoritative config from a lock file."
    ),
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

    def members(self) -> list[FleetMember]:
        from dflash_provision.errors import UsageError
        from dflash_provision.inventory import DrafterSpec, Overrides, load_members

        sources = (("--repo", self.repo), ("--from", self.from_file), ("--lock", self.lock))
        given = [name for name, value in sources if value]
        if len(given) > 1:
            raise UsageError(f"give one authoritative source, not {' and '.join(given)}")
        if self.revision and not self.repo:
            raise UsageError("--revision needs --repo")
        source = DrafterSpec(
            repo=self.repo,
            revision=self.revision,
            lock=str(Path(self.lock).resolve()) if self.lock else None,
            from_file=str(Path(self.from_file).resolve()) if self.from_file else None,
        )
        members = load_members(
            self.inventory, self.targets, Overrides(source=source, path=self.model_path)
        )
        if self.limit is None:
            return members
        from dflash_provision.inventory.limit import select

        return select(members, self.limit)


def fleet_options(func: F) -> F:
    """TARGETs, inventory, authority overrides, --workers and the shared SSH options; the
    command receives ``selection: FleetSelection`` and ``connection: Connection``.

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


def authority_loader() -> Callable[[FleetMember], Any]:
    """``authority_for(member)``: load the member's drafter source (FleetRun caches per source)."""
    from dflash_provision.authority import resolve_authoritative

    def load(member: FleetMember) -> Any:
        spec = member.source
        repo = spec.repo
        if repo and spec.revision:
            repo = f"{repo.split('@', 1)[0]}@{spec.revision}"
        return resolve_authoritative(repo=repo, from_file=spec.from_file, lock=spec.lock)

    return load


def make_run(connection: Connection) -> FleetRun:
    from dflash_provision.fleet import FleetRun

    return FleetRun(
        authority_loader(),
        ssh_options=connection.ssh,
        open_transport=lambda member: connection.open(
            member.target, member.route, sudo=member.become
        ),
    )


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


@click.command("audit")
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--prometheus",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Also write a node_exporter textfile-collector file (atomically).",
)
@click.pass_context
def command(
    ctx: click.Context,
    selection: FleetSelection,
    connection: Connection,
    as_json: bool,
    prometheus: Path | None,
) -> None:
    """Check a whole fleet for drift in parallel (exit 0 in sync, 4 drift, 5 unreachable)."""
    from dflash_provision import report
    from dflash_provision.fleet import audit, audit_exit_code
    from dflash_provision.history import default_store

    members = selection.members()
    run = make_run(connection)
    started = time.monotonic()
    with ProgressDisplay(len(members), "auditing") as display:
        audits = audit(
            members,
            run.authority_for,
            workers=selection.workers,
            progress=lambda a: display.advance(a.name, a.status.value),
            history=default_store(),
            run=run,
        )
    elapsed = time.monotonic() - started
    code = audit_exit_code(audits)
    if prometheus is not None:
        report.write_textfile(
            prometheus,
            report.prometheus_text(audits, timestamp=time.time(), run_duration_s=elapsed),
        )
    if as_json:
        document = report.audit_document(audits, elapsed_s=elapsed, exit_code=int(code))
        click.echo(report.to_json(document))
    else:
        echo_rich(report.audit_table(audits), report.summary_line(audits, elapsed))
    ctx.exit(int(code))
