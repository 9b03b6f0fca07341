"""One test per link of doctor's trace: the fix printed under a broken link belongs to what broke
it (authoritative config, file on disk, validation, loader, vLLM, server and completion,
acceptance), and a stage that could not tell is "cannot tell" with exit 26, never healthy.
Built StageResults shaped like the real stages' data (doctor.trace runs no remote command);
the same links on real hosts are in test_diagnosis_standin.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.source.authority import Authority
from dflash_provision.target import parse_target
from dflash_provision.verify.diagnosis import Cause, render_causes
from dflash_provision.verify.diagnosis import Verdict as CauseVerdict
from dflash_provision.verify.doctor import DoctorReport, Link, trace
from dflash_provision.verify.runtime_check import CheckReport, CheckSettings
from dflash_provision.verify.stages import StageResult, StageStatus
from testbed import samples
from tests.test_diagnosis import verdict_of

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
TARGET_MODEL = samples.REFERENCE_TARGET.read_bytes()
DRAFTER = "/root/models/Qwen3.6-27B-DFlash"
PUSH = f"dflash-provision push gpu1:{DRAFTER} --from x"
PASSED, FAILED = StageStatus.PASSED, StageStatus.FAILED
ARGV = ["vllm", "serve", "/root/models/Qwen3.6-27B", "--port", "8000"]
PROBE = {
    "transformers": "5.24.0",
    "effective": {"config": json.loads(REFERENCE)},
    "vllm": {"importable": True, "version": "0.32.0", "draft": {"aux_layer_ids": [2]}},
}


def good_stages() -> dict[str, StageResult]:
    return {
        "a": StageResult("a", "file on disk", PASSED, "the authoritative config",
                         data={"status": "present"}),
        "b": StageResult("b", "loader", PASSED, "the target loads the authoritative values",
                         data={"probe": PROBE, "loader_problems": [], "vllm_problems": []}),
        "c": StageResult("c", "running server", PASSED, "dflash", data={"argv": ARGV}),
        "d": StageResult("d", "completion", PASSED, "completion of 32 tokens returned"),
        "e": StageResult("e", "acceptance", PASSED, "acceptance 60%"),
    }  # fmt: skip


def doctor(
    *,
    authority: bytes = REFERENCE,
    disk: bytes | None = REFERENCE,
    model_config: bytes | None = None,
    **broken: StageResult,
) -> DoctorReport:
    check = CheckReport(f"gpu1:{DRAFTER}", 8000, "test")
    check.stages = list((good_stages() | broken).values())
    check.disk_bytes = disk
    return trace(
        check,
        parse_target(f"gpu1:{DRAFTER}"),
        Authority("test", authority),
        CheckSettings(),
        push_fix=PUSH,
        model_config=model_config,
    )


def link(report: DoctorReport, name: str) -> Link:
    return next(item for item in report.links if item.name == name)


def failed(key: str, summary: str, **data: Any) -> StageResult:
    return StageResult(key, key, FAILED, summary, [summary], data)


def test_authoritative_config_link_the_fix_is_at_the_source() -> None:
    no_swa = json.dumps({**json.loads(REFERENCE), "use_sliding_window": False}).encode()
    report = doctor(authority=no_swa, disk=no_swa)
    first = report.first_broken
    assert first is not None and first.name == "authoritative config"
    assert first.fix is not None and first.fix.startswith("correct the authoritative config at")


def test_file_on_disk_link_push_for_a_wrong_file_one_revision_for_weights_that_do_not_fit() -> None:
    report = doctor(a=failed("a", "differs", status="present", diff=["x: 1 → 2"]))
    assert link(report, "file on disk").fix == (
        f"{PUSH} && dflash-provision launch gpu1:{DRAFTER} --port 8000 --restart"
    )
    mismatch = "num_hidden_layers: config 5, weights 4"
    weights = {"checked": True, "ok": False, "mismatches": [mismatch], "detail": ""}
    report = doctor(a=failed("a", "weights do not fit", status="present", weights=weights))
    fix = link(report, "file on disk").fix or ""
    assert "ONE revision" in fix and not fix.startswith(PUSH)  # a push cannot fix weights
    assert report.exit_code == ExitCode.INVALID
    own = failed("a", "weights do not fit", status="present", weights=weights, failed_by="weights")
    own.fix = "put the weights of the config's revision in /m"  # stage a's own weights fix
    assert link(doctor(a=own), "file on disk").fix == own.fix
    report = doctor(a=failed("a", "no such directory", status="dir-missing", path="/m/config.json"))
    fix = link(report, "file on disk").fix or ""
    assert fix.startswith("dflash-provision status ") and "the drafter directory of" in fix


def test_validation_link_a_push_only_when_the_authoritative_config_fits_the_target() -> None:
    # the file on disk IS the authoritative config, but neither fits the target model's vocab
    small_vocab = json.dumps({**json.loads(TARGET_MODEL), "vocab_size": 1000}).encode()
    report = doctor(model_config=small_vocab)
    validation = link(report, "validation")
    assert validation.broken, validation.summary
    assert validation.fix is not None and PUSH not in validation.fix
    assert "does not fit the target model /root/models/Qwen3.6-27B" in validation.fix


def test_loader_link_the_fix_follows_why_the_loader_failed() -> None:
    # no transformers in the target's python: --python, not another cause's config fix
    probe = {**PROBE, "transformers": None}
    refused = "/usr/bin/python3 on the target cannot import transformers"
    b = failed("b", refused, probe=probe, loader_problems=[refused], vllm_problems=[])
    fix = link(doctor(b=b), "loader on the target").fix or ""
    assert "--python" in fix and "use_sliding_window" not in fix
    # a probe that could not run at all: a fix about the probe
    why = "the probe did not run with /opt/py on the target: sh: /opt/py: not found"
    fix = link(doctor(b=failed("b", why, python="/opt/py")), "loader on the target").fix or ""
    assert fix.startswith("dflash-provision status ")  # shows the python the server runs
    assert "the probe could not run on the target" in fix and "--python" in fix
    # fields the loader changes: the config fix
    b = failed("b", "loader", probe=PROBE, loader_problems=["sliding_window: null → 2048"],
               vllm_problems=[])  # fmt: skip
    fix = link(doctor(b=b), "loader on the target").fix or ""
    assert fix.startswith("dflash-provision validate ")  # names each field the loader changes
    assert "make the config survive it" in fix and "use_sliding_window" in fix


def test_vllm_link_the_fix_follows_the_problem() -> None:
    def fix_for(problem: str) -> str:
        b = failed("b", problem, probe=PROBE, loader_problems=[], vllm_problems=[problem])
        return link(doctor(b=b), "vLLM").fix or ""

    dropped = fix_for("vLLM's draft hf_config has no sliding_window (authoritative 2048)")
    assert "PR #40898" in dropped
    aux = fix_for("vLLM's auxiliary layer ids [1, 16], expected target_layer_ids + 1 = [2, 17]")
    assert "target_layer_ids + 1" in aux and "PR #40898" not in aux
    unresolved = fix_for("vLLM cannot resolve the draft config: no such model")
    assert "--model" in unresolved and "PR #40898" not in unresolved


def test_server_link_a_completion_that_never_answered_is_not_a_drafter_that_does_not_fit() -> None:
    from dflash_provision.verify.stage_traffic import Completion, stage_completion
    from dflash_provision.verify.stages import CheckContext

    ctx = CheckContext(
        transport=None,  # type: ignore[arg-type]  # stage d's verdict runs no command
        target=parse_target(f"gpu1:{DRAFTER}"),
        authority=Authority("test", REFERENCE),
        auth_doc=json.loads(REFERENCE),
        push_fix=PUSH,
    )
    silent = stage_completion(ctx, Completion(False, error="GET /metrics: timed out"), [])
    fix = link(doctor(d=silent), "running server").fix or ""
    assert "did not answer" in fix and "drafter does not fit" not in fix
    refused = stage_completion(ctx, Completion(False, error="dflash", status=500), [])
    assert "drafter does not fit" in (link(doctor(d=refused), "running server").fix or "")
    c = failed("c", "no vLLM server listens on port 8000")
    c.fix = f"dflash-provision launch gpu1:{DRAFTER} --model MODEL"
    assert link(doctor(c=c), "running server").fix == c.fix


OPEN, RULED_OUT = CauseVerdict.OPEN, CauseVerdict.RULED_OUT


def test_acceptance_link_the_fix_is_the_first_open_causes() -> None:
    ranked = (
        Cause("mask_token_id 248070 is not the token", "...", "take mask_token_id from X", OPEN),
        Cause("another target", "...", "validate Y", OPEN),
        Cause("the file on disk is not the authoritative config", "stage a passed (ok)", "push",
              RULED_OUT),
    )  # fmt: skip
    verdict = verdict_of({"acceptance_rate": 0.011, "per_position": [0.01]})
    verdict = verdict.with_causes("measured: every position is near zero", ranked)
    causes = render_causes(verdict)
    assert (
        causes[1]
        == "1. mask_token_id 248070 is not the token (...); fix: take mask_token_id from X"
    )
    e = StageResult("e", "acceptance", FAILED, "acceptance 1.1%", causes=causes, acceptance=verdict)
    report = doctor(e=e)
    assert report.first_broken is link(report, "acceptance")
    assert link(report, "acceptance").fix == "take mask_token_id from X"
    # a server that drafts nothing has no ranked causes: the fix points at its log
    silent = failed("e", "the server exports no spec-decode metrics: it is not speculating")
    fix = link(doctor(e=silent), "acceptance").fix or ""
    assert fix.startswith("dflash-provision logs ") and "the server does not draft" in fix
    # doctor --json lists the causes once: under the link, not again in the embedded check
    text = json.dumps(report.to_dict())
    assert all(text.count(json.dumps(cause)) == 1 for cause in causes)


def test_an_inconclusive_stage_is_cannot_tell_with_exit_26_never_healthy() -> None:
    e = StageResult("e", "acceptance", StageStatus.INCONCLUSIVE, "only 12 draft tokens")
    report = doctor(e=e)
    assert report.first_broken is None
    assert report.exit_code == ExitCode.INCONCLUSIVE == 26
    data = report.to_dict()
    assert data["ok"] is False and data["cannot_tell"] == ["acceptance"]
    # the same doctor again with twice the prompts, pasteable (PUSH's --from x is the source)
    assert (data["fix"] or "").startswith(
        f"dflash-provision doctor gpu1:{DRAFTER} --from x --port 8000 --prompts 6  # measures"
    ), data["fix"]
    # a broken link still outranks a link that cannot tell
    report = doctor(e=e, a=failed("a", "differs", status="present", diff=["x"]))
    assert report.exit_code == ExitCode.DRIFT


def test_doctor_text_says_cannot_tell_and_its_fix_never_nothing_broken(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dflash_provision.cli.doctor import _render

    e = StageResult("e", "acceptance", StageStatus.INCONCLUSIVE, "only 12 draft tokens")
    _render(doctor(e=e), False)
    out = capsys.readouterr().out
    assert "7 acceptance             cannot tell only 12 draft tokens" in out
    assert "nothing broken" not in out
    assert "cannot tell: acceptance: only 12 draft tokens" in out
    assert "fix: dflash-provision doctor " in out and "# measures again with more evidence" in out
