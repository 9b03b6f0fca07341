"""Stage e's long-context part: for a drafter with sliding-window layers, one prompt longer than
its largest window, whose acceptance past the window is compared with the short prompts'.

Why: a drafter whose sliding layers a vLLM runs as full attention (0.20-0.24: the incident's own
bug) or whose window's KV is recycled while still read (vllm#50169, 0.26: 2.3 % against 33 %)
drafts as trained on every prompt shorter than the window. The smoke prompts are a few dozen
tokens and every published window is 2048-4096: only a longer prompt shows it.

What it sends (after the short prompts, only when their acceptance passed): ``POST /tokenize``
with the long prompt (vLLM's TokenizeResponse gives the count and ``max_model_len``; a server
without it: at least one token per word of the prompt, each word being at most 7 letters, the
conservative bound of 8 characters per token), ``GET /metrics``, one greedy completion of
``--max-tokens`` tokens on a prompt of the window + 32 tokens, ``GET /metrics``. The counters'
difference around that one request is its acceptance: every draft it made was past the window.
Where its reply carries its own figures (``metrics.speculative_decoding``, as stage e reads the
smoke prompts': vllm/request_acceptance.py) those are judged instead, so other clients'
traffic does not matter; the data's ``source`` and the evidence say which.
All of it within one deadline, ``--command-timeout``.

    no sliding layer                     not sent
    --no-long-context                    skipped (said so)
    short prompts did not pass           not sent (nothing to compare with)
    max-model-len < window + 32 + N      cannot tell (the prompt cannot be longer than the window)
    deadline, counters reset,
    too few drafts                       cannot tell (naming why)
    other clients' traffic               judged on the long request's own figures when its reply
                                         carries them (--per-request-spec-decode-metrics, vLLM
                                         0.29+: request_acceptance.py); else cannot tell
    rate < 50 % of the short prompts'    FAILED: the sliding-window layers are not run as trained
    otherwise                            passed (the part past the window reported)
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import DflashProvisionError
from dflash_provision.server.fix_lines import noted
from dflash_provision.validation.speculators_layout import runtime_view
from dflash_provision.verify.acceptance_gate import judge
from dflash_provision.verify.stages import StageResult, StageStatus
from dflash_provision.vllm.features import intended_windows
from dflash_provision.vllm.metrics import Acceptance, acceptance, spec_counters
from dflash_provision.vllm.request_acceptance import (
    SOURCE_COUNTERS,
    SOURCE_REQUESTS,
    RequestFigures,
    own_acceptance,
    read_figures,
)

if TYPE_CHECKING:
    from dflash_provision.verify.acceptance_gate import AcceptanceVerdict

MARGIN = 32  # tokens past the window: the drafts that follow all see a context beyond it
COLLAPSE = 0.5  # past-window acceptance below this share of the short prompts' is a collapse
MIN_DRAFT_TOKENS = 8  # fewer in the long request decide nothing
MAX_REPLY = 4 * 1024 * 1024  # /tokenize lists every token id: a few per word of the prompt
METRICS_BYTES = 4 * 1024 * 1024
CAUSE = (
    "the sliding-window layers are not run as trained (full attention, or the window's KV recycled)"
)
FIX_WHY = (
    "after installing, where the launch runs it, a vLLM that runs DFlash's per-layer sliding "
    "windows as trained (0.25+ or a build that has qwen3_dflash's _resolve_layer_attention; not "
    "0.26 with vllm#50169's KV recycling); then run the check again"
)
UNKNOWN_WHY = (
    "where past the window can be told: a --max-model-len above the window + 32 + --max-tokens, "
    "a longer --command-timeout, a quiet server (or a vLLM 0.29+ started with "
    "--per-request-spec-decode-metrics); or add --no-long-context to leave it out"
)


def collapse_fix(restart: str) -> str:
    """The fix line of a collapse: ``restart`` (the server's restart command) once another vLLM
    is in place."""
    return noted(restart, FIX_WHY)


def unknown_fix(rerun: str) -> str:
    """The fix line when past the window cannot be told: ``rerun`` (this check again) where it
    can be told."""
    return noted(rerun, UNKNOWN_WHY)


# Short words without digits (a tokenizer may split every digit): each word is at least one
# token in every tokenizer that splits at spaces before merging (BPE and SentencePiece alike).
_TEXT = (
    "the bread needs flour water salt and yeast then time warmth and a patient hand while the "
    "press prints pages of words that carry the story of every town"
)
_WORDS = tuple(_TEXT.split())


class LongStatus(enum.StrEnum):
    NOT_SENT = "not_sent"
    SKIPPED = "skipped"
    PASSED = "passed"
    COLLAPSED = "collapsed"
    UNKNOWN = "cannot_tell"


@dataclass(frozen=True)
class LongContext:
    """The long-context part's outcome, with what it measured (for the evidence and --json)."""

    status: LongStatus
    summary: str
    window: int | None = None
    prompt_tokens: int | None = None
    counted_by: str | None = None  # "/tokenize" or the words bound
    max_model_len: int | None = None
    short_rate: float | None = None
    rate: float | None = None
    per_position: tuple[float, ...] = ()
    draft_tokens: float | None = None
    source: str | None = None  # SOURCE_REQUESTS or SOURCE_COUNTERS: whose figures were judged
    source_note: str | None = None
    wall_s: float = 0.0
    requests: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "summary": self.summary,
            "window": self.window,
            "prompt_tokens": self.prompt_tokens,
            "counted_by": self.counted_by,
            "max_model_len": self.max_model_len,
            "short_rate": self.short_rate,
            "rate": self.rate,
            "per_position": list(self.per_position),
            "draft_tokens": self.draft_tokens,
            "source": self.source,
            "source_note": self.source_note,
            "requests": list(self.requests),
            "wall_s": round(self.wall_s, 3),
        }


def largest_window(doc: dict[str, Any]) -> int | None:
    """The largest sliding window of the drafter's layers as the probe reads them (layer_types,
    sliding_window, dflash_config.use_swa / swa_window_size), or None: no sliding layer."""
    windows = intended_windows(runtime_view(doc)) or []
    return max((w for w in windows if isinstance(w, int) and w > 0), default=None)


def decide(window: int, short_rate: float, figures: Acceptance) -> tuple[LongStatus, str]:
    """The verdict on the long request's counter difference ``figures`` (pure)."""
    if not figures.sane:
        return LongStatus.UNKNOWN, (
            "cannot tell past the sliding window: the counters went backwards or are impossible "
            "around the long prompt (a restart?)"
        )
    if figures.foreign_requests or figures.foreign_drafts:
        others = figures.foreign_requests or figures.foreign_drafts
        unit = "request(s)" if figures.foreign_requests else "draft(s)"
        return LongStatus.UNKNOWN, (
            "cannot tell past the sliding window: other clients' traffic mixed into the counters "
            f"around the long prompt ({others} {unit} not the check's own; a vLLM 0.29+ started "
            "with --per-request-spec-decode-metrics returns the request's own figures)"
        )
    if figures.rate is None or figures.delta.draft_tokens < MIN_DRAFT_TOKENS:
        return LongStatus.UNKNOWN, (
            f"cannot tell past the sliding window: only {figures.delta.draft_tokens:g} draft "
            f"tokens during the long prompt, fewer than {MIN_DRAFT_TOKENS}"
        )
    past, short = f"{figures.rate:.1%}", f"{short_rate:.1%}"
    if figures.rate < COLLAPSE * short_rate:
        return LongStatus.COLLAPSED, (
            f"acceptance past the sliding window ({window} tokens) collapsed: {past} against "
            f"{short} on the short prompts: {CAUSE}"
        )
    return LongStatus.PASSED, (
        f"past the sliding window ({window} tokens): acceptance {past} against {short} on the "
        "short prompts"
    )


def _positions(per_position: tuple[float, ...] | list[float]) -> str:
    return ", ".join(f"{p:.2f}" for p in per_position[:8]) or "-"


# -- the requests -------------------------------------------------------------------------------


class _Deadline(Exception):
    """The one deadline passed before the part was done."""


@dataclass
class _Run:
    access: Any
    model_id: str | None
    deadline: float
    sent: list[str] = field(default_factory=list)

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0.05:
            raise _Deadline
        return remaining

    def request(self, method: str, path: str, body: Any = None, max_bytes: int = MAX_REPLY) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        self.sent.append(f"{method} {path}")
        try:
            return self.access.request(method, path, data, timeout=self.left(), max_bytes=max_bytes)
        except DflashProvisionError as exc:
            if time.monotonic() >= self.deadline - 0.05 or getattr(exc, "step", "") == "timeout":
                raise _Deadline from None
            raise


def long_prompt(words: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(max(1, words)))


def _tokenized(run: _Run, prompt: str) -> tuple[int, int | None] | None:
    """(count, max_model_len) from the server's /tokenize, or None when it does not answer so."""
    try:
        reply = run.request("POST", "/tokenize", {"model": run.model_id, "prompt": prompt})
        doc = json.loads(reply.body) if reply.status == 200 and not reply.truncated else None
    except _Deadline:
        raise
    except (DflashProvisionError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    count = doc.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return None
    limit = doc.get("max_model_len")
    return count, limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def _served_max_len(run: _Run) -> int | None:
    """``max_model_len`` of /v1/models (vLLM's ModelCard has it), when /tokenize did not say."""
    try:
        reply = run.request("GET", "/v1/models")
        models = json.loads(reply.body).get("data") or []
        value = models[0].get("max_model_len") if models else None
    except _Deadline:
        raise
    except (DflashProvisionError, ValueError, AttributeError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _build(run: _Run, need: int) -> tuple[str, int, str, int | None]:
    """A prompt of at least ``need`` tokens: (prompt, tokens, how counted, max_model_len)."""
    prompt = long_prompt(need)
    counted = _tokenized(run, prompt)
    if counted is None:
        return prompt, need, "at least one token per word (no /tokenize)", _served_max_len(run)
    count, limit = counted
    if count < need:  # a tokenizer that merges words: more words, counted again
        prompt = long_prompt(need * need // count + MARGIN)
        again = _tokenized(run, prompt)
        count, limit = again if again is not None else (count, limit)
    elif count > need + MARGIN:
        # A tokenizer that splits words (a small vocabulary: real vLLM counted these 96 words
        # as 346 tokens of the tiny test model's) would make the prompt outgrow a max-model-len
        # that fits the window + 32: as many words as the window needs, counted again.
        shorter = long_prompt(-(-need * need // count) + 1)
        again = _tokenized(run, shorter)
        if again is not None and again[0] >= need:
            prompt, (count, limit) = shorter, again
    return prompt, count, "/tokenize", limit if limit is not None else _served_max_len(run)


def _metrics(run: _Run) -> Any:
    reply = run.request("GET", "/metrics", max_bytes=METRICS_BYTES)
    if reply.status != 200 or reply.truncated:
        raise DflashProvisionError(f"GET /metrics answered {reply.status}")
    return spec_counters(reply.body.decode("utf-8", "replace"))


def measure(
    access: Any,
    model_id: str | None,
    doc: dict[str, Any],
    short: AcceptanceVerdict | None,
    *,
    enabled: bool,
    max_tokens: int,
    timeout: float,
) -> LongContext:
    """Run the long-context part (see the module docstring) within one deadline of ``timeout``
    seconds, after the short prompts judged ``short``."""
    window = largest_window(doc)
    if window is None:
        return LongContext(LongStatus.NOT_SENT, "the drafter has no sliding-window layer: no long "
                           "prompt sent")  # fmt: skip
    if not enabled:
        return LongContext(
            LongStatus.SKIPPED,
            f"skipped (--no-long-context): no prompt longer than the sliding window ({window} "
            "tokens) was sent, so a collapse past it is not checked",
            window,
        )
    if short is None or not short.passed or short.figures.rate is None:
        return LongContext(
            LongStatus.NOT_SENT,
            "not sent: the short prompts' acceptance did not pass, nothing to compare with",
            window,
        )
    started = time.monotonic()
    run = _Run(access, model_id, started + timeout)
    try:
        result = _measure(run, window, short, max_tokens)
    except _Deadline:
        result = LongContext(
            LongStatus.UNKNOWN,
            f"cannot tell past the sliding window: the --command-timeout deadline ({timeout:g} s) "
            f"was reached during the long prompt ({run.sent[-1] if run.sent else '-'})",
            window,
        )
    except DflashProvisionError as exc:
        result = LongContext(
            LongStatus.UNKNOWN,
            f"cannot tell past the sliding window: {run.sent[-1]} failed: {exc.message}",
            window,
        )
    return replace(result, wall_s=time.monotonic() - started, requests=list(run.sent))


def _measure(run: _Run, window: int, short: AcceptanceVerdict, max_tokens: int) -> LongContext:
    need = window + MARGIN
    prompt, tokens, counted_by, limit = _build(run, need)
    base = LongContext(
        LongStatus.UNKNOWN, "", window, tokens, counted_by, limit, short.figures.rate
    )
    if limit is not None and limit < tokens + max_tokens:
        # Said as it is: the window's need, or this prompt's count when only that is too long.
        short_of = (
            f"the window ({window} tokens) + {MARGIN}"
            if limit < need + max_tokens
            else f"the long prompt ({tokens} tokens as the server counts them)"
        )
        why = (
            f"cannot tell past the sliding window: the server's max-model-len {limit} is below "
            f"{short_of} + --max-tokens {max_tokens}: no prompt longer than the window fits "
            "(serve with a larger --max-model-len to check it)"
        )
        return replace(base, summary=why)
    before = _maybe_metrics(run)
    body = {
        "model": run.model_id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    reply = run.request("POST", "/v1/completions", body)
    if reply.status != 200:
        text = reply.body.decode("utf-8", "replace") if isinstance(reply.body, bytes) else ""
        why = f"cannot tell past the sliding window: the long prompt failed (HTTP {reply.status})"
        return replace(base, summary=f"{why}: {' '.join(text.split())[:300]}")
    after = _maybe_metrics(run)
    counted = None
    if before is not None and after is not None:
        counted = acceptance(before, after, expected_max_drafts=max_tokens, own_requests=1)
    figures, source, note = _whose(reply, counted, max_tokens)
    if figures is None:
        why = f"cannot tell past the sliding window: {note}"
        return replace(base, summary=why, source=source, source_note=note)
    assert short.figures.rate is not None
    status, summary = decide(window, short.figures.rate, figures)
    return replace(
        base,
        status=status,
        summary=summary,
        rate=figures.rate,
        per_position=figures.per_position,
        draft_tokens=figures.delta.draft_tokens,
        source=source,
        source_note=note,
    )


def _maybe_metrics(run: _Run) -> Any:
    """The counters, or None when /metrics could not be read (the long request's own figures
    may still tell: vLLM returns them under --disable-log-stats too)."""
    try:
        return _metrics(run)
    except _Deadline:
        raise
    except DflashProvisionError:
        return None


def _whose(
    reply: Any, counted: Acceptance | None, max_tokens: int
) -> tuple[Acceptance | None, str, str]:
    """The long request's own figures (``metrics.speculative_decoding`` of its reply, as stage e
    reads the smoke prompts') when it carries sound ones: other clients' traffic cannot mix into
    them. Else the counters' difference around it (which such traffic makes no evidence)."""
    try:
        doc = json.loads(reply.body) if not reply.truncated else None
    except ValueError:
        doc = None
    own = read_figures(doc)
    if isinstance(own, RequestFigures):
        note = (
            "the long request's own metrics.speculative_decoding: other clients' traffic is not "
            "in it"
        )
        if counted is not None and (counted.foreign_requests or counted.foreign_drafts):
            note += " (the server's counters around it had other traffic)"
        return own_acceptance([own], max_tokens), SOURCE_REQUESTS, note
    why = (
        f"its per-request figures are no evidence ({own})"
        if isinstance(own, str)
        else "its reply carries no per-request figures"
    )
    if counted is None:
        return None, SOURCE_COUNTERS, f"{why}, and GET /metrics could not be read around it"
    note = f"{why}: the server's counters around it, which other clients' traffic can mix into"
    return counted, SOURCE_COUNTERS, note


# -- the hook into stage e ----------------------------------------------------------------------


def apply(stage_e: StageResult, long: LongContext, *, restart: str, rerun: str) -> StageResult:
    """Stage e with the long-context part: its data and evidence always; a collapse fails the
    stage, a part that cannot tell makes it inconclusive (the gate's verdict says which, so the
    rollout and the Ansible task inherit it). ``restart`` and ``rerun``: the commands its fix
    lines name (the server's restart, this check again)."""
    stage_e.data["long_context"] = long.to_dict()
    # A stage e that already failed on its short prompts sent nothing more: a line saying so
    # would only lengthen the failing report (its data still says it).
    if not (long.status is LongStatus.NOT_SENT and not stage_e.passed):
        stage_e.evidence.append(f"long context: {long.summary}{_cost(long)}")
    verdict = stage_e.acceptance
    if long.source is not None:
        whose = "its own request" if long.source == SOURCE_REQUESTS else "the server's counters"
        stage_e.evidence.append(f"long context figures from {whose}: {long.source_note}")
    if long.rate is not None and verdict is not None:
        stage_e.evidence.append(
            f"long context per position: {_positions(long.per_position)} past the window, "
            f"{_positions(verdict.figures.per_position)} on the short prompts"
        )
    if long.status not in (LongStatus.COLLAPSED, LongStatus.UNKNOWN) or verdict is None:
        return stage_e
    if long.status is LongStatus.COLLAPSED:
        seen = replace(verdict.observed, long_context_collapsed=long.summary)
    else:
        seen = replace(verdict.observed, long_context_unknown=long.summary)
    judged = judge(verdict.figures, verdict.rules, seen)
    stage_e.acceptance = judged
    stage_e.status = StageStatus(judged.outcome.value)
    stage_e.summary = long.summary
    fix = collapse_fix(restart) if judged.failed else unknown_fix(rerun)
    if judged.failed:
        stage_e.causes = [f"1. {CAUSE}", f"   fix: {fix}"]
    stage_e.fix = fix
    return stage_e


def _cost(long: LongContext) -> str:
    if long.prompt_tokens is None or long.status in (LongStatus.NOT_SENT, LongStatus.SKIPPED):
        return ""
    return f" ({long.prompt_tokens} prompt tokens, {long.wall_s:.1f} s)"
