"""What a target's vLLM does with a drafter, judged from the probe's feature detection
(probe.py: ``draft["runners"]``, ``draft["attention"]``, ``vllm["speculative_keys"]``).

Shared by runtime-check's stage b (does that vLLM run the drafter as it was trained?) and
launch's pre-flight (which runner, which environment, which --speculative-config keys).
Nothing here reads a version number: every answer comes from calling the target's own vLLM
code, and a part the probe could not find out (its helper missing or raising) is an
"unknown", never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLIDING = "sliding_attention"
RUNNERS = ("v1", "v2")
RUNNER_NAMES = {"v1": "V1", "v2": "V2"}
#: What serves a drafter whose sliding layers a vLLM would run as full attention.
SLIDING_FIX = (
    "run a vLLM with per-layer DFlash sliding windows (0.25 or later, or a build whose "
    "qwen3_dflash has _resolve_layer_attention)"
)
MIXED_FIX = (
    "a vLLM whose V2 model runner serves mixed sliding/full DFlash layouts (0.26 or later, "
    "with Triton: a GPU build)"
)


@dataclass
class Judgement:
    """Problems (the vLLM runs the drafter otherwise than trained), unknowns (cannot tell) and
    the fix of the first problem."""

    problems: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    fix: str | None = None
    window_problem: bool = False  # a problem (or unknown) about the sliding windows
    window_unknown: bool = False

    def extend(self, other: Judgement) -> None:
        self.problems += other.problems
        self.unknowns += other.unknowns
        self.fix = self.fix or other.fix
        self.window_problem |= other.window_problem
        self.window_unknown |= other.window_unknown


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def intended_windows(doc: dict[str, Any]) -> list[int | None] | None:
    """Each layer's window as the drafter declares it (None: full attention), or None when the
    config does not say how many layers. ``layer_types`` names the sliding layers; without a
    sliding one, ``dflash_config.use_swa`` makes every layer sliding; the window is
    ``dflash_config.swa_window_size``, else ``sliding_window`` (MiMo's and NVIDIA
    Model-Optimizer's drafters declare their windows with the dflash_config keys)."""
    inner = _dict(doc.get("dflash_config"))
    types = doc.get("layer_types")
    types = types if isinstance(types, list) else None
    count = _int(doc.get("num_hidden_layers")) or (len(types) if types else None)
    if count is None:
        return None
    use_swa = inner.get("use_swa") is True
    window = inner.get("swa_window_size", doc.get("sliding_window"))
    window = _int(window)
    any_sliding = types is not None and SLIDING in types
    if types is None or (use_swa and not any_sliding):
        sliding = [use_swa] * count
    else:
        sliding = [i < len(types) and types[i] == SLIDING for i in range(count)]
    return [window if is_sliding else None for is_sliding in sliding]


def _describe_runner_refusal(name: str, runner: dict[str, Any]) -> str:
    label = RUNNER_NAMES[name]
    if runner.get("present") is False:
        return f"no {label} runner in this vLLM"
    if runner.get("accepts_method") is False:
        return f"{label} refuses the speculative config ({runner.get('refusal')})"
    if runner.get("accepts_layout") is False:
        return f"{label} refuses the layout ({runner.get('layout_refusal')})"
    return f"{label}: cannot tell ({runner.get('error')})"


def serving_runners(draft: dict[str, Any]) -> tuple[list[str], list[str], dict[str, str]]:
    """(runners that serve this drafter, runners that cannot tell, why each other refuses)."""
    runners = _dict(draft.get("runners"))
    serve: list[str] = []
    unknown: list[str] = []
    refused: dict[str, str] = {}
    for name in RUNNERS:
        runner = _dict(runners.get(name))
        flags = (runner.get("present"), runner.get("accepts_method"), runner.get("accepts_layout"))
        if False in flags:
            refused[name] = _describe_runner_refusal(name, runner)
        elif None in flags:
            unknown.append(name)
        else:
            serve.append(name)
    return serve, unknown, refused


def refusals_text(draft: dict[str, Any], refused: dict[str, str]) -> str:
    """Why the runners in ``refused`` refuse this drafter, each once: 0.25's resolver refuses a
    mixed layout with the same words whichever runner asks, said once for both."""
    runners = _dict(draft.get("runners"))
    why = {_dict(runners.get(name)).get("layout_refusal") for name in refused}
    if set(refused) == set(RUNNERS) and layout_refused(draft, every=True) and len(why) == 1:
        return f"both the V1 and the V2 runner refuse its layout ({why.pop()})"
    return "; ".join(refused[name] for name in RUNNERS if name in refused)


def judge_runners(draft: dict[str, Any], version: str) -> Judgement:
    """Whether any model runner of this vLLM serves the drafter (stage b and launch)."""
    result = Judgement()
    if not isinstance(draft.get("runners"), dict):
        result.unknowns.append(
            "the probe did not say which model runner would serve this drafter (an older probe)"
        )
        return result
    serve, unknown, refused = serving_runners(draft)
    runners = _dict(draft.get("runners"))
    if not serve and not unknown:
        result.problems.append(
            f"no model runner of vLLM {version} serves this drafter: "
            + refusals_text(draft, refused)
        )
        result.fix = f"use {MIXED_FIX}" if layout_refused(draft) else None
    elif not serve:
        result.unknowns.append(
            f"cannot tell which model runner of vLLM {version} serves this drafter: "
            + "; ".join(_describe_runner_refusal(n, _dict(runners.get(n))) for n in unknown)
        )
    return result


def layout_refused(draft: dict[str, Any], *, every: bool = False) -> bool:
    """Whether a runner (``every``: each runner) of this vLLM refuses the drafter's layout."""
    runners = _dict(draft.get("runners"))
    refusing = [_dict(runners.get(n)).get("accepts_layout") is False for n in RUNNERS]
    return all(refusing) if every else any(refusing)


def judge_aux(draft: dict[str, Any], target_layer_ids: list[int] | None, version: str) -> Judgement:
    """The aux hidden-state ids each serving runner takes: target_layer_ids + 1 is right; the
    raw ids (no + 1: vLLM without PR #40727) and none at all (the model's defaults) are not."""
    result = Judgement()
    if target_layer_ids is None:
        return result
    expected = [i + 1 for i in target_layer_ids]
    serve, unknown, _ = serving_runners(draft)
    runners = _dict(draft.get("runners"))
    for name in serve + unknown:
        label = RUNNER_NAMES[name]
        aux = _dict(_dict(runners.get(name)).get("aux"))
        ids = aux.get("ids")
        if aux.get("error"):
            result.unknowns.append(
                f"cannot tell which aux layers vLLM {version}'s {label} runner takes: "
                f"{aux['error']}"
            )
        elif ids is None:
            result.problems.append(
                f"vLLM {version}'s {label} runner takes no auxiliary layer ids from this config: "
                f'it falls back to the model\'s defaults ("from model"), expected '
                f"target_layer_ids + 1 = {expected}"
            )
        elif ids == list(target_layer_ids) and ids != expected:
            result.problems.append(
                f"vLLM {version}'s {label} runner takes target_layer_ids as they are ({ids}), "
                f"without the + 1 (expected {expected}): the drafter reads the outputs of the "
                "layers before the ones it was trained on (a vLLM without PR #40727)"
            )
            result.fix = result.fix or "run a vLLM that adds 1 to DFlash target_layer_ids (0.22+)"
        elif ids != expected:
            result.problems.append(
                f"vLLM {version}'s {label} runner takes aux layer ids {ids}, expected "
                f"target_layer_ids + 1 = {expected}"
            )
    return result


def judge_attention(draft: dict[str, Any], doc: dict[str, Any], version: str) -> Judgement:
    """Whether this vLLM applies the drafter's sliding windows, layer by layer."""
    result = Judgement()
    intent = intended_windows(doc)
    sliding = [i for i, w in enumerate(intent or []) if w is not None]
    attention = draft.get("attention")
    if not isinstance(attention, dict):  # an older probe: only its per-layer answer
        attention = {"sliding": True if draft.get("layers") else None}
        if draft.get("layers_error"):
            attention["error"] = draft["layers_error"]
    if attention.get("sliding") is False:
        if sliding:
            window = (intent or [None])[sliding[0]]
            result.problems.append(
                f"vLLM {version} has no per-layer DFlash sliding attention: it runs every "
                f"drafter layer as full attention, the {len(sliding)} sliding-window layer(s) "
                f"(window {window}) included: the incident's own bug (acceptance collapses past "
                "the window)"
            )
            result.fix = SLIDING_FIX
            result.window_problem = True
        return result
    if attention.get("sliding") is None or draft.get("layers_error"):
        why = draft.get("layers_error") or attention.get("error") or "no answer"
        result.unknowns.append(
            f"cannot tell whether vLLM {version} runs the drafter's layers with their "
            f"windows: {why}"
        )
        result.window_unknown = True
        return result
    layers = draft.get("layers")
    runners = _dict(draft.get("runners"))
    refusals = {_dict(runners.get(n)).get("layout_refusal") for n in RUNNERS} - {None}
    for layer in (
        [item for item in layers if isinstance(item, dict)] if isinstance(layers, list) else []
    ):
        index = layer.get("index")
        if not isinstance(index, int) or intent is None:
            continue
        if index >= len(intent):
            result.problems.append(f"vLLM builds layer {index}; the drafter declares {len(intent)}")
            continue
        if layer.get("error") in refusals:
            continue  # the runners' refusal of the whole layout: judge_runners reports it
        if layer.get("error"):
            result.problems.append(f"vLLM refuses layer {index}: {layer['error']}")
            continue
        if layer.get("sliding_window") != intent[index]:
            kind = "full_attention" if intent[index] is None else SLIDING
            result.problems.append(
                f"vLLM layer {index}: window {layer.get('sliding_window')}, expected "
                f"{intent[index]} ({kind})"
            )
            result.window_problem = True
    return result


def judge_draft(
    draft: dict[str, Any], doc: dict[str, Any], target_layer_ids: list[int] | None, version: str
) -> Judgement:
    """Stage b's judgement of what this vLLM runs: runners, aux ids, windows."""
    result = judge_runners(draft, version)
    result.extend(judge_aux(draft, target_layer_ids, version))
    result.extend(judge_attention(draft, doc, version))
    return result


def rejected_keys(keys: list[str], vllm: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """The --speculative-config keys this vLLM would reject at start-up (None: cannot tell,
    with why)."""
    found = _dict(vllm.get("speculative_keys"))
    known = found.get("keys")
    if not isinstance(known, list):
        return None, str(found.get("error") or "the probe did not list them")
    if found.get("forbids_unknown") is not True:
        return [], None
    accepted = {str(k) for k in known}
    return [k for k in keys if k.replace("-", "_") not in accepted], None
