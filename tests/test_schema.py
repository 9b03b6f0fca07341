"""The schema layer: published configs pass, every violation is listed with its JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from dflash_provision.validation.schema_check import (
    SUPPORTED_ARCHITECTURES,
    check_schema,
    schemas_dir,
)
from testbed import samples

PUBLISHED = [
    samples.REFERENCE_DRAFTER,
    samples.INCIDENT_DRAFTER,  # wrong values, but of the right shape: the schema accepts it
    samples.QWEN3_8B_DRAFTER,
    samples.QWEN36_35B_A3B_DRAFTER,
    samples.DFLASH2_DRAFTER,
]


def paths(findings: list[Any]) -> list[str]:
    return [f.path for f in findings]


def test_schema_files_are_valid_draft_2020_12() -> None:
    files = sorted(schemas_dir().glob("*.schema.json"))
    assert len(files) >= 2
    for path in files:
        schema = json.loads(path.read_text(encoding="utf-8"))
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_published_config_passes_schema(path: Path) -> None:
    assert check_schema(samples.load_json(path)) == []


def test_wrong_value_is_reported_at_its_json_path(reference: dict[str, Any]) -> None:
    reference["dflash_config"]["target_layer_ids"][2] = -1
    (finding,) = check_schema(reference)
    assert finding.layer == "schema"
    assert finding.path == "dflash_config.target_layer_ids[2]"
    assert "-1" in finding.message


def test_every_error_is_listed_not_only_the_first(reference: dict[str, Any]) -> None:
    del reference["dflash_config"]["mask_token_id"]
    reference["layer_types"][1] = "linear_attention"
    reference["sliding_window"] = 0
    reference["num_hidden_layers"] = "5"
    assert paths(check_schema(reference)) == [
        "dflash_config.mask_token_id",
        "layer_types[1]",
        "num_hidden_layers",
        "sliding_window",
    ]


def test_missing_required_field_points_at_the_field(reference: dict[str, Any]) -> None:
    del reference["dflash_config"]["target_layer_ids"]
    (finding,) = check_schema(reference)
    assert finding.path == "dflash_config.target_layer_ids"
    assert "missing" in finding.message


def test_float_where_integer_is_required_is_rejected(reference: dict[str, Any]) -> None:
    # JSON Schema alone would accept 5.0 as an integer; transformers' strict config does not.
    reference["num_hidden_layers"] = 5.0
    reference["dflash_config"]["mask_token_id"] = 248070.0
    assert paths(check_schema(reference)) == ["dflash_config.mask_token_id", "num_hidden_layers"]


def test_dflash_config_must_be_an_object(reference: dict[str, Any]) -> None:
    reference["dflash_config"] = [248070]
    assert paths(check_schema(reference)) == ["dflash_config"]


@pytest.mark.parametrize("architectures", [["Qwen3ForCausalLM"], [], None, "DFlashDraftModel"])
def test_unknown_or_missing_architecture_is_one_clear_error(
    reference: dict[str, Any], architectures: Any
) -> None:
    if architectures is None:
        del reference["architectures"]
    else:
        reference["architectures"] = architectures
    (finding,) = check_schema(reference)
    assert finding.path == "architectures"
    for name in SUPPORTED_ARCHITECTURES:
        assert name in finding.message


def test_dflash2_requires_block_size_in_dflash_config_and_explicit_non_causal() -> None:
    doc = samples.load_json(samples.DFLASH2_DRAFTER)
    broken = copy.deepcopy(doc)
    del broken["dflash_config"]["block_size"]
    del broken["is_causal"]
    assert paths(check_schema(broken)) == ["dflash_config.block_size", "is_causal"]
    broken = copy.deepcopy(doc)
    broken["is_causal"] = True
    assert paths(check_schema(broken)) == ["is_causal"]


def test_extra_unconstrained_fields_are_allowed(reference: dict[str, Any]) -> None:
    reference["transformers_version"] = "4.57.1"
    reference["dflash_config"]["experimental_knob"] = {"a": 1}
    assert check_schema(reference) == []
