"""The fix for each way a link of doctor's trace (and runtime-check's stage d) can break, chosen
by what the stage saw: a fix line belongs to the cause it stands under. A python without
transformers gets ``--python``, a probe that could not run gets a fix about the probe, a
drafter directory whose weights do not fit gets one revision's files, and so on."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dflash_provision.runtime.stages import StageResult

PYTHON_FIX = (
    "rerun with --python PATH, the python that runs vLLM on the target (its venv's bin/python): "
    "the probe needs that python's transformers (and vLLM)"
)
_NO_FILE = {"missing"}  # a push creates the file; other read failures it does not cure


def file_fix(a: StageResult, push_fix: str, restart: str) -> str:
    """Stage a failed: push when the config is wrong or absent; one revision's files when only
    the weights do not fit; how to read the file when it could not be read."""
    status = a.data.get("status")
    path = a.data.get("path") or "config.json"
    if a.data.get("diff") or status in _NO_FILE:
        return f"{push_fix} && {restart}"
    if weights_only(a):
        return a.fix or weights_fix(restart)  # stage a's own fix names the directory
    if a.data.get("failed_by") == "files" and a.fix:
        return f"{a.fix} && {restart}"  # push --all-files places the lock's files
    if status == "dir-missing":
        return (
            f"the drafter directory of {path} does not exist on the target: check TARGET's "
            "path (stage c names the drafter the server runs), or put the drafter there"
        )
    if status == "permission-denied":
        return f"connect as a user who can read {path} (or add --sudo)"
    if status in ("not-regular", "too-large", "error"):
        return f"replace {path} with the authoritative regular file: {push_fix} && {restart}"
    return a.fix or f"{push_fix} && {restart}"


def weights_only(a: StageResult) -> bool:
    """Stage a failed only because the weights do not fit the (right) config bytes."""
    if a.data.get("failed_by") == "weights":
        return True
    weights = a.data.get("weights")
    mismatched = isinstance(weights, dict) and bool(weights.get("mismatches"))
    return mismatched and not a.data.get("diff") and a.data.get("status") == "present"


def weights_fix(restart: str) -> str:
    return (
        "put the config.json and the safetensors of ONE pinned revision in the drafter "
        f"directory (dflash-provision fetch REPO --revision SHA), then {restart}"
    )


def validation_fix(push_fix: str, authority_fits_target: bool, model: str | None) -> str:
    """The file on disk fails validation: a push cures it only when the authoritative config
    passes the same layers (with the same target model config)."""
    if authority_fits_target:
        return push_fix
    return (
        f"the authoritative config itself does not fit the target model {model or 'MODEL'}: use "
        "the drafter (revision) made for that target (`dflash-provision validate FILE "
        "--target-config MODEL/config.json` names each field)"
    )


def loader_fix(b: StageResult) -> str | None:
    """Stage b's loader part: the probe did not run, no transformers, a load error, or fields
    the loader changes."""
    probe = b.data.get("probe")
    if not isinstance(probe, dict):
        return probe_fix(b.summary)
    if not probe.get("transformers"):
        return PYTHON_FIX
    effective = probe.get("effective")
    if not isinstance(effective, dict) or not isinstance(effective.get("config"), dict):
        return (
            f"the target's transformers {probe.get('transformers')} cannot load the drafter's "
            "config: `dflash-provision validate FILE` shows why; or upgrade transformers in the "
            "python that runs vLLM (--python names it)"
        )
    if b.data.get("loader_problems"):
        return (
            "make the config survive the loader: e.g. use_sliding_window: true with sliding "
            "layers, layer_types written out (`dflash-provision validate FILE` names each field)"
        )
    return None


def probe_fix(why: str) -> str:
    """The probe did not answer with its report."""
    if "not in this build" in why:
        return "reinstall dflash-provision: this build lacks the target-side probe"
    if "refused its arguments" in why:
        return f"the probe refused its arguments ({why[:160]}): give --model with the target model"
    return f"the probe could not run on the target ({why[:160]}): {PYTHON_FIX}"


def vllm_fix(problem: str, restart: str) -> str:
    """Stage b's vLLM part, by the first problem (the link's summary)."""
    if "auxiliary layer ids" in problem:
        return (
            "vLLM does not read the provisioned target_layer_ids + 1: use a vLLM build with "
            "PR #40727 and check dflash_config.target_layer_ids, then " + restart
        )
    if "cannot resolve" in problem:
        return (
            "vLLM cannot resolve the draft against the target: give --model with the target "
            "model the server serves, or check the drafter with `dflash-provision validate FILE`"
        )
    return (
        "use a vLLM build that keeps the DFlash draft fields (PR #40898: layer_types, "
        f"sliding_window, use_sliding_window, max_window_layers), then {restart}"
    )


def completion_fix(target: str, status: int | None, error: str) -> str:
    """Stage d: the first smoke completion failed. A server that never answered is not a
    drafter that does not fit."""
    quoted = shlex.quote(target)
    if status is None or "cut short" in error or "longer than" in error:
        return (
            f"the server did not answer in full ({error[:160]}): see `dflash-provision logs "
            f"{quoted}` and its load; a slow server needs a larger --command-timeout"
        )
    if status == 404:
        return "the server does not serve that model name: give --model with its served name"
    if 400 <= status < 500:
        return (
            f"the server refused the smoke request (HTTP {status}): its arguments "
            f"(e.g. --max-model-len) are in `dflash-provision status {quoted}`"
        )
    return (
        "the drafter does not fit this target (layer ids, hidden size): "
        f"dflash-provision validate {quoted} --target-config MODEL"
    )


def inconclusive_fix(stage: StageResult) -> str:
    """A stage that could not tell: its own fix, else measure again with more evidence."""
    return stage.fix or (
        "measure again with more evidence (more --prompts; no restart of the server meanwhile)"
    )
