"""What the runtime commands (launch, status, stop, logs, runtime-check, doctor) share in the
CLI: the --port option, the push command that fixes a drafter, a runtime-check report as text.
Here so that no command module imports another."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from dflash_provision.runtime.check import CheckReport
    from dflash_provision.runtime.stages import StageResult
    from dflash_provision.source.authority import SourceSpec

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
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def fix_command(target_spec: str, authority: SourceSpec) -> str:
    """The push command that writes the same authoritative config to the same target."""
    return shlex.join(["dflash-provision", "push", target_spec, *authority.push_options()])


def emit_report(report: CheckReport, *, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str))
        return
    click.echo(
        f"runtime-check {report.target} port {report.port}  (authoritative {report.authority})"
    )
    for stage in report.stages:
        for line in stage_lines(stage):
            click.echo(line)
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


def stage_lines(stage: StageResult, *, label: str | None = None) -> list[str]:
    """A stage as text: a headline with its status, evidence, causes, warnings, the fix."""
    head = label or f"{stage.key}  {stage.name}"
    lines = [f"{head}: {_STATUS_WORD[stage.status.value]}  {stage.summary}"]
    lines += [f"     {line}" for line in stage.evidence if line != stage.summary]
    if stage.causes:
        lines.append("     likely causes, in the order to check them:")
        lines += [f"       {cause}" for cause in stage.causes]
    lines += [f"     warning: {warning}" for warning in stage.warnings]
    if stage.fix and stage.failed:
        lines.append(f"     fix: {stage.fix}")
    return lines
