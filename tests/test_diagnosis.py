"""Unit tests of the acceptance diagnosis (verify/diagnosis.py, vllm/curve.py): the curve's
shapes at their thresholds, causes ranked by what the stages measured (a cause a passed stage
ruled out is never the first fix), and each cause line with the fix that belongs to it. Built
StageResults shaped like the real stages' data; the real runs are in test_diagnosis_standin.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify.acceptance_gate import AcceptanceRules, judge
from dflash_provision.verify.diagnosis import diagnose, first_fix, render_causes
from dflash_provision.verify.reference import from_figures
from dflash_provision.verify.stages import CheckContext, StageResult, StageStatus
from dflash_provision.vllm import curve
from dflash_provision.vllm.curve import Shape, classify
from dflash_provision.vllm.metrics import Acceptance, SpecCounters
from testbed import samples

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
DRAFTER = "/root/models/Qwen3.6-27B-DFlash"
PASSED, FAILED = StageStatus.PASSED, StageStatus.FAILED


def ctx() -> CheckContext:
    return CheckContext(
        transport=None,  # type: ignore[arg-type]  # the diagnosis never runs commands
        target=parse_target(f"gpu1:{DRAFTER}"),
        authority=Authority("test", REFERENCE),
        auth_doc=json.loads(REFERENCE),
        push_fix=f"dflash-provision push gpu1:{DRAFTER} --from x",
    )


def healthy_earlier(**overrides: StageResult) -> dict[str, StageResult]:
    """Stages a-c as they read on a server that runs exactly the provisioned drafter."""
    probe = {
        "transformers": "5.24.0",
        "effective": {"config": json.loads(REFERENCE)},
        "vllm": {"importable": False, "error": "No module named 'vllm'"},
    }
    stages = {
        "a": StageResult("a", "file on disk", PASSED, "config.json is the authoritative config"),
        "b": StageResult(
            "b", "loader", PASSED, "the target loads the authoritative values",
            data={"probe": probe, "loader_problems": [], "vllm_problems": []},
        ),
        "c": StageResult(
            "c", "running server", PASSED, "dflash, 15 speculative tokens",
            data={"port": 8000, "log": {"aux_layers": [2, 17, 32, 47, 62],
                                        "aux_layers_source": "speculative config",
                                        "engine_version": "0.32.0"}},
        ),
    }  # fmt: skip
    return stages | overrides


def acceptance_data(per_position: list[float], rate: float, **extra: Any) -> dict[str, Any]:
    return {"acceptance_rate": rate, "per_position": per_position, **extra}


def verdict_of(data: dict[str, Any]) -> Any:
    """The gate's verdict on figures shaped like ``data`` (rate, curve, mean length, a
    reference): what stage e hands the diagnosis."""
    rate = data["acceptance_rate"]
    mean = data.get("mean_acceptance_length", 1.0 + rate * 15)
    counted = SpecCounters(drafts=100, draft_tokens=1500, accepted=rate * 1500, present=True)
    figures = Acceptance(counted, rate, mean, tuple(data["per_position"]))
    ref = data.get("reference")
    reference = from_figures(ref["recorded_at"], ref) if ref else None
    return judge(figures, AcceptanceRules(0.10, reference=reference))


def acceptance_causes(
    context: CheckContext, earlier: dict[str, StageResult], data: dict[str, Any], num_spec: int
) -> list[str]:
    """Stage e's cause lines for figures shaped like ``data``."""
    return render_causes(diagnose(context, earlier, verdict_of(data), num_spec))


def live(causes: list[str]) -> list[str]:
    return [c for c in causes if c[:1].isdigit()]


# -- the curve ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rates", "shape"),
    [
        ([0.9, 0.8, 0.0, 0.0], Shape.CLIFF),  # the example
        ([0.95, 0.9, 0.85, 0.0, 0.01, 0.0], Shape.CLIFF),  # high at 0-2, ~0 after
        ([curve.CLIFF_HIGH, curve.CLIFF_HIGH, curve.CLIFF_ZERO], Shape.CLIFF),  # both edges in
        ([0.5, 0.49, 0.0, 0.0], Shape.LOW),  # position 1 is not high: no cliff
        ([0.9, 0.8, 0.06, 0.0], Shape.LOW),  # position 2 is not ~0: no cliff
        ([0.75, 0.0, 0.0, 0.0], Shape.LOW),  # one high position is not a cliff (CLIFF_MIN_HEAD)
        ([0.7**i for i in range(1, 16)], Shape.LOW),  # a healthy geometric decay, never a cliff
        ([0.16] + [0.0] * 14, Shape.NEAR_ZERO),  # the 1.1% incident at 15 tokens
        ([curve.NEAR_ZERO_POSITION, 0.1], Shape.NEAR_ZERO),
        ([curve.NEAR_ZERO_POSITION + 0.01, 0.0], Shape.LOW),
    ],
)
def test_the_curve_shape_follows_the_thresholds(rates: list[float], shape: Shape) -> None:
    assert classify(rates, None).shape is shape


def test_without_per_position_counters_the_rate_decides_and_nothing_is_unknown() -> None:
    assert classify([], curve.NEAR_ZERO_RATE).shape is Shape.NEAR_ZERO
    assert classify(None, 0.08).shape is Shape.LOW
    assert classify([], None).shape is Shape.UNKNOWN
    # Counters' JSON is checked, not trusted: impossible rates are no shape at all.
    assert classify([1.5, 0.2], 0.5).shape is Shape.UNKNOWN
    assert classify(["x", True], 0.01).shape is Shape.NEAR_ZERO  # falls back to the rate


def test_a_cliff_names_where_it_falls() -> None:
    found = classify([0.9, 0.8, 0.0, 0.0], None)
    assert found.cliff_at == 2
    assert "falls off a cliff after position 1: 0.90, 0.80, then <= 0.05 from position 2" in (
        found.detail
    )


# -- the causes --------------------------------------------------------------------------------


def test_a_cause_a_passed_stage_ruled_out_is_never_the_first_fix() -> None:
    causes = acceptance_causes(ctx(), healthy_earlier(), acceptance_data([0.16] + [0.0] * 14,
                               0.011), 15)  # fmt: skip
    assert causes[0].startswith("measured: every position is near zero")
    first = live(causes)[0]
    assert not first.startswith(("1. the file on disk", "1. too many speculative tokens"))
    assert first.startswith("1. other weights of the same shapes (a retrain")
    ruled = [c for c in causes if c.startswith("ruled out: ")]
    assert ruled[0] == (
        "ruled out: stage a passed (config.json is the authoritative config): "
        "the file on disk is not the authoritative config"
    )
    assert any(
        "stage c passed (the server's command line: 15 <= block_size - 1" in c for c in ruled
    )
    assert any("stage c passed (the start-up log shows aux layers" in c for c in ruled)
    # ruled out causes come last and carry no fix to try
    assert causes.index(ruled[0]) > causes.index(live(causes)[-1])
    assert all("; fix: " not in c for c in ruled)


def test_every_live_cause_has_its_own_fix() -> None:
    causes = acceptance_causes(ctx(), healthy_earlier(), acceptance_data([0.5, 0.3], 0.05), 15)
    fixes = {c.rpartition("; fix: ")[2] for c in live(causes)}
    assert all("; fix: " in c for c in live(causes))
    assert len(fixes) == len(live(causes))  # no shared catch-all line
    mask = next(c for c in live(causes) if c.split()[1] == "mask_token_id")
    assert "the published config of the weights' revision" in mask.rpartition("; fix: ")[2]


def test_every_cause_fix_is_a_command_the_clis_own_parser_takes() -> None:
    """Each live cause's fix, in the shapes stage e ranks (near zero, low, a cliff), pasted
    as printed: real commands (target, port, model config beside the drafter), no MODEL,
    PATH, REPO@REV; the words after ``#`` are a shell comment."""
    from tests.fixtures.fix_lines import parse

    seen: set[str] = set()
    for rates, rate in (([0.5, 0.3], 0.05), ([0.02, 0.01], 0.01), ([0.9, 0.05], 0.3)):
        causes = acceptance_causes(ctx(), healthy_earlier(), acceptance_data(rates, rate), 15)
        for cause in live(causes):
            fix = cause.rpartition("; fix: ")[2]
            parse(fix)
            seen.add(fix.split("  # ")[0])
    assert len(seen) >= 4, seen


def test_weights_that_do_not_fit_come_first_with_the_fields_that_disagree() -> None:
    weights = {
        "checked": True,
        "ok": False,
        "mismatches": ["num_hidden_layers: config 5, weights 4"],
        "detail": "",
    }
    a = StageResult("a", "file on disk", FAILED, "the weights do not fit",
                    data={"status": "present", "weights": weights})  # fmt: skip
    earlier = healthy_earlier(a=a)
    context = ctx()
    causes = acceptance_causes(context, earlier, acceptance_data([0.3, 0.1], 0.03), 15)
    first = live(causes)[0]
    assert first.startswith("1. the weights do not fit the config or the target")
    assert "num_hidden_layers: config 5, weights 4" in first
    assert "ONE revision" in first.rpartition("; fix: ")[2]
    typed = diagnose(context, earlier, verdict_of(acceptance_data([0.3, 0.1], 0.03)), 15)
    assert first_fix(typed.causes) == first.rpartition("; fix: ")[2]


def test_without_a_weights_check_the_line_says_it_was_not_checked() -> None:
    causes = acceptance_causes(ctx(), healthy_earlier(), acceptance_data([0.3, 0.1], 0.03), 15)
    weights = next(c for c in causes if "the weights do not fit" in c)
    assert "not checked: no safetensors header check in this run" in weights
    ok = {"checked": True, "ok": True, "mismatches": [], "detail": ""}
    a = StageResult("a", "file on disk", PASSED, "ok", data={"status": "present", "weights": ok})
    causes = acceptance_causes(ctx(), healthy_earlier(a=a), acceptance_data([0.3], 0.03), 15)
    assert "ruled out: stage a passed (the safetensors headers fit the config)" in "\n".join(causes)


def test_a_cliff_puts_the_sliding_window_causes_first() -> None:
    data = acceptance_data([0.9, 0.8] + [0.0] * 13, 0.11)
    causes = acceptance_causes(ctx(), healthy_earlier(), data, 15)
    assert "cliff after position 1" in causes[0]
    # b passed: the loader is ruled out; vLLM was not importable: its window handling leads.
    assert live(causes)[0].startswith("1. vLLM runs the draft's sliding-window layers as full")
    assert "not measured: vLLM not resolved by the probe's python" in live(causes)[0]
    loader = StageResult(
        "b", "loader", FAILED, "1 problem(s)",
        data={"probe": {"transformers": "5", "effective": {"config": {}}},
              "loader_problems": ["sliding_window: null → 2048"], "vllm_problems": []},
    )  # fmt: skip
    causes = acceptance_causes(ctx(), healthy_earlier(b=loader), data, 15)
    assert live(causes)[0].startswith("1. the target's loader normalises critical fields")
    assert "stage b: sliding_window: null → 2048" in live(causes)[0]


def test_too_many_speculative_tokens_is_found_first() -> None:
    c = StageResult("c", "running server", FAILED, "num_speculative_tokens 20 > block_size - 1",
                    data={"port": 8011})  # fmt: skip
    causes = acceptance_causes(ctx(), healthy_earlier(c=c), acceptance_data([0.0] * 20, 0.0), 20)
    first = live(causes)[0]
    assert first.startswith("1. too many speculative tokens (num_speculative_tokens 20")
    assert first.endswith("--port 8011 --num-speculative-tokens 15 --restart")


def test_a_reference_rules_out_the_prompts_and_names_a_vllm_upgrade() -> None:
    reference = {
        "mean_acceptance_length": 3.1,
        "acceptance_rate": 0.2,
        "per_position": [0.8, 0.6],
        "recorded_at": "2026-12-01T10:00:00Z",
        "vllm_version": "0.31.0",
    }
    data = acceptance_data([0.4, 0.2], 0.04, mean_acceptance_length=1.6, reference=reference,
                           regression=0.48)  # fmt: skip
    causes = acceptance_causes(ctx(), healthy_earlier(), data, 15)
    assert (
        "mean acceptance length 1.60 vs 3.10 in the reference of 2026-12-01T10:00:00Z, 48% "
        in (causes[0])
    )
    first = live(causes)[0]
    assert first.startswith("1. the vLLM upgrade since the reference")
    assert "vLLM 0.31.0 then, 0.32.0 now" in first
    assert any(
        c.startswith("ruled out: the reference ran the same fixed smoke prompts") for c in causes
    )
    # the same vLLM as the reference: the upgrade is ruled out
    data["reference"] = {**reference, "vllm_version": "0.32.0"}
    causes = acceptance_causes(ctx(), healthy_earlier(), data, 15)
    assert any(c.startswith("ruled out: the same vLLM 0.32.0 as the reference") for c in causes)


def test_no_reference_is_said_and_the_prompt_distribution_stays_open() -> None:
    causes = acceptance_causes(ctx(), healthy_earlier(), acceptance_data([0.6, 0.3], 0.06), 15)
    assert "no acceptance reference for this drafter on this host yet" in causes[0]
    assert any("the prompt distribution" in c for c in live(causes))


# -- the stand-in's curve control (what the real runs use) -------------------------------------


def test_the_standins_per_position_control_gives_that_curve_and_refuses_impossible_ones() -> None:
    from testbed.vllm_standin import Counters, parse_control

    control = parse_control({"per_position_acceptance": [0.9, 0.8, 0, 0]})
    assert control.per_position_acceptance == (0.9, 0.8, 0.0, 0.0)
    counters = Counters(15)
    for _ in range(100):
        counters.draft(control.per_position_acceptance)
    assert counters.total.per_pos == [90, 80] + [0] * 13
    for impossible in ([0.5, 0.9], [1.5], [], "0.9", [True]):
        with pytest.raises(ValueError, match="per_position_acceptance"):
            parse_control({"per_position_acceptance": impossible})
