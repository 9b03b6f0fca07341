"""What the server does not show is "cannot tell", naming why; acceptance counts only when it is
real (issue 29 items 3 and 4): the CLI in a subprocess against an sshd host with the vLLM
STAND-IN (testbed.vllm_standin, a test double copying vLLM 0.32's behaviour for each mode)."""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.runtime import DRAFTER_DIR
from tests.fixtures.standin import Bed, stages, statuses
from tests.test_server_read_standin import hand_start

pytestmark = [pytest.mark.integration, pytest.mark.root]


def test_a_server_without_stats_makes_acceptance_cannot_tell_not_not_speculating(
    bed: Bed,
) -> None:
    bed.launch("--", "--disable-log-stats")
    code, report = bed.check_json()
    e = stages(report)["e"]
    assert code == ExitCode.INCONCLUSIVE, json.dumps(report)[:2000]
    assert e["status"] == "inconclusive"
    assert "cannot tell whether the server speculates" in e["summary"]
    assert "started with --disable-log-stats" in e["summary"]
    assert report["acceptance_rate"] is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ("VLLM_LOGGING_LEVEL=WARNING", "VLLM_LOGGING_LEVEL set in its environment"),
        ("VLLM_LOGGING_PREFIX=[gpu1] ", "VLLM_LOGGING_PREFIX set in its environment"),
    ],
    ids=["level-above-info", "prefix"],
)
def test_a_log_without_readable_start_up_records_makes_stage_c_cannot_tell(
    bed: Bed, env: str, named: str
) -> None:
    bed.launch("--env", env)
    code, report = bed.check_json()
    c = stages(report)["c"]
    assert code == ExitCode.INCONCLUSIVE, json.dumps(report)[:2000]
    assert c["status"] == "inconclusive"
    assert c["summary"].startswith("cannot tell which auxiliary layers")
    assert named in c["summary"]
    assert statuses(report) == "a:passed b:passed c:inconclusive d:passed e:passed"


def test_a_log_level_given_on_the_command_line_is_named(bed: Bed) -> None:
    bed.launch("--", "--log-level", "ERROR")
    code, report = bed.check_json()
    c = stages(report)["c"]
    assert code == ExitCode.INCONCLUSIVE and c["status"] == "inconclusive"
    assert "started with --log-level ERROR" in c["summary"]


def test_the_json_formatters_records_are_read_as_vllms_own(bed: Bed) -> None:
    bed.launch("--", "--logging-config.formatter", "json")
    target = f"{bed.host.alias}:{DRAFTER_DIR}"
    log = bed.cli.run("logs", target, "--port", str(bed.port), *bed.ssh())
    assert '"levelname": "INFO"' in log.stdout  # the stand-in logs JSON records
    code, report = bed.check_json()
    c = stages(report)["c"]
    assert code == 0, json.dumps(report)[:2000]
    assert (
        "aux layers [2, 17, 32, 47, 62] from speculative config = target_layer_ids + 1"
        in (c["evidence"])
    )
    assert c["data"]["log"]["json_records"] > 0


def test_a_speculative_config_without_method_is_judged_as_vllm_infers_it(bed: Bed) -> None:
    spec = json.dumps({"model": DRAFTER_DIR, "num_speculative_tokens": 15})
    hand_start(bed, "--speculative-config", spec)
    code, report = bed.check_json("--python", bed.standin.python)
    c = stages(report)["c"]
    assert code == 0, json.dumps(report)[:3000]
    assert (
        "no method in the speculative config: vLLM infers 'dflash' (the drafter's path "
        f"{DRAFTER_DIR!r} contains 'dflash')" in c["evidence"]
    )


def test_fabricated_acceptance_fails_stage_c_naming_the_setting(bed: Bed) -> None:
    # A server told to accept drafts at a synthetic rate: its counters say 2.5 tokens per step
    # whatever the drafter proposes; a gate on them passes nothing.
    spec = {
        "method": "dflash",
        "model": DRAFTER_DIR,
        "num_speculative_tokens": 15,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
    }
    hand_start(bed, "--speculative-config", json.dumps(spec))
    code, report = bed.check_json("--python", bed.standin.python)
    by = stages(report)
    assert code == ExitCode.RUNTIME_CHECK_FAILED, json.dumps(report)[:3000]
    assert by["c"]["status"] == "failed"
    assert any("rejection_sample_method 'synthetic' fabricates" in p for p in by["c"]["evidence"])
    assert by["e"]["status"] == "inconclusive"
    assert "the acceptance figures are no evidence" in by["e"]["summary"]
    assert report["acceptance_rate"] is None
