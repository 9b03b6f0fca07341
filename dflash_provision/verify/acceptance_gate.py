"""The one judge of acceptance: the figures of a check's smoke prompts against the rules (the rate
gate, the least evidence, the reference and how far below it the mean acceptance length may
fall), into a typed verdict whose finding and figures are data.

Every reader of acceptance asks this module: stage e (verify/stage_traffic.py renders the
verdict), the rollout gate on each batch and after a rollback (``judge_check``), doctor and the
diagnosis (the verdict's ranked causes), the fleet table and its gauges (verify/fleet_check.py),
the Ansible ``runtime_check`` task (through the fleet verdict) and the acceptance reference
that a pass records. None of them reads the figures back from JSON by key.

    no vllm: metric at all              inconclusive  (--disable-log-stats: cannot tell)
    no spec-decode counter              failed        (not speculating)
    figures that are no evidence        inconclusive  (a sampling setting stage c named,
                                                       a restart, impossible counters,
                                                       fewer draft tokens than the minimum)
    nothing drafted                     failed
    rate < min_acceptance               failed
    collapsed past the sliding window   failed        (verify/long_context.py: the long
                                                       prompt's acceptance < half the short's)
    mean length dropped > max_regression
      below the reference               failed        (a smaller drop: a warning; a
                                                       reference of another or unknown
                                                       vLLM version: compared, not gated)
    past the window cannot be told      inconclusive  (max-model-len below the window, the
                                                       deadline, other clients' traffic)
    otherwise                           passed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dflash_provision.verify.reference import Reference, regression
from dflash_provision.vllm.metrics import Acceptance

if TYPE_CHECKING:
    from dflash_provision.verify.diagnosis import Cause
    from dflash_provision.verify.runtime_check import CheckReport


class Outcome(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


class Finding(enum.StrEnum):
    """Why the verdict is what it is (the first rule of the module docstring that applies)."""

    PASSED = "passed"
    NO_VLLM_METRICS = "no_vllm_metrics"
    NOT_SPECULATING = "not_speculating"
    FIGURES_NOT_EVIDENCE = "figures_not_evidence"
    COUNTERS_RESTARTED = "counters_restarted"
    COUNTERS_IMPOSSIBLE = "counters_impossible"
    TOO_FEW_DRAFT_TOKENS = "too_few_draft_tokens"
    NO_DRAFTS = "no_drafts"
    BELOW_MIN_ACCEPTANCE = "below_min_acceptance"
    REGRESSED = "regressed"
    LONG_CONTEXT_COLLAPSED = "long_context_collapsed"
    LONG_CONTEXT_UNKNOWN = "long_context_unknown"


_OUTCOME = {
    Finding.PASSED: Outcome.PASSED,
    Finding.NO_VLLM_METRICS: Outcome.INCONCLUSIVE,
    Finding.NOT_SPECULATING: Outcome.FAILED,
    Finding.FIGURES_NOT_EVIDENCE: Outcome.INCONCLUSIVE,
    Finding.COUNTERS_RESTARTED: Outcome.INCONCLUSIVE,
    Finding.COUNTERS_IMPOSSIBLE: Outcome.INCONCLUSIVE,
    Finding.TOO_FEW_DRAFT_TOKENS: Outcome.INCONCLUSIVE,
    Finding.NO_DRAFTS: Outcome.FAILED,
    Finding.BELOW_MIN_ACCEPTANCE: Outcome.FAILED,
    Finding.REGRESSED: Outcome.FAILED,
    Finding.LONG_CONTEXT_COLLAPSED: Outcome.FAILED,
    Finding.LONG_CONTEXT_UNKNOWN: Outcome.INCONCLUSIVE,
}


@dataclass(frozen=True)
class AcceptanceRules:
    """What acceptance is judged against."""

    min_acceptance: float
    min_draft_tokens: int = 0
    reference: Reference | None = None  # an earlier pass's figures (or a rollout's baseline)
    max_regression: float | None = None  # None: a drop below the reference is a warning only
    notes: tuple[str, ...] = ()  # e.g. why no reference was compared
    # Why the reference is compared but not gated on: it was recorded on another or unknown
    # vLLM version (verify/reference_version.py); None: it is this version's own.
    reference_mismatch: str | None = None


@dataclass(frozen=True)
class Observed:
    """What the server showed besides the counter difference."""

    spec_counters: bool = True  # its /metrics has the spec-decode counters
    vllm_metrics: bool = True  # its /metrics has any vllm: metric at all
    not_evidence: str | None = None  # a setting that makes the figures no evidence (stage c)
    # The long prompt past the drafter's sliding window (verify/long_context.py): why its
    # acceptance collapsed, or why it cannot be told; None: no finding (or not measured).
    long_context_collapsed: str | None = None
    long_context_unknown: str | None = None


@dataclass(frozen=True)
class AcceptanceVerdict:
    """The judgement of one set of figures; ``causes`` are filled in by the diagnosis when the
    gate failed (ranked, typed: see verify/diagnosis.py)."""

    outcome: Outcome
    finding: Finding
    figures: Acceptance
    rules: AcceptanceRules
    observed: Observed = field(default_factory=Observed)
    regression: float | None = None  # drop of the mean length vs rules.reference (0.12 = 12 %)
    causes: tuple[Cause, ...] = ()
    measured: str = ""  # what the causes' ranking rests on (the curve, the reference)

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    @property
    def failed(self) -> bool:
        return self.outcome is Outcome.FAILED

    @property
    def inconclusive(self) -> bool:
        return self.outcome is Outcome.INCONCLUSIVE

    @property
    def rate(self) -> float | None:
        """The acceptance rate when it is evidence (None when the verdict cannot tell)."""
        return None if self.inconclusive else self.figures.rate

    @property
    def mean_length(self) -> float | None:
        return None if self.inconclusive else self.figures.mean_length

    @property
    def clean_window(self) -> bool:
        """No other client's traffic in the figures (only such a window makes a reference)."""
        return not (self.figures.foreign_requests or self.figures.foreign_drafts)

    def with_rules(self, rules: AcceptanceRules) -> AcceptanceVerdict:
        """The same figures judged against other rules (the rollout's gate and baseline)."""
        return judge(self.figures, rules, self.observed)

    def with_causes(self, measured: str, causes: tuple[Cause, ...]) -> AcceptanceVerdict:
        return replace(self, measured=measured, causes=causes)


def judge(
    figures: Acceptance, rules: AcceptanceRules, observed: Observed | None = None
) -> AcceptanceVerdict:
    """The verdict on ``figures`` (see the module docstring for the rules, in order)."""
    seen = observed or Observed()
    drop = None
    if rules.reference is not None and figures.mean_length is not None and figures.sane:
        drop = regression(rules.reference, figures.mean_length)
    finding = _finding(figures, rules, seen, drop)
    outcome = _OUTCOME[finding]
    if outcome is Outcome.INCONCLUSIVE:
        drop = None  # figures that decide nothing are compared with nothing
    return AcceptanceVerdict(outcome, finding, figures, rules, seen, drop)


def _finding(
    figures: Acceptance, rules: AcceptanceRules, seen: Observed, drop: float | None
) -> Finding:
    if not seen.vllm_metrics:
        return Finding.NO_VLLM_METRICS
    if not seen.spec_counters:
        return Finding.NOT_SPECULATING
    if seen.not_evidence:
        return Finding.FIGURES_NOT_EVIDENCE
    if figures.decreased:
        return Finding.COUNTERS_RESTARTED
    if figures.impossible:
        return Finding.COUNTERS_IMPOSSIBLE
    if 0 < figures.delta.draft_tokens < rules.min_draft_tokens:
        return Finding.TOO_FEW_DRAFT_TOKENS
    if figures.rate is None:
        return Finding.NO_DRAFTS
    if figures.rate < rules.min_acceptance:
        return Finding.BELOW_MIN_ACCEPTANCE
    if seen.long_context_collapsed:
        return Finding.LONG_CONTEXT_COLLAPSED
    limit = rules.max_regression if rules.reference_mismatch is None else None
    if drop is not None and limit is not None and drop > limit:
        return Finding.REGRESSED
    if seen.long_context_unknown:
        return Finding.LONG_CONTEXT_UNKNOWN
    return Finding.PASSED


# -- a whole check, judged as the rollout judges a host -----------------------------------------


@dataclass(frozen=True)
class HostJudgement:
    """A host's verdict over a whole runtime-check: ``outcome`` is "passed", "failed" or
    "inconclusive"; ``rate`` and ``mean_length`` what stage e measured (None: not measured)."""

    outcome: str
    detail: str
    rate: float | None
    mean_length: float | None


def judge_check(
    report: CheckReport,
    *,
    min_acceptance: float,
    max_regression: float | None = None,
    baseline_mean_length: float | None = None,
) -> HostJudgement:
    """Judge a host by its runtime-check report: failed when a stage a-d failed; inconclusive
    when no stage failed but one could not tell; else stage e's figures judged by this gate:
    acceptance >= ``min_acceptance`` and, with a baseline and ``max_regression``, a mean
    acceptance length not more than that below ``baseline_mean_length``. The rollout calls it
    for each batch and after a rollback."""
    verdict = report.acceptance_verdict
    rate = verdict.figures.rate if verdict is not None else None
    mean = verdict.figures.mean_length if verdict is not None else None
    failed = [s for s in report.stages if s.failed and s.key != "e"]
    if failed:
        return HostJudgement("failed", f"{failed[0].key}: {failed[0].summary}", rate, mean)
    undecided = next((s for s in report.stages if s.inconclusive), None)
    if undecided is not None:
        return HostJudgement("inconclusive", f"{undecided.key}: {undecided.summary}", None, None)
    shown = f"{rate:.1%}" if rate is not None else "-"
    if verdict is None:
        return HostJudgement("failed", f"acceptance {shown} < {min_acceptance:.0%}", rate, mean)
    baseline = None
    if baseline_mean_length:
        baseline = Reference("baseline", baseline_mean_length, 0.0, [], None)
    rules = replace(
        verdict.rules,
        min_acceptance=min_acceptance,
        reference=baseline,
        max_regression=max_regression if baseline is not None else None,
        reference_mismatch=None,  # the rollout's baseline was measured on this very server
    )
    judged = verdict.with_rules(rules)
    if (
        judged.finding is Finding.REGRESSED
        and judged.regression is not None
        and mean is not None
        and baseline_mean_length is not None
        and max_regression is not None
    ):
        detail = (
            f"mean acceptance length {mean:.2f} is {judged.regression:.0%} below baseline "
            f"{baseline_mean_length:.2f} (--max-regression {max_regression:.0%})"
        )
        return HostJudgement("failed", detail, rate, mean)
    if judged.finding is Finding.LONG_CONTEXT_COLLAPSED:
        detail = f"acceptance {shown}, but {judged.observed.long_context_collapsed}"
        return HostJudgement("failed", detail, rate, mean)
    if judged.failed:
        return HostJudgement("failed", f"acceptance {shown} < {min_acceptance:.0%}", rate, mean)
    return HostJudgement(judged.outcome.value, f"acceptance {shown}", rate, mean)
