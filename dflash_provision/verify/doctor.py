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

import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.server.fix_lines import noted
from dflash_provision.validation.validate import validate_config
from dflash_provision.verify.diagnosis import first_fix
from dflash_provision.verify.link_fixes import (
    file_fix,
    inconclusive_fix,
    loader_fix,
    probe_fix,
    validation_fix,
    vllm_fix,
    weights_only,
)
from dflash_provision.verify.runtime_check import CheckReport, CheckSettings, run_check, with_port
from dflash_provision.verify.stage_disk import part
from dflash_provision.verify.stage_server import server_model
from dflash_provision.verify.stages import StageResult, StageStatus

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerServer
    from dflash_provision.source.authority import Authority
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

    @property
    def cannot_tell(self) -> bool:
        return self.status is StageStatus.INCONCLUSIVE

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
    def undecided(self) -> Link | None:
        """The first link that could not tell (shown only when nothing is broken)."""
        return next((link for link in self.links if link.cannot_tell), None)

    @property
    def exit_code(self) -> ExitCode:
        """The first broken link's code; INCONCLUSIVE when none is broken but one could not
        tell (never OK then); OK when every link holds."""
        broken = self.first_broken
        if broken is not None:
            return broken.exit_code
        return ExitCode.INCONCLUSIVE if self.undecided is not None else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        broken = self.first_broken
        unknown = self.undecided
        shown = broken or unknown
        check = self.check.to_dict()
        for stage in check["stages"]:
            # The causes are the links' (printed once): the embedded check points there.
            stage.pop("causes", None)
        return {
            "target": self.target,
            "ok": shown is None,
            "first_broken_link": broken.name if broken else None,
            "cannot_tell": [link.name for link in self.links if link.cannot_tell],
            "fix": shown.fix if shown else None,
            "exit_code": int(self.exit_code),
            "links": [link.to_dict() for link in self.links],
            "runtime_check": check,
        }


def diagnose(
    transport: Transport,
    target: Target,
    authority: Authority,
    settings: CheckSettings,
    *,
    push_fix: str,
    container: ContainerServer | None = None,
) -> DoctorReport:
    """Run the check, then read it as the pipeline's chain of links (``container``: the server
    runs there, see run_check)."""
    if container is None:  # one lookup; the fix lines name the port
        settings = with_port(transport, target, settings)
    elif settings.find_port:
        settings = replace(settings, port=container.port()[0], find_port=False)
    check = run_check(
        transport, target, authority, settings, push_fix=push_fix, container=container
    )
    c = check.stage("c")
    assert c is not None
    # the target model's path is the server's: read it where the server runs
    model_config = _target_model_config(container.transport if container else transport, c,
                                        settings)  # fmt: skip
    return trace(
        check, target, authority, settings, push_fix=push_fix, model_config=model_config,
        container=container,
    )  # fmt: skip


def trace(
    check: CheckReport,
    target: Target,
    authority: Authority,
    settings: CheckSettings,
    *,
    push_fix: str,
    model_config: bytes | None,
    container: ContainerServer | None = None,
) -> DoctorReport:
    """The links read from a finished check (no remote command): each with the fix that
    belongs to what broke it."""
    a, b, c, d, e = (check.stage(k) for k in "abcde")
    assert a is not None and b is not None and c is not None
    restart = _restart_fix(target, c, settings)
    if container is not None:  # the server reads the drafter at start-up: restart its container
        restart = shlex.join(container.tool_argv("restart", "--", container.option.name))
    model = settings.model or server_model(SimpleServer(c.data.get("argv") or []))
    rerun = _rerun_command(target, c, settings, push_fix)
    links = [
        _authoritative_link(authority),
        _file_link(a, push_fix, restart, target),
        _validation_link(check, authority, push_fix, model_config, target, model),
        _loader_link(b, target, model),
        _vllm_link(b, c, restart, target, model),
        _server_link(c, d, restart),
        _acceptance_link(e, target, restart) if e else _missing("acceptance"),
    ]
    for link in links:  # a stage that could not tell: measure again with more evidence
        if link.status is StageStatus.INCONCLUSIVE and not link.fix:
            link.fix = inconclusive_fix(rerun)
    return DoctorReport(target.display(), links, check)


def _from_stage(name: str, stage: StageResult, code: ExitCode, fix: str | None = None) -> Link:
    """A link that is one stage (a stage that could not tell gets its fix in ``trace``)."""
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


def _file_link(a: StageResult, push_fix: str, restart: str, target: Target) -> Link:
    """Stage a: the fix by what failed (the config, its absence, its weights, its reading)."""
    if not a.failed:
        return _from_stage("file on disk", a, ExitCode.DRIFT)
    code = ExitCode.INVALID if weights_only(a) else ExitCode.DRIFT
    return _from_stage("file on disk", a, code, fix=file_fix(a, push_fix, restart, target))


def _acceptance_link(e: StageResult, target: Target, restart: str) -> Link:
    """Stage e: the fix of the first cause still open (the causes are ranked by evidence); a
    server that drafts nothing at all has no ranked causes: its log says why."""
    fix = None
    if e.failed:
        causes = e.acceptance.causes if e.acceptance is not None else ()
        collapsed = e.data.get("long_context", {}).get("status") == "collapsed"
        fix = (
            first_fix(causes)
            or (e.fix if collapsed else None)
            or noted(
                f"dflash-provision logs {shlex.quote(target.display())}",
                f"the server does not draft: its log says why; then {restart}",
            )
        )
    return _from_stage("acceptance", e, ExitCode.ACCEPTANCE_LOW, fix=fix)


def _missing(name: str) -> Link:
    return Link(name, StageStatus.SKIPPED, "not reached")


def _rerun_command(target: Target, c: StageResult, settings: CheckSettings, push_fix: str) -> str:
    """This doctor again with twice the smoke prompts (the authority's options are the push
    fix's: the same source)."""
    port = c.data.get("port")
    port = port if isinstance(port, int) else settings.port
    source = shlex.split(push_fix)[3:]  # after `dflash-provision push TARGET`
    prompts = str(min(64, settings.prompts * 2))
    return shlex.join(
        ["dflash-provision", "doctor", target.display(), *source, "--port", str(port),
         "--prompts", prompts]
    )  # fmt: skip


def _restart_fix(target: Target, c: StageResult, settings: CheckSettings) -> str:
    """A server reads the drafter config once, at start-up: after a push it must restart."""
    port = c.data.get("port")
    port = port if isinstance(port, int) else settings.port
    return f"dflash-provision launch {shlex.quote(target.display())} --port {port} --restart"


@dataclass
class SimpleServer:
    """Just enough of a RunningServer for server_model()."""

    argv: list[str]
    record: Any = None


def _authoritative_link(authority: Authority) -> Link:
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
    model = settings.model or server_model(SimpleServer(c.data.get("argv") or []))
    if not model or not model.startswith("/") or "\n" in model:
        return None
    read = read_remote_config(
        transport, model.rstrip("/") + "/config.json", timeout=settings.timeout, metadata=False
    )
    return read.data if read.present else None


def _validation_link(
    check: CheckReport,
    authority: Authority,
    push_fix: str,
    target: bytes | None,
    place: Target,
    model: str | None,
) -> Link:
    """The file on disk through every validate layer (it may be wrong AND invalid), with the
    target model's config when it could be read. A push fixes it only when the authoritative
    config passes the same layers."""
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
        validation_fix(
            push_fix,
            validate_config(authority.data, label=authority.label, target=target).ok,
            place,
            model,
        ),
        ExitCode.INVALID,
    )


def _loader_link(b: StageResult, target: Target, model: str | None) -> Link:
    problems = b.data.get("loader_problems")
    if problems is None:  # the probe did not run: the whole stage says why
        fix = probe_fix(b.summary, target) if b.failed else None
        return _from_stage("loader on the target", b, ExitCode.RUNTIME_CHECK_FAILED, fix=fix)
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
        loader_fix(b, target, model),
    )


def _vllm_link(
    b: StageResult, c: StageResult, restart: str, target: Target, model: str | None
) -> Link:
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
            vllm_fix(str(problems[0]), restart, target, model),
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
