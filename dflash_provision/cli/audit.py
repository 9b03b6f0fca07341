"""``dflash-provision audit``: check a whole fleet for drift in parallel.

Hosts come from ``-i INVENTORY`` (our YAML, or an Ansible YAML/INI inventory: see
dflash_provision.inventory) and/or TARGET arguments. ``--repo/--revision``, ``--from``,
``--lock`` and ``--path`` override what the inventory says (and are needed for bare TARGETs).

Each host gets one SSH connection and one remote command; ``--workers`` bounds the parallelism.
Every result is recorded in the local history (``dflash-provision history``).

Exit codes:

    0  every host's config is the authoritative one, byte for byte (in_sync)
    4  (DRIFT) at least one host answered and its file is not the authoritative bytes:
       same_values (the authoritative values in other bytes: a lock pins bytes), drifted,
       missing, invalid or loader_normalised. Takes precedence: a known-wrong host is the more
       urgent news. Each host's code is its status's in file_status.EXIT_CODE.
    7, 8, 6, 5  no host is known to be wrong, but at least one could not be checked; the code is
       the one ``verify`` gives for such a host, the first of this order present: 7 the file
       could not be read (permission denied, another error), 8 container not running, 6
       authentication or host key, 5 refused, timed out, other network failure. ``--json``
       says which host is which.
    2  bad arguments or inventory; other codes as for single-target commands when the
       authoritative config cannot be loaded (e.g. 10-16 for Hub errors).
    9  (LOCAL_WRITE) every host in sync, but the --prometheus file or the history could not be
       written (the results are printed all the same).

``--prometheus FILE`` writes a node_exporter textfile-collector file atomically (metrics in
dflash_provision.fleet.report). Progress is shown only when stdout is a terminal.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from dflash_provision.cli._fleet import FleetSelection, ProgressDisplay, fleet_options, make_run
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import echo_table
from dflash_provision.errors import ExitCode
from dflash_provision.transport.factory import Connector


@click.command("audit")
@fleet_options
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--brief",
    is_flag=True,
    help="One line per host: a drifted host's first change and how many more, not its diff.",
)
@click.option(
    "--prometheus",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Also write a node_exporter textfile-collector file (atomically).",
)
@click.option(
    "--all-files",
    is_flag=True,
    help="Also check every file the lock pins on each host, where it lies; exit 4 when one is "
    "wrong, 26 when one cannot be told (see docs/pinned-files.md).",
)
@click.pass_context
def command(
    ctx: click.Context,
    selection: FleetSelection,
    connection: Connector,
    as_json: bool,
    brief: bool,
    prometheus: Path | None,
    all_files: bool,
) -> None:
    """Check a whole fleet for drift in parallel: one SSH connection and one read per host,
    every result recorded in the history. Plain TARGETs without a source use ./dflash.lock."""
    from dflash_provision.fleet import audit, audit_exit_code, report
    from dflash_provision.fleet.interrupt import FleetInterrupted
    from dflash_provision.history.store import default_store

    members = selection.members()
    run = make_run(connection)
    started = time.monotonic()
    if all_files:
        from dflash_provision.cli._all_files import audit_all_files_command

        audit_all_files_command(ctx, members, run, selection.workers, as_json, prometheus)
        return
    try:
        with ProgressDisplay(len(members), "auditing") as display:
            audits = audit(
                members,
                run.authority_for,
                workers=selection.workers,
                progress=lambda a: display.advance(a.name, a.status.value),
                history=default_store(),
                run=run,
            )
    except FleetInterrupted as stopped:
        # What was audited before the Ctrl-C (recorded in history too); no --prometheus file:
        # one that lacks the hosts not contacted would tell node_exporter a false story.
        elapsed = time.monotonic() - started
        if as_json:
            document = report.audit_document(
                stopped.done, elapsed_s=elapsed, exit_code=int(ExitCode.INTERRUPTED)
            )
            document["summary"].update(stopped.to_dict())
            echo_document(document)
        else:
            echo_table(
                report.audit_spec(stopped.done, show_diff=not brief),
                report.summary_line(stopped.done, elapsed),
            )
        click.echo(stopped.summary(len(members), "audited"), err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    elapsed = time.monotonic() - started
    code = int(audit_exit_code(audits))
    if as_json:
        document = report.audit_document(audits, elapsed_s=elapsed, exit_code=code)
        echo_document(document)
    else:
        echo_table(
            report.audit_spec(audits, show_diff=not brief), report.summary_line(audits, elapsed)
        )
    # After the results are out: a textfile that cannot be written loses no audit.
    if prometheus is not None:
        try:
            report.write_textfile(
                prometheus,
                report.prometheus_text(audits, timestamp=time.time(), run_duration_s=elapsed),
            )
        except OSError as exc:
            click.echo(f"error: {_textfile_failure(prometheus, exc)}", err=True)
            code = code or int(ExitCode.LOCAL_WRITE)  # drift or unreachable hosts stay the news
    ctx.exit(code)


def _textfile_failure(path: Path, exc: OSError) -> str:
    directory = path.parent if str(path.parent) else Path(".")
    why = exc.strerror or str(exc)
    if not directory.is_dir():
        return f"--prometheus {path}: directory {directory} does not exist; create it first"
    return f"--prometheus {path}: cannot write ({why}); nothing written there"
