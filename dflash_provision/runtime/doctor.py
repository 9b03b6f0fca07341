"""``doctor``: the incident's whole investigation as one trace for one target.

It reads top to bottom along the config pipeline and names the FIRST broken link with the
command that fixes it (later links are shown too: they are often broken only because of it)::

    1 authoritative config    repo and commit sha (or file), sha256, and it validates
    2 file on disk            the target's bytes == the authoritative bytes      (stage a)
    3 validation              the file on disk through every validate layer
    4 loader on the target    the target's own transformers keeps the critical fields (stage b)
    5 vLLM                    its version, and its own resolution of the draft    (stage b)
    6 running server          command line and log: dflash, this drafter, N, aux ids (stage c)
                              and a real completion                               (stage d)
    7 acceptance              the smoke prompts' acceptance                       (stage e)

Built on runtime-check's stages: the same evidence, arranged as a chain instead of a checklist.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.runtime.check import CheckReport, CheckSettings, run_check, with_port
from dflash_provision.runtime.stage_disk import part
from dflash_provision.runtime.stage_server import server_model
from dflash_provision.runtime.stages import StageResult, StageStatus

if TYPE_CHECKING:
    from dflash_provision.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport


@dataclass
class Link:
    """One link of the pipeline: its state, what shows it, and the fix when it is broken."""

    name: str
    status: StageStatus
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None
    exit_code: ExitCode = ExitCode.RUNTIME_CHECK_FAILED  # doctor's exit when this link is first
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def broken(self) -> bool:
        return self.status is StageStatus.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "link": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
            "causes": self.causes,
            "warnings": self.warnings,
        }


@dataclass
class DoctorReport:
    target: str
    links: list[Link]
    check: CheckReport

    @property
    def first_broken(self) -> Link | None:
        return next((link for link in self.links if link.broken), None)

    @property
    def exit_code(self) -> ExitCode:
        broken = self.first_broken
        return broken.exit_code if broken else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        broken = self.first_broken
        return {
            "target": self.target,
            "ok": broken is None,
            "first_broken_link": broken.name if broken else None,
            "fix": broken.fix if broken else None,
            "exit_code": int(self.exit_code),
            "links": [link.to_dict() for link in self.links],
            "runtime_check": self.check.to_dict(),
        }


def diagnose(
    transport: Transport,
    target: Target,
    authority: Authority,
    settings: CheckSettings,
    *,
    push_fix: str,
) -> DoctorReport:
    """Run the check, then read it as the pipeline's chain of links."""
    settings = with_port(transport, target, settings)  # one lookup; the fix lines name the port
    check = run_check(transport, target, authority, settings, push_fix=push_fix)
    a, b, c, d, e = (check.stage(k) for k in "abcde")
    assert a is not None and b is not None and c is not None
    restart = _restart_fix(target, c, settings)
    links = [
        _authoritative_link(authority),
        _from_stage("file on disk", a, ExitCode.DRIFT, fix=f"{push_fix}, then {restart}"),
        _validation_link(check, push_fix, _target_model_config(transport, c, settings)),
        _loader_link(b, check),
        _vllm_link(b, c),
        _server_link(c, d, restart),
        _from_stage("acceptance", e, ExitCode.ACCEPTANCE_LOW) if e else _missing("acceptance"),
    ]
    return DoctorReport(target.display(), links, check)


def _from_stage(name: str, stage: StageResult, code: ExitCode, fix: str | None = None) -> Link:
    return Link(
        name,
        stage.status,
        stage.summary,
        list(stage.evidence),
        fix or stage.fix,
        code,
        list(stage.causes),
        list(stage.warnings),
    )


def _missing(name: str) -> Link:
    return Link(name, StageStatus.SKIPPED, "not reached")


def _restart_fix(target: Target, c: StageResult, settings: CheckSettings) -> str:
    """A server reads the drafter config once, at start-up: after a push it must restart."""
    argv = c.data.get("argv") or []
    model = settings.model or server_model(SimpleServer(argv)) or "MODEL"
    return (
        f"dflash-provision launch {shlex.quote(target.display())} --model {shlex.quote(model)} "
        f"--port {settings.port} --restart (the server read the old file at start-up)"
    )


@dataclass
class SimpleServer:
    """Just enough of a RunningServer for server_model()."""

    argv: list[str]
    record: Any = None


def _authoritative_link(authority: Authority) -> Link:
    from dflash_provision.validate import validate_config

    sha256 = authority.sha256
    evidence = [f"source {authority.label}"]
    if authority.commit_sha:
        evidence.append(f"commit {authority.commit_sha}")
    evidence.append(f"sha256 {sha256}")
    report = validate_config(authority.data, label=authority.label)
    evidence.append("layers: " + ", ".join(f"{k} {v}" for k, v in report.layers.items()))
    if report.ok:
        return Link("authoritative config", StageStatus.PASSED, authority.label, evidence)
    errors = [f"{f.layer}: {f.message}" for f in report.errors]
    return Link(
        "authoritative config",
        StageStatus.FAILED,
        f"{authority.label} itself fails validation: {errors[0]}",
        evidence + errors,
        "correct the authoritative config at its source (a pinned Hub revision, the --from file)",
        ExitCode.INVALID,
    )


def _target_model_config(
    transport: Transport, c: StageResult, settings: CheckSettings
) -> bytes | None:
    """The target model's config.json when the model is a directory on the target (one read),
    so validation can check hidden size, vocabulary and layer ids against it."""
    from dflash_provision.remote.ops import read_remote_config

    model = settings.model or server_model(SimpleServer(c.data.get("argv") or []))
    if not model or not model.startswith("/") or "\n" in model:
        return None
    read = read_remote_config(
        transport, model.rstrip("/") + "/config.json", timeout=settings.timeout, metadata=False
    )
    return read.data if read.present else None


def _validation_link(check: CheckReport, push_fix: str, target: bytes | None) -> Link:
    """The file on disk through every validate layer (it may be wrong AND invalid), with the
    target model's config when it could be read."""
    from dflash_provision.validate import validate_config

    if check.disk_bytes is None:
        return Link("validation", StageStatus.SKIPPED, "no file on disk to validate")
    report = validate_config(check.disk_bytes, label="file on disk", target=target)
    layers = ", ".join(f"{k} {v}" for k, v in report.layers.items())
    if report.ok:
        return Link("validation", StageStatus.PASSED, f"the file on disk validates ({layers})")
    errors = [f"{f.layer}: {f.path + ': ' if f.path else ''}{f.message}" for f in report.errors]
    return Link(
        "validation",
        StageStatus.FAILED,
        f"the file on disk fails {len(errors)} check(s): {errors[0]}",
        [f"layers: {layers}", *errors],
        push_fix,
        ExitCode.INVALID,
    )


def _loader_link(b: StageResult, check: CheckReport) -> Link:
    problems = b.data.get("loader_problems")
    if problems is None:  # the probe did not run: the whole stage says why
        return _from_stage("loader on the target", b, ExitCode.RUNTIME_CHECK_FAILED)
    probe = b.data.get("probe") or {}
    evidence = [f"python {probe.get('python')}, transformers {probe.get('transformers')}"]
    if not problems:
        return Link(
            "loader on the target",
            StageStatus.PASSED,
            "the target's transformers keeps every critical field",
            evidence,
        )
    return Link(
        "loader on the target",
        StageStatus.FAILED,
        problems[0],
        evidence + problems,
        "make the config survive the loader: e.g. use_sliding_window: true with sliding layers, "
        "layer_types written out (`dflash-provision validate FILE` names each field)",
    )


def _vllm_link(b: StageResult, c: StageResult) -> Link:
    probe = b.data.get("probe") or {}
    vllm = part(probe, "vllm")
    engine = (c.data.get("log") or {}).get("engine_version")
    version = vllm.get("version") or engine
    evidence = [f"vLLM {version or 'unknown'}" + (f" (server log: v{engine})" if engine else "")]
    problems = b.data.get("vllm_problems")
    if problems:
        return Link(
            "vLLM",
            StageStatus.FAILED,
            problems[0],
            evidence + problems,
            "use a vLLM build that keeps the DFlash draft fields (PR #40898: layer_types, "
            "sliding_window, use_sliding_window, max_window_layers) and ids + 1 (PR #40727)",
        )
    if not vllm.get("importable"):
        why = vllm.get("error") or "not probed"
        return Link(
            "vLLM", StageStatus.SKIPPED, f"not importable by the probe's python ({why})", evidence
        )
    return Link("vLLM", StageStatus.PASSED, "vLLM resolves the draft as authoritative", evidence)


def _server_link(c: StageResult, d: StageResult | None, restart: str) -> Link:
    if c.failed or d is None or not d.failed:
        link = _from_stage("running server", c, ExitCode.RUNTIME_CHECK_FAILED)
        if d is not None and d.passed:
            link.evidence.append(f"completion: {d.summary}")
        return link
    return _from_stage("running server", d, ExitCode.RUNTIME_CHECK_FAILED, fix=d.fix)


def report_json(report: DoctorReport) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str)
