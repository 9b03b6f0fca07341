"""Unit tests for the counter math behind stage e (vllm/metrics.py), its verdicts
(stage_traffic.stage_acceptance), the acceptance references (verify/reference.py and their
table in the history store) and the fleet's mapping of an inconclusive host. No hosts: the
same paths run against the stand-in in tests/test_runtime_counters_standin.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.references import ReferenceKey
from dflash_provision.history.store import HistoryStore
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify import fleet_check, reference
from dflash_provision.verify.acceptance_gate import AcceptanceRules as AcceptanceGate
from dflash_provision.verify.acceptance_gate import Observed
from dflash_provision.verify.runtime_check import CheckReport
from dflash_provision.verify.stage_traffic import stage_acceptance
from dflash_provision.verify.stages import CheckContext, StageResult, StageStatus
from dflash_provision.vllm import metrics
from testbed import samples
from tests.fixtures.cli import run_cli

K = 4


def text(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], **reasons: int) -> str:
    """/metrics as vLLM renders it: two engines split the counts, requests per finish reason."""
    lines = []
    for engine in ("0", "1"):

        def share(n: int, first: bool = engine == "0") -> int:
            return n // 2 if first else n - n // 2

        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(share(drafts))}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(share(draft_tokens))}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(share(accepted))}",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} '
            f"{float(share(n))}"
            for i, n in enumerate(per_pos)
        ]
        lines += [
            f'vllm:request_success_total{{{labels},finished_reason="{r}"}} {float(share(n))}'
            for r, n in reasons.items()
        ]
    return "\n".join(lines) + "\n"


def test_requests_are_summed_over_finish_reasons_and_engines() -> None:
    counters = metrics.spec_counters(text(10, 40, 20, [8, 6, 4, 2], length=7, stop=3, abort=0))
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 40, 20)
    assert counters.per_position == (8, 6, 4, 2) and counters.requests == 10
    assert metrics.spec_counters(text(1, 4, 0, [0, 0, 0, 0])).requests is None  # not exported


def test_a_clean_window_gives_the_rates_and_no_findings() -> None:
    before = metrics.spec_counters(text(10, 40, 20, [8, 6, 4, 2], length=3))
    after = metrics.spec_counters(text(30, 120, 60, [20, 18, 14, 8], length=6))
    result = metrics.acceptance(before, after, expected_max_drafts=96, own_requests=3)
    assert result.sane and result.rate == pytest.approx(0.5) and result.mean_length == 3.0
    assert result.per_position == pytest.approx((0.6, 0.6, 0.5, 0.3))
    assert result.foreign_requests == 0 and result.to_dict()["requests"] == 3


def test_a_counter_that_goes_backwards_is_a_restart_and_gives_no_rate() -> None:
    before = metrics.spec_counters(text(16, 64, 32, [10, 10, 8, 4], length=4))
    after = metrics.spec_counters(text(12, 48, 24, [8, 7, 6, 3], length=3))
    result = metrics.acceptance(before, after, expected_max_drafts=96, own_requests=3)
    assert not result.sane and result.rate is None and result.mean_length is None
    assert "drafts 16 → 12" in result.decreased and "finished requests 4 → 3" in result.decreased
    assert "accepted at position 0 10 → 8" in result.decreased
    # A position that vanished from the exposition counts as gone back to 0.
    shorter = metrics.SpecCounters(20, 80, 40, (12, 12), present=True)
    assert "accepted at position 2 8 → 0" in shorter.decreases_from(before)


def test_a_counter_created_anew_is_a_restart_even_when_the_counts_grew() -> None:
    created = 'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} '
    before = metrics.spec_counters(text(4, 60, 36, [4, 4, 4, 4]) + created + "1764650000.5\n")
    same = metrics.spec_counters(text(16, 240, 144, [16, 16, 16, 16]) + created + "1764650000.5\n")
    anew = metrics.spec_counters(text(16, 240, 144, [16, 16, 16, 16]) + created + "1764650900.0\n")
    assert metrics.acceptance(before, same).sane
    result = metrics.acceptance(before, anew)
    assert result.rate is None and result.decreased == [
        "vllm:spec_decode_num_drafts_created 1764650000.500 → 1764650900.000"
    ]
    # Not exported (prometheus_client's multiprocess mode): nothing to compare, no finding.
    assert metrics.acceptance(metrics.spec_counters(text(4, 60, 36, [4, 4, 4, 4])), anew).sane


def test_accepted_beyond_drafted_or_per_position_beyond_drafts_is_impossible() -> None:
    before = metrics.spec_counters(text(10, 40, 20, [8, 6, 4, 2]))
    too_many = metrics.spec_counters(text(20, 80, 400, [18, 16, 14, 12]))
    result = metrics.acceptance(before, too_many)
    assert result.rate is None and result.impossible == ["accepted tokens 380 > draft tokens 40"]
    per_pos = metrics.spec_counters(text(20, 80, 40, [30, 6, 4, 2]))
    assert metrics.acceptance(before, per_pos).impossible == [
        "accepted at position 0 22 > drafts 10"
    ]
    # Impossible lifetime totals with a plausible difference are no evidence either.
    lying = metrics.SpecCounters(10, 40, 100, (), present=True)
    worse = metrics.SpecCounters(20, 80, 120, (), present=True)
    assert metrics.acceptance(lying, worse).impossible == [
        "accepted tokens 120 > draft tokens 80 (server totals)"
    ]


def test_foreign_requests_are_the_window_beyond_the_checks_own() -> None:
    before = metrics.spec_counters(text(10, 40, 20, [8, 6, 4, 2], length=100))
    after = metrics.spec_counters(text(20, 80, 40, [16, 12, 8, 4], length=108))
    assert metrics.acceptance(before, after, own_requests=3).foreign_requests == 5
    # vLLM may count the last request just after answering it: fewer is no finding.
    late = metrics.spec_counters(text(20, 80, 40, [16, 12, 8, 4], length=102))
    assert metrics.acceptance(before, late, own_requests=3).foreign_requests == 0


# -- stage e's verdicts ------------------------------------------------------------------------


def ctx() -> CheckContext:
    data = samples.REFERENCE_DRAFTER.read_bytes()
    return CheckContext(
        transport=None,  # type: ignore[arg-type]  # stage e runs no commands
        target=parse_target("gpu1:/m"),
        authority=Authority("test", data),
        auth_doc=json.loads(data),
        push_fix="dflash-provision push gpu1:/m --from x",
    )


def judge(before: str, after: str, gate: AcceptanceGate, own: int = 3) -> StageResult:
    result = metrics.acceptance(
        metrics.spec_counters(before),
        metrics.spec_counters(after),
        expected_max_drafts=96,
        own_requests=own,
    )
    return stage_acceptance(
        ctx(), result, rules=gate, observed=Observed(), prompts=3, earlier={}, num_spec=K
    )


BEFORE = text(10, 40, 20, [8, 6, 4, 2], length=3)
AFTER = text(30, 120, 60, [20, 18, 14, 8], length=6)  # 50 %, mean length 3.0


def test_stage_e_is_inconclusive_for_a_restart_impossible_counters_and_too_few_tokens() -> None:
    gate = AcceptanceGate(0.1, min_draft_tokens=32)
    restart = judge(AFTER, BEFORE, gate)
    assert restart.status is StageStatus.INCONCLUSIVE and restart.causes == []
    assert restart.summary.startswith("the server restarted during the check")
    impossible = judge(BEFORE, text(30, 120, 900, [20, 18, 14, 8], length=6), gate)
    assert impossible.status is StageStatus.INCONCLUSIVE
    assert "accepted tokens 880 > draft tokens 80" in impossible.summary
    assert "%" not in impossible.summary
    few = judge(BEFORE, text(12, 48, 24, [9, 7, 5, 3], length=6), gate)
    assert few.status is StageStatus.INCONCLUSIVE
    assert "only 8 draft tokens during the check, fewer than --min-draft-tokens 32" in few.summary
    assert judge(BEFORE, AFTER, gate).status is StageStatus.PASSED  # 80 tokens decide
    nothing = judge(BEFORE, BEFORE, gate)
    assert nothing.failed and "not drafting" in nothing.summary  # zero drafts: a failure


def test_foreign_requests_warn_without_changing_the_verdict() -> None:
    busy = text(30, 120, 60, [20, 18, 14, 8], length=11)
    result = judge(BEFORE, busy, AcceptanceGate(0.1))
    assert result.passed and result.data["foreign_requests"] == 5
    assert any("finished 5 request(s) from other clients" in w for w in result.warnings)


def test_regression_against_the_reference_warns_or_fails_with_the_gate() -> None:
    ref = reference.Reference("2026-12-01T00:00:00+00:00", 3.75, 0.7, [0.9, 0.8], "0.32.0")
    warned = judge(BEFORE, AFTER, AcceptanceGate(0.1, reference=ref))
    assert warned.passed and warned.data["regression"] == pytest.approx(0.2)
    assert warned.data["reference"]["mean_acceptance_length"] == 3.75
    assert any(w.startswith("acceptance regressed: mean acceptance length 3.00 vs 3.75")
               for w in warned.warnings)  # fmt: skip
    gated = judge(BEFORE, AFTER, AcceptanceGate(0.1, reference=ref, max_regression=0.1))
    assert gated.failed and "20.0% lower, more than --max-regression 10.0%" in gated.summary
    assert gated.causes  # the likely causes stand under the failure
    assert judge(BEFORE, AFTER, AcceptanceGate(0.1, reference=ref, max_regression=0.25)).passed
    better = reference.Reference("then", 2.0, 0.3, [], None)
    improved = judge(BEFORE, AFTER, AcceptanceGate(0.1, reference=better, max_regression=0.0))
    assert improved.passed and improved.data["regression"] == pytest.approx(-0.5)
    assert improved.warnings == []


@pytest.mark.parametrize(("given", "value"), [("10%", 0.1), ("0.1", 0.1), (" 5 % ", 0.05)])
def test_max_regression_takes_a_percentage_or_a_fraction(given: str, value: float) -> None:
    assert reference.parse_fraction(given) == pytest.approx(value)


@pytest.mark.parametrize("given", ["abc", "150%", "-1%", "1", "nan", "inf", "%", ""])
def test_max_regression_refuses_anything_else(given: str) -> None:
    with pytest.raises(ValueError):
        reference.parse_fraction(given)


@pytest.mark.parametrize(
    ("value", "why"),
    [("abc", "is not a fraction such as 10% or 0.1"), ("150%", "is outside 0..100%"),
     ("-0.1", "is outside"), ("1", "is outside"), ("nan", "is outside")],
)  # fmt: skip
def test_a_bad_max_regression_is_a_usage_error_naming_the_value(value: str, why: str) -> None:
    proc = run_cli("runtime-check", "gpu1:/m", "--max-regression", value, in_process=True)
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    assert f"Invalid value for '--max-regression': '{value}' {why}" in proc.stderr


def test_no_reference_contradicts_the_reference_options() -> None:
    for other in (["--reset-reference"], ["--max-regression", "10%"]):
        proc = run_cli("runtime-check", "gpu1:/m", "--no-reference", *other, in_process=True)
        assert proc.returncode == ExitCode.USAGE
        assert f"--no-reference and {other[0]} contradict each other" in proc.stderr


# -- the references' table ---------------------------------------------------------------------


def key(host: str = "gpu1", port: int = 8000, sha: str = "a" * 64) -> ReferenceKey:
    return ReferenceKey(HostKey.parse(host), "/m/config.json", port, sha, "p" * 64)


def test_the_newest_reference_of_exactly_that_host_port_drafter_and_prompts(
    tmp_path: Path,
) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.record_reference(key(), {"mean_acceptance_length": 3.0}, message="m1", duration_s=1)
    store.record_reference(key(), {"mean_acceptance_length": 3.5}, message="m2", duration_s=1)
    store.record_reference(key("gpu1/lxc:c1"), {"mean_acceptance_length": 9.0}, message="c",
                           duration_s=1)  # fmt: skip
    found = store.latest_reference(key())
    assert found is not None and found[1]["mean_acceptance_length"] == 3.5
    assert store.latest_reference(key("gpu1/lxc:c1"))[1]["mean_acceptance_length"] == 9.0  # type: ignore[index]
    for other in (key("gpu2"), key("root@gpu1"), key(port=8001), key(sha="b" * 64)):
        assert store.latest_reference(other) is None
    rows = store.query(op="runtime-check")
    assert [r.message for r in rows] == ["c", "m2", "m1"] and rows[0].status == "passed"
    assert rows[0].sha256_after == "a" * 64


def test_damaged_figures_are_no_reference() -> None:
    assert reference.from_figures("t", {"mean_acceptance_length": "3"}) is None
    assert reference.from_figures("t", {"mean_acceptance_length": 0, "acceptance_rate": 0}) is None
    ok = reference.from_figures("t", {"mean_acceptance_length": 3, "acceptance_rate": 0.5,
                                      "per_position": [0.5, "x"]})  # fmt: skip
    assert ok is not None and ok.per_position == [0.5] and ok.vllm_version is None


# -- the fleet form --------------------------------------------------------------------------


def _report(e_status: StageStatus, *, a_failed: bool = False) -> CheckReport:
    report = CheckReport("gpu1:/m", 8000, "test")
    for key_ in "abcd":
        status = StageStatus.FAILED if a_failed and key_ == "a" else StageStatus.PASSED
        report.stages.append(StageResult(key_, key_, status, "s"))
    report.stages.append(StageResult("e", "acceptance", e_status, "too few"))
    return report


def _row(report: CheckReport) -> fleet_check.HostCheck:
    verdict, detail = fleet_check.verdict_of(report)
    row = fleet_check.HostCheck("gpu1", "g", "gpu1:/m", "/m", verdict, detail, report)
    return row


def test_an_inconclusive_host_is_its_own_verdict_and_exit_26_when_none_failed() -> None:
    undecided = _row(_report(StageStatus.INCONCLUSIVE))
    passed = _row(_report(StageStatus.PASSED))
    assert undecided.verdict is fleet_check.HostVerdict.INCONCLUSIVE
    assert undecided.detail == "e: too few"
    assert fleet_check.fleet_exit_code([passed, undecided]) == ExitCode.INCONCLUSIVE
    failed = _row(_report(StageStatus.INCONCLUSIVE, a_failed=True))
    assert failed.verdict is fleet_check.HostVerdict.FAILED
    assert fleet_check.fleet_exit_code([failed, undecided]) == ExitCode.RUNTIME_CHECK_FAILED
    prom = fleet_check.prometheus_text([undecided], timestamp=0)
    assert 'dflash_runtime_check_inconclusive{host="gpu1",group="g",path="/m"} 1' in prom
    assert 'dflash_runtime_check_passed{host="gpu1",group="g",path="/m"} 0' in prom
    assert "1 host: 1 inconclusive" in fleet_check.summary_line([undecided], 1.0)


def test_an_inconclusive_stages_figures_are_no_rate_to_show_or_alert_on() -> None:
    report = _report(StageStatus.INCONCLUSIVE)
    report.stages[-1].data.update(acceptance_rate=0.0, mean_acceptance_length=1.0)
    assert report.acceptance is None and report.to_dict()["acceptance_rate"] is None
    prom = fleet_check.prometheus_text([_row(report)], timestamp=0)
    assert 'dflash_runtime_acceptance_rate{host="gpu1"' not in prom
    assert 'dflash_runtime_mean_acceptance_length{host="gpu1"' not in prom
