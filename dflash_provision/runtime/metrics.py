"""vLLM's spec-decode counters from its Prometheus ``/metrics`` text, and the acceptance math.

Acceptance is measured on a DIFFERENCE: counters read before and after a few smoke prompts. A
server's lifetime totals mix every earlier request (and a warm-up with other settings) into the
number; the difference is what these prompts produced, plus whatever other traffic ran meanwhile
(see Acceptance.foreign_drafts).

    acceptance rate          = accepted tokens / draft tokens
    mean acceptance length   = 1 + accepted tokens / drafts   (the +1 is the target's own token)
    per-position rate i      = accepted at position i / drafts

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
SPEC_METRICS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)

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
        )


def spec_counters(text: str) -> SpecCounters:
    """Read the spec-decode counters from ``/metrics`` text."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    positions: dict[int, float] = {}
    present = False
    for sample in parse_prometheus(text, names=SPEC_METRICS):
        if not math.isfinite(sample.value) or sample.value < 0:
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
    )


@dataclass(frozen=True)
class Acceptance:
    """Acceptance over one counter difference (see the module docstring for the formulas)."""

    delta: SpecCounters
    rate: float | None  # None: nothing was drafted
    mean_length: float | None
    per_position: tuple[float, ...]
    expected_max_drafts: int | None = None  # what the smoke prompts can explain, at most
    notes: list[str] = field(default_factory=list)

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
        }


def acceptance(
    before: SpecCounters, after: SpecCounters, *, expected_max_drafts: int | None = None
) -> Acceptance:
    """Acceptance of what ran between the two readings.

    ``expected_max_drafts``: how many drafts the smoke prompts can cause at most (one per
    generated token, as every decoding step drafts once); more means other clients were served.
    """
    delta = after.minus(before)
    rate = delta.accepted / delta.draft_tokens if delta.draft_tokens > 0 else None
    mean = 1.0 + delta.accepted / delta.drafts if delta.drafts > 0 else None
    per_pos = tuple(p / delta.drafts for p in delta.per_position) if delta.drafts > 0 else ()
    return Acceptance(delta, rate, mean, per_pos, expected_max_drafts)
