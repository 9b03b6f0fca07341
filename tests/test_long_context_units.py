"""Unit tests of stage e's long-context part (verify/long_context.py): which drafters have a
window, the pure decision on the long request's counters, how it turns stage e's verdict (and
so the rollout's judgement), and the stand-in's past-window behaviour and /tokenize. No hosts:
tests/test_long_context_standin.py runs the same through the CLI on a real sshd host."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_provision.verify import long_context
from dflash_provision.verify.acceptance_gate import (
    AcceptanceRules,
    Finding,
    judge,
)
from dflash_provision.verify.long_context import LongContext, LongStatus, decide
from dflash_provision.verify.stages import StageResult, StageStatus
from dflash_provision.vllm.metrics import SpecCounters, acceptance
from testbed import samples, vllm_standin
from tests.fixtures.cli import run_cli

REFERENCE = json.loads(samples.REFERENCE_DRAFTER.read_text())
FIXES = {
    "restart": "dflash-provision launch h:/srv/drafter --port 8000 --restart",
    "rerun": f"dflash-provision runtime-check h:/srv/drafter --from {samples.REFERENCE_DRAFTER} "
    "--port 8000",
}


def figures(drafts: int, accepted: int, k: int = 4, *, requests: int = 1) -> Any:
    before = SpecCounters(present=True, requests=0.0, vllm_metrics=True)
    after = SpecCounters(
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=accepted,
        per_position=(min(accepted, drafts),),
        present=True,
        requests=float(requests),
        vllm_metrics=True,
    )
    return acceptance(before, after, expected_max_drafts=32, own_requests=1)


def test_the_largest_window_is_read_as_the_probe_reads_the_keys() -> None:
    assert long_context.largest_window(REFERENCE) == 2048  # 4 sliding layers + 1 full
    full = {**REFERENCE, "layer_types": ["full_attention"] * 5}
    assert long_context.largest_window(full) is None
    # NVIDIA Model-Optimizer's export: all-full layer_types, use_swa + swa_window_size.
    swa = {
        **full,
        "sliding_window": None,
        "dflash_config": {"use_swa": True, "swa_window_size": 4096},
    }
    assert long_context.largest_window(swa) == 4096
    assert long_context.largest_window({"num_hidden_layers": 2}) is None


def test_a_past_window_rate_below_half_the_short_one_is_a_collapse_naming_the_cause() -> None:
    status, summary = decide(2048, 0.6, figures(31, 3))  # 3 of 124: 2.4 %
    assert status is LongStatus.COLLAPSED
    assert "collapsed: 2.4%" in summary and "against 60.0% on the short prompts" in summary
    assert summary.endswith(
        "the sliding-window layers are not run as trained (full attention, or the window's KV "
        "recycled)"
    )
    status, summary = decide(2048, 0.6, figures(8, 18))  # 18 of 32: 56 %, above half of 60 %
    assert status is LongStatus.PASSED
    assert summary.startswith("past the sliding window (2048 tokens): acceptance 56.2%")


def test_other_traffic_too_few_drafts_or_a_reset_cannot_tell() -> None:
    status, summary = decide(2048, 0.6, figures(8, 18, requests=3))
    assert status is LongStatus.UNKNOWN
    assert "other clients' traffic mixed into the counters" in summary and "2 request(s)" in summary
    status, summary = decide(2048, 0.6, figures(1, 1))  # 4 draft tokens
    assert status is LongStatus.UNKNOWN and "only 4 draft tokens" in summary
    reset = acceptance(
        SpecCounters(drafts=50, draft_tokens=200, present=True, vllm_metrics=True),
        SpecCounters(drafts=8, draft_tokens=32, present=True, vllm_metrics=True),
    )
    status, summary = decide(2048, 0.6, reset)
    assert status is LongStatus.UNKNOWN and "went backwards" in summary


def _stage_e(rate_accepted: int = 18) -> StageResult:
    verdict = judge(figures(8, rate_accepted), AcceptanceRules(0.1))
    assert verdict.passed
    return StageResult(
        "e", "acceptance", StageStatus.PASSED, "acceptance 56.2%", ["x"], {}, acceptance=verdict
    )


def test_a_collapse_fails_stage_e_and_the_gate_keeps_the_finding_for_the_rollout() -> None:
    collapsed = LongContext(LongStatus.COLLAPSED, "acceptance past the sliding window collapsed")
    e = long_context.apply(_stage_e(), collapsed, **FIXES)
    assert e.failed and e.summary == collapsed.summary
    assert e.acceptance is not None and e.acceptance.finding is Finding.LONG_CONTEXT_COLLAPSED
    assert e.causes[0].endswith(long_context.CAUSE)
    assert e.fix == long_context.collapse_fix(FIXES["restart"]) and e.causes[1].endswith(e.fix)
    # The rollout's gate re-judges with its own rules: the finding stays (it is observed).
    again = e.acceptance.with_rules(AcceptanceRules(0.05))
    assert again.finding is Finding.LONG_CONTEXT_COLLAPSED and again.failed


def test_the_fix_lines_are_commands_the_clis_own_parser_takes() -> None:
    """Pasted as printed: the restart (collapse) and this check again (cannot tell), the words
    after ``#`` a shell comment."""
    from tests.fixtures.fix_lines import parse

    for fix in (
        long_context.collapse_fix(FIXES["restart"]),
        long_context.unknown_fix(FIXES["rerun"]),
    ):
        assert "  # " in fix
        parse(fix)


def test_cannot_tell_makes_stage_e_inconclusive_and_skips_are_said() -> None:
    unknown = LongContext(LongStatus.UNKNOWN, "cannot tell past the sliding window: deadline")
    e = long_context.apply(_stage_e(), unknown, **FIXES)
    assert e.inconclusive and e.acceptance is not None
    assert e.acceptance.finding is Finding.LONG_CONTEXT_UNKNOWN
    assert e.fix == long_context.unknown_fix(FIXES["rerun"])
    skipped = LongContext(LongStatus.SKIPPED, "skipped (--no-long-context): ...", 2048)
    e = long_context.apply(_stage_e(), skipped, **FIXES)
    assert e.passed and e.data["long_context"]["status"] == "skipped"
    assert "long context: skipped (--no-long-context)" in e.evidence[-1]


def test_measure_sends_nothing_for_a_drafter_without_sliding_layers_or_when_skipped() -> None:
    class NoAccess:
        def request(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("no request may be sent")

    full = {**REFERENCE, "layer_types": ["full_attention"] * 5}
    e = _stage_e()
    got = long_context.measure(
        NoAccess(), "m", full, e.acceptance, enabled=True, max_tokens=32, timeout=5
    )
    assert got.status is LongStatus.NOT_SENT and got.requests == []
    got = long_context.measure(
        NoAccess(), "m", REFERENCE, e.acceptance, enabled=False, max_tokens=32, timeout=5
    )
    assert got.status is LongStatus.SKIPPED and "--no-long-context" in got.summary


@pytest.mark.parametrize(("mode", "past"), [("full_attention", 0.02), ("recycled_kv", 0.023)])
def test_the_standin_collapses_only_past_the_window(mode: str, past: float) -> None:
    counters = vllm_standin.Counters(4)
    counters.generate(64, 100, 0.6, (2048, past))  # short: inside the window
    short = counters.snapshot()
    assert short.accepted / short.draft_tokens == pytest.approx(0.6, abs=0.05)
    counters = vllm_standin.Counters(4)
    counters.generate(64, 2080, 0.6, (2048, past))
    long = counters.snapshot()
    assert long.accepted / long.draft_tokens < 0.1
    control = vllm_standin.parse_control({"sliding_layers": mode, "prefill_s_per_token": 0.01})
    assert vllm_standin.SLIDING_MODES[control.sliding_layers] == past
    with pytest.raises(ValueError, match="sliding_layers must be one of"):
        vllm_standin.parse_control({"sliding_layers": "sometimes"})


def test_the_rollout_judges_a_host_whose_acceptance_collapsed_past_the_window_failed() -> None:
    from dflash_provision.verify.acceptance_gate import judge_check
    from dflash_provision.verify.runtime_check import CheckReport

    ok = [StageResult(k, k, StageStatus.PASSED, "ok") for k in "abcd"]
    collapsed = LongContext(LongStatus.COLLAPSED, "acceptance past the sliding window collapsed")
    report = CheckReport("h", 8000, "a", [*ok, long_context.apply(_stage_e(), collapsed, **FIXES)])
    judged = judge_check(report, min_acceptance=0.1)
    assert judged.outcome == "failed"
    assert judged.detail.endswith("but acceptance past the sliding window collapsed")
    unknown = LongContext(LongStatus.UNKNOWN, "cannot tell past the sliding window: deadline")
    report = CheckReport("h", 8000, "a", [*ok, long_context.apply(_stage_e(), unknown, **FIXES)])
    judged = judge_check(report, min_acceptance=0.1)
    assert (
        judged.outcome == "inconclusive" and "cannot tell past the sliding window" in judged.detail
    )


def test_the_ansible_task_and_the_cli_take_the_option_to_skip_it() -> None:
    from dflash_provision.ansible_modules.runtime_check import parse_args

    args = {"path": "/m", "src": "a.json"}
    assert parse_args(args).settings.long_context
    assert not parse_args({**args, "no_long_context": True}).settings.long_context
    for command in ("runtime-check", "doctor", "rollout"):
        done = run_cli(command, "--help")
        assert "--no-long-context" in done.stdout, (command, done.stdout)


class _Reply:
    def __init__(self, status: int, body: Any) -> None:
        self.status, self.truncated, self.headers = status, False, {}
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()


class _NoTokenize:
    """A server behind a proxy that forwards only /v1 and /metrics: its counters are the
    stand-in's own metrics text, advanced by the long completion."""

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.counters = vllm_standin.Counters(4)
        self.prompt_words = 0

    def request(self, method: str, path: str, body: bytes | None = None, **_: Any) -> _Reply:
        if path == "/v1/models":
            return _Reply(200, {"data": [{"id": "m", "max_model_len": self.max_model_len}]})
        if path == "/metrics":
            return _Reply(
                200, vllm_standin.metrics_text(self.counters, "m", speculative=True).encode()
            )
        if path == "/v1/completions":
            doc = json.loads(body or b"{}")
            self.prompt_words = len(doc["prompt"].split())
            self.counters.generate(doc["max_tokens"], self.prompt_words, 0.6, (2048, 0.02))
            return _Reply(200, {"choices": [{"text": ""}]})
        return _Reply(404, {"detail": "Not Found"})


def test_without_tokenize_the_words_bound_and_v1_models_max_model_len_are_used() -> None:
    server = _NoTokenize(262144)
    got = long_context.measure(
        server, "m", REFERENCE, _stage_e().acceptance, enabled=True, max_tokens=32, timeout=10
    )
    assert got.counted_by == "at least one token per word (no /tokenize)"
    assert server.prompt_words == got.prompt_tokens == 2048 + 32
    assert got.status is LongStatus.COLLAPSED and got.max_model_len == 262144
    assert got.requests[0] == "POST /tokenize" and "GET /v1/models" in got.requests
    small = long_context.measure(
        _NoTokenize(2048), "m", REFERENCE, _stage_e().acceptance, enabled=True, max_tokens=32,
        timeout=10,
    )  # fmt: skip
    assert small.status is LongStatus.UNKNOWN and "max-model-len 2048 is below" in small.summary


class _Answer:
    def __init__(self, doc: Any) -> None:
        self.body, self.truncated, self.status = json.dumps(doc).encode(), False, 200


def test_the_long_requests_own_figures_win_over_counters_other_traffic_mixed_into() -> None:
    """vLLM's ``metrics.speculative_decoding`` (vllm/v1/metrics/stats.py to_dict(), K=4):
    5 steps, 2 accepted of 20: 10 %, judged though the counters saw another client's request."""
    spec = {"acceptance_histogram": [4, 0, 1, 0, 0], "num_draft_tokens": 20, "num_spec_tokens": 4}
    mixed = figures(10, 30, requests=2)  # the counters: 75 % with another client's request
    own, source, note = long_context._whose(_Answer({"metrics": {"speculative_decoding": spec}}),
                                            mixed, 32)  # fmt: skip
    assert source == "requests" and own is not None and own.rate == pytest.approx(0.1)
    assert own.foreign_requests == 0 and "other traffic" in note
    status, _ = decide(2048, 0.6, own)
    assert status is LongStatus.COLLAPSED
    counted, source, note = long_context._whose(_Answer({"choices": []}), mixed, 32)
    assert source == "counters" and counted is mixed and "no per-request figures" in note
    assert decide(2048, 0.6, mixed)[0] is LongStatus.UNKNOWN
    none, source, note = long_context._whose(_Answer({"choices": []}), None, 32)
    assert none is None and "could not be read" in note
