"""The version matrix of the real-vLLM tier (``make test-vllm``): stage b's probe and launch's
pre-flight against real releases beside 0.32.0, built by testbed.vllm_matrix (route A, their
Python parts: the config resolution both use; neither release serves on this machine)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.runtime import remote_probe
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
