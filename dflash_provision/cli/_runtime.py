"""What the runtime commands (launch, status, stop, logs, runtime-check, doctor) share in the
CLI: the --port option, the push command that fixes a drafter, a runtime-check report as text.
Here so that no command module imports another."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dflash_provision.cli._json_document import echo_document
from dflash_provision.errors import UsageError

if TYPE_CHECKING:
    from dflash_provision.source.authority import SourceSpec
    from dflash_provision.verify.runtime_check import CheckReport
    from dflash_provision.verify.stages import StageResult

F = TypeVar("F", bound=Callable[..., Any])

_STATUS_WORD = {
    "passed": "PASSED",
    "failed": "FAILED",
    "skipped": "skipped",
    "inconclusive": "INCONCLUSIVE",
}


def port_option(func: F) -> F:
    """--port of launch (status, stop and logs find the port: ``server_port_option``)."""
    return click.option(
        "--port",
        type=click.IntRange(1, 65535),
        default=None,
        help=(
            "The server's port on the target (it listens on 127.0.0.1 only). Default: 8000; "
            "with --restart alone, the port launch started TARGET's drafter directory on."
        ),
    )(func)


_FOUND_PORT_HELP = (
    "The server's port on the target. Default: the port that launch started TARGET's drafter "
    "directory on (its launch record; several: choose with --port), else 8000."
)


def server_port_option(func: F) -> F:
    """--port for status, stop and logs: default found from TARGET's launch records."""
    return click.option(
        "--port", type=click.IntRange(1, 65535), default=None, help=_FOUND_PORT_HELP
    )(func)


def long_context_option(func: F) -> F:
    """--no-long-context (runtime-check, doctor, rollout): stage e's long prompt not sent."""
    return click.option(
        "--no-long-context",
        is_flag=True,
        help="Do not send stage e's prompt longer than a sliding-window drafter's window (one "
        "prompt of window + 32 tokens, its acceptance past the window compared with the short "
        "prompts'); the check says it was skipped.",
    )(func)


def _container_value(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    from dflash_provision.server.container_server import parse_container_option

    if value is None:
        return None
    try:
        return parse_container_option(value)
    except UsageError as exc:
        raise click.BadParameter(exc.message, param_hint="'--container'") from None


def container_option(func: F) -> F:
    """--container [docker:|podman:]NAME: the server runs in that container on TARGET's host."""
    return click.option(
        "--container",
        "container",
        metavar="NAME",
        callback=_container_value,
        help=(
            "[docker:|podman:]NAME: the server runs in this Docker (or Podman) container on "
            "TARGET's machine; TARGET is "
            "the drafter directory on that machine (as provisioned). The container's record "
            "(docker container inspect) maps the drafter path through its mounts, both ways; "
            "its Python, processes and port are reached with docker exec, its start-up log is "
            "docker logs. Default port: --port of the container's command."
        ),
    )(func)


REHASH_FILES_HELP = (
    "When the lock pins the drafter's other files (fetch --all-files): hash every one on the "
    "host, not relying on a recorded proof of an unchanged file (sizes are always checked)."
)


def rehash_files_option(func: F) -> F:
    """--rehash-files of launch, runtime-check, doctor and rollout."""
    return click.option("--rehash-files", is_flag=True, help=REHASH_FILES_HELP)(func)


def check_options(func: F) -> F:
    """What runtime-check and doctor measure alike: the server's port, the acceptance gate, the
    smoke prompts, and the target's python and model for stage b."""
    decorators = [
        click.option("--port", type=click.IntRange(1, 65535), default=None, help=_FOUND_PORT_HELP),
        click.option(
            "--min-acceptance",
            type=click.FloatRange(0.0, 1.0),
            default=0.10,
            show_default=True,
            help="Lowest acceptable draft acceptance rate (0..1).",
        ),
        click.option(
            "--prompts",
            type=click.IntRange(1, 64),
            default=3,
            show_default=True,
            help="Greedy smoke prompts for the acceptance measurement.",
        ),
        click.option("--python", help="The target's Python for the probe (default: the server's)."),
        click.option(
            "--model", help="The target model for vLLM's resolution (default: the server's)."
        ),
        long_context_option,
        click.option(
            "--verbose",
            "-v",
            is_flag=True,
            help="A failing check: every stage's evidence and the causes the stages ruled out "
            "(by default: the failing stage, its open causes and the fix).",
        ),
        rehash_files_option,
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def fix_command(target_spec: str, authority: SourceSpec) -> str:
    """The push command that writes the same authoritative config to the same target."""
    return shlex.join(["dflash-provision", "push", target_spec, *authority.push_options()])


VERBOSE_HINT = "(-v: every stage's evidence and the causes the stages ruled out)"


def emit_report(report: CheckReport, *, as_json: bool, verbose: bool = True) -> None:
    """The report as JSON or text. A check that did not pass is short unless ``verbose``: the
    passed stages as their headline, the failing one with its evidence, its open causes and the
    fix (a passing check is shown whole: its evidence is what it proved)."""
    if as_json:
        echo_document(report.to_dict())
        return
    click.echo(
        f"runtime-check {report.target} port {report.port}  (authoritative {report.authority})"
    )
    from dflash_provision.cli._render import echo_wrapped

    short = not verbose and not report.ok
    for stage in report.stages:
        echo_wrapped(stage_lines(stage, short=short))
    failure = report.first_failure
    took = f"{report.duration_s:.1f} s (smoke prompts {report.smoke_s:.1f} s)"
    undecided = next((s for s in report.stages if s.inconclusive), None)
    if failure is None and undecided is not None:
        click.echo(
            f"runtime-check INCONCLUSIVE at stage {undecided.key} ({undecided.name}) in {took}: "
            "neither passed nor failed"
        )
    elif failure is None:
        click.echo(f"runtime-check passed in {took}")
    else:
        click.echo(f"runtime-check FAILED at stage {failure.key} ({failure.name}) in {took}")
    if short:
        click.echo(VERBOSE_HINT)


def open_causes(causes: list[str]) -> list[str]:
    """Stage e's cause lines without those a passed stage ruled out (kept for --verbose)."""
    from dflash_provision.verify.diagnosis import RULED_OUT

    return [cause for cause in causes if not cause.startswith(RULED_OUT)]


def stage_lines(stage: StageResult, *, label: str | None = None, short: bool = False) -> list[str]:
    """A stage as text: a headline with its status, evidence, causes, warnings, the fix.
    ``short``: a stage that passed or was skipped is its headline alone, and no ruled-out cause
    is listed."""
    head = label or f"{stage.key}  {stage.name}"
    lines = [f"{head}: {_STATUS_WORD[stage.status.value]}  {stage.summary}"]
    if short and not (stage.failed or stage.inconclusive):
        return lines
    lines += [f"     {line}" for line in stage.evidence if line != stage.summary]
    causes = open_causes(stage.causes) if short else stage.causes
    if causes:
        lines.append("     likely causes, in the order to check them:")
        lines += [f"       {cause}" for cause in causes]
    lines += [f"     warning: {warning}" for warning in stage.warnings]
    if stage.fix and stage.failed:
        lines.append(f"     fix: {stage.fix}")
    return lines
