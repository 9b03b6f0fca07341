"""``--all-files`` of verify and audit: the pinned files checked where they lie, rendered."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._fleet import ProgressDisplay
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import echo_table
from dflash_provision.errors import ExitCode, RemoteStepFailed
from dflash_provision.fleet import files_repair, report
from dflash_provision.fleet.files_audit import (
    HostFilesAudit,
    audit_all_files,
    files_summary,
    fleet_exit_code,
)
from dflash_provision.fleet.files_repair import repair_all_files
from dflash_provision.fleet.interrupt import FleetInterrupted
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import default_store
from dflash_provision.host_state.file_status import Command, HostStatus
from dflash_provision.host_state.files_status import combined_exit
from dflash_provision.host_state.pinned_check import check_pinned_files
from dflash_provision.place.push import verify_config
from dflash_provision.place.push_files import push_files
from dflash_provision.remote.place_files import cached_copy
from dflash_provision.source.pinned_source import pinned_for

if TYPE_CHECKING:
    from dflash_provision.fleet.results import HostRepair
    from dflash_provision.fleet.run import FleetRun
    from dflash_provision.history.store import HistoryStore
    from dflash_provision.host_state.files_status import FilesJudgement
    from dflash_provision.inventory import FleetMember
    from dflash_provision.place.push_files import FilesPush
    from dflash_provision.source.authority import Authority, SourceSpec
    from dflash_provision.source.pinned_files import PinnedFile
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport
    from dflash_provision.transport.factory import Connector


def verify_all_files(
    ctx: click.Context,
    target: Target,
    spec: SourceSpec,
    authority: Authority,
    connection: Connector,
    as_json: bool,
) -> None:
    """verify TARGET --all-files: the config as verify reads it, then every pinned file, on one
    connection; one exit code for both (check/files_status.combined_exit)."""
    pinned = pinned_for(spec, authority)
    store = default_store()
    with connection.open(target) as transport:
        result = verify_config(transport, target, authority)
        files = check_pinned_files(
            transport,
            target.model_dir,
            pinned,
            host=HostKey.of_target(target),
            history=store,
        )
    code = combined_exit(result.exit_code, files.exit_code(Command.VERIFY))
    if as_json:
        document = result.to_dict()
        document["files"] = files.to_dict()
        document["exit_code"] = int(code)
        echo_document(document)
        ctx.exit(int(code))
    if not result.status.audited:
        raise RemoteStepFailed(f"{result.target}: {result.message}", step="read")
    click.echo(f"{result.status.value}: {result.target}: {result.message}")
    for line in result.diff.lines if result.diff else []:
        click.echo(f"  {line}")
    echo_files(files)
    if store.problem is not None:
        click.echo(f"warning: proofs not recorded: {store.problem}", err=True)
    ctx.exit(int(code))


def echo_files(files: FilesJudgement, indent: str = "") -> None:
    """The files' verdict: a status line, then one line per file that is not proved, and a
    line that says when the check relied on recorded proofs instead of hashing."""
    click.echo(f"{indent}files {files.status.value}: {files.detail}")
    for item in files.problems:
        click.echo(f"{indent}  {item.verdict.value}: {item.name}: {item.detail}")
    relied = files.relied
    if relied:
        names = ", ".join(f.name for f in relied)
        click.echo(
            f"{indent}  relied on recorded proofs (unchanged device, inode, size, mtime, ctime; "
            f"not hashed again): {names}"
        )


def audit_all_files_command(
    ctx: click.Context,
    members: Sequence[FleetMember],
    run: FleetRun,
    workers: int,
    as_json: bool,
    prometheus: Path | None,
) -> None:
    """audit --all-files: the configs as audit reports them, each host's files after them."""
    started = time.monotonic()
    try:
        with ProgressDisplay(len(members), "auditing") as display:
            results = audit_all_files(
                members,
                run,
                workers=workers,
                progress=lambda r: display.advance(r.audit.name, _progress_word(r)),
                history=default_store(),
            )
    except FleetInterrupted as stopped:
        finished = [r for r in stopped.done if isinstance(r, HostFilesAudit)]
        _echo_audit(finished, time.monotonic() - started, ExitCode.INTERRUPTED, as_json)
        click.echo(stopped.summary(len(members), "audited"), err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    elapsed = time.monotonic() - started
    audits = [r.audit for r in results]
    code = fleet_exit_code(results)
    _echo_audit(results, elapsed, code, as_json)
    if prometheus is not None:  # the configs' metrics, as audit writes them
        try:
            report.write_textfile(
                prometheus,
                report.prometheus_text(audits, timestamp=time.time(), run_duration_s=elapsed),
            )
        except OSError as exc:
            click.echo(f"error: --prometheus {prometheus}: cannot write ({exc})", err=True)
            code = code or ExitCode.LOCAL_WRITE
    ctx.exit(int(code))


def _echo_audit(
    results: Sequence[HostFilesAudit], elapsed: float, code: ExitCode, as_json: bool
) -> None:
    audits = [r.audit for r in results]
    if as_json:
        document = report.audit_document(audits, elapsed_s=elapsed, exit_code=int(code))
        document["hosts"] = [r.to_dict() for r in results]
        document["summary"]["files"] = files_summary(results)
        echo_document(document)
        return
    echo_table(report.audit_spec(audits), report.summary_line(audits, elapsed))
    for result in results:
        if result.files is None:
            click.echo(f"{result.audit.name}: files not checked ({result.audit.status.value})")
        else:
            click.echo(f"{result.audit.name}:")
            echo_files(result.files, indent="  ")
    click.echo(files_summary(results))


def _progress_word(result: HostFilesAudit) -> str:
    files = f", files {result.files.status.value}" if result.files else ""
    return f"{result.audit.status.value}{files}"


def push_pinned_files(
    transport: Transport,
    target: Target,
    pinned: list[PinnedFile],
    store: HistoryStore | None,
    as_json: bool,
) -> FilesPush:
    """push --all-files after the config: the files checked, the wrong ones placed (progress in
    bytes on stderr), checked again."""
    hub_timeout = max(60.0, transport.command_timeout)

    def progress(name: str, done: int, size: int) -> None:
        if not as_json:
            click.echo(f"placing {name}: {done}/{size} bytes", err=True)

    return push_files(
        transport,
        target.model_dir,
        pinned,
        host=HostKey.of_target(target),
        history=store,
        source_for=lambda item: cached_copy(item, timeout=hub_timeout),
        progress=progress,
    )


def echo_files_push(files: FilesPush) -> None:
    for placed in files.placed:
        resumed = f", resumed at {placed.resumed_at} bytes" if placed.resumed_at else ""
        mode = f", mode {placed.mode} ({placed.mode_from})" if placed.mode else ""
        click.echo(f"placed {placed.name}: {placed.size} bytes, {placed.sent} sent{resumed}{mode}")
    echo_files(files.after)
    strays = [f.name for f in files.after.problems if f.verdict.value == "stray"]
    if strays:
        click.echo(
            f"  not removed (remove them by hand if vLLM must not load them): {', '.join(strays)}"
        )


def repair_files_command(
    ctx: click.Context,
    members: Sequence[FleetMember],
    run: FleetRun,
    repairs: Sequence[HostRepair],
    config_code: ExitCode,
    workers: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    """repair --all-files: the configs' repair as repair reports it, then every host whose
    config ended in sync has its files made right (checked only with --dry-run)."""
    started = time.monotonic()
    ready = [
        m for m, r in zip(members, repairs, strict=True) if r.final.status is HostStatus.IN_SYNC
    ]
    with ProgressDisplay(len(ready), "placing files") as display:
        results = repair_all_files(
            ready,
            run,
            workers=workers,
            dry_run=dry_run,
            hub_timeout=max(60.0, run.connector.ssh.command_timeout),
            progress=lambda r: display.advance(r.name, f"{r.bytes_sent} bytes placed"),
            history=None if dry_run else default_store(),
        )
    elapsed = time.monotonic() - started
    by_name = {r.name: r for r in results}
    files_code = files_repair.fleet_exit_code(results)
    if dry_run:  # as audit: a wrong file is drift
        files_code = ExitCode.DRIFT if files_code is not ExitCode.OK else files_code
    code = config_code if config_code is not ExitCode.OK else files_code
    if as_json:
        document = report.repair_document(
            repairs, elapsed_s=elapsed, exit_code=int(code), dry_run=dry_run
        )
        for host in document["hosts"]:
            result = by_name.get(host["name"])
            host["files"] = result.to_dict() if result is not None else None
        echo_document(document)
        ctx.exit(int(code))
    echo_table(report.repair_spec(repairs), report.repair_summary_line(repairs, elapsed))
    for result in results:
        click.echo(f"{result.name}:")
        if result.files is None:
            click.echo(f"  files not made right: {result.error}")
            continue
        for placed in result.files.placed:
            resumed = f", resumed at {placed.resumed_at} bytes" if placed.resumed_at else ""
            mode = f", mode {placed.mode} ({placed.mode_from})" if placed.mode else ""
            click.echo(
                f"  placed {placed.name}: {placed.size} bytes, {placed.sent} sent{resumed}{mode}"
            )
        echo_files(result.files.after if not dry_run else result.files.before, indent="  ")
    for member, repair in zip(members, repairs, strict=True):
        if member.name not in by_name:
            click.echo(f"{member.name}: files not checked (config {repair.final.status.value})")
    ctx.exit(int(code))
