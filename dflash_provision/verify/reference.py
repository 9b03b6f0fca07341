"""Acceptance references: the figures of a passing runtime-check, kept in the history store, and
the regression of a later check against them.

Two checks are comparable when they ran on the same host (login, port and container included)
and server port, with the same drafter config (the authority's sha256) and the same smoke prompts
(a digest of their text, their count and max_tokens). Greedy decoding of the same prompts by the
same model and drafter drafts the same way, so the mean acceptance length should come out the
same; a drop is the drafter, the server or the vLLM build changing under it.

    regression = (reference mean acceptance length - this one) / reference mean length

0.12 means 12 % lower than the reference; negative means better. A pass whose figures are below
its reference is not recorded as the new reference: the next check would compare with the lowered
figures and the drop would vanish. ``--reset-reference`` records them anyway (a deliberate
change, such as a new vLLM build), ``--no-reference`` neither compares nor records.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.history.host_key import HostKey
from dflash_provision.history.references import ReferenceKey

if TYPE_CHECKING:
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.verify.stages import CheckContext
    from dflash_provision.vllm.metrics import Acceptance

# A drop smaller than this is float noise, not a regression worth a warning.
_NOISE = 1e-6


@dataclass(frozen=True)
class Reference:
    """The newest reference for a key, as stage e's data carries it (the contract's keys)."""

    recorded_at: str
    mean_acceptance_length: float
    acceptance_rate: float
    per_position: list[float]
    vllm_version: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "per_position": self.per_position,
            "recorded_at": self.recorded_at,
            "vllm_version": self.vllm_version,
        }


def prompts_digest(prompts: list[str], max_tokens: int) -> str:
    """sha256 of the smoke prompts' text, their order and count, and max_tokens."""
    canonical = json.dumps({"prompts": prompts, "max_tokens": max_tokens}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def reference_key(
    target: Target, server_port: int, authority: Authority, prompts: list[str], max_tokens: int
) -> ReferenceKey:
    return ReferenceKey(
        HostKey.of_target(target),
        target.config_path,
        server_port,
        authority.sha256,
        prompts_digest(prompts, max_tokens),
    )


def from_figures(recorded_at: str, figures: dict[str, Any]) -> Reference | None:
    """A Reference from stored figures; None when they are not usable numbers (a hand-edited
    or damaged row is no reference)."""
    mean = _number(figures.get("mean_acceptance_length"))
    rate = _number(figures.get("acceptance_rate"))
    per_pos = figures.get("per_position")
    version = figures.get("vllm_version")
    if mean is None or rate is None or mean <= 0:
        return None
    positions = [_number(p) for p in per_pos] if isinstance(per_pos, list) else []
    return Reference(
        recorded_at,
        mean,
        rate,
        [p for p in positions if p is not None],
        version if isinstance(version, str) else None,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def regression(reference: Reference, mean_length: float) -> float:
    """Relative drop of the mean acceptance length against the reference (0.12 = 12 % lower)."""
    drop = (reference.mean_acceptance_length - mean_length) / reference.mean_acceptance_length
    return 0.0 if abs(drop) < _NOISE else drop


def figures(
    measured: Acceptance,
    *,
    prompts: list[str],
    max_tokens: int,
    vllm_version: str | None,
    target_model: str | None,
) -> dict[str, Any]:
    """What a passing check records: stage e's figures, the prompts, the vLLM version."""
    return {
        "acceptance_rate": measured.rate,
        "mean_acceptance_length": measured.mean_length,
        "per_position": list(measured.per_position),
        "drafts": measured.delta.drafts,
        "draft_tokens": measured.delta.draft_tokens,
        "prompts": prompts,
        "prompt_count": len(prompts),
        "max_tokens": max_tokens,
        "vllm_version": vllm_version,
        "target_model": target_model,
    }


def vllm_version(ctx: CheckContext) -> str | None:
    """The server's vLLM version: its own ``GET /version`` (verify/reference_version.py), else
    its engine's start-up line (stage c), else the version the target's python imports (stage
    b's probe)."""
    if ctx.server_version:
        return ctx.server_version
    engine = ctx.log.engine if ctx.log is not None else None
    if engine is not None and engine.version:
        return str(engine.version)
    probe = ctx.probe if isinstance(ctx.probe, dict) else {}
    vllm = probe.get("vllm")
    version = vllm.get("version") if isinstance(vllm, dict) else None
    return str(version) if isinstance(version, str) and version else None


def parse_fraction(text: str) -> float:
    """``10%`` or ``0.1`` → 0.1; ValueError (with the reason) for anything else or outside
    0..1 (a drop of 100 % or more would gate nothing)."""
    raw = text.strip()
    scale = 100.0 if raw.endswith("%") else 1.0
    number = raw[:-1].strip() if scale == 100.0 else raw
    try:
        value = float(number) / scale
    except ValueError:
        raise ValueError(f"{text!r} is not a fraction such as 10% or 0.1") from None
    if not 0.0 <= value < 1.0:  # also rejects nan and inf
        raise ValueError(f"{text!r} is outside 0..100% (0..1)")
    return value
