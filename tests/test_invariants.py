"""DFlash invariants (dflash-facts.md §Invariants 1-7) and compatibility with the target model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflash_provision.validation.invariants import block_size_of, check_invariants, check_target
from testbed import samples

PUBLISHED = [
    samples.REFERENCE_DRAFTER,
    samples.QWEN3_8B_DRAFTER,
    samples.QWEN36_35B_A3B_DRAFTER,
    samples.DFLASH2_DRAFTER,
]


def only(findings: list[Any]) -> Any:
    assert len(findings) == 1, [f.message for f in findings]
    return findings[0]


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_published_config_satisfies_every_invariant(path: Path) -> None:
    assert check_invariants(samples.load_json(path), num_speculative_tokens=7) == []


def test_layer_types_length_must_match_num_hidden_layers(reference: dict[str, Any]) -> None:
    reference["layer_types"].append("full_attention")
    finding = only(check_invariants(reference))
    assert finding.path == "layer_types"
    assert "6 entries" in finding.message and "num_hidden_layers is 5" in finding.message


def test_layer_type_value_must_be_sliding_or_full(reference: dict[str, Any]) -> None:
    reference["layer_types"][4] = "chunked_attention"
    assert only(check_invariants(reference)).path == "layer_types[4]"


def test_sliding_layers_need_a_positive_sliding_window(reference: dict[str, Any]) -> None:
    reference["sliding_window"] = None
    finding = only(check_invariants(reference))
    assert finding.path == "sliding_window"
    assert "null" in finding.message and "[0, 1, 2, 3]" in finding.message


def test_sliding_layers_need_use_sliding_window_true(reference: dict[str, Any]) -> None:
    reference["use_sliding_window"] = False
    finding = only(check_invariants(reference))
    assert finding.path == "use_sliding_window"
    assert "set use_sliding_window: true" in finding.message


def test_all_full_attention_needs_no_window() -> None:
    assert check_invariants(samples.load_json(samples.INCIDENT_DRAFTER)) == []


@pytest.mark.parametrize(
    ("ids", "path", "words"),
    [
        ([], "dflash_config.target_layer_ids", "empty"),
        ([1, 16, 16, 46, 61], "dflash_config.target_layer_ids", "repeats [16]"),
        ([1, 31, 16, 46, 61], "dflash_config.target_layer_ids", "strictly increasing"),
        ([1, 16, 31, 46, 64], "dflash_config.target_layer_ids[4]", "num_target_layers (64)"),
    ],
)
def test_target_layer_ids_must_be_unique_increasing_and_in_range(
    reference: dict[str, Any], ids: list[int], path: str, words: str
) -> None:
    reference["dflash_config"]["target_layer_ids"] = ids
    finding = only(check_invariants(reference))
    assert finding.path == path
    assert words in finding.message


def test_eagle_aux_layer_ids_must_be_target_layer_ids_plus_one(reference: dict[str, Any]) -> None:
    reference["eagle_aux_hidden_state_layer_ids"] = [2, 17, 32, 47, 62]
    assert check_invariants(reference) == []
    reference["eagle_aux_hidden_state_layer_ids"] = [1, 16, 31, 46, 61]
    finding = only(check_invariants(reference))
    assert finding.path == "eagle_aux_hidden_state_layer_ids"
    assert "[2, 17, 32, 47, 62]" in finding.message


@pytest.mark.parametrize("mask", [-1, 248320, 300000])
def test_mask_token_id_must_be_inside_the_vocabulary(reference: dict[str, Any], mask: int) -> None:
    reference["dflash_config"]["mask_token_id"] = mask
    finding = only(check_invariants(reference))
    assert finding.path == "dflash_config.mask_token_id"
    assert str(mask) in finding.message and "248320" in finding.message


def test_block_size_is_read_from_dflash_config_before_top_level(reference: dict[str, Any]) -> None:
    assert block_size_of(reference) == (16, "block_size")
    dflash2 = samples.load_json(samples.DFLASH2_DRAFTER)
    assert block_size_of(dflash2) == (8, "dflash_config.block_size")


def test_block_size_must_exist_somewhere(reference: dict[str, Any]) -> None:
    del reference["block_size"]
    assert only(check_invariants(reference)).path == "block_size"


def test_two_different_block_sizes_are_an_error(reference: dict[str, Any]) -> None:
    reference["dflash_config"]["block_size"] = 8
    finding = only(check_invariants(reference))
    assert "16" in finding.message and "8" in finding.message


def test_speculative_tokens_beyond_block_size_minus_one_are_an_error() -> None:
    dflash2 = samples.load_json(samples.DFLASH2_DRAFTER)  # block_size 8 in dflash_config
    assert check_invariants(dflash2, num_speculative_tokens=7) == []
    finding = only(check_invariants(dflash2, num_speculative_tokens=8))
    assert finding.path == "dflash_config.block_size"
    assert "at most 7" in finding.message


def test_dflash2_must_declare_is_causal_false() -> None:
    dflash2 = samples.load_json(samples.DFLASH2_DRAFTER)
    del dflash2["is_causal"]
    finding = only(check_invariants(dflash2))
    assert finding.path == "is_causal"
    assert "set is_causal: false" in finding.message


def test_wrongly_typed_fields_do_not_crash_the_checks(reference: dict[str, Any]) -> None:
    reference["layer_types"] = "sliding"
    reference["dflash_config"] = {"target_layer_ids": "1,16", "mask_token_id": None}
    reference["num_target_layers"] = "64"
    assert check_invariants(reference) == []  # the schema layer reports these


def test_reference_drafter_fits_its_target(reference: dict[str, Any], target: dict) -> None:
    assert check_target(reference, target) == []


def test_drafter_for_another_target_names_every_mismatch(target: dict[str, Any]) -> None:
    findings = check_target(samples.load_json(samples.QWEN3_8B_DRAFTER), target)
    assert [f.path for f in findings] == ["hidden_size", "vocab_size", "num_target_layers"]
    assert all(f.layer == "target" for f in findings)
    assert "drafter 4096, target 5120" in findings[0].message


def test_layer_ids_beyond_a_smaller_target_are_errors(
    reference: dict[str, Any], target: dict[str, Any]
) -> None:
    target["num_hidden_layers"] = 48
    reference["num_target_layers"] = 48
    reference["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 47]
    # inside the target: no error (only the tap-spacing hint, a warning)
    assert [f for f in check_target(reference, target) if f.severity == "error"] == []
    reference["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 61]
    finding = only(check_target(reference, target))
    assert finding.path == "dflash_config.target_layer_ids[4]"
    assert "61" in finding.message and "48" in finding.message


def test_multimodal_target_is_read_through_text_config(reference: dict[str, Any]) -> None:
    target = {"architectures": ["X"], "text_config": samples.load_json(samples.REFERENCE_TARGET)}
    assert check_target(reference, target) == []
