"""Unit tests of what the server does not show (issue 29 items 3 and 4): JSON log records, a log
with no readable start-up record, the method vLLM infers, and sampling settings whose acceptance
figures are no evidence. The stand-in tests are in test_server_blind_spots_standin.py."""

from __future__ import annotations

import json
from typing import Any

from dflash_provision.target import parse_target
from dflash_provision.verify.stage_server import sampling_findings, stage_server
from dflash_provision.verify.stages import StageStatus
from dflash_provision.vllm import log as vllm_log
from dflash_provision.vllm.argv import inferred_method, logging_settings
from tests.test_server_read_units import AUX, DRAFTER, ENGINE, MARK, SERVE, Server, ctx


def json_record(message: str, level: str = "INFO", name: str = "vllm.v1.engine.core") -> str:
    """vLLM 0.32's JSON formatter (pythonjsonlogger, JSON_FORMAT's keys)."""
    record = {
        "asctime": "2026-12-05 09:00:00,000",
        "levelname": level,
        "name": name,
        "processName": "EngineCore_DP0",
        "process": 7,
        "message": message,
    }
    return json.dumps(record)


def _stage_c(argv: list[str], lines: list[str], env_names: list[str] | None = None) -> Any:
    c = ctx()
    c.server = Server(argv)
    if env_names is not None:
        c.server.record = type("Record", (), {"env_names": env_names, "model": None})()
    c.log = vllm_log.parse_startup("\n".join(lines) + "\n")
    return stage_server(c, 8000)


GOOD = {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}
ARGV = [*SERVE, "--speculative-config", json.dumps(GOOD)]
ENGINE_MESSAGE = ENGINE.split("] ", 1)[1]
AUX_MESSAGE = AUX.split("] ", 1)[1]


def test_json_records_are_vllms_own_and_a_clients_json_is_not() -> None:
    forged = ENGINE_MESSAGE.replace(DRAFTER, "/evil")
    lines = [
        MARK,
        json_record(forged, name="my_app"),  # not one of vLLM's loggers
        '{"levelname": "INFO", "message": "' + AUX_MESSAGE + '"}',  # no logger name
        json_record(ENGINE_MESSAGE),
        json_record(AUX_MESSAGE),
        json_record("Application startup complete.", name="uvicorn.error"),
        json_record(forged),  # after ready: requests were served by then
    ]
    facts = vllm_log.parse_startup("\n".join(lines) + "\n")
    assert facts.engine is not None and facts.engine.spec_model == DRAFTER
    assert facts.aux is not None and facts.aux.ids == (2, 17, 32, 47, 62)
    assert facts.ready is not None and facts.json_records == 2
    assert _stage_c(ARGV, lines).passed


def test_a_log_with_no_readable_info_record_is_cannot_tell_naming_the_setting() -> None:
    warning = "(APIServer pid=7) WARNING 12-02 05:00:00 [api.py:1] something"
    argv = [*ARGV, "--logging-config", json.dumps({"log_level": "WARNING"})]
    result = _stage_c(argv, [MARK, warning])
    assert result.status is StageStatus.INCONCLUSIVE
    assert 'started with --logging-config {"log_level": "WARNING"}' in result.summary
    # No setting known: the log's own shape is named.
    result = _stage_c(ARGV, [MARK, "[gpu1] " + ENGINE, "[gpu1] " + AUX])
    assert result.status is StageStatus.INCONCLUSIVE
    assert "none of its 3 log line(s) is a vLLM record" in result.summary
    result = _stage_c(ARGV, [MARK, "x"], env_names=["VLLM_CONFIGURE_LOGGING", "HF_HOME"])
    assert "VLLM_CONFIGURE_LOGGING set in its environment" in result.summary
    # A readable log that never names the aux layers is still a finding, not a blind spot.
    failed = _stage_c(ARGV, [MARK, ENGINE])
    assert failed.failed and "never says which auxiliary layers" in failed.summary


def test_logging_options_are_read_as_vllm_serve_takes_them() -> None:
    assert logging_settings([*SERVE, "--log-level", "WARNING"]) == ["--log-level WARNING"]
    assert logging_settings([*SERVE, "--logging-config.log_level=error"]) == [
        "--logging-config.log_level error"
    ]
    assert logging_settings([*SERVE, "--log_config_file", "/etc/l.json"]) == [
        "--log-config-file /etc/l.json"
    ]
    assert logging_settings([*SERVE, "--log-level", "DEBUG"]) == []
    assert logging_settings([*SERVE, "--logging-config.formatter", "json"]) == []  # read


def test_a_method_left_out_is_inferred_as_vllm_0_32_infers_it() -> None:
    assert inferred_method("/m/z-lab/Qwen3-8B-DFlash-b16", ["DFlashDraftModel"])[0] == "dflash"
    assert inferred_method("/m/EAGLE3-llama", [])[0] == "eagle3"
    assert inferred_method("/m/muse", ["MuseGlimmerAssistantModel"])[0] == "dflash"
    assert inferred_method("pkg.MyProposer", [])[0] == "custom_class"
    method, why = inferred_method("/m/drafter", ["DFlashDraftModel"])
    assert method == "draft_model" and "'dflash'" in why
    # A drafter whose path does not say dflash is run as a plain draft model: stage c fails.
    c = ctx()
    c.target = parse_target("gpu1:/m/drafter")
    spec = {"model": "/m/drafter", "num_speculative_tokens": 15}
    c.server = Server([*SERVE, "--speculative-config", json.dumps(spec)])
    result = stage_server(c, 8000)
    assert result.failed
    assert result.summary.startswith("speculative method 'draft_model'")
    assert any("vLLM infers 'draft_model'" in line for line in result.evidence)


def test_sampling_that_fabricates_or_loses_acceptance_is_named() -> None:
    synthetic, _ = sampling_findings({"rejection_sample_method": "synthetic"}, "0.32.0")
    assert synthetic and "'synthetic' fabricates acceptance" in synthetic[0]
    fly, _ = sampling_findings({"rejection_sample_method": "fly"}, "0.34.0")
    assert fly and "'fly' is lossy" in fly[0]
    assert sampling_findings({"rejection_sample_method": "block"}, "0.32.0") == ([], [])
    probabilistic = {"draft_sample_method": "probabilistic"}
    failed, _ = sampling_findings(probabilistic, "0.28.0")
    assert failed and "not lossless in vLLM 0.28.0" in failed[0]
    assert sampling_findings(probabilistic, "0.32.0") == ([], [])
    _, undecided = sampling_findings(probabilistic, "0.1.dev20904+g179dd0fa9")
    assert undecided and "cannot tell" in undecided[0]
    # Stage c fails on the command line's setting; the acceptance it measures is no evidence.
    spec = {**GOOD, "rejection_sample_method": "fly"}
    result = _stage_c([*SERVE, "--speculative-config", json.dumps(spec)], [MARK, ENGINE, AUX])
    assert result.failed and result.data["figures_not_evidence"].startswith(
        "rejection_sample_method 'fly'"
    )
