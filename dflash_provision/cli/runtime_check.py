"""``dflash-provision runtime-check``: prove that the server on a port runs the provisioned
drafter and that its drafts are accepted (stages a-e, see dflash_provision.verify.runtime_check).

One TARGET (and no inventory): every stage with its evidence. An inventory (``-i``), ``--limit``
or several TARGETs: the fleet form, hosts in parallel, a table (``--json``, ``--prometheus``).

Exit codes: 0 every stage passed on every host; 24 a stage a-d failed (the server does not run
what was provisioned); 25 only the acceptance gate failed; 5 (fleet) some hosts could not be
checked; 26 no stage failed but one could not tell (inconclusive: a restart during the check,
impossible counters, too few draft tokens); 2 usage; the usual codes for connection errors
(single target) and Hub errors.

A passing check records its acceptance figures as a reference in the history store
(verify/reference.py); a later check of the same host, port, drafter and prompts compares.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dflash_provision.cli._fleet import FleetSelection, ProgressDisplay, fleet_options, make_run
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._runtime import check_options, container_option, emit_report
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerOption
    from dflash_provision.source.authority import Authority, SourceSpec
    from dflash_provision.verify.runtime_check import CheckSettings


@click.command(
    "runtime-check",
    help=(
        "Prove that the vLLM server on --port runs TARGET's provisioned drafter: (a) the file on "
        "disk is the authoritative config (same_values passes with a warning); (b) the "
        "target's own transformers and vLLM load it "
        "with the authoritative values; (c) the server's command line and log show method "
        "dflash, this drafter, N and aux layers = target_layer_ids + 1; (d) a real completion "
        "succeeds; (e) acceptance over greedy smoke prompts is at least --min-acceptance. Works "
        "on servers the tool did not start. With -i INVENTORY, --limit or several TARGETs: the "
        "fleet form (parallel, table, --json, --prometheus). A pass records its acceptance as "
        "the reference a later check compares with (--max-regression, --no-reference). Exit 0 "
        "all passed, 24 a stage a-d failed, 25 acceptance below the gate, 5 hosts not checked, "
        "26 inconclusive (a restart, impossible counters, too few draft tokens)."
    ),
)
@fleet_options
@check_options
@container_option
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=32,
    show_default=True,
    help="Tokens each smoke prompt generates (fixed length: ignore_eos).",
)
@click.option("--lock-repo", metavar="OWNER/NAME", help="Which repo's entry of the lock file.")
@click.option(
    "--skip-loader",
    is_flag=True,
    help="Skip stage b (the target's python, transformers and vLLM: seconds per host), e.g. "
    "for frequent acceptance alerting.",
)
@click.option(
    "--min-draft-tokens",
    type=click.IntRange(1, 1_000_000),
    default=32,
    show_default=True,
    help="Fewer draft tokens than this during the smoke prompts decide nothing: stage e is "
    "inconclusive (exit 26).",
)
@click.option(
    "--max-regression",
    metavar="FRACTION",
    callback=lambda _ctx, _param, value: _fraction(value),
    help="Fail stage e when the mean acceptance length is more than this below the acceptance "
    "reference of an earlier pass (10% or 0.1); without it a drop is a warning.",
)
@click.option(
    "--no-reference",
    is_flag=True,
    help="Neither compare with the acceptance reference nor record one.",
)
@click.option(
    "--reset-reference",
    is_flag=True,
    help="Do not compare; record this check's figures as the new reference if it passes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--prometheus",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Also write per-host acceptance gauges to a node_exporter textfile.",
)
@click.option(
    "--deadline",
    "host_deadline",
    type=click.FloatRange(1, 86400),
    metavar="SECONDS",
    help="Fleet form: the most time one host's check may take (default: 3 x --command-timeout); "
    "a host still running then is reported not checked (dflash_runtime_check_up 0) and the run "
    "goes on, so it ends within ceil(hosts / --workers) deadlines.",
)
@click.pass_context
def command(
    ctx: click.Context,
    selection: FleetSelection,
    connection: Connector,
    port: int | None,
    min_acceptance: float,
    prompts: int,
    max_tokens: int,
    python: str | None,
    model: str | None,
    container: ContainerOption | None,
    verbose: bool,
    rehash_files: bool,
    lock_repo: str | None,
    skip_loader: bool,
    min_draft_tokens: int,
    max_regression: float | None,
    no_reference: bool,
    reset_reference: bool,
    as_json: bool,
    prometheus: Path | None,
    host_deadline: float | None,
    no_long_context: bool,
) -> None:
    from dflash_provision.verify.runtime_check import CheckSettings

    if no_reference and (reset_reference or max_regression is not None):
        other = "--reset-reference" if reset_reference else "--max-regression"
        raise click.UsageError(f"--no-reference and {other} contradict each other")

    settings = CheckSettings(
        port=port or 8000,
        find_port=port is None,
        min_acceptance=min_acceptance,
        prompts=prompts,
        max_tokens=max_tokens,
        timeout=connection.ssh.command_timeout,
        python=python,
        model=model,
        probe=not skip_loader,
        min_draft_tokens=min_draft_tokens,
        max_regression=max_regression,
        references=not no_reference,
        reset_reference=reset_reference,
        long_context=not no_long_context,
        rehash_files=rehash_files,
    )
    single = len(selection.targets) == 1 and selection.inventory is None and not selection.limit
    if container is not None and not (single and prometheus is None):
        raise click.UsageError(
            "--container checks one TARGET (no inventory, --limit or --prometheus)"
        )
    if single and prometheus is None:
        ctx.exit(_single(selection, connection, settings, as_json, lock_repo, container, verbose))
    ctx.exit(_fleet(selection, connection, settings, as_json, prometheus, host_deadline))


def _fraction(value: str | None) -> float | None:
    from dflash_provision.verify.reference import parse_fraction

    if value is None:
        return None
    try:
        return parse_fraction(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--max-regression'") from None


# -- one target --------------------------------------------------------------------------------


def authority_for_single(
    selection: FleetSelection, lock_repo: str | None = None
) -> tuple[Authority, str]:
    """The authoritative config as push resolves it (``./dflash.lock`` by default), and the push
    options that name it again (for the fix command)."""
    source = selection.source(lock_repo)
    return source.load(), shlex.join(source.push_options())


def _single(
    selection: FleetSelection,
    connection: Connector,
    settings: CheckSettings,
    as_json: bool,
    lock_repo: str | None,
    container: ContainerOption | None = None,
    verbose: bool = False,
) -> int:
    from dflash_provision.server.container_server import open_container_server
    from dflash_provision.verify.runtime_check import push_fix_command, run_check

    target = parse_target(selection.targets[0])
    if selection.model_path:
        from dflash_provision.inventory.common import with_path

        target = with_path(target, selection.model_path, "command line", "--path")
    authority, args = authority_for_single(selection, lock_repo)
    with connection.open(target) as transport:
        found = None
        if container is not None:  # the container's record first: it must run
            found = open_container_server(
                transport, container, target, docker_host=connection.docker_host
            )
        report = run_check(
            transport,
            target,
            authority,
            settings,
            push_fix=push_fix_command(target, args),
            container=found,
        )
    emit_report(report, as_json=as_json, verbose=verbose)
    return int(report.exit_code)


# -- a fleet -----------------------------------------------------------------------------------


def _fleet(
    selection: FleetSelection,
    connection: Connector,
    settings: CheckSettings,
    as_json: bool,
    prometheus: Path | None,
    host_deadline: float | None = None,
) -> int:
    from dflash_provision.cli._render import echo_table
    from dflash_provision.fleet.report import write_textfile
    from dflash_provision.verify import fleet_check

    members = selection.members(default=_default_source(selection))
    run = make_run(connection)
    started = time.monotonic()
    with ProgressDisplay(len(members), "runtime-check") as display:
        rows = fleet_check.check_fleet(
            members,
            run,
            settings,
            workers=selection.workers,
            progress=lambda r: display.advance(r.name, r.verdict.value),
            host_deadline=host_deadline or fleet_check.default_host_deadline(settings.timeout),
        )
    elapsed = time.monotonic() - started
    code = fleet_check.fleet_exit_code(rows)
    if prometheus is not None:
        write_textfile(prometheus, fleet_check.prometheus_text(rows, timestamp=time.time()))
    if as_json:
        document = fleet_check.fleet_document(rows, elapsed_s=elapsed, exit_code=int(code))
        echo_document(document)
    else:
        echo_table(fleet_check.fleet_table(rows), fleet_check.summary_line(rows, elapsed))
    return int(code)


def _default_source(selection: FleetSelection) -> SourceSpec | None:
    """Plain TARGETs without a source use ./dflash.lock, as push and the single form do."""
    if selection.targets and not selection.source().is_set:
        return SourceSpec().or_default_lock()
    return None
