"""What a failing runtime-check or doctor puts first (issue 31, item 8), on one real sshd host
with the vLLM STAND-IN (a test double): with no server the report leads with stage c's "no vLLM
server listens", not stage b's guess at a python; stage e lists only causes that fit the drafter
at hand, in its own values; a failing check is short (the failing stage, its open causes, each
with its fix) and -v shows the whole report, ruled-out causes included."""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE
from tests.fixtures.standin import Bed

pytestmark = [pytest.mark.integration, pytest.mark.root]

# The reference drafter with no sliding-window layer (as the Qwen3-8B DFlash drafters are): no
# mixed layout, so neither the V1/V2 runner choice nor a lost window can lower its acceptance.
ALL_FULL = (
    json.dumps(
        {
            **json.loads(REFERENCE),
            "layer_types": ["full_attention"] * len(json.loads(REFERENCE)["layer_types"]),
            "use_sliding_window": False,
            "sliding_window": None,
        },
        indent=2,
    )
    + "\n"
).encode()


def _doctor(bed: Bed, *extra: str, authority: bytes = REFERENCE) -> tuple[int, str]:
    proc = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(authority),
        "--port", str(bed.port), *bed.ssh(), *extra,
    )  # fmt: skip
    return proc.returncode, proc.stdout


def test_no_server_leads_with_stage_c_single_and_fleet(bed: Bed) -> None:
    single = bed.check(verbose=False)
    assert single.returncode == ExitCode.RUNTIME_CHECK_FAILED, single.stdout + single.stderr
    last = single.stdout.splitlines()[-2]  # the hint line follows the verdict
    assert last.startswith("runtime-check FAILED at stage c (running server)"), single.stdout
    assert f"c  running server: FAILED  no vLLM server listens on port {bed.port}" in single.stdout
    assert "b  loader" in single.stdout and ": FAILED" not in single.stdout.split("\nb  ")[1][:90]

    inventory = bed.tmp / "fleet.yaml"
    inventory.write_text(
        f"defaults:\n  path: {DRAFTER_DIR}\n  drafter: {{from: {bed.authority()}}}\n"
        f"hosts:\n  - {bed.host.alias}\n"
    )
    fleet = bed.cli.run(
        "runtime-check", "-i", str(inventory), "--port", str(bed.port), *bed.ssh(), "--json"
    )
    assert fleet.returncode == ExitCode.RUNTIME_CHECK_FAILED, fleet.stdout + fleet.stderr
    (row,) = json.loads(fleet.stdout)["hosts"]
    assert row["detail"].startswith(f"c: no vLLM server listens on port {bed.port}"), row
    assert "give --python" not in row["detail"]


def test_a_failing_check_is_short_and_verbose_shows_the_ruled_out(bed: Bed) -> None:
    bed.launch()
    bed.control(acceptance=0.011)
    short = bed.check(verbose=False)
    assert short.returncode == ExitCode.ACCEPTANCE_LOW, short.stdout + short.stderr
    out = short.stdout
    assert "ruled out: " not in out and "config.json: sha256" not in out  # no passed evidence
    assert "e  acceptance: FAILED" in out and "likely causes, in the order to check them:" in out
    assert "1. " in out and "; fix: " in out  # the open causes, each with its fix
    assert out.rstrip().endswith("(-v: every stage's evidence and the causes the stages ruled out)")
    assert len(out.splitlines()) <= 20, out
    # The mixed reference drafter: the runner cause fits it; the mask cause in its own value.
    assert "the wrong vLLM model runner" in out
    assert "mask_token_id 248070 is not the token" in out and "248064" not in out

    verbose = bed.check("--verbose", verbose=False)
    assert verbose.returncode == ExitCode.ACCEPTANCE_LOW
    assert "ruled out: stage a passed (" in verbose.stdout
    assert "config.json: sha256" in verbose.stdout
    assert "(-v:" not in verbose.stdout

    code, doctor = _doctor(bed)
    assert code == ExitCode.ACCEPTANCE_LOW, doctor
    assert "ruled out: " not in doctor and "<-- first broken link" in doctor
    assert "fix: " in doctor and "1. " in doctor
    assert len(doctor.splitlines()) < len(_doctor(bed, "-v")[1].splitlines())
    assert "ruled out: stage a passed (" in _doctor(bed, "-v")[1]


def test_causes_fit_a_drafter_with_no_mixed_layers(bed: Bed) -> None:
    from tests.fixtures.runtime import put

    put(bed.host, f"{DRAFTER_DIR}/config.json", ALL_FULL)
    bed.launch(authority=ALL_FULL)
    bed.control(acceptance=0.011)
    for out in (bed.check(authority=ALL_FULL).stdout, _doctor(bed, authority=ALL_FULL)[1]):
        assert "likely causes, in the order to check them:" in out, out
        assert "model runner" not in out and "V2" not in out, out
        assert "sliding-window layers" not in out, out
        assert "mask_token_id 248070 is not the token" in out and "248064" not in out, out
