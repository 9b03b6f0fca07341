"""``dflash.provision.runtime_check``: the runtime-check stages a-e for the server that serves a
host's drafter, through the play's connection, as ``dflash-provision runtime-check`` runs them.

The HTTP requests to the server are made ON the host by its Python (server/access.py), never
from the controller's loopback. The task passes only when every stage passed; a stage that
failed (a-d: the server does not run what was provisioned; e: acceptance below the gate) fails
it, and so does a stage that could not tell (inconclusive: too few draft tokens, a counter
reset): a check that cannot tell is never a pass. ``exit_code`` is the CLI's for the same
report (0, 24, 25, 26).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.ansible_modules.common import (
    HOST_OPTIONS,
    SOURCE_OPTIONS,
    HostArgs,
    SourceArgs,
    count,
    failed,
    flag,
    number,
    open_host,
    parse_host,
    parse_source,
    refuse_unknown,
    text,
)
from dflash_provision.errors import DflashProvisionError, UsageError
from dflash_provision.transport.callback import ShellRunner
from dflash_provision.verify import runtime_check as check
from dflash_provision.verify.fleet_check import HostVerdict, verdict_of
from dflash_provision.verify.reference import parse_fraction
from dflash_provision.verify.runtime_check import push_fix_command, run_check

if TYPE_CHECKING:
    from dflash_provision.verify.fleet_check import HostVerdict
    from dflash_provision.verify.runtime_check import CheckReport, CheckSettings

#: As the CLI names them (``skip_loader`` is ``--skip-loader``, and so on).
OPTIONS = (
    *HOST_OPTIONS,
    *SOURCE_OPTIONS,
    "port", "min_acceptance", "prompts", "max_tokens", "min_draft_tokens", "max_regression",
    "python", "model", "skip_loader", "no_reference", "reset_reference", "no_long_context",
)  # fmt: skip


@dataclass(frozen=True)
class RuntimeCheckArgs:
    host: HostArgs
    source: SourceArgs
    settings: CheckSettings


def parse_args(args: Mapping[str, Any]) -> RuntimeCheckArgs:
    refuse_unknown(args, OPTIONS)
    host, source = parse_host(args), parse_source(args)
    port = args.get("port")
    if port is not None:
        port = count(args, "port", 0, low=1, high=65535)
    no_reference, reset = flag(args, "no_reference"), flag(args, "reset_reference")
    regression = _regression(args.get("max_regression"))
    if no_reference and (reset or regression is not None):
        other = "reset_reference" if reset else "max_regression"
        raise UsageError(f"no_reference and {other} contradict each other")
    settings = check.CheckSettings(
        port=port or check.DEFAULT_PORT,
        find_port=port is None,
        min_acceptance=number(
            args,
            "min_acceptance",
            check.DEFAULT_MIN_ACCEPTANCE,
            check=lambda v: 0.0 <= v <= 1.0,
            meaning="a fraction from 0 to 1",
        ),
        prompts=count(args, "prompts", check.DEFAULT_PROMPTS, low=1, high=64),
        max_tokens=count(args, "max_tokens", check.DEFAULT_MAX_TOKENS, low=1, high=4096),
        timeout=host.command_timeout,
        python=text(args, "python"),
        model=text(args, "model"),
        probe=not flag(args, "skip_loader"),
        min_draft_tokens=count(
            args, "min_draft_tokens", check.DEFAULT_MIN_DRAFT_TOKENS, low=1, high=1_000_000
        ),
        max_regression=regression,
        references=not no_reference,
        reset_reference=reset,
        long_context=not flag(args, "no_long_context"),
    )
    return RuntimeCheckArgs(host, source, settings)


def _regression(value: Any) -> float | None:
    """``10%`` or ``0.1`` (a string or a YAML number), as ``--max-regression``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"max_regression: a fraction such as 10% or 0.1, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"max_regression: a fraction such as 10% or 0.1, got {value!r}")
    try:
        return parse_fraction(str(value))
    except ValueError as exc:
        raise UsageError(f"max_regression: {exc}") from None


def run_runtime_check(runner: ShellRunner, host: str, args: RuntimeCheckArgs) -> dict[str, Any]:
    """The report of ``runtime-check --json`` for ``host`` as a task result."""
    try:
        return _run(runner, host, args)
    except DflashProvisionError as exc:
        return failed(exc)


def _run(runner: ShellRunner, host: str, args: RuntimeCheckArgs) -> dict[str, Any]:
    spec = args.source.spec()
    authority = spec.load()
    transport, target = open_host(runner, host, args.host)
    fix = push_fix_command(target, shlex.join(spec.push_options()))
    report = run_check(transport, target, authority, args.settings, push_fix=fix)
    verdict, detail = verdict_of(report)
    return {
        **report.to_dict(),
        "changed": False,
        "failed": not report.ok,
        "inconclusive": verdict is HostVerdict.INCONCLUSIVE,
        "msg": _message(report, verdict, detail),
    }


def _message(report: CheckReport, verdict: HostVerdict, detail: str) -> str:
    """The task's one line: the fleet table's verdict detail (``e: ...``) in words."""
    if verdict is HostVerdict.PASSED:
        return f"every stage passed on port {report.port}: {detail}"
    if verdict is HostVerdict.INCONCLUSIVE:
        return f"cannot tell: stage {detail}"
    broken = report.first_failure
    fix = f"; fix: {broken.fix}" if broken is not None and broken.fix else ""
    return f"stage {detail} (failed){fix}"
