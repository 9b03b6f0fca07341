"""runtime-check stages a (the file on disk) and b (the config as the target's own transformers
loads it, and vLLM's resolution of the draft where vLLM is importable there)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dflash_provision.errors import ExitCode
from dflash_provision.host_state.file_status import (
    PASSES_WITH_WARNING,
    Command,
    HostStatus,
    judge,
    passes,
)
from dflash_provision.host_state.weights_check import check_remote
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.server.drafter_files import (
    all_files_fix,
    check_drafter_files,
    evidence,
    wrong_files,
)
from dflash_provision.server.fix_lines import weights_fix
from dflash_provision.server.probe_run import run_probe_on
from dflash_provision.validation import effective
from dflash_provision.validation.diff import Change, render_changes, semantic_diff
from dflash_provision.validation.effective import CRITICAL_FIELDS
from dflash_provision.validation.speculators_layout import (
    file_field,
    is_speculators,
    runtime_view,
    tap_spacing_hint,
)
from dflash_provision.verify.link_fixes import restart_command
from dflash_provision.verify.stages import STAGE_NAMES, CheckContext, StageResult, StageStatus
from dflash_provision.vllm.features import (
    Judgement,
    judge_attention,
    judge_aux,
    judge_runners,
    serving_runners,
)
from dflash_provision.vllm.speculators_conversion import settle_unwritten

if TYPE_CHECKING:
    pass

# -- a: file on disk ---------------------------------------------------------------------------


def stage_file(ctx: CheckContext) -> StageResult:
    """a: the bytes at the target's config path are the authoritative bytes, and the weights
    beside them (their safetensors headers) fit the authoritative config; with a lock that pins
    the drafter's other files, each of them is the pinned one where it lies."""
    return _judge_pinned_files(ctx, _judge_weights(ctx, _stage_file_bytes(ctx)))


def _judge_pinned_files(ctx: CheckContext, result: StageResult) -> StageResult:
    """Add the pinned files (server/drafter_files.py, one exec) to a's verdict by
    runtime-check's row of files_status.EXIT_CODE: a wrong or unreadable file fails the stage
    (24), one that cannot be told leaves a passed stage inconclusive (26), never passed."""
    files = check_drafter_files(
        ctx.transport,
        ctx.target,
        ctx.authority,
        rehash=ctx.rehash_files,
        timeout=ctx.timeout,
    )
    if files is None:
        return result
    result.data["files"] = files.to_dict()
    result.evidence += evidence(files)
    code = files.exit_code(Command.RUNTIME_CHECK)
    if code is ExitCode.OK:
        return result
    first = f"the drafter's files are not the pinned commit's: {wrong_files(files)}"
    if code is ExitCode.INCONCLUSIVE:
        first = "cannot tell whether the drafter's files are the pinned commit's: " + (
            wrong_files(files)
        )
    if not result.passed and not result.inconclusive:
        result.summary += f"; and {first}"
        if result.fix == ctx.push_fix and code is not ExitCode.INCONCLUSIVE:
            result.fix = all_files_fix(ctx.push_fix)  # one push makes the config and files right
        return result
    result.summary = first
    if code is ExitCode.INCONCLUSIVE:
        result.status = StageStatus.INCONCLUSIVE
        result.fix = "raise --command-timeout (a second check relies on the proofs of the first)"
    else:
        result.status = StageStatus.FAILED
        result.fix = all_files_fix(ctx.push_fix)
    result.data["failed_by"] = "files"
    return result


def _judge_weights(ctx: CheckContext, result: StageResult) -> StageResult:
    """Add the weights check (one exec) to a's verdict: a mismatch fails the stage; weights
    that could not be read are a warning (not a pass of that check); no weights, a note."""
    weights = check_remote(ctx.transport, ctx.target.model_dir, ctx.auth_doc, timeout=ctx.timeout)
    result.data["weights"] = weights.to_dict()
    evidence = [f"weights: {weights.detail}", *(f"weights: {n}" for n in weights.notes)]
    if weights.failed:
        evidence += [f"weights: {line}" for line in weights.mismatches]
    result.evidence += evidence
    if not weights.checked and weights.detail.startswith("weights not checked"):
        result.warnings.append(weights.detail)
    if not weights.failed:
        return result
    first = f"the weights do not fit the authoritative config: {weights.mismatches[0]}"
    if result.passed:
        result.status = StageStatus.FAILED
        result.summary = first + (
            f" (+{len(weights.mismatches) - 1} more)" if len(weights.mismatches) > 1 else ""
        )
        result.fix = weights_fix(ctx.push_fix, restart_command(ctx.target), ctx.target)
        result.data["failed_by"] = "weights"  # the bytes are right: pushing them fixes nothing
    else:
        result.summary += f"; and {first}"
    return result


def _stage_file_bytes(ctx: CheckContext) -> StageResult:
    """a's first half: the file at the target's config path, judged (file_status.judge) and
    passed or failed by runtime-check's row of file_status.EXIT_CODE."""
    name = STAGE_NAMES["a"]
    read = read_remote_config(ctx.transport, ctx.target.config_path, timeout=ctx.timeout)
    ctx.disk = read
    judgement = judge(read, ctx.authority)
    data: dict[str, Any] = {
        "path": read.path,
        "status": read.status.value,
        "sha256": read.sha256,
        "file_status": judgement.status.value,
    }
    data["authoritative"] = ctx.authority.label
    if not read.present or read.data is None:
        return StageResult(
            "a",
            name,
            StageStatus.FAILED,
            read.describe(),
            [read.describe()],
            data,
            fix=ctx.push_fix,
        )
    diff = judgement.diff
    evidence = [f"{read.path}: sha256 {read.sha256}", f"authoritative {ctx.authority.label}"]
    if judgement.status is HostStatus.IN_SYNC:
        return StageResult(
            "a",
            name,
            StageStatus.PASSED,
            f"{read.path} is the authoritative config",
            evidence,
            data,
        )
    data["diff"] = diff.lines if diff else []
    if passes(Command.RUNTIME_CHECK, judgement.status):
        # Same meaning: every loader sees the same values, but the proof by sha256 is lost.
        summary = f"{read.path}: same values as the authoritative config, other bytes"
        warned = judgement.status in PASSES_WITH_WARNING[Command.RUNTIME_CHECK]
        return StageResult(
            "a",
            name,
            StageStatus.PASSED,
            summary,
            evidence,
            data,
            warnings=[
                f"{judgement.status.value}: {summary}; `{ctx.push_fix}` writes the exact bytes"
            ]
            if warned
            else [],
        )
    count = (len(diff.changes) if diff else 0) or 1
    summary = (
        f"{read.path} differs from {ctx.authority.label} ({count} field(s); disk → authoritative)"
    )
    lines = diff.lines if diff else []
    return StageResult(
        "a", name, StageStatus.FAILED, summary, evidence + lines, data, fix=ctx.push_fix
    )


# -- b: loader-effective config and vLLM's resolution on the target ----------------------------


def run_probe(
    ctx: CheckContext, python: str, model: str | None, num_spec: int | None
) -> dict[str, Any] | str:
    """Run the probe on the target. The parsed JSON object, or a one-line error."""
    return run_probe_on(ctx.transport, ctx.target.model_dir, python, model, num_spec, ctx.timeout)


def _critical(doc: dict[str, Any]) -> dict[str, Any]:
    return {name: doc[name] for name in CRITICAL_FIELDS if name in doc}


def compare_effective(auth_doc: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """Critical fields of the authoritative config that the target's loader does not hold,
    as ``path: loaded on target → authoritative`` lines, plus rope and window coherence."""
    wanted = _critical(auth_doc)
    got = {name: loaded[name] for name in wanted if name in loaded}
    lines = render_changes(semantic_diff(got, wanted))
    # effective.py's checks by meaning (rope settings, sliding layers without a window) read a
    # config object by attribute: the probe's dict, seen the same way.
    seen_as_config = SimpleNamespace(**loaded)
    lines += [f.message for f in effective._check_rope(auth_doc, seen_as_config)]
    lines += [f.message for f in effective._check_coherence(seen_as_config)]
    return lines


def compare_vllm_draft(ctx: CheckContext, draft: dict[str, Any], version: str = "") -> list[str]:
    """vLLM's own view of the draft vs the authoritative config: runners, aux ids, windows,
    hf_config (the problems; :func:`judge_vllm_draft` also returns what it cannot tell)."""
    return judge_vllm_draft(ctx, draft, version).problems


def judge_vllm_draft(ctx: CheckContext, draft: dict[str, Any], version: str = "") -> Judgement:
    """What the target's vLLM runs (vllm/features.py, from the probe's feature detection) against
    the authoritative config, plus the draft hf_config's window fields."""
    auth = runtime_view(ctx.auth_doc)  # the speculators layout as vLLM converts it
    named = version or "on the target"
    if isinstance(draft.get("runners"), dict):
        result = judge_runners(draft, named)
        result.extend(judge_aux(draft, ctx.target_layer_ids, named))
    else:  # an older probe's answer: the one aux helper it called
        result = Judgement(problems=_aux_problems(ctx, draft))
    result.extend(judge_attention(draft, auth, named))
    hf_config = draft.get("hf_config")
    hf_config = hf_config if isinstance(hf_config, dict) else {}
    for name in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"):
        if name not in auth:
            continue
        if name not in hf_config:
            result.problems.append(
                f"vLLM's draft hf_config has no {name} (authoritative {json.dumps(auth[name])}): "
                "this vLLM build drops it (speculators conversion without PR #40898)"
            )
            result.window_problem = True
        elif hf_config[name] != auth[name]:
            result.problems.append(
                f"vLLM's draft hf_config {name} {json.dumps(hf_config[name])}, authoritative "
                f"{json.dumps(auth[name])}"
            )
            result.window_problem = True
    return result


def _aux_problems(ctx: CheckContext, draft: dict[str, Any]) -> list[str]:
    aux = draft.get("aux_layer_ids")
    if ctx.expected_aux is not None and aux is None:
        why = f" ({draft['aux_error']})" if draft.get("aux_error") else ""
        return [
            "vLLM takes no auxiliary layer ids from this config: it falls back to the model's "
            f'defaults ("from model"), expected target_layer_ids + 1 = {ctx.expected_aux}{why}'
        ]
    if ctx.expected_aux is not None and aux != ctx.expected_aux:
        return [
            f"vLLM's auxiliary layer ids {aux}, expected target_layer_ids + 1 = {ctx.expected_aux}"
        ]
    return []


def part(probe: dict[str, Any], name: str) -> dict[str, Any]:
    """One part of the probe's answer as an object ({} when absent or of another type)."""
    value = probe.get(name)
    return value if isinstance(value, dict) else {}


def _layers_of(draft: dict[str, Any]) -> list[dict[str, Any]]:
    """The probe's per-layer entries that are objects (its JSON is checked, not trusted)."""
    layers = draft.get("layers")
    return [item for item in layers if isinstance(item, dict)] if isinstance(layers, list) else []


def stage_loader(
    ctx: CheckContext, python: str, model: str | None, num_spec: int | None
) -> StageResult:
    """b: the config as the target's transformers loads it, and vLLM's resolution there."""
    name = STAGE_NAMES["b"]
    probe = run_probe(ctx, python, model, num_spec)
    if isinstance(probe, dict) and probe.get("error") and "effective" not in probe:
        probe = f"the probe refused its arguments: {probe['error']}"
    if isinstance(probe, str):
        return StageResult("b", name, StageStatus.FAILED, probe, [probe], {"python": python})
    ctx.probe = probe
    evidence = [
        f"python {probe.get('python')} ({python}), transformers {probe.get('transformers')}"
    ]
    if probe.get("cached") is True:
        # The probe keys its cache by the python, the installed package versions and the config
        # bytes: a hit is the same answer the loader would give again.
        evidence.append("the probe's answer came from its cache on the target (same inputs)")
    data: dict[str, Any] = {"python": python, "probe": probe}
    loader, vs_authoritative = _loader_part(ctx, probe, python, evidence)
    judged = _vllm_part(ctx, part(probe, "vllm"), model, evidence)
    problems = vs_authoritative + judged.problems
    data.update(
        problems=problems,
        loader_problems=loader,
        authoritative_problems=vs_authoritative,
        vllm_problems=judged.problems,
        vllm_unknowns=judged.unknowns,
        window_unknown=judged.window_unknown,
    )
    warnings = tap_spacing_warnings(ctx, probe)
    if problems:
        summary = f"{len(problems)} problem(s) on the target; first: {problems[0]}"
        fix = judged.fix if judged.problems and problems[0] == judged.problems[0] else None
        if fix is not None:
            fix += ", then `dflash-provision launch ... --vllm PATH --restart`"
        return StageResult(
            "b",
            name,
            StageStatus.FAILED,
            summary,
            evidence + problems + judged.unknowns,
            data,
            fix=fix,
            warnings=warnings,
        )
    if judged.unknowns:
        # A probe helper missing or raising is "cannot tell", never a pass (exit 26).
        summary = f"cannot tell: {judged.unknowns[0]}"
        return StageResult(
            "b",
            name,
            StageStatus.INCONCLUSIVE,
            summary,
            evidence + judged.unknowns,
            data,
            warnings=warnings,
        )
    summary = "the target loads the authoritative values"
    return StageResult("b", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings)


def tap_spacing_warnings(ctx: CheckContext, probe: dict[str, Any]) -> list[str]:
    """The reference tap-spacing hint, with the target's layer count the probe read there."""
    layers = probe.get("target_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        return []
    hint = tap_spacing_hint(ctx.auth_doc, layers)
    return [hint[1]] if hint is not None else []


def _loader_part(
    ctx: CheckContext, probe: dict[str, Any], python: str, evidence: list[str]
) -> tuple[list[str], list[str]]:
    """(what the loader itself changes in the file on disk, how the loaded config differs from
    the authoritative one). They differ only when the file on disk is not authoritative (stage
    a): then the second list also holds the file's own differences, marked as such."""
    eff = part(probe, "effective")
    if probe.get("layout") == "speculators" and probe.get("transformers"):
        return speculators_loader_part(ctx, eff, evidence)
    if not probe.get("transformers"):
        refused = (
            f"{python} on the target cannot import transformers: give --python with the python "
            "that runs vLLM"
        )
        return [refused], [refused]
    if eff.get("error") or not isinstance(eff.get("config"), dict):
        refused = f"the target's transformers cannot load the drafter: {eff.get('error')}"
        return [refused], [refused]
    loaded = eff["config"]
    vs_auth = compare_effective(ctx.auth_doc, loaded)
    disk_doc = _disk_doc(ctx)
    by_loader = compare_effective(disk_doc, loaded) if disk_doc is not None else vs_auth
    if by_loader:
        evidence += [f"the loader changes the file: {line}" for line in by_loader]
    else:
        evidence.append("transformers on the target keeps every critical field of the file")
    if vs_auth and not by_loader:
        marked = [f"loaded on the target (as the file on disk says): {line}" for line in vs_auth]
    else:
        marked = [f"loaded on the target: {line}" for line in vs_auth]
    return by_loader, marked


def speculators_loader_part(
    ctx: CheckContext, eff: dict[str, Any], evidence: list[str]
) -> tuple[list[str], list[str]]:
    """The loader part for a speculators-layout drafter: what a runtime sees is vLLM's own
    conversion of the file (transformers cannot load the layout without remote code). Its
    critical fields are compared with the authoritative config as vLLM would convert it, each
    line naming the field the file keeps it in."""
    if eff.get("error"):
        refused = (
            f"vLLM on the target cannot convert the speculators-layout drafter: {eff['error']}"
        )
        return [refused], [refused]
    loaded = eff.get("config")
    if not isinstance(loaded, dict):
        evidence.append(str(eff.get("note") or "no loader on the target reads this layout"))
        return [], []

    notes: list[str] = []

    def differences(doc: dict[str, Any]) -> list[str]:
        view = runtime_view(doc, keep_block_size=False)
        wanted = {name: view[name] for name in CRITICAL_FIELDS if name in view}
        got = {name: loaded[name] for name in wanted if name in loaded}
        # Keys this vLLM's conversion does not write: as its DFlash code sees them.
        eagle = "eagle_aux_hidden_state_layer_ids"
        wanted, got, settled = settle_unwritten(
            wanted, got, eff.get("conversion_reads"), aux=(view.get(eagle), loaded.get(eagle))
        )
        notes[:] = settled
        changes = [
            Change(file_field(doc, c.path), c.kind, c.old, c.new)
            for c in semantic_diff(got, wanted)
        ]
        return render_changes(changes)

    evidence.append("the target's vLLM converts the speculators layout (SpeculatorsConfig)")
    vs_auth = differences(ctx.auth_doc)
    evidence += notes
    disk_doc = _disk_doc(ctx)
    by_loader = differences(disk_doc) if disk_doc is not None else vs_auth
    evidence += [f"vLLM's conversion changes the file: {line}" for line in by_loader]
    return by_loader, [f"converted on the target: {line}" for line in vs_auth]


def _disk_doc(ctx: CheckContext) -> dict[str, Any] | None:
    if ctx.disk is None or ctx.disk.data is None:
        return None
    try:
        doc = json.loads(ctx.disk.data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _vllm_part(
    ctx: CheckContext, vllm: dict[str, Any], model: str | None, evidence: list[str]
) -> Judgement:
    if vllm.get("importable") is not True and "timed out" in str(vllm.get("error")):
        # The probe ran out of time before vLLM answered: not a vLLM-less python.
        return Judgement(unknowns=[f"cannot tell what vLLM runs: {vllm.get('error')}"])
    if not vllm.get("importable"):
        evidence.append(f"vLLM not importable by that python ({vllm.get('error')}): not resolved")
        return Judgement()
    version = str(vllm.get("version"))
    evidence.append(f"vLLM {version} importable")
    draft = vllm.get("draft")
    if not isinstance(draft, dict):
        # A speculators-layout drafter names its own target (the verifier): the probe resolved
        # it without --model, so no draft here is vLLM's refusal (or a timeout), not a skip.
        if model is None and not is_speculators(ctx.auth_doc):
            evidence.append("vLLM's resolution skipped: the target model is not known (--model)")
            return Judgement()
        return Judgement(problems=[f"vLLM cannot resolve the draft config: {vllm.get('error')}"])
    evidence.append(
        f"vLLM resolves aux layer ids {draft.get('aux_layer_ids')}, windows "
        f"{[layer.get('sliding_window') for layer in _layers_of(draft)]}"
    )
    attention = part(draft, "attention")
    if attention.get("sliding") is True:
        evidence.append(
            f"vLLM {version} has per-layer DFlash sliding attention (reads "
            f"{', '.join(map(str, attention.get('reads') or [])) or 'no window key'})"
        )
    serve, _, refused = serving_runners(draft)
    if serve:
        evidence.append(
            "model runner(s) that serve this drafter: "
            + ", ".join(n.upper() for n in serve)
            + "".join(f"; {why}" for why in refused.values())
        )
    v2 = part(part(draft, "runners"), "v2")
    if draft.get("mixed_layout_error") and v2.get("accepts_layout") is not False:
        # Not a wrong value: the V1 runner refuses mixed layouts; launch adds the V2 runner.
        # (Where V2 refuses it too, as on 0.25, judge_runners says no runner serves it.)
        evidence.append(
            f"mixed sliding/full layout: needs VLLM_USE_V2_MODEL_RUNNER=1 "
            f"({draft['mixed_layout_error']})"
        )
    return judge_vllm_draft(ctx, draft, version)
