"""The speculators layout of a DFlash drafter through validate's layers and diff, and the
reference tap-spacing warning (DFlash only; DFlash2 and matching ids never warn)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.validation.diff import render_changes, semantic_diff
from dflash_provision.validation.effective import check_effective
from dflash_provision.validation.invariants import check_invariants, check_target
from dflash_provision.validation.schema_check import check_schema
from dflash_provision.validation.speculators_layout import default_target_layer_ids, runtime_view
from dflash_provision.validation.validate import validate_config
from testbed import samples
from tests.fixtures.cli import run_cli_in_process

TLC = "transformer_layer_config"
SPEC_TOKENS = "speculators_config.proposal_methods[0].speculative_tokens"


@pytest.fixture
def spec() -> dict[str, Any]:
    return samples.load_json(samples.SPECULATORS_DRAFTER)


@pytest.fixture
def target() -> dict[str, Any]:
    return samples.load_json(samples.REFERENCE_TARGET)


def paths(findings: list[Any]) -> list[str]:
    return [f.path for f in findings]


def errors(findings: list[Any]) -> list[Any]:
    return [f for f in findings if f.severity == "error"]


def test_good_speculators_config_passes_every_layer(spec: dict[str, Any]) -> None:
    report = validate_config(
        json.dumps(spec).encode(),
        label="spec",
        target=samples.REFERENCE_TARGET.read_bytes(),
        num_speculative_tokens=7,
    )
    assert report.ok, [f.message for f in report.findings]
    # One hint: vLLM runs this mixed layout's full-attention layer causal (see the next test).
    assert [(f.path, f.severity) for f in report.findings] == [
        ("sliding_window_non_causal", "warning")
    ]
    assert report.layers["schema"] == report.layers["effective"] == "passed"
    assert report.layers["target"] == "passed"


def test_schema_names_the_speculators_fields(spec: dict[str, Any]) -> None:
    del spec["speculators_config"]["verifier"]
    spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 0
    spec[TLC]["num_hidden_layers"] = 5.0
    spec["speculators_model_type"] = "eagle3"
    assert paths(check_schema(spec)) == [
        "speculators_config.proposal_methods[0].speculative_tokens",
        "speculators_config.verifier",
        "speculators_model_type",
        f"{TLC}.num_hidden_layers",
    ]


@pytest.mark.parametrize(
    ("edit", "path", "words"),
    [
        (lambda d: d[TLC]["layer_types"].append("full_attention"), f"{TLC}.layer_types", "6 en"),
        (lambda d: d[TLC].update(sliding_window=None), f"{TLC}.sliding_window", "vLLM refuses"),
        (
            lambda d: d.update(aux_hidden_state_layer_ids=[2, 32, 17, 47, 62]),
            "aux_hidden_state_layer_ids",
            "strictly increasing",
        ),
        (
            lambda d: d.update(aux_hidden_state_layer_ids=[0, 17, 32, 47, 62]),
            "aux_hidden_state_layer_ids[0]",
            "embedding output",
        ),
        (lambda d: d.update(mask_token_id=248320), "mask_token_id", "vocab_size (248320)"),
        (lambda d: d.update(draft_vocab_size=300000), "draft_vocab_size", "exceeds"),
        (
            lambda d: d["speculators_config"]["proposal_methods"][0].update(speculative_tokens=8),
            "speculators_config.proposal_methods[0].speculative_tokens",
            "block_size - 1 = 7",
        ),
        (lambda d: d.update(model_type="qwen3"), "model_type", "skips its speculators conversion"),
        (
            lambda d: d["speculators_config"].update(algorithm="dflash2"),
            "speculators_config.algorithm",
            "make them agree",
        ),
        (lambda d: d.pop("sliding_window_non_causal"), "sliding_window_non_causal", "non-causal"),
    ],
)
def test_broken_speculators_config_fails_its_invariant(
    spec: dict[str, Any], edit: Any, path: str, words: str
) -> None:
    edit(spec)
    (finding,) = errors(check_invariants(spec))
    assert finding.path == path
    assert words in finding.message


def test_causal_sliding_layers_warn_that_vllm_makes_full_layers_causal_too(
    spec: dict[str, Any],
) -> None:
    (finding,) = check_invariants(spec)
    assert finding.severity == "warning" and "full_attention at [4]" in finding.message
    spec["sliding_window_non_causal"] = True  # non-causal: vLLM's override matches training
    assert check_invariants(spec) == []
    spec["sliding_window_non_causal"] = False
    spec[TLC]["layer_types"] = ["sliding_attention"] * 5  # no full layer to make causal
    assert check_invariants(spec) == []


def test_sample_from_anchor_allows_block_size_tokens(spec: dict[str, Any]) -> None:
    spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 8
    assert paths(errors(check_invariants(spec))) == [SPEC_TOKENS]  # 8 > block_size - 1
    spec["sample_from_anchor"] = True  # the anchor position drafts too: block_size tokens
    assert errors(check_invariants(spec)) == []
    assert paths(errors(check_invariants(spec, num_speculative_tokens=9))) == ["block_size"]


def test_target_fit_reads_transformer_layer_config_and_aux_ids(
    spec: dict[str, Any], target: dict[str, Any]
) -> None:
    spec[TLC]["hidden_size"] = 4096
    spec["aux_hidden_state_layer_ids"] = [2, 17, 32, 47, 65]
    found = errors(check_target(spec, target))
    assert paths(found) == [f"{TLC}.hidden_size", "aux_hidden_state_layer_ids[4]"]
    assert "target has 64 layers" in found[1].message


def test_effective_layer_reports_what_vllms_conversion_replaces(spec: dict[str, Any]) -> None:
    spec[TLC]["dflash_config"] = {"swa_window_size": 1024}
    spec[TLC]["use_sliding_window"] = False
    found = check_effective(spec)
    assert [(f.path, f.severity) for f in found] == [
        (f"{TLC}.dflash_config", "error"),
        (f"{TLC}.sliding_window", "warning"),
    ]
    assert "swa_window_size" in found[0].message


def test_runtime_view_is_vllms_conversion(spec: dict[str, Any]) -> None:
    view = runtime_view(spec)
    assert view["eagle_aux_hidden_state_layer_ids"] == [2, 17, 32, 47, 62]
    assert view["dflash_config"] == {
        "mask_token_id": 248077,
        "target_layer_ids": [1, 16, 31, 46, 61],
        "sample_from_anchor": False,
        "causal": True,
    }
    assert view["layer_types"] == spec[TLC]["layer_types"]


# --- the reference tap spacing ---


@pytest.mark.parametrize(
    ("layers", "taps", "ids"),
    [
        (64, 5, [1, 16, 31, 46, 61]),
        (36, 5, [1, 9, 17, 25, 33]),
        (48, 5, [1, 12, 23, 34, 45]),
        (7, 3, [1, 2, 4]),  # 2.5 rounds to 2: Python's round(), as the reference uses
        (40, 1, [20]),
    ],
)
def test_default_tap_spacing_matches_the_reference(layers: int, taps: int, ids: list[int]) -> None:
    assert default_target_layer_ids(layers, taps) == ids


def test_dflash_ids_off_the_default_spacing_warn_naming_the_expected_ids(
    target: dict[str, Any],
) -> None:
    incident = samples.load_json(samples.INCIDENT_DRAFTER)
    (finding,) = check_target(incident, target)
    assert finding.severity == "warning"
    assert finding.path == "dflash_config.target_layer_ids"
    assert "expected [1, 16, 31, 46, 61]" in finding.message


def test_matching_ids_and_dflash2_drafters_do_not_warn(target: dict[str, Any]) -> None:
    assert check_target(samples.load_json(samples.REFERENCE_DRAFTER), target) == []
    dflash2 = samples.load_json(samples.DFLASH2_DRAFTER)  # ids [5, 19, 33, 47, 61]
    assert [f for f in check_target(dflash2, target) if "spacing" in f.message] == []


def test_speculators_aux_ids_are_compared_as_hidden_state_indices(
    spec: dict[str, Any], target: dict[str, Any]
) -> None:
    assert check_target(spec, target) == []  # aux [2, 17, ...] = default ids + 1
    spec["aux_hidden_state_layer_ids"] = [1, 16, 31, 46, 61]  # the ids without the + 1
    (finding,) = check_target(spec, target)
    assert finding.severity == "warning"
    assert "expected [2, 17, 32, 47, 62]" in finding.message
    spec["speculators_model_type"] = spec["speculators_config"]["algorithm"] = "dflash2"
    assert check_target(spec, target) == []


# --- diff and the CLI ---


def test_diff_names_speculators_fields(spec: dict[str, Any]) -> None:
    changed = copy.deepcopy(spec)
    changed["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 5
    changed["aux_hidden_state_layer_ids"][4] = 63
    changed[TLC]["sliding_window"] = 4096
    assert render_changes(semantic_diff(spec, changed)) == [
        "aux_hidden_state_layer_ids[4]: 62 → 63",
        "speculators_config.proposal_methods[0].speculative_tokens: 7 → 5",
        f"{TLC}.sliding_window: 2048 → 4096",
    ]


@pytest.mark.integration
def test_cli_validate_and_diff_of_a_speculators_config(tmp_path: Path) -> None:
    good = run_cli_in_process(
        "validate", samples.SPECULATORS_DRAFTER, "--target-config", samples.REFERENCE_TARGET
    )
    assert good.returncode == ExitCode.OK, good.stdout + good.stderr
    assert good.stdout.rstrip().endswith("valid")

    doc = samples.load_json(samples.SPECULATORS_DRAFTER)
    doc["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 9
    doc["aux_hidden_state_layer_ids"] = [1, 16, 31, 46, 61]
    broken = tmp_path / "config.json"
    broken.write_text(json.dumps(doc))
    bad = run_cli_in_process(
        "validate", tmp_path, "--target-config", samples.REFERENCE_TARGET, "--json"
    )
    assert bad.returncode == ExitCode.INVALID, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    found = {(f["path"], f["severity"]) for f in report["findings"]}
    assert ("speculators_config.proposal_methods[0].speculative_tokens", "error") in found
    assert ("aux_hidden_state_layer_ids", "warning") in found

    drift = run_cli_in_process("diff", samples.SPECULATORS_DRAFTER, broken)
    assert drift.returncode == ExitCode.DRIFT
    assert "speculators_config.proposal_methods[0].speculative_tokens: 7 → 9" in drift.stdout


# --- stage b and c on data shaped like the probe's and the server's (no hosts) ---


def spec_ctx(auth: dict[str, Any], disk: dict[str, Any] | None = None) -> Any:
    from types import SimpleNamespace

    from dflash_provision.source.authority import Authority
    from dflash_provision.target import parse_target
    from dflash_provision.verify.stages import CheckContext

    data = json.dumps(auth).encode()
    ctx = CheckContext(
        transport=None,  # type: ignore[arg-type]  # the comparisons never run commands
        target=parse_target("gpu1:/m/D"),
        authority=Authority("test", data),
        auth_doc=json.loads(data),
        push_fix="dflash-provision push gpu1:/m/D --from x",
    )
    if disk is not None:
        ctx.disk = SimpleNamespace(data=json.dumps(disk).encode())  # what stage a read
    return ctx


class Server:
    def __init__(self, argv: list[str]) -> None:
        self.pid, self.argv, self.speculative_config, self.record = 42, argv, None, None


def test_stage_c_reads_n_and_method_from_speculators_config_of_the_served_dir(
    spec: dict[str, Any],
) -> None:
    from dflash_provision.verify.stage_server import stage_server

    ctx = spec_ctx(spec)
    ctx.server = Server(["vllm", "serve", "/m/D/", "--port", "8000"])
    result = stage_server(ctx, 8000)
    assert result.passed, result.evidence
    assert result.data["spec"]["num_speculative_tokens"] == 7
    assert result.data["spec"]["method"] == "dflash"

    other = copy.deepcopy(spec)
    other["speculators_model_type"] = "eagle3"  # the file the server read serves another method
    ctx = spec_ctx(spec, disk=other)
    ctx.server = Server(["vllm", "serve", "/m/D"])
    assert "speculative method 'eagle3', expected 'dflash'" in stage_server(ctx, 8000).summary

    # An override on the command line is the operator's choice: checked against the block only.
    ctx = spec_ctx(spec)
    ctx.server = Server(["vllm", "serve", "/m/D"])
    ctx.server.speculative_config = {"num_speculative_tokens": 8}
    assert "num_speculative_tokens 8 > block_size - 1 = 7" in stage_server(ctx, 8000).summary


def test_stage_b_compares_vllms_conversion_naming_the_speculators_fields(
    spec: dict[str, Any],
) -> None:
    from dflash_provision.verify.stage_disk import speculators_loader_part

    converted = runtime_view(spec, keep_block_size=False)
    assert speculators_loader_part(spec_ctx(spec), {"config": converted}, []) == ([], [])
    # A vLLM whose conversion dropped the window and shifted the taps:
    broken = copy.deepcopy(converted)
    broken["sliding_window"] = None
    broken["dflash_config"]["target_layer_ids"][0] = 2
    _, vs_auth = speculators_loader_part(spec_ctx(spec), {"config": broken}, [])
    assert vs_auth == [
        "converted on the target: aux_hidden_state_layer_ids (- 1): 2 → 1",
        f"converted on the target: {TLC}.sliding_window: null → 2048",
    ]
    evidence: list[str] = []
    note = {"config": None, "note": "transformers cannot load the speculators layout"}
    assert speculators_loader_part(spec_ctx(spec), note, evidence) == ([], [])
    assert evidence == ["transformers cannot load the speculators layout"]


def test_stage_b_without_a_draft_for_a_speculators_drafter_fails_even_without_model(
    spec: dict[str, Any],
) -> None:
    from dflash_provision.verify.stage_disk import _vllm_part

    # The probe resolves a speculators drafter against its own verifier: no draft is an answer.
    timed_out = {"importable": True, "version": "0.32.0", "error": "probe timed out", "draft": None}
    assert _vllm_part(spec_ctx(spec), timed_out, None, []).problems == [
        "vLLM cannot resolve the draft config: probe timed out"
    ]


def test_diff_across_layouts_compares_what_vllm_reads_named_as_b_keeps_it() -> None:
    from dflash_provision.validation.diff import cross_layout_diff

    reference = samples.load_json(samples.REFERENCE_DRAFTER)
    spec = samples.load_json(samples.SPECULATORS_DRAFTER)
    # Same drafter, two layouts: only what really differs for vLLM (taps, window, sizes agree).
    assert render_changes(cross_layout_diff(reference, spec)) == [
        "block_size: 16 → 8",
        "mask_token_id: 248070 → 248077",
    ]
    incident = samples.load_json(samples.INCIDENT_DRAFTER)
    lines = render_changes(cross_layout_diff(incident, spec))
    assert "aux_hidden_state_layer_ids[1]: 18 → 17" in lines  # ids + 1: vLLM's aux convention
    assert f"{TLC}.sliding_window: null → 2048" in lines
    back = render_changes(cross_layout_diff(spec, incident))
    assert "dflash_config.target_layer_ids[1]: 16 → 17" in back


@pytest.mark.integration
def test_cli_diff_across_layouts_says_so_and_is_drift() -> None:
    drift = run_cli_in_process("diff", samples.REFERENCE_DRAFTER, samples.SPECULATORS_DRAFTER)
    assert drift.returncode == ExitCode.DRIFT, drift.stdout + drift.stderr
    assert "layouts differ (reference → speculators); comparing what vLLM reads" in drift.stdout
    assert "mask_token_id: 248070 → 248077" in drift.stdout
    assert "dflash_config" not in drift.stdout  # no "every key moved" noise
    as_json = run_cli_in_process(
        "diff", samples.REFERENCE_DRAFTER, samples.SPECULATORS_DRAFTER, "--json"
    )
    payload = json.loads(as_json.stdout)
    assert payload["layouts"] == {"a": "reference", "b": "speculators"}
    assert payload["identical"] is False
