"""runtime-check for real: the CLI in a subprocess against sshd hosts in namespaces, with the
vLLM STAND-IN (testbed.vllm_standin, a test double named so everywhere)
installed as ``vllm`` there and started by ``launch``. The stand-in loads the drafter with real
transformers and applies vLLM's DFlash rules; its control file sets acceptance, failing
completions and other traffic. Stage b runs the real target-side probe with the host's python.
"""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from testbed.vllm_standin_install import (
    CONTROL_ENV,
)
from tests.fixtures.runtime import (
    CONTROL,
    DRAFTER_DIR,
    INCIDENT,
    NO_SWA,
    REFERENCE,
    TARGET_DIR,
    put,
)
from tests.fixtures.standin import Bed, ContainerBed, stages, statuses

pytestmark = [pytest.mark.integration, pytest.mark.root]

# --------------------------------------------------------------------------------------------


def test_a_good_launch_passes_every_stage_with_its_evidence(bed: Bed) -> None:
    bed.launch()
    proc = bed.check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "a  file on disk: PASSED" in out
    assert "b  loader-effective config and vLLM's resolution on the target: PASSED" in out
    assert "c  running server: PASSED" in out
    assert "aux layers [2, 17, 32, 47, 62] from speculative config = target_layer_ids + 1" in out
    assert "engine v0.32.0+dflash-standin: speculative method dflash" in out
    assert "d  a real completion: PASSED" in out
    assert "e  acceptance: PASSED  acceptance 60.0%" in out
    assert "runtime-check passed" in out

    code, report = bed.check_json()
    assert (
        code == 0
        and report["ok"]
        and statuses(report) == ("a:passed b:passed c:passed d:passed e:passed")
    )
    e = stages(report)["e"]["data"]
    assert e["acceptance_rate"] == pytest.approx(0.6, abs=0.01)
    assert e["mean_acceptance_length"] > 1.0 and len(e["per_position"]) == 15
    assert e["foreign_drafts"] == 0
    c = stages(report)["c"]["data"]
    assert c["spec"] == {"method": "dflash", "model": DRAFTER_DIR, "num_speculative_tokens": 15}

    # Frequent alerting can leave the loader probe (seconds per host) out: b says it was skipped.
    code, quick = bed.check_json("--skip-loader")
    assert code == 0 and statuses(quick) == "a:passed b:skipped c:passed d:passed e:passed"
    assert "--skip-loader" in stages(quick)["b"]["summary"]


def test_the_incidents_wrong_file_fails_on_disk_at_the_server_and_in_acceptance(bed: Bed) -> None:
    # The incident: the file on disk holds guessed values and the server runs with them.
    put(bed.host, f"{DRAFTER_DIR}/config.json", INCIDENT)
    bed.launch(authority=INCIDENT)
    bed.control(acceptance=0.011)
    code, report = bed.check_json()  # against the real authoritative config
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    by = stages(report)
    assert by["a"]["status"] == "failed"
    assert "dflash_config.mask_token_id: 248064 → 248070" in by["a"]["evidence"]
    assert by["a"]["fix"].startswith(f"dflash-provision push {bed.host.alias}:{DRAFTER_DIR} --from")
    # The server's log shows the wrong ids + 1, not the authoritative ones.
    assert by["c"]["status"] == "failed"
    assert "aux layers [2, 18, 34, 50, 64]" in by["c"]["summary"]
    assert "expected target_layer_ids + 1 = [2, 17, 32, 47, 62]" in by["c"]["summary"]
    assert by["e"]["status"] == "failed" and "acceptance 1.1%" in by["e"]["summary"]
    # the file on disk was found wrong: its cause leads, with the push that fixes it
    assert by["e"]["causes"][1].startswith("1. the file on disk is not the authoritative config")
    assert "dflash-provision push" in by["e"]["causes"][1].rpartition("; fix: ")[2]


def test_use_sliding_window_false_is_caught_by_the_targets_own_loader(bed: Bed) -> None:
    # The file IS the authoritative one (stage a passes), but transformers on the target nulls
    # sliding_window, so vLLM cannot even start with it.
    put(bed.host, f"{DRAFTER_DIR}/config.json", NO_SWA)
    code, report = bed.check_json("--python", bed.standin.python, authority=NO_SWA)
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    by = stages(report)
    assert by["a"]["status"] == "passed"
    assert by["b"]["status"] == "failed"
    loader = "\n".join(by["b"]["data"]["loader_problems"])
    assert "sliding_window: null → 2048" in loader
    assert by["c"]["status"] == "failed" and "no vLLM server listens" in by["c"]["summary"]
    assert (by["d"]["status"], by["e"]["status"]) == ("skipped", "skipped")


def test_a_server_running_another_drafter_path_fails_stage_c(bed: Bed) -> None:
    put(bed.host, "/root/models/other-drafter/config.json", REFERENCE)
    bed.launch(drafter="/root/models/other-drafter")
    code, report = bed.check_json()
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    c = stages(report)["c"]
    assert c["status"] == "failed"
    assert f"runs drafter '/root/models/other-drafter', not '{DRAFTER_DIR}'" in c["summary"]
    assert "--restart" in c["fix"]
    assert stages(report)["a"]["status"] == "passed"  # the file is right; the server is not


def test_too_many_speculative_tokens_fails_stage_c_and_collapses_acceptance(bed: Bed) -> None:
    bed.launch("--num-speculative-tokens", "20", "--force")
    proc = bed.check()
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout + proc.stderr
    assert "num_speculative_tokens 20 > block_size - 1 = 15" in proc.stdout
    assert "e  acceptance: FAILED  acceptance 0.0% is below --min-acceptance 10.0%" in proc.stdout
    assert "1. too many speculative tokens (num_speculative_tokens 20, at most block_size - 1)" in (
        proc.stdout
    )
    assert "--num-speculative-tokens 15 --restart" in proc.stdout


def test_a_healthy_server_whose_first_completion_fails_fails_stage_d(bed: Bed) -> None:
    bed.launch()
    bed.control(fail_completions=True)
    code, report = bed.check_json()
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    by = stages(report)
    assert [by[k]["status"] for k in "abc"] == ["passed"] * 3
    d = by["d"]
    assert d["status"] == "failed" and "HTTP 500" in d["summary"]
    assert "expects 256 concatenated aux hidden features but received 128" in d["summary"]
    assert any(line.startswith("log: ") and "256" in line for line in d["evidence"])
    assert by["e"]["status"] == "skipped"


def test_acceptance_of_1_1_percent_fails_only_the_gate_with_causes_by_evidence(bed: Bed) -> None:
    bed.launch()
    bed.control(acceptance=0.011)
    proc = bed.check()
    assert proc.returncode == ExitCode.ACCEPTANCE_LOW, proc.stdout + proc.stderr
    out = proc.stdout
    assert "e  acceptance: FAILED  acceptance 1.1% is below --min-acceptance 10.0%" in out
    causes = [line.strip() for line in out.splitlines() if line.startswith("       ")]
    live = [c for c in causes if c[:1].isdigit()]
    # stages a-c passed: what they cover is ruled out, the near-zero curve's causes come first
    assert live[0].startswith("1. other weights of the same shapes (a retrain")
    assert "ruled out: stage a passed (" in out and "ruled out: stage b passed (" in out
    assert bed.check("--min-acceptance", "0.01").returncode == 0


def test_other_traffic_on_the_server_is_flagged(bed: Bed) -> None:
    bed.launch()
    bed.control(extra_traffic=500)
    # The short prompts' window (the long prompt past the window cannot tell with such traffic:
    # tests/test_long_context_standin.py).
    code, report = bed.check_json("--no-long-context")
    assert code == 0
    e = stages(report)["e"]
    # 500 drafts by "other clients" between the two readings; the smoke prompts' 96 tokens can
    # explain at most 96 drafts, so at least 404 are someone else's.
    assert e["data"]["drafts"] >= 500
    assert e["data"]["foreign_drafts"] >= 500 - 96
    assert any("other traffic mixed into the counters" in w for w in e["warnings"])


def test_runtime_check_without_a_server_says_so_and_how_to_start_one(bed: Bed) -> None:
    proc = bed.check("--python", bed.standin.python)
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED
    assert f"no vLLM server listens on port {bed.port}" in proc.stdout
    fix = next(line for line in proc.stdout.splitlines() if "fix: " in line).split("fix: ", 1)[1]
    # status shows what launch recorded for the port (no MODEL to fill in); launch is named
    assert fix.startswith(f"dflash-provision status {bed.host.alias}:") and "launch" in fix, fix


# --------------------------------------------------------------------------------------------
# inside an LXC busybox container behind the SSH host (no route to it: requests go through the
# container's python, the probe runs there too)


@pytest.mark.lxc
def test_runtime_check_inside_an_lxc_container_behind_ssh_passes_every_stage(
    container_bed: ContainerBed,
) -> None:
    container_bed.launch()
    proc = container_bed.run("runtime-check", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert statuses(report) == "a:passed b:passed c:passed d:passed e:passed"
    probe = stages(report)["b"]["data"]["probe"]
    assert probe["effective"]["config"]["layer_types"][0] == "sliding_attention"
    assert stages(report)["e"]["data"]["acceptance_rate"] == pytest.approx(0.6, abs=0.01)


def test_a_server_the_tool_did_not_start_is_found_by_its_port_and_checked(bed: Bed) -> None:
    # Started by hand, as an operator would: no pidfile, no launch record, no known log.
    spec = json.dumps({"method": "dflash", "model": DRAFTER_DIR, "num_speculative_tokens": 7})
    script = (
        # The reference drafter mixes sliding and full layers: vLLM needs its V2 runner.
        f'{CONTROL_ENV}="$4" VLLM_USE_V2_MODEL_RUNNER=1 setsid "$1" serve "$2" '
        '--speculative-config "$3" '
        '--host 127.0.0.1 --port "$5" > /root/by-hand.log 2>&1 < /dev/null &'
    )
    bed.host.exec(
        ["sh", "-c", script, "sh", bed.standin.vllm, TARGET_DIR, spec, CONTROL, str(bed.port)],
        check=True,
    )
    wait = (
        "import sys, time, urllib.request\n"
        "for _ in range(240):\n"
        "    try:\n"
        "        urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/health', timeout=1)\n"
        "        sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.5)\n"
        "sys.exit(open('/root/by-hand.log').read()[-2000:])\n"
    )
    ready = bed.host.exec(["/usr/bin/python3", "-c", wait, str(bed.port)], timeout=280)
    assert ready.returncode == 0, ready.stderr

    code, report = bed.check_json("--python", bed.standin.python)
    assert code == 0, json.dumps(report, indent=1)[:3000]
    c = stages(report)["c"]
    assert c["data"]["spec"]["num_speculative_tokens"] == 7
    assert "not started by dflash-provision launch" in c["warnings"][0]
    assert stages(report)["e"]["data"]["acceptance_rate"] == pytest.approx(0.6, abs=0.01)


def test_launch_runs_runtime_check_with_its_own_authority_and_connection(bed: Bed) -> None:
    proc = bed.launch(check=True)
    assert "started: vLLM 0.32.0+dflash-standin ready" in proc.stdout
    assert "e  acceptance: PASSED" in proc.stdout
    assert "runtime-check passed" in proc.stdout
