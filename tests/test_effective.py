"""The effective layer with the real transformers loader: what a runtime sees, not the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.validation.effective import check_effective
from dflash_provision.validation.validate import validate_config
from testbed import samples

pytestmark = pytest.mark.integration

PUBLISHED = [
    samples.REFERENCE_DRAFTER,
    samples.INCIDENT_DRAFTER,
    samples.QWEN3_8B_DRAFTER,
    samples.QWEN36_35B_A3B_DRAFTER,
    samples.DFLASH2_DRAFTER,
]


def by_path(findings: list[Any]) -> dict[str, str]:
    return {f.path: f.message for f in findings}


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_published_config_loads_unchanged(path: Path) -> None:
    assert check_effective(samples.load_json(path)) == []


def test_use_sliding_window_false_makes_loader_drop_the_window(reference: dict[str, Any]) -> None:
    reference["use_sliding_window"] = False
    messages = by_path(check_effective(reference))
    assert list(messages) == ["sliding_window"]
    message = messages["sliding_window"]
    assert "file 2048" in message and "loads null" in message
    assert "set use_sliding_window: true" in message


def test_absent_layer_types_is_rebuilt_by_the_loader(reference: dict[str, Any]) -> None:
    del reference["layer_types"]
    messages = by_path(check_effective(reference))
    assert list(messages) == ["layer_types"]
    # Default max_window_layers (28) exceeds 5 layers: the loader builds all-full attention.
    assert '["full_attention", "full_attention", "full_attention"' in messages["layer_types"]
    assert "write layer_types explicitly" in messages["layer_types"]


def test_rope_theta_hidden_by_rope_parameters_is_caught(reference: dict[str, Any]) -> None:
    reference["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    messages = by_path(check_effective(reference))
    assert list(messages) == ["rope_theta"]
    assert "10000000" in messages["rope_theta"] and "1000000.0" in messages["rope_theta"]


def test_rope_theta_moved_into_rope_parameters_is_not_a_change() -> None:
    # top-level rope_theta + YaRN rope_scaling
    doc = samples.load_json(samples.QWEN36_35B_A3B_DRAFTER)
    assert "rope_parameters" not in doc
    assert check_effective(doc) == []


def test_absent_rope_theta_and_window_take_loader_defaults(reference: dict[str, Any]) -> None:
    del reference["rope_theta"]
    del reference["sliding_window"]
    messages = by_path(check_effective(reference))
    assert "default 10000.0" in messages["rope_theta"]
    assert "default 4096" in messages["sliding_window"]


def test_config_transformers_cannot_load_is_one_line_error(reference: dict[str, Any]) -> None:
    reference["head_dim"] = 128.0
    (finding,) = check_effective(reference)
    assert finding.layer == "effective" and finding.path == ""
    assert "head_dim" in finding.message and "\n" not in finding.message


def test_loader_normalised_file_is_distinguishable_in_the_report(reference: dict) -> None:
    del reference["layer_types"]
    report = validate_config(json.dumps(reference).encode(), label="x")
    assert report.layers["effective"] == "failed"
    assert report.layers["schema"] == report.layers["invariants"] == "passed"
    assert report.loader_normalised and not report.ok
    assert report.to_dict()["loader_normalised"] is True


def test_use_sliding_window_false_is_an_invariant_error_and_loader_normalised(
    reference: dict[str, Any],
) -> None:
    reference["use_sliding_window"] = False
    report = validate_config(json.dumps(reference).encode(), label="x")
    assert report.layers["invariants"] == report.layers["effective"] == "failed"
    assert report.loader_normalised  # what the loader does is the sharper fact (as audit says)
