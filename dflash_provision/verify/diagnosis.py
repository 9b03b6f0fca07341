"""Why acceptance collapsed (stage e), ranked by what the stages measured.

Each candidate cause is judged against the evidence the earlier stages gathered:

    found      a stage saw this fault (weights that do not fit the config, the file on disk
               differs, N > block_size - 1, aux ids other than target_layer_ids + 1, a field the
               loader or vLLM drops): these come first
    open       no stage can see it, or it was not measured this time (then the line says why):
               ranked by whether the per-position curve's shape (vllm/curve.py) fits it
    ruled out  a passed stage covers it: listed last as "ruled out: <what showed it>", never
               as a fix to try

Every live cause line ends with the fix that belongs to it (``...; fix: ...``). A reference of
this drafter's earlier acceptance (stage e's ``reference`` / ``regression``) and the weights
check (stage a's ``weights``) are used when present and said to be absent otherwise.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_provision.server.fix_lines import noted, weights_fix
from dflash_provision.validation.invariants import block_size_of
from dflash_provision.validation.speculators_layout import runtime_view
from dflash_provision.verify.link_fixes import authority_source, validate_command
from dflash_provision.verify.stage_server import server_model
from dflash_provision.verify.stages import CheckContext, StageResult
from dflash_provision.vllm.curve import Curve, Shape, classify

if TYPE_CHECKING:
    from dflash_provision.verify.acceptance_gate import AcceptanceVerdict
    from dflash_provision.verify.reference import Reference

FIX_MARK = "; fix: "
RULED_OUT = "ruled out: "
MEASURED = "measured: "  # the first line: what the ranking rests on (no cause, no fix)
_ALL = frozenset(Shape)


class Verdict(enum.IntEnum):
    """Ordered: lower values are shown first."""

    FOUND = 0
    OPEN = 1
    RULED_OUT = 2


@dataclass(frozen=True)
class Cause:
    text: str  # what would be wrong
    seen: str  # what the stages saw about it
    fix: str  # the action that fixes exactly this cause
    verdict: Verdict
    fits: frozenset[Shape] = _ALL  # the curve shapes this cause produces

    def line(self, number: int) -> str:
        if self.verdict is Verdict.RULED_OUT:
            return f"{RULED_OUT}{self.seen}: {self.text}"
        return f"{number}. {self.text} ({self.seen}){FIX_MARK}{self.fix}"


def rank(causes: list[Cause], shape: Shape) -> list[Cause]:
    """found first, then open causes whose curve fits, then the other open ones, then the ruled
    out; the catalogue order (most telling first) within each group."""

    def key(item: tuple[int, Cause]) -> tuple[int, int, int]:
        index, cause = item
        misfit = 0 if shape is Shape.UNKNOWN or shape in cause.fits else 1
        return (int(cause.verdict), misfit if cause.verdict is Verdict.OPEN else 0, index)

    return [cause for _, cause in sorted(enumerate(causes), key=key)]


def render(causes: list[Cause]) -> list[str]:
    lines, number = [], 0
    for cause in causes:
        if cause.verdict is not Verdict.RULED_OUT:
            number += 1
        lines.append(cause.line(number))
    return lines


def first_fix(causes: Sequence[Cause]) -> str | None:
    """The fix of the first live cause (doctor's acceptance link): the causes are ranked."""
    return next((c.fix for c in causes if c.verdict is not Verdict.RULED_OUT), None)


def diagnose(
    ctx: CheckContext,
    earlier: dict[str, StageResult],
    verdict: AcceptanceVerdict,
    num_spec: int | None,
) -> AcceptanceVerdict:
    """``verdict`` with stage e's causes ranked by the evidence (see the module docstring) and
    the line saying what the ranking rests on."""
    figures = verdict.figures
    curve = classify(list(figures.per_position), figures.rate)
    facts = _Facts(ctx, earlier, verdict, num_spec, curve)
    causes = [
        _weights(facts),
        _file_on_disk(facts),
        _num_spec(facts),
        _aux_ids(facts),
        _loader(facts),
        _vllm_windows(facts),
        _vllm_changed(facts),
        _retrained(facts),
        _mask(facts),
        _runner(facts),
        _rope_or_target(facts),
        _prompts(facts),
    ]
    measured = f"{MEASURED}{curve.detail}; {facts.against_reference()}"
    ranked = rank([c for c in causes if c is not None], curve.shape)
    return verdict.with_causes(measured, tuple(ranked))


def render_causes(verdict: AcceptanceVerdict) -> list[str]:
    """Stage e's cause lines: what the ranking rests on, then each cause with its fix."""
    return [verdict.measured, *render(list(verdict.causes))] if verdict.measured else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class _Facts:
    """What the causes read: the context, the earlier stages and stage e's verdict."""

    ctx: CheckContext
    earlier: dict[str, StageResult]
    verdict: AcceptanceVerdict
    num_spec: int | None
    curve: Curve

    def stage(self, key: str) -> StageResult | None:
        return self.earlier.get(key)

    def said(self, key: str) -> str:
        stage = self.earlier.get(key)
        return f"stage {key} {stage.status.value} ({stage.summary})" if stage else "not checked"

    def by(self, key: str, what: str) -> str:
        """What stage ``key`` showed: "stage a passed (...)" when it passed."""
        stage = self.earlier.get(key)
        return f"stage {key} passed ({what})" if stage and stage.passed else f"stage {key}: {what}"

    @property
    def target(self) -> str:
        return shlex.quote(self.ctx.target.display())

    def restart(self, extra: str = "") -> str:
        """launch --restart for this target (its recorded launch, as it was, with ``extra``):
        the server reads its drafter once, at start-up."""
        container = self.ctx.container
        if container is not None:  # a server in a container: a new start of the container
            name = container.option.name
            if extra:  # another vLLM: another image, so a new container (launch --docker)
                return (
                    f"dflash-provision launch TARGET --docker IMAGE --container-name {name} "
                    "--restart, IMAGE one whose vLLM has them"
                )
            return shlex.join(container.tool_argv("restart", "--", name))
        c = self.stage("c")
        port = _dict(c.data if c else {}).get("port")
        where = f" --port {port}" if isinstance(port, int) else ""
        return f"dflash-provision launch {self.target}{where}{extra} --restart"

    @property
    def model(self) -> str | None:
        return server_model(self.ctx.server)

    def validate(self) -> str:
        return validate_command(self.ctx.target, self.model)

    @property
    def probe(self) -> dict[str, Any]:
        b = self.stage("b")
        return _dict(b.data.get("probe")) if b else {}

    @property
    def reference(self) -> Reference | None:
        return self.verdict.rules.reference

    def against_reference(self) -> str:
        ref = self.reference
        if ref is None:
            return "no acceptance reference for this drafter on this host yet"
        mean = self.verdict.figures.mean_length
        drop = self.verdict.regression
        when = ref.recorded_at or "an earlier check"
        now = f"{mean:.2f}" if mean is not None else "?"
        then = f"{ref.mean_acceptance_length:.2f}"
        lower = f", {drop:.0%} lower" if drop is not None else ""
        return f"mean acceptance length {now} vs {then} in the reference of {when}{lower}"


def _weights(f: _Facts) -> Cause:
    a = f.stage("a")
    weights = _dict(a.data.get("weights") if a else None)
    text = (
        "the weights do not fit the config or the target (a config of one revision beside "
        "weights of another, or a retrain of another shape)"
    )
    fix = weights_fix(f.ctx.push_fix, f.restart(), f.ctx.target)
    if not weights or not weights.get("checked"):
        why = str(weights.get("detail") or "no safetensors header check in this run")
        seen = why if "not checked" in why else f"not checked: {why}"
        return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.LOW}))
    mismatches = [str(m) for m in weights.get("mismatches") or []]
    if mismatches:
        seen = "stage a's safetensors headers: " + "; ".join(mismatches[:4])
        return Cause(text, seen, fix, Verdict.FOUND)
    seen = f.by("a", "the safetensors headers fit the config")
    return Cause(text, seen, fix, Verdict.RULED_OUT)


def _retrained(f: _Facts) -> Cause:
    """Weights of the right shapes but another training: no header check can see it; a lock
    that pins the drafter's files (fetch --all-files) can, by stage a's hashes on the host."""
    text = (
        "other weights of the same shapes (a retrain, an lm_head or embedding taken from the "
        "target)"
    )
    a = f.stage("a")
    files = _dict(a.data.get("files") if a else None)
    if not files:
        seen = "no stage reads the weights' values: their shapes are all a header check sees"
        fix = noted(
            f.restart(),
            "after comparing the safetensors' sha256 with the pinned revision's on the Hub and "
            "putting that revision's weights in place (a lock with push --all-files does it)",
        )
        return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.NEAR_ZERO, Shape.LOW}))
    fix = f"{a.fix if a and a.fix else f.ctx.push_fix + ' --all-files'} && {f.restart()}"
    entries = [_dict(item) for item in files.get("files") or []]
    bad = [e for e in entries if e.get("verdict") not in ("proved", "unchanged")]
    if files.get("status") == "in_sync":
        seen = f.by("a", f"every pinned file is the lock's: {files.get('detail')}")
        return Cause(text, seen, fix, Verdict.RULED_OUT)
    shown = "; ".join(f"{e.get('path')} {e.get('verdict')}" for e in bad[:4])
    seen = f"stage a's pinned files: {shown}"
    if files.get("status") == "drifted":
        return Cause(text, seen, fix, Verdict.FOUND)
    return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.NEAR_ZERO, Shape.LOW}))


def _file_on_disk(f: _Facts) -> Cause:
    a = f.stage("a")
    text = "the file on disk is not the authoritative config"
    fix = f"{f.ctx.push_fix} && {f.restart()}"
    if a is None:
        return Cause(text, "stage a not run", fix, Verdict.OPEN)
    if a.passed:
        return Cause(text, f"stage a passed ({a.summary})", fix, Verdict.RULED_OUT)
    disk = f.ctx.disk
    if a.data.get("diff") or disk is None or disk.data is None:
        return Cause(text, f.said("a"), fix, Verdict.FOUND)
    # stage a failed for another reason (its weights): the config itself is the authoritative one
    same = disk.data == f.ctx.authority.data
    seen = f.by("a", "the file on disk has the authoritative " + ("bytes" if same else "values"))
    return Cause(text, seen, fix, Verdict.RULED_OUT)


def _num_spec(f: _Facts) -> Cause:
    size, where = block_size_of(f.ctx.auth_doc)
    n = f.num_spec
    text = (
        f"too many speculative tokens (num_speculative_tokens {n}, at most {where} - 1): every "
        "draft past the block is rejected"
    )
    fix = f.restart(f" --num-speculative-tokens {size - 1}" if size else "")
    near_zero = frozenset({Shape.NEAR_ZERO})
    if n is None or size is None:
        seen = f"not known: the server's N {n}, {where} {size}"
        return Cause(text, seen, fix, Verdict.OPEN, near_zero)
    if n > size - 1:
        seen = f.by("c", f"the server's command line: {n} > {where} - 1 = {size - 1}")
        return Cause(text, seen, fix, Verdict.FOUND)
    seen = f.by("c", f"the server's command line: {n} <= {where} - 1 = {size - 1}")
    return Cause(text, seen, fix, Verdict.RULED_OUT)


def _aux_ids(f: _Facts) -> Cause:
    """target_layer_ids / their +1 offset, from the start-up log (c) and vLLM's own view (b)."""
    c = f.stage("c")
    want = f.ctx.expected_aux
    text = f"the drafter reads other target layers than target_layer_ids + 1 = {want}"
    fix = noted(
        f.restart(),
        "the server must read the provisioned target_layer_ids; a vLLM without PR #40727 reads "
        "the ids without the + 1",
    )
    near_zero = frozenset({Shape.NEAR_ZERO})
    log = _dict(c.data.get("log") if c else None)
    aux = log.get("aux_layers")
    if c is not None and c.failed and any(_aux_problem(line) for line in c.evidence):
        return Cause(text, f.said("c"), fix, Verdict.FOUND, near_zero)
    draft = _dict(_dict(f.probe.get("vllm")).get("draft"))
    if aux is not None and aux == want and log.get("aux_layers_source") != "model":
        source = log.get("aux_layers_source")
        seen = f.by("c", f"the start-up log shows aux layers {aux} from {source}")
        return Cause(text, seen, fix, Verdict.RULED_OUT, near_zero)
    if draft.get("aux_layer_ids") is not None and draft.get("aux_layer_ids") == want:
        seen = f"stage b: vLLM resolves aux layers {want} (the running server's log not read)"
        return Cause(text, seen, fix, Verdict.OPEN, near_zero)
    seen = "not verified: the server's start-up log was not read" if c else "stage c not run"
    return Cause(text, seen, fix, Verdict.OPEN, near_zero)


def _aux_problem(line: str) -> bool:
    """Stage c's lines that say the server reads other layers (stage_server._log_problems)."""
    return "aux layers" in line and ("expected target_layer_ids" in line or "fell back" in line)


def _loader(f: _Facts) -> Cause | None:
    b = f.stage("b")
    kinds = _layer_kinds(f)
    if kinds is not None and "sliding_attention" not in kinds and not (b and b.failed):
        return None  # no sliding-window layer to lose (a failed stage b is still shown)
    text = (
        "the target's loader normalises critical fields (use_sliding_window false nulls "
        "sliding_window, layer_types rebuilt): sliding-window layers run as full attention"
    )
    fix = noted(
        f.validate(),
        "names each field the loader changes: make the authoritative config survive it "
        "(use_sliding_window: true with sliding layers, layer_types written out), then "
        f"{f.ctx.push_fix} && {f.restart()}",
    )
    cliff = frozenset({Shape.CLIFF})
    effective = _dict(f.probe.get("effective"))
    problems = b.data.get("loader_problems") if b else None
    if b is None or not isinstance(problems, list):
        why = f"not measured: {b.summary}" if b else "stage b not run"
        return Cause(text, why, fix, Verdict.OPEN, cliff)
    if not f.probe.get("transformers") or not isinstance(effective.get("config"), dict):
        return Cause(text, f"not measured: {problems[0] if problems else b.summary}", fix,
                     Verdict.OPEN, cliff)  # fmt: skip
    if problems:
        return Cause(text, f"stage b: {problems[0]}", fix, Verdict.FOUND, cliff)
    seen = f.by("b", "the target's transformers keeps every critical field")
    return Cause(text, seen, fix, Verdict.RULED_OUT, cliff)


def _vllm_windows(f: _Facts) -> Cause | None:
    """vLLM runs the draft's sliding-window layers as full attention: a vLLM without per-layer
    DFlash sliding windows (before 0.25), or a conversion that drops the window fields (no PR
    #40898). Ruled out only when stage b saw that vLLM resolve every layer's window; not a cause
    at all for a drafter with no sliding-window layer."""
    kinds = _layer_kinds(f)
    if kinds is not None and "sliding_attention" not in kinds:
        return None
    b = f.stage("b")
    text = (
        "vLLM runs the draft's sliding-window layers as full attention (no per-layer DFlash "
        "sliding windows in that vLLM, or a conversion that drops the window fields)"
    )
    fix = noted(
        f.restart(),
        "after installing a vLLM with per-layer DFlash sliding windows that keeps the draft's "
        "window fields (0.25 or later, or a build with them) where the launch runs it",
    )
    cliff = frozenset({Shape.CLIFF})
    vllm = _dict(f.probe.get("vllm"))
    problems = [str(p) for p in (b.data.get("vllm_problems") or [])] if b else []
    windows = [p for p in problems if "window" in p or "layer_types" in p]
    if windows:
        return Cause(text, f"stage b: {windows[0]}", fix, Verdict.FOUND, cliff)
    if not vllm.get("importable") or not isinstance(vllm.get("draft"), dict):
        why = vllm.get("error") or "not probed"
        seen = f"not measured: vLLM not resolved by the probe's python ({why})"
        return Cause(text, seen, fix, Verdict.OPEN, cliff)
    draft = _dict(vllm.get("draft"))
    attention = _dict(draft.get("attention"))
    resolved = isinstance(draft.get("layers"), list) and not draft.get("layers_error")
    if b is None or b.data.get("window_unknown") or not resolved:
        why = draft.get("layers_error") or attention.get("error") or "no per-layer answer"
        seen = f"not measured: stage b cannot tell whether vLLM applies the windows ({why})"
        return Cause(text, seen, fix, Verdict.OPEN, cliff)
    seen = f.by("b", f"vLLM {vllm.get('version')} keeps every layer's window")
    return Cause(text, seen, fix, Verdict.RULED_OUT, cliff)


def _vllm_changed(f: _Facts) -> Cause | None:
    """Only with a reference: the vLLM version it was measured with against today's."""
    ref = f.reference
    if ref is None or not ref.vllm_version:
        return None
    c = f.stage("c")
    now = _dict(c.data.get("log") if c else None).get("engine_version") or _dict(
        f.probe.get("vllm")
    ).get("version")
    then = ref.vllm_version
    text = "the vLLM upgrade since the reference changed how the draft runs"
    fix = noted(
        f.restart(),
        f"with the reference's vLLM {then} installed where the launch runs it, to confirm",
    )
    seen = f"{f.against_reference()}; vLLM {then} then, {now or 'unknown'} now"
    if now is None or str(now) == str(then):
        return Cause(text, f"the same vLLM {then} as the reference", fix, Verdict.RULED_OUT)
    return Cause(text, seen, fix, Verdict.FOUND)


def _mask(f: _Facts) -> Cause:
    inner = _dict(f.ctx.auth_doc.get("dflash_config"))
    mask = inner.get("mask_token_id", f.ctx.auth_doc.get("mask_token_id"))
    a = f.stage("a")
    text = f"mask_token_id {mask} is not the token the drafter was trained with"
    where = "the file on disk has the authoritative value" if a and a.passed else f.said("a")
    # The drafter's own value: no stage can know which token it was trained with.
    seen = f"{where}; no stage can tell whether {mask} is the training token"
    fix = noted(
        f"dflash-provision diff {shlex.quote(authority_source(f.ctx.authority))} {f.target}",
        "shows the authoritative mask_token_id against the file the server loaded; take the "
        "right one from the published config of the weights' revision and correct the "
        "authoritative config",
    )
    return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.NEAR_ZERO}))


def _layer_kinds(f: _Facts) -> set[str] | None:
    """The attention kinds the drafter's layer_types name (None: no list to tell by)."""
    kinds = runtime_view(f.ctx.auth_doc).get("layer_types")  # either published layout
    return {str(k) for k in kinds} if isinstance(kinds, list) else None


def _runner(f: _Facts) -> Cause | None:
    kinds = _layer_kinds(f)
    if kinds is not None and not {"sliding_attention", "full_attention"} <= kinds:
        return None  # no mixed layout: the V1/V2 runner choice cannot touch this drafter
    draft = _dict(_dict(f.probe.get("vllm")).get("draft"))
    text = "the wrong vLLM model runner for this layout (mixed sliding/full layers need V2)"
    mixed = draft.get("mixed_layout_error")
    record = getattr(f.ctx.server, "record", None)
    names = list(getattr(record, "env_names", None) or [])
    if mixed:
        seen = "stage b: mixed layout; the server's env " + (
            "sets VLLM_USE_V2_MODEL_RUNNER" if "VLLM_USE_V2_MODEL_RUNNER" in names else
            "is not known to set VLLM_USE_V2_MODEL_RUNNER"
        )  # fmt: skip
    else:
        seen = "not measured by a stage"
    fix = noted(f.restart(), "launch sets VLLM_USE_V2_MODEL_RUNNER=1 for mixed layouts")
    return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.NEAR_ZERO}))


def _rope_or_target(f: _Facts) -> Cause:
    text = (
        "another target, revision or quantization than the drafter was trained for (RoPE "
        "settings, hidden size, vocabulary)"
    )
    seen = f"{f.against_reference()}; the server serves {f.model or 'an unknown model'}"
    fix = noted(
        f.validate(),
        "then use the drafter revision made for this target and its quantization (pin it with "
        "fetch --revision)",
    )
    return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.LOW, Shape.NEAR_ZERO}))


def _prompts(f: _Facts) -> Cause:
    text = "the prompt distribution: the smoke prompts are far from the drafter's training data"
    fix = noted(
        f"dflash-provision history --host {shlex.quote(f.ctx.target.machine)} --op runtime-check",
        "judge against a reference, not an absolute gate: a passing runtime-check records this "
        "drafter's figures (listed here), later checks compare with them",
    )
    ref = f.reference
    if ref is not None:
        seen = f"the reference ran the same fixed smoke prompts: {f.against_reference()}"
        return Cause(text, seen, fix, Verdict.RULED_OUT)
    seen = f"{f.against_reference()} to compare with"
    return Cause(text, seen, fix, Verdict.OPEN, frozenset({Shape.LOW}))
