"""``runtime-check`` core: run stages a-e against one target and return a CheckReport.

Order and cost (exec = one remote command; request = one HTTP request through the transport):

    (port)                 without --port: 1 exec (the launch records: which port runs
                           TARGET's drafter, see locate.py)
    a  file on disk        2 execs (read; the safetensors headers beside it)
    c  find the server     1 exec (state of the port) + 1 exec (this launch's start-up part of
                           its log, when we know the log)
    b  probe               1 exec (the target's python: transformers, and vLLM when importable;
                           the target model comes from the server found in c)
    d  completion          GET /v1/models, GET /version, GET /metrics (before), the first
                           smoke prompt
    e  acceptance          the other smoke prompts, GET /metrics (after); judged on the
                           replies' own per-request figures when every one carries them,
                           else the counters (vllm/request_acceptance.py); the acceptance
                           reference of the server's vLLM version from the local history
                           store (no remote cost; verify/reference_version.py); for a
                           drafter with sliding layers, one prompt longer than the window
                           (POST /tokenize, 2 x GET /metrics, 1 completion: long_context.py)

c's lookup runs before b so that b can hand vLLM the model the server really serves and use the
python that runs it. d's completion is also e's first smoke prompt.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ConfigInvalid, DflashProvisionError, ExitCode
from dflash_provision.history.store import default_store
from dflash_provision.server.access import ReplyUnusable, open_server, too_large
from dflash_provision.server.locate import choose_port
from dflash_provision.server.process import find_server, read_log, read_startup_log
from dflash_provision.server.readiness import fatal_lines
from dflash_provision.validation.validate import parse_config
from dflash_provision.verify import long_context, reference
from dflash_provision.verify.acceptance_gate import AcceptanceRules, AcceptanceVerdict, Observed
from dflash_provision.verify.link_fixes import restart_command
from dflash_provision.verify.reference import reference_key, vllm_version
from dflash_provision.verify.reference_version import lookup, server_version
from dflash_provision.verify.speculators_serve import served_spec
from dflash_provision.verify.stage_disk import stage_file, stage_loader
from dflash_provision.verify.stage_server import server_model, server_spec, stage_server
from dflash_provision.verify.stage_traffic import (
    SMOKE_PROMPTS,
    Completion,
    complete,
    cut_short,
    endpoint_failed,
    served_model_id,
    stage_acceptance,
    stage_completion,
)
from dflash_provision.verify.stages import (
    STAGE_NAMES,
    CheckContext,
    StageResult,
    StageStatus,
    skipped,
)
from dflash_provision.vllm.log import parse_startup
from dflash_provision.vllm.metrics import acceptance, spec_counters
from dflash_provision.vllm.request_acceptance import choose

if TYPE_CHECKING:
    from dflash_provision.server.container_server import ContainerServer
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

DEFAULT_PORT = 8000
DEFAULT_MIN_ACCEPTANCE = 0.10
DEFAULT_PROMPTS = 3
DEFAULT_MAX_TOKENS = 32
# Fewer draft tokens than this in the window decide nothing (inconclusive). The default smoke
# prompts make far more: 3 x 32 tokens gave 84 draft tokens at 100 % acceptance with K=4 on the
# tiny real vLLM model (one 40-token completion: 32 to 156), 180 on the stand-in (K=15).
DEFAULT_MIN_DRAFT_TOKENS = 32
LOG_LINES = 2000
LOG_BYTES = 512 * 1024
METRICS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class CheckSettings:
    """How to check: which port, the acceptance gate, the smoke prompts, where python lives."""

    port: int = DEFAULT_PORT
    # True (no --port): the port launch started TARGET's drafter on (its launch record), else
    # ``port``; resolved once per target by ``with_port``.
    find_port: bool = False
    min_acceptance: float = DEFAULT_MIN_ACCEPTANCE
    prompts: int = DEFAULT_PROMPTS
    max_tokens: int = DEFAULT_MAX_TOKENS
    timeout: float = 60.0  # each remote command and each HTTP request
    python: str | None = None  # the target's python for the probe (default: the server's)
    model: str | None = None  # the target model for vLLM's resolution (default: the server's)
    # Stage b starts the target's python and imports transformers there (2-5 s per host on a
    # 2-core machine): frequent fleet checks for alerting may leave it to a slower schedule.
    probe: bool = True
    min_draft_tokens: int = DEFAULT_MIN_DRAFT_TOKENS
    max_regression: float | None = None  # gate on the drop vs the reference (None: warn only)
    # Acceptance references in the history store (verify/reference.py): compare with the
    # newest one and record a pass; reset_reference records without comparing.
    references: bool = False
    reset_reference: bool = False
    # Stage e's long prompt past a sliding-window drafter's window (verify/long_context.py).
    long_context: bool = True
    # Stage a and a lock that pins the drafter's other files: hash each one on the host even
    # when a recorded proof says it is unchanged.
    rehash_files: bool = False


@dataclass
class CheckReport:
    """Every stage's result for one target, in order a-e, with timings."""

    target: str
    port: int
    authority: str
    stages: list[StageResult] = field(default_factory=list)
    duration_s: float = 0.0
    smoke_s: float = 0.0  # time spent in smoke completions (d's prompt included)
    disk_bytes: bytes | None = None  # the file stage a read (doctor validates it)

    @property
    def ok(self) -> bool:
        """Every stage passed or was skipped by choice: an inconclusive stage is not ok."""
        return not any(stage.failed or stage.inconclusive for stage in self.stages)

    def stage(self, key: str) -> StageResult | None:
        return next((s for s in self.stages if s.key == key), None)

    @property
    def first_failure(self) -> StageResult | None:
        return next((s for s in self.stages if s.failed), None)

    @property
    def acceptance_verdict(self) -> AcceptanceVerdict | None:
        """Stage e's verdict by the acceptance gate (None: no figures were measured)."""
        stage = self.stage("e")
        return stage.acceptance if stage is not None else None

    @property
    def acceptance(self) -> float | None:
        """Stage e's rate, when it is evidence: an inconclusive verdict's figures (too few draft
        tokens) stay in its data but are no rate to show or alert on."""
        verdict = self.acceptance_verdict
        return verdict.rate if verdict is not None else None

    @property
    def exit_code(self) -> ExitCode:
        """0 all passed; RUNTIME_CHECK_FAILED when a-d failed (the server does not run what was
        provisioned); ACCEPTANCE_LOW when only the acceptance gate failed; INCONCLUSIVE when no
        stage failed but one could not tell."""
        failed = [s.key for s in self.stages if s.failed]
        if failed == ["e"]:
            return ExitCode.ACCEPTANCE_LOW
        if failed:
            return ExitCode.RUNTIME_CHECK_FAILED
        if any(s.inconclusive for s in self.stages):
            return ExitCode.INCONCLUSIVE
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "port": self.port,
            "authority": self.authority,
            "ok": self.ok,
            "exit_code": int(self.exit_code),
            "acceptance_rate": self.acceptance,
            "duration_s": round(self.duration_s, 3),
            "smoke_s": round(self.smoke_s, 3),
            "stages": [s.to_dict() for s in self.stages],
        }


def push_fix_command(target: Target, authority_args: str) -> str:
    """The push that puts the authoritative bytes on this target."""
    return f"dflash-provision push {shlex.quote(target.display())} {authority_args}".rstrip()


def _timed(run: Callable[[], StageResult]) -> StageResult:
    started = time.monotonic()
    result = run()
    result.duration_s = time.monotonic() - started
    return result


def target_python(settings: CheckSettings, server: Any) -> str:
    """The python to probe with: --python, else the one that runs the server (its launch record,
    or argv[0] when the server runs as ``python ... serve``), else python3 on PATH."""
    if settings.python:
        return settings.python
    record = getattr(server, "record", None)
    if record is not None and getattr(record, "python", None):
        return str(record.python)
    argv = [str(arg) for arg in getattr(server, "argv", None) or []]
    if argv and posixpath.basename(argv[0]).startswith("python"):
        return argv[0]
    return "python3"


def run_check(
    transport: Transport,
    target: Target,
    authority: Authority,
    settings: CheckSettings,
    *,
    push_fix: str,
    container: ContainerServer | None = None,
) -> CheckReport:
    """Run stages a-e (see the module docstring). Connection failures propagate.

    ``container``: the server runs in that Docker/Podman container on ``transport``'s machine
    and ``target`` is the provisioned directory on it: stage a reads it there, stages b-e go
    through ``docker exec`` with the directory as the container sees it (container_server.py)."""
    started = time.monotonic()
    if container is None:
        settings = with_port(transport, target, settings)
    elif settings.find_port:
        settings = replace(settings, port=container.port()[0], find_port=False)
    ctx = CheckContext(
        transport=transport,
        target=target,
        authority=authority,
        auth_doc=_authoritative_doc(authority),
        push_fix=push_fix,
        timeout=settings.timeout,
        rehash_files=settings.rehash_files,
    )
    report = CheckReport(target.display(), settings.port, authority.label)
    if container is not None:
        report.target = f"{target.display()} (server in {container.option.display()})"
    stage_a = _timed(lambda: stage_file(ctx))
    report.disk_bytes = ctx.disk.data if ctx.disk is not None else None
    if container is not None:  # the server's side: in the container, its path for the drafter
        ctx.transport, ctx.target = container.transport, container.inside_target(target)
        ctx.container = container
    looked_up = time.monotonic()
    ctx.server = find_server(ctx.transport, settings.port, timeout=settings.timeout)
    ctx.log = _read_log(ctx)
    lookup_s = time.monotonic() - looked_up
    python = target_python(settings, ctx.server)
    model = settings.model or server_model(ctx.server)
    num_spec = (
        served_spec(ctx, ctx.server, server_spec(ctx.server))[0].get("num_speculative_tokens")
        if ctx.server
        else None
    )
    if container is not None and container.inside is None:
        # Nothing to load in there: the provisioned file is not what this container can read.
        # Stage c names the two directories; b cannot tell (never a pass, never the cause).
        why = f"cannot tell: {container.not_visible()}"
        stage_b = StageResult("b", STAGE_NAMES["b"], StageStatus.INCONCLUSIVE, why, [why])
    elif settings.probe:
        stage_b = _timed(lambda: stage_loader(ctx, python, model, _int(num_spec)))
        stage_b = _guessed_python(ctx, stage_b, settings)
    else:
        stage_b = skipped("b", "skipped (--skip-loader): the target's loader and vLLM not asked")
    stage_c = _timed(lambda: stage_server(ctx, settings.port))
    stage_c.duration_s += lookup_s  # finding the server and reading its log belong to c
    report.stages = [stage_a, stage_b, stage_c]
    if ctx.server is None:
        report.stages += [skipped("d", "no server to ask"), skipped("e", "no server to ask")]
    else:
        report.stages += _serve_stages(ctx, settings, python, model, report, _int(num_spec))
    report.duration_s = time.monotonic() - started
    _record_reference(ctx, settings, report, model)
    return report


def _guessed_python(
    ctx: CheckContext, stage_b: StageResult, settings: CheckSettings
) -> StageResult:
    """No server and no --python: the probe ran a guessed ``python3``. That it has no
    transformers says nothing about the python that would run vLLM, so stage b cannot tell (it
    did not fail) and stage c's "no vLLM server listens" leads the report."""
    probe = ctx.probe
    if ctx.server is not None or settings.python or not stage_b.failed:
        return stage_b
    if not isinstance(probe, dict) or probe.get("transformers"):
        return stage_b  # the probe did not run, or python3 loads the drafter: b's own verdict
    stage_b.status = StageStatus.INCONCLUSIVE
    stage_b.summary = (
        "cannot tell: no server names its python and python3 on the target cannot import "
        "transformers (give --python with the python that runs vLLM)"
    )
    return stage_b


def with_port(transport: Transport, target: Target, settings: CheckSettings) -> CheckSettings:
    """``settings`` with its port chosen: --port, else TARGET's launch record (one exec), else
    8000; UsageError when TARGET's drafter runs on several ports."""
    if not settings.find_port:
        return settings

    choice = choose_port(transport, target, None, timeout=settings.timeout)
    return replace(settings, port=choice.port, find_port=False)


def _authoritative_doc(authority: Authority) -> dict[str, Any]:
    """The authoritative config parsed; ConfigInvalid when it is not a JSON object (nothing can
    be compared with it)."""
    parsed = parse_config(authority.data, what=authority.label)
    if parsed.doc is None:
        raise ConfigInvalid(f"the authoritative config: {parsed.findings[0].message}")
    return parsed.doc


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_log(ctx: CheckContext) -> Any:
    """The server's start-up facts from its log (ours: the launch record names it): this
    launch's part of the log from its beginning, read with vllm/log.py's rules."""
    server = ctx.server
    if server is not None and server.record is None and ctx.container is not None:
        return _container_log(ctx)
    if server is None or server.record is None:
        return None
    tail = read_startup_log(ctx.transport, server.record, max_bytes=LOG_BYTES, timeout=ctx.timeout)
    if not tail.present:
        return None
    ctx.log_size = tail.size
    return parse_startup(tail.text)


def _container_log(ctx: CheckContext) -> Any:
    """The start-up facts from ``docker logs`` of this start of the container, when the server
    is its main process (else what it prints is not Docker's log: None, as for a server that
    launch did not start)."""
    if not ctx.container.is_main_process(ctx.server):
        return None
    text = ctx.container.startup_log(max_bytes=LOG_BYTES, timeout=ctx.timeout)
    ctx.log_size = len(text.encode("utf-8"))
    return parse_startup(text)


def _serve_stages(
    ctx: CheckContext,
    settings: CheckSettings,
    python: str,
    model: str | None,
    report: CheckReport,
    num_spec: int | None,
) -> list[StageResult]:
    """d and e over one access to the server's port."""
    timeout = settings.timeout
    with open_server(ctx.transport, settings.port, python=python) as access:
        started = time.monotonic()
        try:
            model_id = served_model_id(access, model, timeout)
            ctx.server_version = server_version(access, timeout)
            before = spec_counters(_metrics_text(access, timeout))
            prompts = smoke_prompts(settings.prompts)
            first = _complete(access, model_id, prompts[0], settings.max_tokens, timeout)
        except ReplyUnusable as exc:  # /v1/models or /metrics dripped, too large, cut short
            stage_d = endpoint_failed(ctx, "d", exc)
            stage_d.duration_s = report.smoke_s = time.monotonic() - started
            return [stage_d, skipped("e", "no completion succeeded: nothing to measure")]
        except DflashProvisionError as exc:
            first, before, prompts = Completion(False, error=exc.message), None, []
        stage_d = stage_completion(ctx, first, _fatal_since(ctx))
        stage_d.duration_s = time.monotonic() - started
        if not first.ok or before is None:
            report.smoke_s = stage_d.duration_s
            return [stage_d, skipped("e", "no completion succeeded: nothing to measure")]
        started_e = time.monotonic()
        tokens, own, answers = first.tokens, 1, [first.per_request]
        for prompt in prompts[1:]:
            more = _complete(access, model_id, prompt, settings.max_tokens, timeout)
            tokens += more.tokens if more.ok else 0
            own += 1 if more.ok else 0
            answers += [more.per_request] if more.ok else []
        report.smoke_s = time.monotonic() - started
        try:
            after = spec_counters(_metrics_text(access, timeout))
        except ReplyUnusable as exc:
            return [stage_d, endpoint_failed(ctx, "e", exc)]
        except DflashProvisionError as exc:
            why = f"the counters could not be read after the smoke prompts: {exc.message}"
            failed = StageResult("e", "acceptance", StageStatus.FAILED, why, [why])
            return [stage_d, failed]
        counted = acceptance(before, after, expected_max_drafts=tokens, own_requests=own)
        result, source = choose(answers, counted)
        assert result is not None  # the counters were read: choose falls back to them
        earlier = {s.key: s for s in report.stages}
        stage_e = stage_acceptance(
            ctx,
            result,
            rules=_rules(ctx, settings, prompts, result),
            observed=_observed(earlier, before, after, own=source.own),
            prompts=len(prompts),
            earlier=earlier,
            num_spec=num_spec,
            source=source,
        )
        long = _long_context(ctx, settings, access, model_id, stage_e)
        stage_e = long_context.apply(stage_e, long, **_fix_commands(ctx, settings))
        stage_e.duration_s = time.monotonic() - started_e
    return [stage_d, stage_e]


def _long_context(
    ctx: CheckContext, settings: CheckSettings, access: Any, model_id: str | None, e: StageResult
) -> long_context.LongContext:
    return long_context.measure(
        access,
        model_id,
        ctx.auth_doc,
        e.acceptance,
        enabled=settings.long_context,
        max_tokens=settings.max_tokens,
        timeout=settings.timeout,
    )


def _fix_commands(ctx: CheckContext, settings: CheckSettings) -> dict[str, str]:
    """The commands stage e's own fix lines name: the server's restart, and this check again
    (the target and authority as the push fix names them: the same source)."""
    source = shlex.split(ctx.push_fix)[2:]  # after `dflash-provision push`
    if ctx.container is not None:  # the server reads the drafter at start-up: a new start
        where = ctx.container.option
        restart = shlex.join(ctx.container.tool_argv("restart", "--", where.name))
        rerun = ["dflash-provision", "runtime-check", *source, "--container", where.display()]
        return {"restart": restart, "rerun": shlex.join(rerun)}
    rerun = ["dflash-provision", "runtime-check", *source, "--port", str(settings.port)]
    return {"restart": restart_command(ctx.target, settings.port), "rerun": shlex.join(rerun)}


def _observed(
    earlier: dict[str, StageResult], before: Any, after: Any, *, own: bool = False
) -> Observed:
    """What the server showed besides the figures: its metrics, and whether stage c found a
    sampling setting that makes them no evidence. With the check's own per-request figures
    (``own``) the server's metrics do not matter: the replies showed it speculating (vLLM
    returns them with --disable-log-stats too)."""
    c = earlier.get("c")
    not_evidence = c.data.get("figures_not_evidence") if c is not None else None
    return Observed(
        spec_counters=own or after.present,
        vllm_metrics=own or after.vllm_metrics or before.vllm_metrics,
        not_evidence=not_evidence if isinstance(not_evidence, str) else None,
    )


def _rules(
    ctx: CheckContext, settings: CheckSettings, prompts: list[str], result: Any
) -> AcceptanceRules:
    """Stage e's rules, with the newest acceptance reference for this host, drafter and prompts
    (when references are on and the window is a clean measurement)."""
    gate = AcceptanceRules(settings.min_acceptance, settings.min_draft_tokens)
    if not settings.references or settings.reset_reference:
        return gate
    if result.foreign_requests or result.foreign_drafts:
        note = (
            "not compared with the acceptance reference: other clients' traffic is in the figures"
        )
        return replace(gate, notes=(note,))
    key = reference_key(ctx.target, settings.port, ctx.authority, prompts, settings.max_tokens)
    try:
        reference, mismatch = lookup(default_store(), key, vllm_version(ctx))
    except DflashProvisionError as exc:  # a broken history store must not stop the check
        note = f"the acceptance reference could not be read: {exc.message}"
        return replace(gate, notes=(note,))
    return replace(
        gate,
        reference=reference,
        max_regression=settings.max_regression,
        reference_mismatch=mismatch,
    )


def _record_reference(
    ctx: CheckContext, settings: CheckSettings, report: CheckReport, model: str | None
) -> None:
    """Record a passing check's figures as the newest reference (verify/reference.py): only a
    clean window (no other traffic) that did not fall below its reference, unless reset."""
    verdict = report.acceptance_verdict
    if not settings.references or not report.ok or verdict is None or not verdict.passed:
        return
    if not verdict.clean_window:
        return
    drop = verdict.regression
    own_version = verdict.rules.reference_mismatch is None  # else: this version's first
    if drop is not None and drop > 0 and not settings.reset_reference and own_version:
        return
    prompts = smoke_prompts(settings.prompts)
    key = reference.reference_key(
        ctx.target, settings.port, ctx.authority, prompts, settings.max_tokens
    )
    figures = reference.figures(
        verdict.figures,
        prompts=prompts,
        max_tokens=settings.max_tokens,
        vllm_version=reference.vllm_version(ctx),
        target_model=model,
    )
    message = (
        f"acceptance reference: rate {verdict.rate or 0.0:.1%}, mean acceptance length "
        f"{verdict.mean_length or 0.0:.2f}, {len(prompts)} prompt(s) x "
        f"{settings.max_tokens} tokens, port {settings.port}, vLLM {figures['vllm_version'] or '?'}"
    )
    default_store().record_reference(key, figures, message=message, duration_s=report.duration_s)


def smoke_prompts(count: int) -> list[str]:
    return [SMOKE_PROMPTS[i % len(SMOKE_PROMPTS)] for i in range(max(1, count))]


def _complete(access: Any, model_id: str | None, prompt: str, tokens: int, timeout: float) -> Any:
    try:
        return complete(access, model_id, prompt, tokens, timeout)
    except DflashProvisionError as exc:
        return Completion(False, error=exc.message)


def _metrics_text(access: Any, timeout: float) -> str:
    """/metrics' text (bounded: METRICS_BYTES, one deadline); ReplyUnusable when it dripped past
    the deadline, was larger than the bound or was cut short."""
    reply = access.request("GET", "/metrics", timeout=timeout, max_bytes=METRICS_BYTES)
    if reply.truncated:
        raise too_large("GET", "/metrics", METRICS_BYTES)
    short = cut_short(reply)
    if short:
        raise ReplyUnusable(f"GET /metrics: {short}", step="http")
    if reply.status != 200:
        return ""
    return str(reply.body.decode("utf-8", "replace"))


def _fatal_since(ctx: CheckContext) -> list[str]:
    """Fatal lines the server logged since stage c read its log (a failed request logs its
    error as it answers), the most telling first (launch's own ranking: vLLM's DFlash errors,
    then an exception's line, before the traceback around it)."""
    if ctx.server is None or ctx.server.record is None or ctx.log_size is None:
        return []
    tail = read_log(
        ctx.transport,
        ctx.server.record,
        LOG_LINES,
        max_bytes=LOG_BYTES,
        offset=ctx.log_size,
        timeout=ctx.timeout,
    )
    return fatal_lines(tail.text, exited=False) if tail.present else []


__all__ = [
    "DEFAULT_MIN_ACCEPTANCE",
    "DEFAULT_PORT",
    "CheckReport",
    "CheckSettings",
    "StageStatus",
    "push_fix_command",
    "run_check",
]
