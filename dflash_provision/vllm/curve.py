"""The shape of the per-position acceptance curve: what kind of broken drafter it points at.

vLLM counts, per draft position i, how many drafts had position i accepted; divided by the
drafts that gives rate(i), which never rises with i (a draft is accepted as a prefix). Users'
reports of broken drafters show three shapes (see /work/shared/dflash-facts.md):

    cliff        high at the first positions, ~0 right after (sliding-window layers run as full
                 attention, a window lost by the loader or vLLM)
    near zero    every position ~0 (shifted layer ids or the +1 offset, the mask token, the
                 wrong model runner, RoPE, an lm_head overwritten by the target's)
    low          neither: acceptance uniformly low (another target, revision or quantization
                 than the drafter was trained for; the prompt distribution)

A healthy drafter decays geometrically (rate(i) = a^(i+1) for a per-token acceptance a): a
step from >= CLIFF_HIGH straight to <= CLIFF_ZERO is not reachable that way, which is what
tells a cliff from a steep but healthy decay. Every threshold lives here, nowhere else.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: A position is "high" when at least this share of the drafts had it accepted.
CLIFF_HIGH = 0.5
#: A position is "~0" when at most this share of the drafts had it accepted.
CLIFF_ZERO = 0.05
#: A cliff needs at least this many high positions before it (positions 0-1 at least).
CLIFF_MIN_HEAD = 2
#: Every position at most this: the drafter predicts (almost) nothing.
NEAR_ZERO_POSITION = 0.2
#: Without per-position counters: an overall acceptance rate at most this is near zero.
NEAR_ZERO_RATE = 0.03


class Shape(enum.StrEnum):
    CLIFF = "cliff"
    NEAR_ZERO = "near zero"
    LOW = "low"
    UNKNOWN = "unknown"  # nothing drafted, or no counters to tell


@dataclass(frozen=True)
class Curve:
    shape: Shape
    detail: str  # what the curve looks like, in words, for the cause lines
    cliff_at: int | None = None  # the first ~0 position of a cliff


def _rates(per_position: Sequence[object]) -> list[float]:
    """The finite numbers of the curve (the counters' JSON is checked, not trusted)."""
    rates = []
    for value in per_position:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return []
        if not math.isfinite(value):
            return []
        rates.append(float(value))
    return rates


def _cliff(rates: list[float]) -> int | None:
    """The position where the curve drops from high straight to ~0, staying there."""
    for at in range(CLIFF_MIN_HEAD, len(rates)):
        head, tail = rates[:at], rates[at:]
        if min(head) >= CLIFF_HIGH and max(tail) <= CLIFF_ZERO:
            return at
    return None


def _show(rates: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in rates[:8]) + (", ..." if len(rates) > 8 else "")


def classify(per_position: Sequence[object] | None, rate: float | None) -> Curve:
    """The shape of a curve (per-position rates), the overall rate as the fallback."""
    rates = _rates(per_position or [])
    if rates and max(rates) > 1.0:
        return Curve(Shape.UNKNOWN, f"per-position rates above 1 ({_show(rates)}): not counters")
    if rates:
        at = _cliff(rates)
        if at is not None:
            return Curve(
                Shape.CLIFF,
                f"the per-position curve falls off a cliff after position {at - 1}: "
                f"{_show(rates[:at])}, then <= {CLIFF_ZERO:g} from position {at}",
                at,
            )
        if max(rates) <= NEAR_ZERO_POSITION:
            return Curve(
                Shape.NEAR_ZERO,
                f"every position is near zero (<= {NEAR_ZERO_POSITION:g}: {_show(rates)})",
            )
        return Curve(Shape.LOW, f"the per-position curve is low throughout ({_show(rates)})")
    if rate is None or not math.isfinite(rate):
        return Curve(Shape.UNKNOWN, "no per-position counters and no rate")
    if rate <= NEAR_ZERO_RATE:
        return Curve(Shape.NEAR_ZERO, f"acceptance {rate:.1%} is near zero (no per-position data)")
    return Curve(Shape.LOW, f"acceptance {rate:.1%} is low (no per-position data)")
