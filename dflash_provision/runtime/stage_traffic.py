"""runtime-check stages d (one real completion) and e (spec-decode acceptance over greedy smoke
prompts); the causes named when acceptance fails come from runtime/diagnosis.py."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from dflash_provision.runtime.diagnosis import acceptance_causes
from dflash_provision.runtime.link_fixes import completion_fix
from dflash_provision.runtime.stages import STAGE_NAMES, CheckContext, StageResult, StageStatus

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
        fix=completion_fix(ctx.target.display(), first.status, first.error),
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


@dataclass(frozen=True)
class AcceptanceGate:
    """What stage e judges against: the rate gate, the least evidence it takes, the reference
    of an earlier pass and how far below it the mean acceptance length may fall."""

    min_acceptance: float
    min_draft_tokens: int = 0
    reference: Any = None  # reference.Reference | None
    max_regression: float | None = None  # None: a drop is a warning only
    notes: tuple[str, ...] = ()  # e.g. why no reference was compared


def stage_acceptance(
    ctx: CheckContext,
    acceptance: Any,  # metrics.Acceptance
    *,
    present: bool,
    gate: AcceptanceGate,
    prompts: int,
    earlier: dict[str, StageResult],
    num_spec: int | None,
    exported: bool = True,
) -> StageResult:
    """e: acceptance over the smoke prompts' counter difference: inconclusive when the counters
    are no evidence (a restart, impossible figures, too few draft tokens, no ``vllm:`` metrics
    at all, a sampling setting stage c found fabricates them), else against
    ``gate.min_acceptance`` and the reference (see runtime/reference.py)."""
    name = STAGE_NAMES["e"]
    min_acceptance = gate.min_acceptance
    data = acceptance.to_dict() | {
        "min_acceptance": min_acceptance,
        "min_draft_tokens": gate.min_draft_tokens,
        "prompts": prompts,
        "reference": gate.reference.to_dict() if gate.reference is not None else None,
        "regression": None,
    }
    delta = acceptance.delta
    evidence = [
        f"{prompts} greedy prompt(s), {acceptance.expected_max_drafts} tokens: "
        f"{delta.drafts:g} drafts, {delta.draft_tokens:g} draft tokens, {delta.accepted:g} accepted"
    ]
    warnings = _traffic_warnings(acceptance) + list(gate.notes)
    if not exported:
        why = (
            "cannot tell whether the server speculates: its /metrics has no vllm: metric at all"
            f"{_stats_off(ctx)}; serve without --disable-log-stats to have acceptance measured"
        )
        return StageResult("e", name, StageStatus.INCONCLUSIVE, why, [why], data, warnings=warnings)
    if not present:
        why = "the server exports no spec-decode metrics: it is not speculating"
        return StageResult("e", name, StageStatus.FAILED, why, [why], data, warnings=warnings)
    c = earlier.get("c")
    fabricated = c.data.get("figures_not_evidence") if c is not None else None
    if isinstance(fabricated, str):
        why = f"the acceptance figures are no evidence: {fabricated}"
        evidence.append(why)
        return StageResult(
            "e", name, StageStatus.INCONCLUSIVE, why, evidence, data, warnings=warnings
        )
    undecided = _no_evidence(acceptance, gate.min_draft_tokens)
    if undecided is not None:
        evidence.append(undecided)
        return StageResult(
            "e", name, StageStatus.INCONCLUSIVE, undecided, evidence, data, warnings=warnings
        )
    if acceptance.rate is None:
        why = "no drafts were counted during the smoke prompts: the drafter is not drafting"
        return StageResult("e", name, StageStatus.FAILED, why, evidence, data, warnings=warnings)
    per_pos = ", ".join(f"{p:.3f}" for p in acceptance.per_position)
    evidence.append(
        f"acceptance rate {acceptance.rate:.1%}, mean acceptance length "
        f"{acceptance.mean_length:.2f}, per position {per_pos or '-'}"
    )
    summary = f"acceptance {acceptance.rate:.1%} is below --min-acceptance {min_acceptance:.1%}"
    low = acceptance.rate < min_acceptance
    regressed = _against_reference(acceptance, gate, data, evidence, warnings)
    if not low and regressed is None:
        summary = f"acceptance {acceptance.rate:.1%} (>= {min_acceptance:.1%})"
        return StageResult(
            "e", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings
        )
    if not low and regressed is not None:
        summary = regressed
    return StageResult(
        "e",
        name,
        StageStatus.FAILED,
        summary,
        evidence,
        data,
        causes=acceptance_causes(ctx, earlier, data, num_spec),
        warnings=warnings,
    )


def _stats_off(ctx: CheckContext) -> str:
    from dflash_provision.runtime.vllm_argv import has_switch

    argv = [str(a) for a in getattr(ctx.server, "argv", None) or []]
    if has_switch(argv, "--disable-log-stats"):
        return " (it was started with --disable-log-stats, which removes them)"
    return " (--disable-log-stats removes them; so may a proxy in front of it)"


def _traffic_warnings(acceptance: Any) -> list[str]:
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


def _no_evidence(acceptance: Any, min_draft_tokens: int) -> str | None:
    """Why the counter difference cannot decide (inconclusive), else None."""
    if acceptance.decreased:
        return (
            "the server restarted during the check (its counters began again: "
            f"{'; '.join(acceptance.decreased[:4])}): no acceptance rate can be computed; "
            "run the check again"
        )
    if acceptance.impossible:
        return (
            "the server's counters are impossible, so they are no evidence: "
            f"{'; '.join(acceptance.impossible[:4])}"
        )
    tokens = acceptance.delta.draft_tokens
    if 0 < tokens < min_draft_tokens:
        return (
            f"only {tokens:g} draft tokens during the check, fewer than --min-draft-tokens "
            f"{min_draft_tokens}: too few to judge (raise --prompts or --max-tokens)"
        )
    return None


def _against_reference(
    acceptance: Any,
    gate: AcceptanceGate,
    data: dict[str, Any],
    evidence: list[str],
    warnings: list[str],
) -> str | None:
    """Compare the mean acceptance length with the reference; the failure summary when the drop
    exceeds ``gate.max_regression``, else None (a smaller drop is a warning)."""
    from dflash_provision.runtime.reference import regression

    reference = gate.reference
    if reference is None or acceptance.mean_length is None:
        return None
    drop = regression(reference, acceptance.mean_length)
    data["regression"] = drop
    versus = (
        f"mean acceptance length {acceptance.mean_length:.2f} vs "
        f"{reference.mean_acceptance_length:.2f} in the reference of {reference.recorded_at} "
        f"(vLLM {reference.vllm_version or '?'})"
    )
    evidence.append(f"{versus}: {_change(drop)}")
    if drop <= 0:
        return None
    if gate.max_regression is not None and drop > gate.max_regression:
        return f"{versus}: {drop:.1%} lower, more than --max-regression {gate.max_regression:.1%}"
    warnings.append(f"acceptance regressed: {versus}: {drop:.1%} lower")
    return None


def _change(drop: float) -> str:
    if drop > 0:
        return f"{drop:.1%} lower"
    return f"{-drop:.1%} higher" if drop < 0 else "the same"
