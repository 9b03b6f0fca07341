"""vLLM's spec-decode counters from its Prometheus ``/metrics`` text, and the acceptance math.

Acceptance is measured on a DIFFERENCE: counters read before and after a few smoke prompts. A
server's lifetime totals mix every earlier request (and a warm-up with other settings) into the
number; the difference is what these prompts produced, plus whatever other traffic ran meanwhile
(see Acceptance.foreign_drafts).

    acceptance rate          = accepted tokens / draft tokens
    mean acceptance length   = 1 + accepted tokens / drafts   (the +1 is the target's own token)
    per-position rate i      = accepted at position i / drafts

A difference is evidence only when it makes sense (``sanity``): no counter decreased during the
window (a decrease means the server restarted: its counters began again at 0, so no rate can be
computed; so does a counter created anew, by its ``_created`` sample), accepted tokens never
exceed draft tokens, and no position accepted more tokens than there were drafts. Other clients'
traffic in the window is counted from vLLM's request counter (``vllm:request_success_total``,
one series per ``finished_reason``, summed): requests finished during the window beyond the
check's own completions are foreign (Acceptance.foreign_requests).

Series are matched by metric name only and summed over every label set: vLLM adds labels such as
``engine="0",model_name="..."`` and several engines each export their own series. The text is
untrusted: at most MAX_METRICS_BYTES are parsed, lines are length-capped, non-finite or negative
counter values are ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_METRICS_BYTES = 4 * 1024 * 1024
_MAX_LINE = 4096

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# vLLM's V1 stat logger: one series per finished_reason (stop, length, abort, error, repetition).
REQUESTS = "vllm:request_success_total"
# prometheus_client's creation time of the drafts counter (Unix time; absent in its
# multiprocess mode): a new value means the counter was created anew, i.e. the server restarted,
# even when the new counts have already grown past the old ones.
DRAFTS_CREATED = "vllm:spec_decode_num_drafts_created"
SPEC_METRICS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)
_READ = (*SPEC_METRICS, REQUESTS, DRAFTS_CREATED)

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str, *, names: tuple[str, ...] | None = None) -> list[Sample]:
    """Samples of the exposition text (comments skipped), only ``names`` when given."""
    samples = []
    for raw in text[:MAX_METRICS_BYTES].splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or len(line) > _MAX_LINE:
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match.group("name")
        if names is not None and name not in names:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        labels = {m.group("key"): m.group("value") for m in _LABEL.finditer(match["labels"] or "")}
        samples.append(Sample(name, labels, value))
    return samples


@dataclass(frozen=True)
class SpecCounters:
    """The spec-decode counters at one moment, summed over engines and other labels."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()  # accepted tokens at position 0, 1, ...
    present: bool = False  # False: the server exports none of the spec-decode metrics
    requests: float | None = None  # requests finished (all reasons); None: not exported
    created: float | None = None  # DRAFTS_CREATED summed over engines; None: not exported
    # Any ``vllm:`` sample at all: without one (``--disable-log-stats`` removes vLLM's stat
    # loggers, its Prometheus one included) the text cannot say whether the server speculates.
    vllm_metrics: bool = False

    def minus(self, before: SpecCounters) -> SpecCounters:
        """What happened between ``before`` and this reading (a counter reset reads as 0)."""
        width = max(len(self.per_position), len(before.per_position))
        mine = self.per_position + (0.0,) * (width - len(self.per_position))
        theirs = before.per_position + (0.0,) * (width - len(before.per_position))
        return SpecCounters(
            drafts=max(0.0, self.drafts - before.drafts),
            draft_tokens=max(0.0, self.draft_tokens - before.draft_tokens),
            accepted=max(0.0, self.accepted - before.accepted),
            per_position=tuple(max(0.0, a - b) for a, b in zip(mine, theirs, strict=True)),
            present=self.present and before.present,
            requests=_minus(self.requests, before.requests),
        )

    def decreases_from(self, before: SpecCounters) -> list[str]:
        """The counters that went backwards since ``before`` ("name before → now"): only a
        restarted server (or a broken exporter) makes a counter decrease."""
        pairs = [
            ("drafts", before.drafts, self.drafts),
            ("draft tokens", before.draft_tokens, self.draft_tokens),
            ("accepted tokens", before.accepted, self.accepted),
        ]
        for i, was in enumerate(before.per_position):
            now = self.per_position[i] if i < len(self.per_position) else 0.0
            pairs.append((f"accepted at position {i}", was, now))
        if before.requests is not None and self.requests is not None:
            pairs.append(("finished requests", before.requests, self.requests))
        found = [f"{name} {was:g} → {now:g}" for name, was, now in pairs if now < was]
        if (
            before.created is not None
            and self.created is not None
            and abs(self.created - before.created) > 1e-3
        ):
            found.append(f"{DRAFTS_CREATED} {before.created:.3f} → {self.created:.3f}")
        return found

    def impossible(self) -> list[str]:
        """Why these figures cannot be true counts (accepted > drafted, a position that accepted
        more tokens than there were drafts), empty when they can."""
        problems = []
        if self.accepted > self.draft_tokens:
            problems.append(
                f"accepted tokens {self.accepted:g} > draft tokens {self.draft_tokens:g}"
            )
        for i, count in enumerate(self.per_position):
            if count > self.drafts:
                problems.append(f"accepted at position {i} {count:g} > drafts {self.drafts:g}")
        return problems


def _minus(now: float | None, before: float | None) -> float | None:
    if now is None or before is None:
        return None
    return max(0.0, now - before)


def spec_counters(text: str) -> SpecCounters:
    """Read the spec-decode counters from ``/metrics`` text."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    positions: dict[int, float] = {}
    present = False
    requests: float | None = None
    created: float | None = None
    vllm_metrics = False
    for sample in parse_prometheus(text):
        vllm_metrics = vllm_metrics or sample.name.startswith("vllm:")
        if sample.name not in _READ or not math.isfinite(sample.value) or sample.value < 0:
            continue
        if sample.name == REQUESTS:
            requests = (requests or 0.0) + sample.value
            continue
        if sample.name == DRAFTS_CREATED:
            created = (created or 0.0) + sample.value
            continue
        present = True
        if sample.name == ACCEPTED_PER_POS:
            position = sample.labels.get("position", "")
            if position.isdigit() and int(position) < 1024:
                positions[int(position)] = positions.get(int(position), 0.0) + sample.value
        else:
            totals[sample.name] += sample.value
    width = max(positions) + 1 if positions else 0
    return SpecCounters(
        drafts=totals[DRAFTS],
        draft_tokens=totals[DRAFT_TOKENS],
        accepted=totals[ACCEPTED],
        per_position=tuple(positions.get(i, 0.0) for i in range(width)),
        present=present,
        requests=requests,
        created=created,
        vllm_metrics=vllm_metrics,
    )


@dataclass(frozen=True)
class Acceptance:
    """Acceptance over one counter difference (see the module docstring for the formulas)."""

    delta: SpecCounters
    rate: float | None  # None: nothing was drafted, or the counters are no evidence
    mean_length: float | None
    per_position: tuple[float, ...]
    expected_max_drafts: int | None = None  # what the smoke prompts can explain, at most
    notes: list[str] = field(default_factory=list)
    own_requests: int | None = None  # the check's own completions that succeeded
    decreased: list[str] = field(default_factory=list)  # counters that went backwards
    impossible: list[str] = field(default_factory=list)  # figures no real count can give

    @property
    def sane(self) -> bool:
        """The difference is evidence: nothing went backwards, nothing impossible."""
        return not self.decreased and not self.impossible

    @property
    def foreign_requests(self) -> int:
        """Requests finished in the window beyond the check's own: other clients were served.
        (Fewer than our own is no finding: vLLM may count a request just after answering it.)"""
        if self.own_requests is None or self.delta.requests is None:
            return 0
        return max(0, int(self.delta.requests) - self.own_requests)

    @property
    def foreign_drafts(self) -> int:
        """Drafts beyond what the smoke prompts can explain: other traffic ran meanwhile."""
        if self.expected_max_drafts is None:
            return 0
        return max(0, int(self.delta.drafts) - self.expected_max_drafts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafts": self.delta.drafts,
            "draft_tokens": self.delta.draft_tokens,
            "accepted_tokens": self.delta.accepted,
            "acceptance_rate": self.rate,
            "mean_acceptance_length": self.mean_length,
            "per_position": list(self.per_position),
            "expected_max_drafts": self.expected_max_drafts,
            "foreign_drafts": self.foreign_drafts,
            "requests": self.delta.requests,
            "own_requests": self.own_requests,
            "foreign_requests": self.foreign_requests,
            "counters_decreased": list(self.decreased),
            "counters_impossible": list(self.impossible),
        }


def acceptance(
    before: SpecCounters,
    after: SpecCounters,
    *,
    expected_max_drafts: int | None = None,
    own_requests: int | None = None,
) -> Acceptance:
    """Acceptance of what ran between the two readings; no rate when the counters make no sense
    (a decrease: the server restarted; impossible figures in the difference or the totals).

    ``expected_max_drafts``: how many drafts the smoke prompts can cause at most (one per
    generated token, as every decoding step drafts once); more means other clients were served.
    ``own_requests``: the check's own completions, against the server's finished requests.
    """
    delta = after.minus(before)
    decreased = after.decreases_from(before)
    impossible = delta.impossible() or [f"{p} (server totals)" for p in after.impossible()]
    if decreased or impossible:
        return Acceptance(
            delta,
            None,
            None,
            (),
            expected_max_drafts,
            own_requests=own_requests,
            decreased=decreased,
            impossible=impossible,
        )
    rate = delta.accepted / delta.draft_tokens if delta.draft_tokens > 0 else None
    mean = 1.0 + delta.accepted / delta.drafts if delta.drafts > 0 else None
    per_pos = tuple(p / delta.drafts for p in delta.per_position) if delta.drafts > 0 else ()
    return Acceptance(delta, rate, mean, per_pos, expected_max_drafts, own_requests=own_requests)
