"""runtime-check stages d (one real completion) and e (spec-decode acceptance over greedy smoke
prompts, judged by verify/acceptance_gate.py); the causes named when acceptance fails come from
verify/diagnosis.py."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from dflash_provision.verify.acceptance_gate import (
    AcceptanceRules,
    AcceptanceVerdict,
    Finding,
    Observed,
    judge,
)
from dflash_provision.verify.diagnosis import diagnose, render_causes
from dflash_provision.verify.link_fixes import completion_fix
from dflash_provision.verify.stage_server import server_model
from dflash_provision.verify.stages import STAGE_NAMES, CheckContext, StageResult, StageStatus
from dflash_provision.vllm.argv import has_switch
from dflash_provision.vllm.metrics import Acceptance
from dflash_provision.vllm.request_acceptance import FigureSource, read_figures

# -- d and e: a real completion, then acceptance over a few smoke prompts ----------------------

# Fixed prompts: greedy decoding of the same prompts on the same model drafts the same way, so
# runs are comparable from one check to the next.
SMOKE_PROMPTS = (
    "The history of the printing press begins",
    "def fibonacci(n):\n    ",
    "Count from one to twenty in words: one, two,",
    "A recipe for bread needs flour, water,",
)
MAX_REPLY = 1024 * 1024


@dataclass
class Completion:
    ok: bool
    tokens: int = 0
    text: str = ""
    error: str = ""
    status: int | None = None
    # The reply's own spec-decode figures (vllm/request_acceptance.py): None when it has none
    per_request: Any = None


def served_model_id(access: Any, fallback: str | None, timeout: float) -> str | None:
    """The model name the server answers to (``/v1/models``), else ``fallback``."""
    try:
        reply = access.request("GET", "/v1/models", timeout=timeout, max_bytes=MAX_REPLY)
        models = json.loads(reply.body).get("data") or []
        if reply.status == 200 and models and isinstance(models[0].get("id"), str):
            return str(models[0]["id"])
    except (ValueError, AttributeError, TypeError):
        pass
    return fallback


def complete(
    access: Any, model_id: str | None, prompt: str, max_tokens: int, timeout: float
) -> Completion:
    """One greedy completion of exactly ``max_tokens`` tokens (ignore_eos): same work each run."""
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    reply = access.request(
        "POST", "/v1/completions", json.dumps(body).encode(), timeout=timeout, max_bytes=MAX_REPLY
    )
    short = cut_short(reply)
    if short:
        return Completion(False, error=short, status=reply.status)
    text = reply.body.decode("utf-8", "replace") if isinstance(reply.body, bytes) else reply.body
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if reply.status != 200 or not isinstance(parsed, dict) or not parsed.get("choices"):
        return Completion(False, error=_error_text(parsed, text), status=reply.status)
    usage = parsed.get("usage") or {}
    tokens = usage.get("completion_tokens")
    choice = parsed["choices"][0]
    return Completion(
        True,
        tokens=tokens if isinstance(tokens, int) and tokens >= 0 else max_tokens,
        text=str(choice.get("text", ""))[:200],
        status=reply.status,
        per_request=read_figures(parsed),
    )


def cut_short(reply: Any) -> str | None:
    """Why a reply's body is not whole (longer than our limit, or fewer bytes than its
    Content-Length), else None: a cut reply must not pass for an empty answer or low counters."""
    if getattr(reply, "truncated", False):
        return f"the reply is longer than the {MAX_REPLY} bytes read"
    announced = (getattr(reply, "headers", None) or {}).get("content-length", "")
    if announced.isdigit() and len(reply.body) < int(announced):
        return (
            f"the reply was cut short: {len(reply.body)} of {announced} bytes arrived "
            "(the connection to the server lost the rest)"
        )
    return None


def _error_text(parsed: Any, text: str) -> str:
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("message", parsed))
        if isinstance(error, dict):
            error = error.get("message", error)
        return " ".join(str(error).split())[:400]
    return " ".join(text.split())[:400] or "empty reply"


def stage_completion(ctx: CheckContext, first: Completion, fatal_after: list[str]) -> StageResult:
    """d: the first smoke completion, as the proof that the server can serve at all."""
    name = STAGE_NAMES["d"]
    if first.ok:
        summary = f"completion of {first.tokens} tokens returned"
        evidence = [f"text: {first.text!r}"]
        if not first.text.strip():
            # A reader would take '' for a failure; it is what a synthetic model (the demo's
            # tiny target) serves, and what this stage proves is that tokens came back.
            evidence.append(
                f"an empty text is expected from a synthetic model: its {first.tokens} tokens "
                "decode to nothing visible (special tokens such as <|endoftext|> are left out "
                "of the text); from a real model it would be worth a look"
            )
        return StageResult("d", name, StageStatus.PASSED, summary, evidence)
    summary = f"the completion failed (HTTP {first.status}): {first.error}"
    if fatal_after and fatal_after[0][:200] not in first.error:
        summary += f"; the server logged: {fatal_after[0][:300]}"
    evidence = [summary, *[f"log: {line[:300]}" for line in fatal_after[:3]]]
    return StageResult(
        "d",
        name,
        StageStatus.FAILED,
        summary,
        evidence,
        {"status": first.status},
        fix=completion_fix(ctx.target, first.status, first.error, server_model(ctx.server)),
    )


def _endpoint_fix(ctx: CheckContext, path: str) -> str:
    target = shlex.quote(ctx.target.display())
    return (
        f"the server's {path} endpoint misbehaves (it did not answer within the deadline, or "
        "answered too much): this says nothing about the drafter; look at the server "
        f"(dflash-provision logs {target}) and at whatever answers on its port (a proxy?)"
    )


def endpoint_failed(ctx: CheckContext, key: str, error: Any) -> StageResult:
    """Stage ``key`` failed because an endpoint's answer was unusable (``access.ReplyUnusable``:
    dripped past its deadline, larger than its bound, cut short): the message names the request,
    and the fix is about that endpoint, never the drafter."""
    message = str(getattr(error, "message", error))
    path = message.split(":", 1)[0].split(" ", 1)[-1] if ":" in message else "/metrics"
    what = "the counters" if path == "/metrics" else f"{path}"
    summary = f"{what} could not be read: {message}"
    return StageResult(
        key,
        STAGE_NAMES[key],
        StageStatus.FAILED,
        summary,
        [summary],
        {"endpoint": path, "error": message},
        fix=_endpoint_fix(ctx, path),
    )


def stage_acceptance(
    ctx: CheckContext,
    figures: Acceptance,
    *,
    rules: AcceptanceRules,
    observed: Observed,
    prompts: int,
    earlier: dict[str, StageResult],
    num_spec: int | None,
    source: FigureSource | None = None,
) -> StageResult:
    """e: the smoke prompts' counter difference judged by the one acceptance gate
    (verify/acceptance_gate.py), rendered with its evidence; the likely causes of a failed gate
    ranked by the diagnosis (verify/diagnosis.py)."""
    verdict = judge(figures, rules, observed)
    name = STAGE_NAMES["e"]
    data = stage_data(verdict, prompts) | (source.to_dict() if source is not None else {})
    delta = figures.delta
    evidence = [
        f"{prompts} greedy prompt(s), {figures.expected_max_drafts} tokens: "
        f"{delta.drafts:g} drafts, {delta.draft_tokens:g} draft tokens, {delta.accepted:g} accepted"
    ]
    if source is not None:
        evidence.append(source.line())
    warnings = _traffic_warnings(figures) + list(rules.notes)
    status = StageStatus(verdict.outcome.value)
    early = _early_summary(ctx, verdict)
    if early is not None:
        if verdict.finding in (Finding.NO_VLLM_METRICS, Finding.NOT_SPECULATING):
            evidence = [early, *([source.line()] if source is not None else [])]
        else:
            evidence.append(early)
        return StageResult(
            "e", name, status, early, evidence, data, warnings=warnings, acceptance=verdict
        )
    rate, mean = figures.rate, figures.mean_length
    assert rate is not None and mean is not None  # a verdict past _early_summary has both
    per_pos = ", ".join(f"{p:.3f}" for p in figures.per_position)
    evidence.append(
        f"acceptance rate {rate:.1%}, mean acceptance length {mean:.2f}, "
        f"per position {per_pos or '-'}"
    )
    _reference_lines(verdict, evidence, warnings)
    if verdict.passed:
        summary = f"acceptance {rate:.1%} (>= {rules.min_acceptance:.1%})"
        return StageResult(
            "e", name, status, summary, evidence, data, warnings=warnings, acceptance=verdict
        )
    summary = f"acceptance {rate:.1%} is below --min-acceptance {rules.min_acceptance:.1%}"
    if verdict.finding is Finding.REGRESSED:
        summary = f"{_versus(verdict)}: {verdict.regression:.1%} lower, more than --max-regression "
        summary += f"{rules.max_regression:.1%}"
    verdict = diagnose(ctx, earlier, verdict, num_spec)
    return StageResult(
        "e", name, status, summary, evidence, data,
        causes=render_causes(verdict), warnings=warnings, acceptance=verdict,
    )  # fmt: skip


def stage_data(verdict: AcceptanceVerdict, prompts: int) -> dict[str, Any]:
    """Stage e's data in --json: the figures, the rules, the reference and the regression."""
    rules = verdict.rules
    return verdict.figures.to_dict() | {
        "min_acceptance": rules.min_acceptance,
        "min_draft_tokens": rules.min_draft_tokens,
        "prompts": prompts,
        "reference": rules.reference.to_dict() if rules.reference is not None else None,
        "regression": verdict.regression,
        "reference_mismatch": rules.reference_mismatch,
    }


def _early_summary(ctx: CheckContext, verdict: AcceptanceVerdict) -> str | None:
    """The summary of a verdict reached before any rate (no metrics, no evidence, no drafts)."""
    figures = verdict.figures
    finding = verdict.finding
    if finding is Finding.NO_VLLM_METRICS:
        return (
            "cannot tell whether the server speculates: its /metrics has no vllm: metric at all"
            f"{_stats_off(ctx)}; serve without --disable-log-stats to have acceptance measured"
        )
    if finding is Finding.NOT_SPECULATING:
        return "the server exports no spec-decode metrics: it is not speculating"
    if finding is Finding.FIGURES_NOT_EVIDENCE:
        return f"the acceptance figures are no evidence: {verdict.observed.not_evidence}"
    if finding is Finding.COUNTERS_RESTARTED:
        return (
            "the server restarted during the check (its counters began again: "
            f"{'; '.join(figures.decreased[:4])}): no acceptance rate can be computed; "
            "run the check again"
        )
    if finding is Finding.COUNTERS_IMPOSSIBLE:
        return (
            "the server's counters are impossible, so they are no evidence: "
            f"{'; '.join(figures.impossible[:4])}"
        )
    if finding is Finding.TOO_FEW_DRAFT_TOKENS:
        return (
            f"only {figures.delta.draft_tokens:g} draft tokens during the check, fewer than "
            f"--min-draft-tokens {verdict.rules.min_draft_tokens}: too few to judge (raise "
            "--prompts or --max-tokens)"
        )
    if finding is Finding.NO_DRAFTS:
        return "no drafts were counted during the smoke prompts: the drafter is not drafting"
    return None


def _stats_off(ctx: CheckContext) -> str:
    argv = [str(a) for a in getattr(ctx.server, "argv", None) or []]
    if has_switch(argv, "--disable-log-stats"):
        return " (it was started with --disable-log-stats, which removes them)"
    return " (--disable-log-stats removes them; so may a proxy in front of it)"


def _traffic_warnings(acceptance: Acceptance) -> list[str]:
    """Other clients' traffic in the window. It does not change the verdict: their drafts come
    from the same server and drafter, so a collapse still shows (and a busy production server
    must stay checkable); but the window is no clean measurement, so no reference is compared
    or recorded from it (check.py)."""
    warnings = []
    if acceptance.foreign_requests:
        warnings.append(
            f"other traffic mixed into the counters: the server finished "
            f"{acceptance.foreign_requests} request(s) from other clients during the check "
            f"({acceptance.delta.requests:g} finished, {acceptance.own_requests} were the "
            "check's own); the figures include theirs"
        )
    if acceptance.foreign_drafts:
        warnings.append(
            f"other traffic mixed into the counters: {acceptance.foreign_drafts} drafts more than "
            "the smoke prompts can explain; the rate includes other clients' requests"
        )
    return warnings


def _versus(verdict: AcceptanceVerdict) -> str:
    reference = verdict.rules.reference
    assert reference is not None and verdict.figures.mean_length is not None
    return (
        f"mean acceptance length {verdict.figures.mean_length:.2f} vs "
        f"{reference.mean_acceptance_length:.2f} in the reference of {reference.recorded_at} "
        f"(vLLM {reference.vllm_version or '?'})"
    )


def _reference_lines(verdict: AcceptanceVerdict, evidence: list[str], warnings: list[str]) -> None:
    """The comparison with the reference as evidence; a drop the gate lets pass, a warning."""
    drop = verdict.regression
    if drop is None:
        return
    evidence.append(f"{_versus(verdict)}: {_change(drop)}")
    mismatch = verdict.rules.reference_mismatch
    if mismatch is not None:
        warnings.append(mismatch)
    limit = verdict.rules.max_regression
    if drop > 0 and (limit is None or drop <= limit or mismatch is not None):
        warnings.append(f"acceptance regressed: {_versus(verdict)}: {drop:.1%} lower")


def _change(drop: float) -> str:
    if drop > 0:
        return f"{drop:.1%} lower"
    return f"{-drop:.1%} higher" if drop < 0 else "the same"
