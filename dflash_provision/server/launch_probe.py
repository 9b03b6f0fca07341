"""``launch``'s pre-flight questions to the target's own vLLM, before anything is stopped or
started: the probe of runtime-check's stage b (vllm/probe.py), run with the python that runs
the ``--vllm`` command, then judged by vllm/features.py.

- which model runner serves this drafter there, and so whether ``VLLM_USE_V2_MODEL_RUNNER`` is
  set (only where that vLLM needs it to pick the runner and knows the variable; 0.34 has no V1
  runner and refuses any value but 1), or refused (no runner serves the layout: which vLLM
  can; V2 without Triton on the host);
- whether that vLLM runs the drafter as trained (aux ids, sliding windows): a refusal naming
  what is needed (``--force`` starts it anyway, with the finding as a warning);
- the ``--speculative-config`` keys it would reject at start-up;
- whether it takes ``--per-request-spec-decode-metrics`` (``RunnerPlan.vllm`` carries the
  answer; vllm/request_acceptance.py ``launch_args`` decides what launch passes).

A probe that cannot answer (no python with vLLM found, a timeout) is a warning, not a pass of
these checks: launch then falls back to the layout rule (a mixed drafter gets the V2 runner)
and vLLM's own start-up decides.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import ExitCode, RuntimeFailure
from dflash_provision.server.bounded import EndedAtDeadline, run_bounded
from dflash_provision.server.probe_run import run_probe_on
from dflash_provision.transport.base import Transport
from dflash_provision.validation.speculators_layout import runtime_view
from dflash_provision.vllm.features import (
    MIXED_FIX,
    judge_attention,
    judge_aux,
    layout_refused,
    refusals_text,
    rejected_keys,
    serving_runners,
)

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
_SHEBANG_BYTES = 256
#: The probe imports vLLM cold (20-36 s on an idle 2-core host, over 60 s on a loaded one):
#: once, before a start that takes minutes.
PROBE_BUDGET_S = 180.0


@dataclass
class RunnerPlan:
    """What pre-flight learnt from the target's vLLM: the server's env, and what it said."""

    python: str
    env: dict[str, str]
    added: list[str]
    runner: str | None = None  # "v1" / "v2": the runner that will serve, when known
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    answered: bool = False  # the probe answered with vLLM's resolution of the draft
    vllm: dict[str, Any] | None = None  # the probe's answer about vLLM (importable)


def vllm_python(transport: Transport, vllm_cmd: tuple[str, ...], fallback: str | None) -> str:
    """The python that runs ``vllm_cmd`` on the target: the command itself when it is a python,
    else the interpreter its script names (``#!/venv/bin/python``, ``#!/usr/bin/env python3``),
    else ``fallback`` or python3."""
    first = vllm_cmd[0]
    if posixpath.basename(first).startswith("python"):
        return first
    script = 'p=$(command -v -- "$1") && head -c ' + str(_SHEBANG_BYTES) + ' -- "$p"'
    try:
        result = run_bounded(transport, ["sh", "-c", script, "sh", first], timeout=30)
    except EndedAtDeadline:
        return fallback or "python3"
    line = result.stdout[:_SHEBANG_BYTES].decode("utf-8", "replace").split("\n", 1)[0]
    if result.exit_status == 0 and line.startswith("#!"):
        words = line[2:].split()
        if words and posixpath.basename(words[0]) == "env" and len(words) > 1:
            words = words[1:]
        if words and posixpath.basename(words[0]).startswith("python"):
            return words[0]
    return fallback or "python3"


def plan_runner(
    transport: Transport,
    drafter_dir: str,
    doc: dict[str, Any],
    model: str,
    num_spec: int,
    env: dict[str, str],
    *,
    vllm_cmd: tuple[str, ...],
    python: str | None,
    speculative_keys: list[str],
    force: bool,
    timeout: float,
) -> RunnerPlan:
    """Ask the target's vLLM (module docstring); raises the refusal."""
    found = vllm_python(transport, vllm_cmd, python)
    budget = max(timeout, PROBE_BUDGET_S)
    answer = run_probe_on(transport, drafter_dir, found, model, num_spec, budget, vllm_only=True)
    return plan_from_answer(
        answer,
        found,
        doc,
        env,
        speculative_keys=speculative_keys,
        force=force,
        where=transport.description,
    )


def plan_from_answer(
    answer: Any,
    found: str,
    doc: dict[str, Any],
    env: dict[str, str],
    *,
    speculative_keys: list[str],
    force: bool,
    where: str,
) -> RunnerPlan:
    """The plan from the probe's ``answer`` (run with the python ``found``); raises the refusal.
    Which runner serves is asked first: a layout no runner serves is refused as such, with
    the vLLM that can (``--force`` cannot start what no runner serves)."""
    plan = RunnerPlan(found, dict(env), [])
    vllm = answer.get("vllm") if isinstance(answer, dict) else None
    if not isinstance(vllm, dict) or not vllm.get("importable"):
        why = answer if isinstance(answer, str) else (vllm or {}).get("error")
        plan.warnings.append(
            f"cannot tell what vLLM does with this drafter: the probe with {found} had no "
            f"answer from vLLM ({why}); the layout rule applies and vLLM's start-up decides"
        )
        return plan
    plan.vllm = vllm
    version = str(vllm.get("version"))
    _check_keys(speculative_keys, vllm, version, plan)
    draft = vllm.get("draft")
    if not isinstance(draft, dict):
        raise RuntimeFailure(
            f"pre-flight: vLLM {version} on {where} cannot resolve this draft "
            f"config: {vllm.get('error')}",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    plan.answered = True
    _choose_runner(draft, version, plan)
    _judge_as_trained(draft, doc, version, plan, force=force)
    return plan


def _check_keys(keys: list[str], vllm: dict[str, Any], version: str, plan: RunnerPlan) -> None:
    rejected, why = rejected_keys(keys, vllm)
    if rejected is None:
        if keys:
            plan.warnings.append(
                f"cannot tell whether vLLM {version} takes the --speculative-config keys "
                f"{', '.join(keys)} ({why})"
            )
        return
    if rejected:
        raise RuntimeFailure(
            f"pre-flight: vLLM {version} rejects the --speculative-config key(s) "
            f"{', '.join(rejected)} at start-up (its SpeculativeConfig has no such field and "
            "forbids others): drop them",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )


def _judge_as_trained(
    draft: dict[str, Any], doc: dict[str, Any], version: str, plan: RunnerPlan, *, force: bool
) -> None:
    """Refuse a vLLM that would run the drafter otherwise than trained (stage b's finding)."""
    view = runtime_view(doc)
    inner = view.get("dflash_config")
    ids = inner.get("target_layer_ids") if isinstance(inner, dict) else None
    ids = ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
    judged = judge_aux(draft, ids, version)
    judged.extend(judge_attention(draft, view, version))
    plan.warnings += [f"cannot tell: {line}" for line in judged.unknowns]
    if not judged.problems:
        return
    message = f"vLLM {version} would not run this drafter as trained: {judged.problems[0]}"
    more = len(judged.problems) - 1
    message += f" (+{more} more)" if more else ""
    if force:
        plan.warnings.append(f"--force: starting although {message}")
        return
    fix = f"; {judged.fix}" if judged.fix else ""
    raise RuntimeFailure(
        f"pre-flight: {message}{fix} (--force starts it anyway)",
        exit_code=ExitCode.VLLM_UNUSABLE,
    )


def _choose_runner(draft: dict[str, Any], version: str, plan: RunnerPlan) -> None:
    """Set VLLM_USE_V2_MODEL_RUNNER only where this vLLM needs and takes it (module docstring)."""
    runners = draft.get("runners")
    if not isinstance(runners, dict):
        plan.warnings.append("cannot tell which model runner serves this drafter (older probe)")
        return
    serve, unknown, refused = serving_runners(draft)
    no_triton = "v2" in serve and runners.get("triton") is False
    if no_triton:
        serve.remove("v2")
        refused["v2"] = "V2 needs Triton, which this vLLM cannot import on this host"
    v1_gone = (runners.get("v1") or {}).get("present") is False
    given = plan.env.get(V2_RUNNER_ENV)
    if v1_gone and given is not None and given != "1":
        raise RuntimeFailure(
            f"pre-flight: --env {V2_RUNNER_ENV}={given}: vLLM {version} has no V1 runner and "
            "refuses this variable at start-up unless it is 1: drop that --env",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    if not serve and not unknown:
        # What can serve it is named only for a layout or Triton refusal: a runner that refuses
        # the speculative method says so itself.
        can = f"; {MIXED_FIX} can" if layout_refused(draft) or no_triton else ""
        raise RuntimeFailure(
            f"pre-flight: no model runner of vLLM {version} can serve this drafter here: "
            f"{refusals_text(draft, refused)}{can}",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    if given is not None and not v1_gone:
        chosen = "v2" if given == "1" else "v1"
        if chosen in refused:
            raise RuntimeFailure(
                f"pre-flight: --env {V2_RUNNER_ENV}={given} picks the {chosen.upper()} runner, "
                f"which cannot serve this drafter ({refused[chosen]}): drop that --env",
                exit_code=ExitCode.VLLM_UNUSABLE,
            )
        plan.runner = chosen
        return
    default = runners.get("default")
    if default in serve or (default in unknown and not serve):
        plan.runner = default
        return
    want = serve[0] if serve else None
    if want is None:
        return
    if runners.get("env_known") is not True:
        raise RuntimeFailure(
            f"pre-flight: vLLM {version} picks the {str(default).upper()} runner, which cannot "
            f"serve this drafter ({refused.get(str(default), 'cannot tell')}), and has no "
            f"{V2_RUNNER_ENV} to pick {want.upper()}",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    plan.env[V2_RUNNER_ENV] = "1" if want == "v2" else "0"
    plan.added.append(V2_RUNNER_ENV)
    plan.runner = want
    plan.notes.append(
        f"{V2_RUNNER_ENV}={plan.env[V2_RUNNER_ENV]}: vLLM {version}'s default "
        f"{str(default).upper()} runner cannot serve this drafter ({refused.get(str(default))})"
    )


def describe(plan: RunnerPlan) -> str:
    """One note line: which python answered and the runner that will serve."""
    runner = f", the {plan.runner.upper()} model runner serves it" if plan.runner else ""
    return f"vLLM asked with {shlex.quote(plan.python)}{runner}"
