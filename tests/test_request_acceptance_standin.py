"""Stage e judges the check's own requests when vLLM returns their figures
(``--per-request-spec-decode-metrics``, vLLM 0.29+), the server's counters otherwise, and says
which; an acceptance reference of another vLLM version is shown but not gated on. The CLI in a
subprocess against a real sshd host running the vLLM STAND-IN (a test double), whose control
file adds other clients' traffic that drafts badly and whose ``VLLM_STANDIN_VERSION`` sets what
its ``GET /version`` answers."""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.standin import Bed, stages

pytestmark = [pytest.mark.integration, pytest.mark.root]

PER_REQUEST = ("--", "--per-request-spec-decode-metrics", "summary")


def test_own_figures_are_judged_when_other_clients_drag_the_counters_down(bed: Bed) -> None:
    # Another client's prompts draft badly (0 %) and run while the check runs: on the server's
    # counters a healthy drafter (60 %) looks broken.
    bed.launch()
    bed.control(acceptance=0.6, foreign_requests=20, foreign_acceptance=0.0)
    code, report = bed.check_json()
    e = stages(report)["e"]
    assert code == ExitCode.ACCEPTANCE_LOW, report
    assert e["data"]["source"] == "counters"
    assert "no per-request figures" in e["data"]["source_note"]
    assert e["data"]["foreign_requests"] == 20

    bed.launch("--restart", *PER_REQUEST)
    proc = bed.check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "figures from the check's own requests" in proc.stdout
    assert "acceptance 60.0%" in proc.stdout, proc.stdout
    code, report = bed.check_json()
    e = stages(report)["e"]
    assert code == 0, report
    assert e["data"]["source"] == "requests"
    assert "other traffic: 20 request(s) of other clients" in e["data"]["source_note"]
    assert e["data"]["acceptance_rate"] == pytest.approx(0.6, abs=0.02)
    assert e["data"]["own_requests"] == 3 and e["data"]["foreign_requests"] == 0
    assert not any("other traffic mixed into the counters" in w for w in e["warnings"])


def test_a_server_without_the_option_falls_back_to_the_counters_and_says_so(bed: Bed) -> None:
    bed.launch()
    proc = bed.check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "figures from the server's counters: the replies carry no per-request figures" in (
        proc.stdout
    )


def test_a_reference_of_another_vllm_version_is_shown_but_not_gated(bed: Bed) -> None:
    bed.launch("--env", "VLLM_STANDIN_VERSION=0.31.0")
    assert bed.check().returncode == 0  # records 0.31.0's reference (mean length 10.00)

    bed.launch("--restart", "--env", "VLLM_STANDIN_VERSION=0.32.0")
    bed.control(acceptance=0.4)  # 30 % lower mean acceptance length on the new release
    code, report = bed.check_json("--max-regression", "10%")
    e = stages(report)["e"]
    assert code == 0, report
    assert e["data"]["reference"]["vllm_version"] == "0.31.0"
    assert e["data"]["regression"] == pytest.approx(0.3, abs=0.01)
    mismatch = e["data"]["reference_mismatch"]
    assert "recorded on vLLM 0.31.0, this server runs vLLM 0.32.0" in mismatch
    assert "not gated" in mismatch and mismatch in e["warnings"]
    # That pass was 0.32.0's first: it became this version's reference, which is gated on.
    history = bed.cli.run("history", "--op", "runtime-check", "--json")
    versions = [row["message"].rsplit("vLLM ", 1)[-1] for row in json.loads(history.stdout)]
    assert versions == ["0.32.0", "0.31.0"], versions
    bed.control(acceptance=0.2)
    gated = bed.check("--max-regression", "10%")
    assert gated.returncode == ExitCode.ACCEPTANCE_LOW, gated.stdout + gated.stderr
    assert "(vLLM 0.32.0)" in gated.stdout and "more than --max-regression 10.0%" in gated.stdout


def test_own_figures_still_tell_when_disable_log_stats_removed_every_metric(bed: Bed) -> None:
    # vLLM returns per-request figures independently of --disable-log-stats (its option's own
    # help, vllm/config/observability.py): where the counters cannot tell, the replies can.
    bed.launch(*PER_REQUEST, "--disable-log-stats")
    code, report = bed.check_json()
    e = stages(report)["e"]
    assert code == 0, report
    assert e["status"] == "passed" and e["data"]["source"] == "requests"
    assert e["data"]["acceptance_rate"] == pytest.approx(0.6, abs=0.02)
