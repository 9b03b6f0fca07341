"""Canonical JSON and the semantic diff: what counts as drift and how it reads."""

from __future__ import annotations

import json
from typing import Any

from dflash_provision.validation.diff import Change, render_changes, semantic_diff
from testbed import samples


def lines(old: Any, new: Any) -> list[str]:
    return render_changes(semantic_diff(old, new))


def test_key_order_and_whitespace_are_not_drift() -> None:
    text = samples.REFERENCE_DRAFTER.read_text(encoding="utf-8")
    original = json.loads(text)
    reordered = json.loads(
        json.dumps(dict(reversed(list(original.items()))), separators=(",", ":"))
    )
    assert semantic_diff(original, reordered) == []


def test_float_spelling_is_not_drift() -> None:
    assert semantic_diff(json.loads('{"eps": 1e-06}'), json.loads('{"eps": 0.000001}')) == []


def test_integer_versus_float_is_a_type_change() -> None:
    (change,) = semantic_diff({"sliding_window": 2048}, {"sliding_window": 2048.0})
    assert change == Change("sliding_window", "type_changed", 2048, 2048.0)
    assert render_changes([change]) == ["sliding_window: 2048 → 2048.0 (integer → float)"]


def test_changed_value_renders_old_and_new() -> None:
    old = {"dflash_config": {"mask_token_id": 248064}}
    new = {"dflash_config": {"mask_token_id": 248070}}
    assert lines(old, new) == ["dflash_config.mask_token_id: 248064 → 248070"]


def test_null_to_value_is_a_change() -> None:
    (change,) = semantic_diff({"sliding_window": None}, {"sliding_window": 2048})
    assert change.kind == "changed"
    assert render_changes([change]) == ["sliding_window: null → 2048"]


def test_added_and_removed_keys_render_with_plus_and_minus() -> None:
    old = {"kept": 1, "removed_key": [1, 2]}
    new = {"kept": 1, "new_key": {"a": True}}
    assert lines(old, new) == ['+ new_key: {"a": true}', "- removed_key: [1, 2]"]


def test_lists_are_compared_position_by_position() -> None:
    old = {"ids": [1, 17, 33, 49, 63]}
    new = {"ids": [1, 16, 31, 46, 61]}
    assert [c.path for c in semantic_diff(old, new)] == [f"ids[{i}]" for i in range(1, 5)]
    # An element dropped from the front shifts everything: that is drift at every position.
    assert lines({"t": ["s", "s", "f"]}, {"t": ["s", "f"]}) == ['t[1]: "s" → "f"', '- t[2]: "f"']


def test_reordered_list_is_drift() -> None:
    assert lines({"t": ["a", "b"]}, {"t": ["b", "a"]}) == ['t[0]: "a" → "b"', 't[1]: "b" → "a"']


def test_changes_are_sorted_with_numeric_list_indexes() -> None:
    old = {"l": list(range(12)), "a": 1}
    new = {"l": [*range(9), 0, 0, 0], "a": 2}
    assert [c.path for c in semantic_diff(old, new)] == ["a", "l[9]", "l[10]", "l[11]"]


def test_incident_against_reference_names_every_wrong_field() -> None:
    incident = json.loads(samples.INCIDENT_DRAFTER.read_text(encoding="utf-8"))
    reference = json.loads(samples.REFERENCE_DRAFTER.read_text(encoding="utf-8"))
    rendered = lines(incident, reference)
    assert "dflash_config.mask_token_id: 248064 → 248070" in rendered
    assert "dflash_config.target_layer_ids[4]: 63 → 61" in rendered
    assert 'layer_types[0]: "full_attention" → "sliding_attention"' in rendered
    assert "sliding_window: null → 2048" in rendered
    assert "use_sliding_window: false → true" in rendered


def test_odd_keys_are_quoted_in_paths() -> None:
    (change,) = semantic_diff({"a.b": 1}, {"a.b": 2})
    assert change.path == '["a.b"]'


def test_boolean_versus_integer_is_a_type_change() -> None:
    # 1 == True in Python; in a config they mean different things to the loader.
    (change,) = semantic_diff({"use_sliding_window": 1}, {"use_sliding_window": True})
    assert change.kind == "type_changed"
    assert render_changes([change]) == ["use_sliding_window: 1 → true (integer → boolean)"]


def test_object_versus_array_is_a_type_change_not_a_descent() -> None:
    (change,) = semantic_diff({"rope": {"theta": 1.0}}, {"rope": [1.0]})
    assert change == Change("rope", "type_changed", {"theta": 1.0}, [1.0])


def test_nested_lists_and_objects_name_the_exact_position() -> None:
    old = {"a": [{"b": [1, 2]}, {"c": 3}]}
    new = {"a": [{"b": [1, 5, 6]}, {"c": 3, "d": None}]}
    assert lines(old, new) == ["a[0].b[1]: 2 → 5", "+ a[0].b[2]: 6", "+ a[1].d: null"]


def test_nan_on_both_sides_is_not_drift_but_nan_against_a_number_is() -> None:
    assert semantic_diff(json.loads('{"x": NaN}'), json.loads('{"x": NaN}')) == []
    (change,) = semantic_diff(json.loads('{"x": NaN}'), {"x": 1.0})
    assert change.kind == "changed"
