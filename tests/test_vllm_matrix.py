"""The version matrix of the real-vLLM tier (``make test-vllm``): stage b's probe and launch's
pre-flight against real releases beside 0.32.0, built by testbed.vllm_matrix (route A, their
Python parts: the config resolution both use; neither release serves on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
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
