"""The version matrix of the real-vLLM tier (``make test-vllm``): stage b's probe and launch's
pre-flight against real releases beside 0.32.0, built by testbed.vllm_matrix (route A, their
Python parts: the config resolution both use; 0.20.1, 0.24.0 and 0.34.0 cannot serve on this
machine; 0.28.0's ``vllm serve`` runs here up to its own refusal of a mixed drafter, for
launch's failure report)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.vllm import probe as remote_probe
from testbed import tiny_models, vllm_matrix
from tests.fixtures.cli import run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tiny_models.TinyModels:
    return tiny_models.build_tiny_models(tmp_path_factory.mktemp("tiny"))


def release(version: str) -> vllm_matrix.Release:
    chosen = vllm_matrix.RELEASES[version]
    vllm_matrix.ensure_release(chosen)
    return chosen


def test_stage_b_fails_the_mixed_drafter_on_0_24_naming_the_incidents_bug(
    models: tiny_models.TinyModels, tmp_path: Path
) -> None:
    env = release("0.24.0").env
    drafter = models.mixed
    done = run_cli(
        "runtime-check", str(drafter), "--from", str(drafter / "config.json"),
        "--python", str(env.python), "--model", str(models.target), "--port", "18997", "--json",
        "--command-timeout", "300",
        cwd=tmp_path, home=tmp_path / "home", timeout=600,
    )  # fmt: skip
    b = next(s for s in json.loads(done.stdout)["stages"] if s["stage"] == "b")
    assert b["status"] == "failed", b
    assert "no per-layer DFlash sliding attention" in b["summary"]
    assert "the incident's own bug" in b["summary"]
    assert "0.25 or later" in (b["fix"] or "")


def test_launch_refuses_a_key_0_34_rejects_before_anything_starts(
    models: tiny_models.TinyModels, tmp_path: Path
) -> None:
    env = release("0.34.0").env
    drafter = models.agreeing
    done = run_cli(
        "launch", str(drafter), "--from", str(drafter / "config.json"),
        "--model", str(models.target), "--vllm", str(env.vllm), "--port", "18996", "--no-check",
        "--speculative-config", '{"disable_padded_drafter_batch": true}',
        cwd=tmp_path, home=tmp_path / "home", timeout=600,
    )  # fmt: skip
    assert done.returncode == ExitCode.VLLM_UNUSABLE, done.stdout + done.stderr
    assert "rejects the --speculative-config key(s) disable_padded_drafter_batch" in done.stderr


@pytest.mark.parametrize(
    ("version", "levels"),
    [("0.20.1", []), ("0.24.0", []), ("0.34.0", ["none", "summary", "detailed"])],
)
def test_the_probe_finds_per_request_spec_decode_metrics_only_where_the_release_has_them(
    version: str, levels: list[str]
) -> None:
    # What launch asks before it passes --per-request-spec-decode-metrics: the release's own
    # EngineArgs field (0.29+), not its version number. (0.32.0: tests/test_vllm_real.py.)
    env = release(version).env
    program = (
        "import importlib.util, json\n"
        f"spec = importlib.util.spec_from_file_location('probe', {str(remote_probe.__file__)!r})\n"
        "probe = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(probe)\n"
        "print(json.dumps(probe.per_request_metrics()))\n"
    )
    done = subprocess.run(
        [str(env.python), "-c", program],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"levels": levels, "error": None}


@pytest.mark.parametrize("version", ["0.20.1", "0.24.0", "0.34.0"])
def test_stage_b_passes_a_speculators_drafter_with_a_local_verifier_as_that_vllm_converts_it(
    models: tiny_models.TinyModels, tmp_path: Path, version: str
) -> None:
    # 0.34.0: its maybe_override_with_speculators refuses a verifier that is not a Hub repo
    # ("Speculators verifier must name a remote model repository"), while the server resolves
    # the drafter fine: the probe converts it with SpeculatorsConfig instead. 0.24.0: its
    # conversion writes no causal nor sample_from_anchor (newer releases do): stage b compares
    # them as that release reads them, not as missing. 0.20.1: its conversion also writes
    # target_layer_ids without the - 1, beside the eagle ids its runner taps.
    from tests.test_vllm_real import _speculators_layout

    env = release(version).env
    reference = json.loads((models.agreeing / "config.json").read_text())
    doc = _speculators_layout(reference, str(models.target))
    doc["sliding_window_non_causal"] = True  # the speculators default: non-causal
    drafter = tmp_path / "drafter-speculators"
    shutil.copytree(models.agreeing, drafter)
    (drafter / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    done = run_cli(
        "runtime-check", str(drafter), "--from", str(drafter / "config.json"),
        "--python", str(env.python), "--port", "18995", "--json", "--command-timeout", "300",
        cwd=tmp_path, home=tmp_path / "home", timeout=600,
    )  # fmt: skip
    b = next(s for s in json.loads(done.stdout)["stages"] if s["stage"] == "b")
    assert b["status"] == "passed", b
    assert b["data"]["probe"]["effective"]["loader"] == "vllm"  # vLLM's own conversion


def test_a_launch_0_28_refuses_at_start_up_is_headed_by_vllms_own_reason(
    models: tiny_models.TinyModels, tmp_path: Path
) -> None:
    # A --vllm command pre-flight cannot see through (`env VLLM`: no python to ask), so the
    # layout rule starts the mixed drafter and vLLM 0.28.0 itself refuses it: the API server
    # dies on a pydantic ValidationError printed behind "(APIServer pid=N) ".
    env = release("0.28.0").env
    drafter = models.mixed
    done = run_cli(
        "launch", str(drafter), "--from", str(drafter / "config.json"),
        "--model", str(models.target), "--vllm", f"env {env.vllm}", "--python", "/usr/bin/python3",
        "--port", "18994", "--no-check", "--ready-timeout", "600",
        cwd=tmp_path, home=tmp_path / "home", timeout=900,
    )  # fmt: skip
    assert done.returncode == ExitCode.LAUNCH_FAILED, done.stdout + done.stderr
    headline = next(line for line in done.stdout.splitlines() if line.startswith("FAILED:"))
    assert headline.endswith(
        "exited during start-up on 127.0.0.1:18994 on local: ValidationError for VllmConfig: "
        "Model Runner V2 requires Triton."
    ), headline


def test_launch_pre_flight_on_0_28_refuses_the_mixed_drafter_naming_the_vllm_that_can(
    models: tiny_models.TinyModels, tmp_path: Path
) -> None:
    env = release("0.28.0").env
    drafter = models.mixed
    done = run_cli(
        "launch", str(drafter), "--from", str(drafter / "config.json"),
        "--model", str(models.target), "--vllm", str(env.vllm), "--port", "18993", "--no-check",
        cwd=tmp_path, home=tmp_path / "home", timeout=900,
    )  # fmt: skip
    assert done.returncode == ExitCode.VLLM_UNUSABLE, done.stdout + done.stderr
    assert "no model runner of vLLM 0.28.0" in done.stderr
    assert "V2 needs Triton" in done.stderr and "0.26 or later" in done.stderr
