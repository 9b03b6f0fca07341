"""`validate` and `diff` end to end: parse layer, report, and the real CLI in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.validation.validate import parse_config, validate_config
from testbed import samples
from tests.fixtures.cli import run_cli_in_process

# --- parse layer (in process, fast) ---


def test_json_syntax_error_reports_line_and_column() -> None:
    (finding,) = parse_config(b'{\n  "a": 1,\n  "b" 2\n}').findings
    assert finding.layer == "parse"
    assert "line 3, column 7" in finding.message


def test_duplicate_key_is_an_error_naming_both_values() -> None:
    data = b'{"dflash_config": {"mask_token_id": 248070, "mask_token_id": 248064}}'
    parsed = parse_config(data)
    (finding,) = parsed.findings
    assert finding.path == "dflash_config.mask_token_id"
    assert "248070" in finding.message and "248064" in finding.message
    assert parsed.doc == {"dflash_config": {"mask_token_id": 248064}}


@pytest.mark.parametrize(("data", "words"), [(b"[1, 2]", "array"), (b"null", "null")])
def test_top_level_must_be_an_object(data: bytes, words: str) -> None:
    parsed = parse_config(data)
    assert parsed.doc is None
    assert words in parsed.findings[0].message


def test_nan_is_not_json() -> None:
    parsed = parse_config(b'{"rope_theta": NaN}')
    assert parsed.doc is None and "NaN" in parsed.findings[0].message


def test_unparseable_file_skips_every_later_layer() -> None:
    report = validate_config(b"{", label="broken", effective=False)
    assert report.layers == {
        "parse": "failed",
        "schema": "skipped",
        "invariants": "skipped",
        "effective": "skipped",
        "target": "skipped",
        "against": "skipped",
    }
    assert not report.ok


def test_every_layer_runs_even_when_an_earlier_one_fails() -> None:
    doc = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    doc["num_hidden_layers"] = "5"  # schema error
    doc["dflash_config"]["mask_token_id"] = 999999  # invariant error
    report = validate_config(
        json.dumps(doc).encode(),
        label="x",
        effective=False,
        target=samples.REFERENCE_TARGET.read_bytes(),
        against=samples.REFERENCE_DRAFTER.read_bytes(),
    )
    assert report.layers["schema"] == report.layers["invariants"] == "failed"
    assert report.layers["target"] == "passed"
    assert report.layers["against"] == "failed"
    assert {f.layer for f in report.errors} == {"schema", "invariants", "against"}


@pytest.mark.parametrize(
    "path",
    [
        samples.REFERENCE_DRAFTER,
        samples.QWEN3_8B_DRAFTER,
        samples.QWEN36_35B_A3B_DRAFTER,
        samples.DFLASH2_DRAFTER,
    ],
    ids=lambda p: p.name,
)
def test_published_config_is_valid_without_the_loader(path: Path) -> None:
    report = validate_config(path.read_bytes(), label=path.name, effective=False)
    assert report.ok, report.to_dict()


# --- the real CLI (subprocesses: each pays the transformers import, so few of them) ---


@pytest.mark.integration
def test_incident_against_reference_fails_naming_each_wrong_field() -> None:
    result = run_cli_in_process(
        "validate", samples.INCIDENT_DRAFTER, "--against", samples.REFERENCE_DRAFTER
    )
    assert result.returncode == ExitCode.INVALID, result.stderr
    out = result.stdout
    assert "✓ effective" in out
    assert "✗ against" in out
    assert "dflash_config.mask_token_id: 248064, authoritative 248070" in out
    assert "dflash_config.target_layer_ids[1]: 17, authoritative 16" in out
    assert 'layer_types[0]: "full_attention", authoritative "sliding_attention"' in out
    assert "sliding_window: null, authoritative 2048" in out
    assert out.rstrip().endswith("INVALID: 11 errors")


@pytest.mark.integration
def test_json_report_with_target_config_mismatches() -> None:
    result = run_cli_in_process(
        "validate", samples.QWEN3_8B_DRAFTER, "--target-config", samples.REFERENCE_TARGET, "--json"
    )
    assert result.returncode == ExitCode.INVALID, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["layers"]["target"] == "failed"
    assert report["layers"]["effective"] == "passed"
    target_paths = [f["path"] for f in report["findings"] if f["layer"] == "target"]
    assert target_paths == ["hidden_size", "vocab_size", "num_target_layers"]
    assert report["target_source"].endswith("qwen3.6-27b-target.config.json")


def test_cli_reports_parse_error_position_and_valid_file(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text('{\n  "architectures": ["DFlashDraftModel"],\n  "block_size": 16,,\n}\n')
    result = run_cli_in_process("validate", tmp_path)  # a directory: reads its config.json
    assert result.returncode == ExitCode.INVALID
    assert "✗ parse" in result.stdout
    assert "line 3, column 20" in result.stdout
    assert "- schema (skipped)" in result.stdout

    result = run_cli_in_process("validate", samples.REFERENCE_DRAFTER, "--no-effective")
    assert result.returncode == ExitCode.OK, result.stdout
    assert result.stdout.rstrip().endswith("valid")
    assert "- effective (skipped)" in result.stdout


def test_cli_unreadable_source_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli_in_process("validate", tmp_path / "missing.json", "--no-effective")
    assert result.returncode == ExitCode.USAGE
    assert "no such file" in result.stderr


def test_diff_command_output_and_exit_codes(tmp_path: Path) -> None:
    reordered = tmp_path / "reordered.json"
    doc = json.loads(samples.REFERENCE_DRAFTER.read_bytes())
    reordered.write_text(json.dumps(dict(reversed(list(doc.items())))))
    same = run_cli_in_process("diff", samples.REFERENCE_DRAFTER, reordered)
    assert (same.returncode, same.stdout.strip()) == (ExitCode.OK, "identical")

    drift = run_cli_in_process("diff", samples.INCIDENT_DRAFTER, samples.REFERENCE_DRAFTER)
    assert drift.returncode == ExitCode.DRIFT
    assert "dflash_config.mask_token_id: 248064 → 248070" in drift.stdout
    assert "sliding_window: null → 2048" in drift.stdout

    as_json = run_cli_in_process(
        "diff", samples.INCIDENT_DRAFTER, samples.REFERENCE_DRAFTER, "--json"
    )
    assert as_json.returncode == ExitCode.DRIFT
    payload = json.loads(as_json.stdout)
    assert payload["identical"] is False
    assert {"path": "sliding_window", "kind": "changed", "old": None, "new": 2048} in payload[
        "changes"
    ]


def test_cli_num_speculative_tokens_must_fit_the_block() -> None:
    too_many = run_cli_in_process(
        "validate", samples.REFERENCE_DRAFTER, "--no-effective", "--num-speculative-tokens", "16"
    )
    assert too_many.returncode == ExitCode.INVALID
    assert "num_speculative_tokens 16 exceeds block_size - 1 = 15" in too_many.stdout
    fits = run_cli_in_process(
        "validate", samples.REFERENCE_DRAFTER, "--no-effective", "--num-speculative-tokens", "15"
    )
    assert fits.returncode == ExitCode.OK, fits.stdout
