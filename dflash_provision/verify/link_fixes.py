"""The fix for each way a link of doctor's trace (and runtime-check's stage d) can break, chosen
by what the stage saw: a fix line belongs to the cause it stands under. A python without
transformers gets ``--python``, a probe that could not run gets a fix about the probe, a
drafter directory whose weights do not fit gets one revision's files, and so on.

Every fix line is a command that can be pasted as it is printed (real target, paths and
options, shell-quoted), optionally followed by ``  # why`` (a shell comment: what the command
does not do itself, in words); tests parse each with the CLI's own parser."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

from dflash_provision.server.fix_lines import noted, weights_fix

if TYPE_CHECKING:
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.verify.stages import StageResult


def target_config_source(target: Target, model: str | None) -> str | None:
    """The SOURCE of the target model's config.json for ``validate --target-config``: beside
    the drafter on the same machine when ``model`` is a directory there, the Hub id itself
    otherwise; None when the model is not known."""
    if not model:
        return None
    if model.startswith("/"):
        return replace(target, path=posixpath.join(model, "config.json")).display()
    return model


def restart_command(target: Target, port: int | None = None) -> str:
    """``launch TARGET --restart``: the recorded launch as it was (the server reads its drafter
    once, at start-up)."""
    where = ["--port", str(port)] if port is not None else []
    return shlex.join(["dflash-provision", "launch", target.display(), *where, "--restart"])


def authority_source(authority: Authority) -> str:
    """The authoritative config as a SOURCE ``diff`` and ``validate`` read: the Hub repo at the
    commit it was read at (a repo or a lock), else its label (a file or a target)."""
    if authority.commit_sha and "@" in authority.label:
        return f"{authority.label.split('@', 1)[0]}@{authority.commit_sha}"
    return authority.label


def validate_command(target: Target, model: str | None) -> str:
    """``validate`` of the drafter file on disk with the served model's config when known."""
    command = ["dflash-provision", "validate", target.display()]
    source = target_config_source(target, model)
    return shlex.join(command + (["--target-config", source] if source else []))


PYTHON_WHY = (
    "the probe needs the transformers (and vLLM) of the python that runs vLLM on the target: "
    "rerun with --python naming that python (its venv's bin/python)"
)
_NO_FILE = {"missing"}  # a push creates the file; other read failures it does not cure


def file_fix(a: StageResult, push_fix: str, restart: str, target: Target) -> str:
    """Stage a failed: push when the config is wrong or absent; one revision's files when only
    the weights do not fit; how to read the file when it could not be read."""
    status = a.data.get("status")
    path = a.data.get("path") or "config.json"
    if a.data.get("diff") or status in _NO_FILE:
        return f"{push_fix} && {restart}"
    if weights_only(a):
        return a.fix or weights_fix(push_fix, restart, target)  # stage a's own names the dir
    if a.data.get("failed_by") == "files" and a.fix:
        return f"{a.fix} && {restart}"  # push --all-files places the lock's files
    if status == "dir-missing":
        return noted(
            shlex.join(["dflash-provision", "status", target.display()]),
            f"the drafter directory of {path} does not exist on the target: status names the "
            "drafter the server runs; check the target's path, or put the drafter there",
        )
    if status == "permission-denied":
        return noted(
            shlex.join(["dflash-provision", "verify", target.display(), "--sudo"]),
            f"{path} is not readable by this login: read it through sudo (or connect as a user "
            "who can)",
        )
    if status in ("not-regular", "too-large", "error"):
        return noted(
            f"{push_fix} && {restart}", f"replaces {path} with the authoritative regular file"
        )
    return f"{push_fix} && {restart}"


def weights_only(a: StageResult) -> bool:
    """Stage a failed only because the weights do not fit the (right) config bytes."""
    if a.data.get("failed_by") == "weights":
        return True
    weights = a.data.get("weights")
    mismatched = isinstance(weights, dict) and bool(weights.get("mismatches"))
    return mismatched and not a.data.get("diff") and a.data.get("status") == "present"


def validation_fix(
    push_fix: str, authority_fits_target: bool, target: Target, model: str | None
) -> str:
    """The file on disk fails validation: a push cures it only when the authoritative config
    passes the same layers (with the same target model config)."""
    if authority_fits_target:
        return push_fix
    return noted(
        validate_command(target, model),
        f"the authoritative config itself does not fit the target model {model or '(unknown)'}:"
        " use the drafter (revision) made for that target; validate names each field",
    )


def loader_fix(b: StageResult, target: Target, model: str | None) -> str | None:
    """Stage b's loader part: the probe did not run, no transformers, a load error, or fields
    the loader changes."""
    probe = b.data.get("probe")
    if not isinstance(probe, dict):
        return probe_fix(b.summary, target)
    if not probe.get("transformers"):
        return _rerun(target, PYTHON_WHY)
    effective = probe.get("effective")
    if not isinstance(effective, dict) or not isinstance(effective.get("config"), dict):
        return noted(
            validate_command(target, model),
            f"the target's transformers {probe.get('transformers')} cannot load the drafter's "
            "config: validate shows why; or upgrade transformers in the python that runs vLLM",
        )
    if b.data.get("loader_problems"):
        return noted(
            validate_command(target, model),
            "names each field the loader changes: make the config survive it (e.g. "
            "use_sliding_window: true with sliding layers, layer_types written out)",
        )
    return None


def _rerun(target: Target, why: str) -> str:
    """Status (the server's command line: the python and model it runs) and what to rerun."""
    return noted(shlex.join(["dflash-provision", "status", target.display()]), why)


def probe_fix(why: str, target: Target) -> str:
    """The probe did not answer with its report."""
    if "not in this build" in why:
        return noted(
            "python3 -m pip install --force-reinstall dflash-provision",
            "this build lacks the target-side probe",
        )
    if "refused its arguments" in why:
        return _rerun(
            target,
            f"the probe refused its arguments ({why[:160]}): rerun with --model naming the "
            "target model",
        )
    return _rerun(target, f"the probe could not run on the target ({why[:160]}): {PYTHON_WHY}")


def vllm_fix(problem: str, restart: str, target: Target, model: str | None) -> str:
    """Stage b's vLLM part, by the first problem (the link's summary)."""
    if "auxiliary layer ids" in problem:
        return noted(
            restart,
            "after installing a vLLM build with PR #40727 where the launch runs it: it reads "
            "the provisioned target_layer_ids + 1",
        )
    if "cannot resolve" in problem:
        return noted(
            validate_command(target, model),
            "vLLM cannot resolve the draft against the target: validate checks the drafter "
            "against the served model (rerun with --model naming it if another)",
        )
    return noted(
        restart,
        "after installing a vLLM build that keeps the DFlash draft fields (PR #40898: "
        "layer_types, sliding_window, use_sliding_window, max_window_layers) where the launch "
        "runs it",
    )


def completion_fix(target: Target, status: int | None, error: str, model: str | None) -> str:
    """Stage d: the first smoke completion failed. A server that never answered is not a
    drafter that does not fit."""
    place = target.display()
    if status is None or "cut short" in error or "longer than" in error:
        return noted(
            shlex.join(["dflash-provision", "logs", place]),
            f"the server did not answer in full ({error[:160]}): its log and its load say why; "
            "a slow server needs a larger --command-timeout",
        )
    if status == 404:
        return noted(
            shlex.join(["dflash-provision", "status", place]),
            "the server does not serve that model name: status shows its command line; rerun "
            "with --model naming its served name",
        )
    if 400 <= status < 500:
        return noted(
            shlex.join(["dflash-provision", "status", place]),
            f"the server refused the smoke request (HTTP {status}): its arguments (e.g. "
            "--max-model-len) are on its command line",
        )
    return noted(
        validate_command(target, model),
        "the drafter does not fit this target (layer ids, hidden size)",
    )


def inconclusive_fix(rerun: str) -> str:
    """A stage that could not tell (and has no fix of its own): ``rerun``, the same check with
    more prompts."""
    return noted(rerun, "measures again with more evidence; no restart of the server meanwhile")
