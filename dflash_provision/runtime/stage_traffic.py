"""runtime-check stages d (one real completion) and e (spec-decode acceptance over greedy smoke
prompts), and the likely causes named when acceptance fails."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from dflash_provision.invariants import block_size_of
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
    unusable: bool = False  # the answer dripped past its deadline (access.ReplyUnusable)


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
        return StageResult("d", name, StageStatus.PASSED, summary, [f"text: {first.text!r}"])
    summary = f"the completion failed (HTTP {first.status}): {first.error}"
    if fatal_after and fatal_after[0][:200] not in first.error:
        summary += f"; the server logged: {fatal_after[0][:300]}"
    evidence = [summary, *[f"log: {line[:300]}" for line in fatal_after[:3]]]
    fix = (
        "the drafter does not fit this target (layer ids, hidden size): "
        f"dflash-provision validate {shlex.quote(ctx.target.display())} --target-config MODEL"
    )
    if first.unusable:
        fix = _endpoint_fix(ctx, "/v1/completions")
    return StageResult(
        "d", name, StageStatus.FAILED, summary, evidence, {"status": first.status}, fix=fix
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


def likely_causes(ctx: CheckContext, earlier: dict[str, StageResult], n: int | None) -> list[str]:
    """Why acceptance collapses, in the order an engineer should check, each with what the
    earlier stages already saw about it."""
    auth = ctx.auth_doc
    target = shlex.quote(ctx.target.display())
    size, where = block_size_of(auth)

    def seen(key: str) -> str:
        stage = earlier.get(key)
        return f"stage {key} {stage.status.value}: {stage.summary}" if stage else "not checked"

    inner = auth.get("dflash_config")
    mask = (inner if isinstance(inner, dict) else {}).get(
        "mask_token_id", auth.get("mask_token_id")
    )
    causes = [
        f"the file on disk is not the authoritative config ({seen('a')}); "
        f"fix: dflash-provision push {target} ...",
        "the loader normalised critical fields (use_sliding_window false nulls sliding_window, "
        f"layer_types rebuilt) ({seen('b')})",
        f"target_layer_ids / their +1 offset: expected aux layers {ctx.expected_aux} ({seen('c')})",
        f"mask_token_id {mask}: it must be the token the drafter was trained with "
        "(the incident had 248064 instead of 248070)",
        f"num_speculative_tokens {n} vs {where} {size}: more than {where} - 1 drafts are all "
        "rejected",
        "RoPE settings or a different target model than the drafter was trained for "
        f"(dflash-provision validate {target} --target-config MODEL)",
        "a vLLM build that drops the sliding-window fields of the draft config (stage b's vLLM "
        "resolution; speculators conversion without PR #40898)",
    ]
    return [f"{i}. {cause}" for i, cause in enumerate(causes, 1)]


def stage_acceptance(
    ctx: CheckContext,
    acceptance: Any,  # metrics.Acceptance
    *,
    present: bool,
    min_acceptance: float,
    prompts: int,
    earlier: dict[str, StageResult],
    num_spec: int | None,
) -> StageResult:
    """e: acceptance over the smoke prompts' counter difference, against ``min_acceptance``."""
    name = STAGE_NAMES["e"]
    data = acceptance.to_dict() | {"min_acceptance": min_acceptance, "prompts": prompts}
    delta = acceptance.delta
    evidence = [
        f"{prompts} greedy prompt(s), {acceptance.expected_max_drafts} tokens: "
        f"{delta.drafts:g} drafts, {delta.draft_tokens:g} draft tokens, {delta.accepted:g} accepted"
    ]
    warnings = []
    if acceptance.foreign_drafts:
        warnings.append(
            f"other traffic mixed into the counters: {acceptance.foreign_drafts} drafts more than "
            "the smoke prompts can explain; the rate includes other clients' requests"
        )
    if not present:
        why = "the server exports no spec-decode metrics: it is not speculating"
        return StageResult("e", name, StageStatus.FAILED, why, [why], data, warnings=warnings)
    if acceptance.rate is None:
        why = "no drafts were counted during the smoke prompts: the drafter is not drafting"
        return StageResult("e", name, StageStatus.FAILED, why, evidence, data, warnings=warnings)
    per_pos = ", ".join(f"{p:.3f}" for p in acceptance.per_position)
    evidence.append(
        f"acceptance rate {acceptance.rate:.1%}, mean acceptance length "
        f"{acceptance.mean_length:.2f}, per position {per_pos or '-'}"
    )
    if acceptance.rate >= min_acceptance:
        summary = f"acceptance {acceptance.rate:.1%} (>= {min_acceptance:.1%})"
        return StageResult(
            "e", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings
        )
    summary = f"acceptance {acceptance.rate:.1%} is below --min-acceptance {min_acceptance:.1%}"
    return StageResult(
        "e",
        name,
        StageStatus.FAILED,
        summary,
        evidence,
        data,
        causes=likely_causes(ctx, earlier, num_spec),
        warnings=warnings,
    )
