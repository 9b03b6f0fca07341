"""A speculators-layout DFlash drafter at runtime, on a real sshd host with the vLLM STAND-IN (a
test double, named so everywhere): served as ``vllm serve <drafter dir>`` (vLLM reads its
speculators_config itself: no --speculative-config) and through launch's --speculative-config.
Stage b runs the real target-side probe with the host's python; stage c reads the server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.vllm_standin_install import CONTROL_ENV
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, TARGET_DIR, put
from tests.fixtures.standin import Bed, stages, statuses

pytestmark = [pytest.mark.integration, pytest.mark.root]

SPEC_TOKENS = "speculators_config.proposal_methods[0].speculative_tokens"


def speculators_config(n: int = 7, aux: list[int] | None = None) -> bytes:
    doc: dict[str, Any] = samples.load_json(samples.SPECULATORS_DRAFTER)
    doc["speculators_config"]["verifier"]["name_or_path"] = TARGET_DIR  # local: never the Hub
    doc["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = n
    if aux is not None:
        doc["aux_hidden_state_layer_ids"] = aux
    return (json.dumps(doc, indent=2) + "\n").encode()


def serve_by_hand(bed: Bed) -> None:
    """``vllm serve DRAFTER_DIR`` as an operator starts a speculators drafter (no launch)."""
    script = (
        # The drafter mixes sliding and full layers: vLLM needs its V2 runner.
        f'{CONTROL_ENV}="$3" VLLM_USE_V2_MODEL_RUNNER=1 setsid "$1" serve "$2" '
        '--host 127.0.0.1 --port "$4" > /root/by-hand.log 2>&1 < /dev/null &'
    )
    argv = ["sh", "-c", script, "sh", bed.standin.vllm, DRAFTER_DIR, CONTROL, str(bed.port)]
    bed.host.exec(argv, check=True)
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


def test_a_speculators_drafter_served_from_its_directory_passes_b_and_c(bed: Bed) -> None:
    good = speculators_config()
    put(bed.host, f"{DRAFTER_DIR}/config.json", good)
    serve_by_hand(bed)
    code, report = bed.check_json("--python", bed.standin.python, authority=good)
    assert code == 0, json.dumps(report, indent=1)[:4000]
    assert statuses(report) == "a:passed b:passed c:passed d:passed e:passed"
    b, c = stages(report)["b"], stages(report)["c"]
    assert any("speculators layout" in line for line in b["evidence"]), b["evidence"]
    assert b["warnings"] == []  # aux [2, 17, 32, 47, 62] = the default spacing + 1
    spec = c["data"]["spec"]
    assert (spec["method"], spec["model"], spec["num_speculative_tokens"]) == (
        "dflash",
        DRAFTER_DIR,
        7,
    )
    assert spec["source"].startswith("speculators_config of")
    assert "--speculative-config" not in " ".join(c["data"]["argv"])


def test_stage_c_fails_when_the_served_n_disagrees_with_the_authoritative_one(bed: Bed) -> None:
    # The server read an older file (N 5) and still serves it; the authoritative config says 7.
    put(bed.host, f"{DRAFTER_DIR}/config.json", speculators_config(n=5))
    serve_by_hand(bed)
    code, report = bed.check_json("--python", bed.standin.python, authority=speculators_config())
    assert code == ExitCode.RUNTIME_CHECK_FAILED
    by = stages(report)
    assert by["a"]["status"] == "failed"
    assert f"{SPEC_TOKENS}: 5 → 7" in by["a"]["evidence"]
    assert by["c"]["status"] == "failed"
    assert "N = 5" in by["c"]["summary"] and "says 7" in by["c"]["summary"]


def test_a_launched_speculators_drafter_passes_and_off_default_taps_warn_in_b(bed: Bed) -> None:
    # launch's own form (--speculative-config naming the drafter): vLLM converts it the same way.
    # N 5 in the file: launch's default, as `vllm serve <drafter dir>` would take it.
    off = speculators_config(n=5, aux=[1, 16, 31, 46, 61])  # the reference ids without the + 1
    put(bed.host, f"{DRAFTER_DIR}/config.json", off)
    bed.launch(authority=off)
    code, report = bed.check_json(authority=off)
    assert code == 0, json.dumps(report, indent=1)[:4000]
    by = stages(report)
    assert statuses(report) == "a:passed b:passed c:passed d:passed e:passed"
    assert "aux layers [1, 16, 31, 46, 61] from speculative config" in "\n".join(
        by["c"]["evidence"]
    )
    (warning,) = by["b"]["warnings"]
    assert "expected [2, 17, 32, 47, 62]" in warning
    assert by["c"]["data"]["spec"]["num_speculative_tokens"] == 5
