"""``dflash-provision rollout``: a new drafter config across a serving fleet in gated batches.

Pre-flight on every host, a baseline acceptance per host, then batch by batch: write and prove
the config, restart the server with its recorded launch, run every runtime-check stage, judge
the gate; a failed batch is rolled back (proved), an inconclusive check pauses. The rollout is a
record in the history database, saved before each step (``--status``, ``--resume``,
``--abort``). Exit codes: 0 completed, 27 rolled back, 28 paused (inconclusive), 29 aborted,
30 a rollback not proved, 31 refused (pre-flight failed, a host held, named twice or no
longer the one the record saved, or --abort of a rollout that is not open).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dflash_provision.cli._env import parse_env
from dflash_provision.cli._fleet import FleetSelection, fleet_options, make_run
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import echo_table
from dflash_provision.cli._runtime import (
    container_option,
    long_context_option,
    rehash_files_option,
)
from dflash_provision.errors import ExitCode, LocalWriteFailed, UsageError
from dflash_provision.plain_table import Cell, Column, TableSpec
from dflash_provision.rollout.batches import parse_batches
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.rollout.record import HostState, Rollout


@click.command("rollout")
@fleet_options
@click.option(
    "--batches",
    default="1,25%,100%",
    show_default=True,
    metavar="LIST",
    help="Cumulative batch ends: host counts or shares, as Ansible's serial.",
)
@click.option(
    "--max-fail-percentage",
    type=click.FloatRange(0, 100),
    default=0.0,
    show_default=True,
    metavar="P",
    help="A batch fails when more of its hosts fail.",
)
@click.option(
    "--min-acceptance",
    type=click.FloatRange(0, 1),
    default=0.10,
    show_default=True,
    metavar="X",
    help="A host passes only with acceptance >= X.",
)
@click.option(
    "--max-regression",
    metavar="R",
    help="A host fails when its mean acceptance length is more than R (10% or 0.1) "
    "below its baseline.",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="Env values for restarted servers, overriding those read from each running server "
    "(the launch recorded only the NAMES; needed where they cannot be read).",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds a restarted server has to become ready.",
)
@click.option(
    "--keep-backups",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Backups of the old file to keep (the rollback restores from them).",
)
@click.option(
    "--skip-failed-hosts",
    is_flag=True,
    help="Leave hosts that fail pre-flight out instead of refusing to start.",
)
@click.option(
    "--rollback-all", is_flag=True, help="A failed batch rolls back the earlier batches too."
)
@rehash_files_option
@container_option
@click.option("--dry-run", is_flag=True, help="Print the plan (pre-flight reads only).")
@click.option(
    "--status",
    "status",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ID]",
    help="Show a rollout (no ID: the recent ones).",
)
@click.option("--resume", "resume_id", metavar="ID", help="Continue a rollout from its last step.")
@click.option(
    "--abort", "abort_id", metavar="ID", help="Put back every host the rollout changed, proved."
)
@click.option("--json", "as_json", is_flag=True, help="Print the rollout as JSON.")
@long_context_option
@click.option(
    "--prometheus",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a node_exporter textfile (state, batch, per-host acceptance) when it stops.",
)
@click.pass_context
def command(
    ctx: click.Context, /, selection: FleetSelection, connection: Connector, **opts: Any
) -> None:
    """Change the drafter config across a serving fleet in gated batches, with automatic,
    proved rollback (see README "rollout")."""
    from dflash_provision.rollout.store import RolloutStore

    store = RolloutStore()
    if opts["status"] is not None:
        _status(store, opts["status"], opts["as_json"])
        return
    if opts["resume_id"] or opts["abort_id"]:
        from dflash_provision.rollout.engine import refuse_closed
        from dflash_provision.rollout.plan import members_again

        rollout = store.load(opts["resume_id"] or opts["abort_id"])
        _same_container(rollout, opts["container"])
        if opts["abort_id"]:
            refuse_closed(rollout)
        members = members_again(rollout, _recorded_selection(rollout).members(), connection.ssh)
        engine = _engine(rollout, members, connection, store, opts)
        with _interruptible(ctx, engine.rollout, opts["prometheus"], opts["as_json"]):
            engine.abort() if opts["abort_id"] else engine.resume()
        _finish(ctx, engine.rollout, opts["as_json"])
        return
    new = _new_config(selection)
    members = selection.members()
    if opts["dry_run"]:
        _dry_run(ctx, members, new, connection, opts)
        return
    rollout = _new_rollout(selection, members, new, connection, opts)
    engine = _engine(rollout, members, connection, store, opts)
    with _interruptible(ctx, engine.rollout, opts["prometheus"], opts["as_json"]):
        engine.start()
    _finish(ctx, engine.rollout, opts["as_json"])


@contextlib.contextmanager
def _interruptible(
    ctx: click.Context, rollout: Rollout, prom: Path | None, as_json: bool = False
) -> Iterator[None]:
    """Ctrl-C: the steps in flight finish (each is journaled), then the way on is printed.
    Either way the --prometheus file says where the rollout stands."""
    try:
        yield
    except KeyboardInterrupt:
        _write_prometheus(rollout, prom)
        if rollout.state.value == "interrupted":  # before any write: holds no host
            click.echo(
                f"interrupted: rollout {rollout.id}: {rollout.message}; start it again with "
                f"`{rollout.command('--resume')}` or run a new rollout",
                err=True,
            )
            ctx.exit(int(ExitCode.INTERRUPTED))
        # The steps in flight have finished and printed theirs (engine._each waits for them):
        # where each host stands, then the way on, last.
        _show(rollout, as_json, int(ExitCode.INTERRUPTED))
        click.echo(
            f"interrupted: rollout {rollout.id} is recorded at {rollout.state.value}; continue "
            f"with `{rollout.command('--resume')}` or undo it with "
            f"`{rollout.command('--abort')}`",
            err=True,
        )
        ctx.exit(int(ExitCode.INTERRUPTED))
    _write_prometheus(rollout, prom)


def _write_prometheus(rollout: Rollout, path: Path | None) -> None:
    if path is None:
        return
    from dflash_provision.fleet.report import write_textfile
    from dflash_provision.rollout.prometheus import prometheus_text

    try:
        write_textfile(path, prometheus_text(rollout, timestamp=time.time()))
    except OSError as exc:
        raise LocalWriteFailed(f"--prometheus {path}: {exc.strerror or exc}") from None


def _new_config(selection: FleetSelection) -> Any:
    from dflash_provision.place.push import check_authority

    source = selection.source()
    if not source.is_set:
        raise UsageError(
            "rollout needs the new config: --repo R --revision SHA, --lock FILE or --from FILE"
        )
    authority = source.load()
    check_authority(authority, force=False, verb="roll out")
    return authority


def _settings(opts: dict[str, Any]) -> Any:
    from dflash_provision.verify.runtime_check import CheckSettings

    return CheckSettings(
        min_acceptance=opts["min_acceptance"],
        probe=True,
        long_context=not opts.get("no_long_context"),
    )


def _gate(opts: dict[str, Any]) -> Any:
    from dflash_provision.rollout.record import Gate
    from dflash_provision.verify.reference import parse_fraction

    regression = None
    if opts["max_regression"] is not None:
        try:
            regression = parse_fraction(opts["max_regression"])
        except ValueError as exc:
            raise UsageError(f"--max-regression: {exc}") from None
    return Gate(opts["max_fail_percentage"], opts["min_acceptance"], regression)


def _new_rollout(
    selection: FleetSelection,
    members: list[Any],
    new: Any,
    connection: Connector,
    opts: dict[str, Any],
) -> Rollout:
    from dflash_provision.history.store import utc_now
    from dflash_provision.rollout.plan import Settings, connection_args, new_rollout
    from dflash_provision.rollout.store import new_id

    sel = asdict(selection)
    sel["inventory"] = str(selection.inventory.absolute()) if selection.inventory else None
    settings = Settings(
        id=new_id(),
        created_at=utc_now(),
        batches=parse_batches(opts["batches"]),
        gate=_gate(opts),
        rollback_all=opts["rollback_all"],
        selection=sel,
        connection_args=connection_args(sys.argv[1:]),
        rehash_files=opts["rehash_files"],
        server_container=opts["container"].display() if opts["container"] else None,
    )
    return new_rollout(members, new, settings, connection.ssh)


def _same_container(rollout: Rollout, given: Any) -> None:
    """--resume / --abort act on the containers the record names (the record is the truth):
    a --container that says otherwise is refused, not followed."""
    if given is None:
        return
    recorded = {str((h.server_container or {}).get("container")) for h in rollout.hosts}
    if recorded != {given.display()}:
        raise UsageError(
            f"--container {given.display()}: rollout {rollout.id} was started with "
            f"{', '.join(sorted(recorded))}; --resume and --abort use what its record says "
            "(leave --container out)"
        )


def _recorded_selection(rollout: Rollout) -> FleetSelection:
    """The selection the rollout recorded (inventory, --limit, TARGETs): its hosts again."""
    sel = dict(rollout.check.get("selection") or {})
    sel["inventory"] = Path(sel["inventory"]) if sel.get("inventory") else None
    sel["targets"] = tuple(sel.get("targets") or ())
    return FleetSelection(**sel)


def _engine(
    rollout: Rollout, members: list[Any], connection: Connector, store: Any, opts: dict[str, Any]
) -> Any:
    from dflash_provision.rollout.engine import Engine, Options

    settings = replace(_settings(opts), min_acceptance=rollout.gate.min_acceptance)
    options = Options(
        check=settings,
        env=parse_env(opts["env_items"]),
        keep_backups=opts["keep_backups"],
        ready_timeout=opts["ready_timeout"],
        skip_failed_hosts=opts["skip_failed_hosts"],
        workers=int((rollout.check.get("selection") or {}).get("workers") or 16),
    )
    return Engine(rollout, members, make_run(connection), store, options, _progress)


def _progress(line: str) -> None:
    click.echo(line, err=True)


# -- output ------------------------------------------------------------------------------------


def _finish(ctx: click.Context, rollout: Rollout, as_json: bool) -> None:
    from dflash_provision.rollout.engine import EXIT_CODES

    code = int(EXIT_CODES.get(rollout.state, 1))
    _show(rollout, as_json, code)
    if rollout.state.value == "paused":
        click.echo(f"paused: resume with: {rollout.command('--resume')}", err=True)
    elif rollout.state.value == "rollback_failed":
        click.echo(f"ROLLBACK NOT PROVED: {rollout.message}", err=True)
    ctx.exit(code)


def _show(rollout: Rollout, as_json: bool, code: int | None = None) -> None:
    if as_json:
        doc = rollout.to_dict()
        doc.pop("new_config", None)
        doc["exit_code"] = code
        echo_document(doc)
        return
    from dflash_provision.rollout.engine import state_line

    headers = ("host", "batch", "outcome", "baseline → new → after rollback", "detail")
    table = TableSpec(tuple(Column(h) for h in headers), tuple(_row(h) for h in rollout.hosts))
    echo_table(table, f"rollout {rollout.id}: {state_line(rollout.state, rollout.message)}")


def _row(h: HostState) -> tuple[Cell, ...]:
    figures = f"{h.baseline.show()} → {h.new.show()} → {h.after.show()}"
    return tuple(Cell(c) for c in (h.name, str(h.batch or "-"), h.phase, figures, h.detail))


def _status(store: Any, rollout_id: str, as_json: bool) -> None:
    if rollout_id:
        _show(store.load(rollout_id), as_json)
        return
    rows = store.all()
    if as_json:
        keys = ("id", "created_at", "updated_at", "state")
        echo_document([dict(zip(keys, r, strict=True)) for r in rows])
        return
    if not rows:
        click.echo("no rollouts recorded")
        return
    columns = tuple(Column(h) for h in ("rollout", "state", "started", "updated"))
    cells = tuple((Cell(r[0]), Cell(r[3]), Cell(r[1]), Cell(r[2])) for r in rows)
    echo_table(TableSpec(columns, cells))


def _dry_run(
    ctx: click.Context, members: list[Any], new: Any, connection: Connector, opts: dict[str, Any]
) -> None:
    """The plan: batches, each host's change and whether its server restarts, the gate. Only
    reads (pre-flight); writes nothing, restarts nothing, records nothing."""
    from dflash_provision.rollout.plan import dry_run

    plan = dry_run(
        members, new, make_run(connection), parse_env(opts["env_items"]),
        parse_batches(opts["batches"]), rehash_files=opts["rehash_files"],
        container=opts["container"],
    )  # fmt: skip
    count = sum(len(batch) for batch in plan.batches)
    click.echo(f"plan: {new.label} (sha256 {new.sha256[:12]}) to {count} host(s)")
    for number, batch in enumerate(plan.batches, start=1):
        click.echo(f"batch {number}: {', '.join(h.name for h in batch)}")
        for h in batch:
            restart = f"server restarted (port {h.port})" if h.restart else (
                "file only: no server started by launch")  # fmt: skip
            if h.server_container:
                restart = f"docker restart of {h.server_container['container']} (port {h.port})"
            change = "; ".join(h.diff[:3]) + (
                f" (+{len(h.diff) - 3} more)" if len(h.diff) > 3 else ""
            )
            if h.old_sha256 == h.new_sha256:
                restart = "nothing to write; no restart once its baseline passes"
            click.echo(f"  {h.name}: {change or 'no change'}; {restart}")
    for name, why in plan.failed:
        click.echo(f"pre-flight failed: {name}: {why}")
    click.echo(f"gate: {_gate(opts).describe()}")

    ctx.exit(0 if plan.ok else int(ExitCode.ROLLOUT_REFUSED))
