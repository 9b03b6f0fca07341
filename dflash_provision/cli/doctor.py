"""``dflash-provision doctor``: one target's config pipeline as a trace, first broken link named
with the command that fixes it (see dflash_provision.verify.doctor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dflash_provision.cli._connect import (
    authority_options,
    runtime_connection_options,
)
from dflash_provision.cli._json_document import echo_document
from dflash_provision.cli._render import echo_wrapped
from dflash_provision.cli._runtime import (
    VERBOSE_HINT,
    check_options,
    container_option,
    fix_command,
    open_causes,
)
from dflash_provision.source.authority import SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerOption

_WORD = {"passed": "ok", "failed": "BROKEN", "skipped": "-", "inconclusive": "cannot tell"}


@click.command(
    "doctor",
    help=(
        "Trace TARGET's config pipeline top to bottom: authoritative config (repo, sha) → file "
        "on disk → validation layers → the config as the target's own transformers loads it → "
        "vLLM's version and its resolution of the draft → the running server on --port (and a "
        "real completion) → acceptance. Names the first broken link and the command that fixes "
        "it. Exit 0 nothing broken; otherwise the code of the first broken link: 3 invalid, "
        "4 file on disk differs, 24 runtime, 25 acceptance below --min-acceptance; 26 when "
        "nothing is broken but a link cannot tell (too few drafts, counters reset)."
    ),
)
@click.argument("target_spec", metavar="TARGET")
@authority_options
@check_options
@container_option
@click.option("--json", "as_json", is_flag=True, help="Print the trace as JSON.")
@runtime_connection_options
@click.pass_context
def command(
    ctx: click.Context,
    target_spec: str,
    authority_spec: SourceSpec,
    port: int | None,
    min_acceptance: float,
    prompts: int,
    python: str | None,
    model: str | None,
    container: ContainerOption | None,
    verbose: bool,
    rehash_files: bool,
    as_json: bool,
    connection: Connector,
    no_long_context: bool,
) -> None:
    from dflash_provision.verify.doctor import diagnose
    from dflash_provision.verify.runtime_check import CheckSettings

    target = parse_target(target_spec)
    authority = authority_spec.load()
    settings = CheckSettings(
        port=port or 8000,
        find_port=port is None,
        min_acceptance=min_acceptance,
        prompts=prompts,
        timeout=connection.ssh.command_timeout,
        python=python,
        model=model,
        long_context=not no_long_context,
        rehash_files=rehash_files,
    )
    with connection.open(target) as transport:
        found = None
        if container is not None:
            from dflash_provision.server.container_server import open_container_server

            found = open_container_server(
                transport, container, target, docker_host=connection.docker_host
            )
        report = diagnose(
            transport,
            target,
            authority,
            settings,
            push_fix=fix_command(target_spec, authority_spec),
            container=found,
        )
    if as_json:
        echo_document(report.to_dict())
    else:
        _render(report, verbose)
    ctx.exit(int(report.exit_code))


def _render(report, verbose: bool) -> None:  # type: ignore[no-untyped-def]
    """The trace. Unless ``verbose``, a trace with a broken or undecided link is short: the links
    that hold as one line each, no cause a passed stage ruled out (-v shows them)."""
    _echo(f"doctor {report.target}  (server port {report.check.port})")
    broken = report.first_broken
    short = not verbose and (broken is not None or report.undecided is not None)
    for index, link in enumerate(report.links, 1):
        marker = "  <-- first broken link" if link is broken else ""
        _echo(f"{index} {link.name:<22} {_WORD[link.status.value]:<7} {link.summary}{marker}")
        if short and link.status.value not in ("failed", "inconclusive"):
            continue
        shown = [line for line in link.evidence if line != link.summary]
        for line in shown[:12]:
            _echo(f"      {line}")
        if len(shown) > 12:
            _echo(f"      (+{len(shown) - 12} more)")
        causes = open_causes(link.causes) if short else link.causes
        if causes:
            _echo("      likely causes, in the order to check them:")
            for cause in causes:
                _echo(f"        {cause}")
        for warning in link.warnings:
            _echo(f"      warning: {warning}")
    unknown = report.undecided
    if broken is None and unknown is None:
        _echo("nothing broken: the server runs the provisioned config and its drafts are accepted")
        return
    if broken is None:
        # Never "nothing broken": the evidence of this link could not decide.
        _echo(f"cannot tell: {unknown.name}: {unknown.summary}")
        shown = unknown
    else:
        _echo(f"first broken link: {broken.name}: {broken.summary}")
        shown = broken
    if shown.fix:
        _echo(f"fix: {shown.fix}")
    if short:
        _echo(VERBOSE_HINT)


def _echo(line: str) -> None:
    """One line of the trace; on a terminal wrapped to its width (cli/_render.wrapped)."""
    echo_wrapped([line])
