"""``dflash-provision repair``: audit a fleet, then push to every host whose file is wrong.

Written to: every host that answered and whose file is not the authoritative bytes: drifted,
missing, invalid, loader_normalised, and same_values (the authoritative values in other bytes,
rewritten to the exact bytes: a lock pins bytes), through the full write protocol (atomic
write, backup, read-back), write first: the old file's bytes come back with the read-back and
are judged as an audit's read would be (fleet/repairing.py); the read-back is the fresh audit.
Never written to: hosts in sync, and hosts that could not be read (unreachable, auth,
permission, container). ``--max-failures N`` stops starting new writes once N have failed.
``--dry-run`` only shows what would change. Every write is recorded in the local history as
"started" before it begins.

Exit codes:

    0  every host ends in sync (written ones verified by a fresh audit)
    7  (REMOTE_FAILED) a write failed, was skipped by --max-failures, or a written host is not
       in sync afterwards (as push exits 7 for a failed write; 1 is kept for bugs)
    7, 8, 6 or 5  every write succeeded, but some hosts could not be checked at all, so the
       fleet is not known to be right: the audit's code for them (see cli/audit.py)
    3  (INVALID) the authoritative config itself fails validation: nothing is written
    with --dry-run: the audit's codes (0 nothing to do, 4 something would change, 5-8 unchecked)
"""

from __future__ import annotations

import time

import click

from dflash_provision.cli._fleet import FleetSelection, ProgressDisplay, fleet_options, make_run
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import echo_table
from dflash_provision.errors import ExitCode
from dflash_provision.transport.factory import Connector


@click.command("repair")
@fleet_options
@click.option("--dry-run", is_flag=True, help="Show what would be written; write nothing.")
@click.option(
    "--max-failures",
    type=click.IntRange(min=1),
    metavar="N",
    help="Start no new write after N writes failed (default: no limit).",
)
@click.option(
    "--keep-backups",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Backups of the old file to keep in <dir>/.dflash-backups.",
)
@click.option(
    "--mkdir", is_flag=True, help="Create the model directory on hosts where it is missing."
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--brief",
    is_flag=True,
    help="One line per host: a drifted host's first change and how many more, not its diff.",
)
@click.option(
    "--all-files",
    is_flag=True,
    help="Then put every file the lock pins in place on each host, as push --all-files does, "
    "--workers hosts at once, each file read from this machine's Hub cache once (see "
    "docs/pinned-files.md).",
)
@click.pass_context
def command(
    ctx: click.Context,
    selection: FleetSelection,
    connection: Connector,
    dry_run: bool,
    max_failures: int | None,
    keep_backups: int,
    mkdir: bool,
    as_json: bool,
    brief: bool,
    all_files: bool,
) -> None:
    """Audit a fleet, then push to every host whose file is not the authoritative bytes (a
    same_values file, the right values in other bytes, included), through the full write
    protocol, and audit it again (exit 0 only if all end in sync). --dry-run shows each host's
    audit detail and writes nothing. Plain TARGETs without a source use ./dflash.lock."""
    from dflash_provision.fleet import repair, repair_exit_code, report
    from dflash_provision.fleet.interrupt import FleetInterrupted
    from dflash_provision.history.store import default_store
    from dflash_provision.remote.proof import WriteOptions

    members = selection.members()
    run = make_run(connection)
    started = time.monotonic()
    try:
        with ProgressDisplay(len(members), "repairing") as display:
            repairs = repair(
                members,
                run.authority_for,
                workers=selection.workers,
                dry_run=dry_run,
                max_failures=max_failures,
                progress=lambda r: display.advance(r.name, r.action.value),
                history=default_store(),
                write=WriteOptions(keep_backups, mkdir),
                run=run,
            )
    except FleetInterrupted as stopped:
        # What was done before the Ctrl-C: the writes that finished (each journaled as it
        # happened) and the hosts audited; none was started after it.
        elapsed = time.monotonic() - started
        if as_json:
            document = report.repair_document(
                stopped.done,
                elapsed_s=elapsed,
                exit_code=int(ExitCode.INTERRUPTED),
                dry_run=dry_run,
            )
            document["summary"].update(stopped.to_dict())
            echo_document(document)
        else:
            echo_table(
                report.repair_spec(stopped.done, show_diff=not brief),
                report.repair_summary_line(stopped.done, elapsed),
            )
        click.echo(stopped.summary(len(members), "handled"), err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    elapsed = time.monotonic() - started
    code = repair_exit_code(repairs, dry_run=dry_run)
    if all_files:
        from dflash_provision.cli._all_files import repair_files_command

        repair_files_command(ctx, members, run, repairs, code, selection.workers, dry_run, as_json)
        return
    if as_json:
        document = report.repair_document(
            repairs, elapsed_s=elapsed, exit_code=int(code), dry_run=dry_run
        )
        echo_document(document)
    else:
        echo_table(
            report.repair_spec(repairs, show_diff=not brief),
            report.repair_summary_line(repairs, elapsed),
        )
    ctx.exit(int(code))
