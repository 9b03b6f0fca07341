"""The five stages of ``runtime-check``, each a function from what is known so far to a
:class:`StageResult` (status, one-line summary, evidence lines, data for JSON, the fix).

    a  file on disk        the target's config.json equals the authoritative config
    b  loader and vLLM     the config as the target's own transformers loads it, and (where vLLM
                           is importable there) vLLM's own resolution of the draft: aux layer ids,
                           per-layer windows, draft hf_config, field by field vs authoritative
    c  running server      the process on the port: method dflash, this drafter, N, engine
                           version, aux layers == target_layer_ids + 1 from its start-up log
    d  completion          one real completion succeeds
    e  acceptance          spec-decode counters before/after greedy smoke prompts

Stages never raise for what a target reports (a missing file, a dead server, a probe error):
those are failed stages with evidence. Connection failures propagate (the caller classifies
them as for every other command).
"""

from __future__ import annotations

import enum
import json
import posixpath
import shlex
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dflash_provision.invariants import block_size_of

if TYPE_CHECKING:
    from dflash_provision.authority import Authority
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.runtime.vllm_log import LogFacts
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport

_MAX_PROBE_OUTPUT = 256 * 1024
_SLIDING = "sliding_attention"


class StageStatus(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class StageResult:
    """One stage's verdict and everything that supports it."""

    key: str  # "a".."e"
    name: str
    status: StageStatus
    summary: str  # one line
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None  # the command (or action) that fixes a failure
    causes: list[str] = field(default_factory=list)  # stage e: likely causes, in checking order
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is StageStatus.PASSED

    @property
    def failed(self) -> bool:
        return self.status is StageStatus.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.key,
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
            "causes": self.causes,
            "warnings": self.warnings,
            "data": self.data,
            "duration_s": round(self.duration_s, 3),
        }


STAGE_NAMES = {
    "a": "file on disk",
    "b": "loader-effective config and vLLM's resolution on the target",
    "c": "running server",
    "d": "a real completion",
    "e": "acceptance",
}


def skipped(key: str, why: str) -> StageResult:
    return StageResult(key, STAGE_NAMES[key], StageStatus.SKIPPED, why)


@dataclass
class CheckContext:
    """What the stages share: where to look, what must be there, and what earlier stages saw."""

    transport: Transport
    target: Target
    authority: Authority
    auth_doc: dict[str, Any]
    push_fix: str  # "dflash-provision push TARGET --repo ..." for this target and authority
    timeout: float = 60.0
    disk: RemoteRead | None = None
    probe: dict[str, Any] | None = None
    server: Any = None  # process.RunningServer
    log: LogFacts | None = None
    log_size: int | None = None  # the log's size when it was read: later lines come after

    @property
    def target_layer_ids(self) -> list[int] | None:
        inner = self.auth_doc.get("dflash_config")
        ids = inner.get("target_layer_ids") if isinstance(inner, dict) else None
        ids = ids if ids is not None else self.auth_doc.get("target_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return ids
        return None

    @property
    def expected_aux(self) -> list[int] | None:
        ids = self.target_layer_ids
        return [i + 1 for i in ids] if ids is not None else None


# -- a: file on disk ---------------------------------------------------------------------------


def stage_file(ctx: CheckContext) -> StageResult:
    """a: the bytes at the target's config path are the authoritative bytes."""
    from dflash_provision.push import config_diff
    from dflash_provision.remote.ops import read_remote_config

    name = STAGE_NAMES["a"]
    read = read_remote_config(ctx.transport, ctx.target.config_path, timeout=ctx.timeout)
    ctx.disk = read
    data: dict[str, Any] = {
        "path": read.path,
        "status": read.status.value,
        "sha256": read.sha256,
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
    diff = config_diff(read.data, ctx.authority.data)
    evidence = [f"{read.path}: sha256 {read.sha256}", f"authoritative {ctx.authority.label}"]
    if diff.bytes_equal:
        return StageResult(
            "a",
            name,
            StageStatus.PASSED,
            f"{read.path} is the authoritative config",
            evidence,
            data,
        )
    data["diff"] = diff.lines
    if diff.formatting_only:
        # Same meaning: every loader sees the same values, but the proof by sha256 is lost.
        summary = f"{read.path}: same values as the authoritative config, other bytes"
        return StageResult(
            "a",
            name,
            StageStatus.PASSED,
            summary,
            evidence,
            data,
            warnings=[f"{summary}; `{ctx.push_fix}` writes the exact bytes"],
        )
    count = len(diff.changes) or 1
    summary = (
        f"{read.path} differs from {ctx.authority.label} ({count} field(s); disk → authoritative)"
    )
    return StageResult(
        "a", name, StageStatus.FAILED, summary, evidence + diff.lines, data, fix=ctx.push_fix
    )


# -- b: loader-effective config and vLLM's resolution on the target ----------------------------


def probe_command(
    python: str, drafter_dir: str, model: str | None, num_spec: int | None, timeout: float
) -> list[str]:
    """argv for the target-side probe (its source goes on stdin, see remote_probe)."""
    argv = [python, "-", "--drafter", drafter_dir, "--timeout", f"{timeout:g}"]
    if model:
        argv += ["--model", model]
    if num_spec is not None:
        argv += ["--num-speculative-tokens", str(num_spec)]
    return argv


def probe_source() -> str:
    """The probe's program text (REALVLLM's remote_probe), shipped on stdin."""
    from dflash_provision.runtime import remote_probe

    source = getattr(remote_probe, "PROBE_SOURCE", None)
    if isinstance(source, str):
        return source
    maker = getattr(remote_probe, "probe_source", None)
    if callable(maker):
        return str(maker())
    from pathlib import Path

    return Path(remote_probe.__file__).read_text(encoding="utf-8")


def run_probe(
    ctx: CheckContext, python: str, model: str | None, num_spec: int | None
) -> dict[str, Any] | str:
    """Run the probe on the target. The parsed JSON object, or a one-line error."""
    budget = max(ctx.timeout, 30.0)
    argv = probe_command(python, ctx.target.model_dir, model, num_spec, budget)
    try:
        source = probe_source()
    except ImportError:
        return "the target-side probe (dflash_provision.runtime.remote_probe) is not in this build"
    result = ctx.transport.run(argv, stdin=source.encode(), timeout=budget + 15)
    out = result.stdout[:_MAX_PROBE_OUTPUT]
    try:
        parsed = json.loads(out.decode("utf-8", "replace"))
    except ValueError:
        err = result.stderr.decode("utf-8", "replace").strip().splitlines()
        why = err[-1] if err else f"exit status {result.exit_status}, no JSON on stdout"
        return f"the probe did not run with {python} on the target: {why[:300]}"
    if not isinstance(parsed, dict) or parsed.get("probe") != 1:
        return "the probe answered with something that is not its JSON report"
    return parsed


def _critical(doc: dict[str, Any]) -> dict[str, Any]:
    from dflash_provision.effective import CRITICAL_FIELDS

    return {name: doc[name] for name in CRITICAL_FIELDS if name in doc}


def compare_effective(auth_doc: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """Critical fields of the authoritative config that the target's loader does not hold,
    as ``path: loaded on target → authoritative`` lines, plus rope and window coherence."""
    from dflash_provision import effective
    from dflash_provision.diff import render_changes, semantic_diff

    wanted = _critical(auth_doc)
    got = {name: loaded[name] for name in wanted if name in loaded}
    lines = render_changes(semantic_diff(got, wanted))
    # effective.py's checks by meaning (rope settings, sliding layers without a window) read a
    # config object by attribute: the probe's dict, seen the same way.
    seen_as_config = SimpleNamespace(**loaded)
    lines += [f.message for f in effective._check_rope(auth_doc, seen_as_config)]
    lines += [f.message for f in effective._check_coherence(seen_as_config)]
    return lines


def compare_vllm_draft(ctx: CheckContext, draft: dict[str, Any]) -> list[str]:
    """vLLM's own view of the draft vs the authoritative config: aux ids, windows, hf_config."""
    problems: list[str] = []
    auth = ctx.auth_doc
    aux = draft.get("aux_layer_ids")
    if ctx.expected_aux is not None and aux is None:
        why = f" ({draft['aux_error']})" if draft.get("aux_error") else ""
        problems.append(
            "vLLM takes no auxiliary layer ids from this config: it falls back to the model's "
            f'defaults ("from model"), expected target_layer_ids + 1 = {ctx.expected_aux}{why}'
        )
    elif ctx.expected_aux is not None and aux != ctx.expected_aux:
        problems.append(
            f"vLLM's auxiliary layer ids {aux}, expected target_layer_ids + 1 = {ctx.expected_aux}"
        )
    layer_types = auth.get("layer_types")
    window = auth.get("sliding_window")
    for layer in _layers_of(draft):
        index = layer.get("index")
        if not isinstance(index, int) or not isinstance(layer_types, list):
            continue
        if index >= len(layer_types):
            problems.append(f"vLLM builds layer {index}; layer_types has {len(layer_types)}")
            continue
        if layer.get("error"):
            problems.append(f"vLLM refuses layer {index}: {layer['error']}")
            continue
        want = window if layer_types[index] == _SLIDING else None
        if layer.get("sliding_window") != want:
            problems.append(
                f"vLLM layer {index}: window {layer.get('sliding_window')}, expected {want} "
                f"({layer_types[index]})"
            )
    hf_config = draft.get("hf_config")
    hf_config = hf_config if isinstance(hf_config, dict) else {}
    for name in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers"):
        if name not in auth:
            continue
        if name not in hf_config:
            problems.append(
                f"vLLM's draft hf_config has no {name} (authoritative {json.dumps(auth[name])}): "
                "this vLLM build drops it (speculators conversion without PR #40898)"
            )
        elif hf_config[name] != auth[name]:
            problems.append(
                f"vLLM's draft hf_config {name} {json.dumps(hf_config[name])}, authoritative "
                f"{json.dumps(auth[name])}"
            )
    return problems


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
    vllm = _vllm_part(ctx, part(probe, "vllm"), model, evidence)
    problems = vs_authoritative + vllm
    data.update(
        problems=problems,
        loader_problems=loader,
        authoritative_problems=vs_authoritative,
        vllm_problems=vllm,
    )
    if problems:
        summary = f"{len(problems)} problem(s) on the target; first: {problems[0]}"
        return StageResult("b", name, StageStatus.FAILED, summary, evidence + problems, data)
    return StageResult(
        "b", name, StageStatus.PASSED, "the target loads the authoritative values", evidence, data
    )


def _loader_part(
    ctx: CheckContext, probe: dict[str, Any], python: str, evidence: list[str]
) -> tuple[list[str], list[str]]:
    """(what the loader itself changes in the file on disk, how the loaded config differs from
    the authoritative one). They differ only when the file on disk is not authoritative (stage
    a): then the second list also holds the file's own differences, marked as such."""
    eff = part(probe, "effective")
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
) -> list[str]:
    if not vllm.get("importable"):
        evidence.append(f"vLLM not importable by that python ({vllm.get('error')}): not resolved")
        return []
    evidence.append(f"vLLM {vllm.get('version')} importable")
    draft = vllm.get("draft")
    if not isinstance(draft, dict):
        if model is None:
            evidence.append("vLLM's resolution skipped: the target model is not known (--model)")
            return []
        return [f"vLLM cannot resolve the draft config: {vllm.get('error')}"]
    evidence.append(
        f"vLLM resolves aux layer ids {draft.get('aux_layer_ids')}, windows "
        f"{[layer.get('sliding_window') for layer in _layers_of(draft)]}"
    )
    if draft.get("mixed_layout_error"):
        # Not a wrong value: the V1 runner refuses mixed layouts; launch adds the V2 runner.
        evidence.append(
            f"mixed sliding/full layout: needs VLLM_USE_V2_MODEL_RUNNER=1 "
            f"({draft['mixed_layout_error']})"
        )
    return compare_vllm_draft(ctx, draft)


# -- c: the running server ---------------------------------------------------------------------


def same_path(a: str | None, b: str) -> bool:
    return a is not None and posixpath.normpath(a) == posixpath.normpath(b)


def server_spec(server: Any) -> dict[str, Any]:
    """The speculative config the server's own command line carries (parsed by process.py)."""
    for attr in ("speculative_config", "spec_config", "speculative"):
        value = getattr(server, attr, None)
        if isinstance(value, dict):
            return value
    return {}


def stage_server(ctx: CheckContext, port: int) -> StageResult:
    """c: the process on the port runs this drafter with DFlash, N within block_size - 1, and its
    log shows the engine version and aux layers == target_layer_ids + 1."""
    name = STAGE_NAMES["c"]
    server = ctx.server
    if server is None:
        why = f"no vLLM server listens on port {port} on {ctx.transport.description}"
        return StageResult(
            "c",
            name,
            StageStatus.FAILED,
            why,
            [why],
            {"port": port},
            fix="dflash-provision launch " + shlex.quote(ctx.target.display()) + " --model MODEL",
        )
    spec = server_spec(server)
    argv = list(getattr(server, "argv", []) or [])
    evidence = [f"pid {getattr(server, 'pid', '?')}: {shlex.join(argv)[:400]}"]
    problems = _argv_problems(ctx, spec)
    problems += _log_problems(ctx, spec, evidence)
    data = {"port": port, "pid": getattr(server, "pid", None), "argv": argv, "spec": spec}
    warnings = []
    if ctx.log is None:
        data["log"] = None
        warnings.append(
            "the server's start-up log is not readable (not started by dflash-provision launch): "
            "engine version and auxiliary layers not verified"
        )
    else:
        data["log"] = ctx.log.to_dict()
    if problems:
        fix = _server_fix(ctx, problems, port)
        return StageResult(
            "c", name, StageStatus.FAILED, problems[0], evidence + problems, data, fix, [], warnings
        )
    n = spec.get("num_speculative_tokens")
    summary = f"dflash with {ctx.target.model_dir}, {n} speculative tokens, aux {ctx.expected_aux}"
    return StageResult("c", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings)


def _argv_problems(ctx: CheckContext, spec: dict[str, Any]) -> list[str]:
    if not spec:
        return ["the server's command line has no --speculative-config: it is not speculating"]
    problems = []
    if spec.get("method") != "dflash":
        problems.append(f"speculative method {spec.get('method')!r}, expected 'dflash'")
    if not same_path(spec.get("model"), ctx.target.model_dir):
        problems.append(
            f"the server runs drafter {spec.get('model')!r}, not {ctx.target.model_dir!r}"
        )
    n = spec.get("num_speculative_tokens")
    size, where = block_size_of(ctx.auth_doc)
    if not isinstance(n, int):
        problems.append(f"num_speculative_tokens is {n!r} on the command line")
    elif size is not None and n > size - 1:
        problems.append(
            f"num_speculative_tokens {n} > {where} - 1 = {size - 1}: every draft past the block "
            "is rejected (acceptance collapses to ~0%)"
        )
    return problems


def _log_problems(ctx: CheckContext, spec: dict[str, Any], evidence: list[str]) -> list[str]:
    facts = ctx.log
    if facts is None:
        return []
    problems = []
    engine = facts.engine
    if engine is None:
        evidence.append(f"no engine start-up line in the last {facts.lines_read} log lines")
    else:
        evidence.append(
            f"engine v{engine.version}: speculative method {engine.spec_method}, drafter "
            f"{engine.spec_model}, num_spec_tokens {engine.num_spec_tokens}"
        )
        if engine.num_spec_tokens is not None and engine.num_spec_tokens != spec.get(
            "num_speculative_tokens"
        ):
            problems.append(
                f"the engine runs {engine.num_spec_tokens} speculative tokens, the command line "
                f"says {spec.get('num_speculative_tokens')}"
            )
    aux = facts.aux
    if aux is None:
        problems.append("the log never says which auxiliary layers the drafter reads")
    elif aux.fallback:
        problems.append(
            f'vLLM fell back to the model\'s default aux layers {list(aux.ids)} ("from model"): '
            "the drafter's target_layer_ids were not used"
        )
    elif ctx.expected_aux is not None and list(aux.ids) != ctx.expected_aux:
        problems.append(
            f"aux layers {list(aux.ids)} from {aux.source}, expected target_layer_ids + 1 = "
            f"{ctx.expected_aux}"
        )
    else:
        evidence.append(f"aux layers {list(aux.ids)} from {aux.source} = target_layer_ids + 1")
    for line in facts.fatal[-3:]:
        evidence.append(f"log: {line[:300]}")
    return problems


def _server_fix(ctx: CheckContext, problems: list[str], port: int) -> str:
    """Restart with the right settings; after a push first when the file on disk is wrong (the
    server read it at start-up)."""
    target = shlex.quote(ctx.target.display())
    wrong_file = ctx.disk is not None and ctx.disk.data != ctx.authority.data
    first = f"{ctx.push_fix}, then " if wrong_file else ""
    model = server_model(ctx.server) or "MODEL"
    size, _ = block_size_of(ctx.auth_doc)
    n = (
        f" --num-speculative-tokens {size - 1}"
        if size and any("num_speculative_tokens" in p for p in problems)
        else ""
    )
    launch = f"dflash-provision launch {target} --model {shlex.quote(model)} --port {port}"
    return f"{first}{launch}{n} --restart"


def server_model(server: Any) -> str | None:
    """The target model the server serves: its launch record's, else ``serve MODEL`` in argv."""
    record = getattr(server, "record", None)
    if record is not None and getattr(record, "model", None):
        return str(record.model)
    argv = [str(arg) for arg in getattr(server, "argv", None) or []]
    for index, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[index + 1].startswith("-"):
            return argv[index + 1]
    return None


# -- d and e: a real completion, then acceptance over a few smoke prompts ----------------------

# Fixed prompts: greedy decoding of the same prompts on the same model drafts the same way, so
# runs are comparable from one check to the next.
SMOKE_PROMPTS = (
    "The history of the printing press begins",
    "def fibonacci(n):\n    ",
    "Count from one to twenty in words: one, two,",
    "A recipe for bread needs flour, water,",
)
MAX_REPLY = 1024 * 1024


@dataclass
class Completion:
    ok: bool
    tokens: int = 0
    text: str = ""
    error: str = ""
    status: int | None = None


def served_model_id(access: Any, fallback: str | None, timeout: float) -> str | None:
    """The model name the server answers to (``/v1/models``), else ``fallback``."""
    try:
        reply = access.request("GET", "/v1/models", timeout=timeout, max_bytes=MAX_REPLY)
        models = json.loads(reply.body).get("data") or []
        if reply.status == 200 and models and isinstance(models[0].get("id"), str):
            return str(models[0]["id"])
    except (ValueError, AttributeError, TypeError):
        pass
    return fallback


def complete(
    access: Any, model_id: str | None, prompt: str, max_tokens: int, timeout: float
) -> Completion:
    """One greedy completion of exactly ``max_tokens`` tokens (ignore_eos): same work each run."""
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    reply = access.request(
        "POST", "/v1/completions", json.dumps(body).encode(), timeout=timeout, max_bytes=MAX_REPLY
    )
    short = cut_short(reply)
    if short:
        return Completion(False, error=short, status=reply.status)
    text = reply.body.decode("utf-8", "replace") if isinstance(reply.body, bytes) else reply.body
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if reply.status != 200 or not isinstance(parsed, dict) or not parsed.get("choices"):
        return Completion(False, error=_error_text(parsed, text), status=reply.status)
    usage = parsed.get("usage") or {}
    tokens = usage.get("completion_tokens")
    choice = parsed["choices"][0]
    return Completion(
        True,
        tokens=tokens if isinstance(tokens, int) and tokens >= 0 else max_tokens,
        text=str(choice.get("text", ""))[:200],
        status=reply.status,
    )


def cut_short(reply: Any) -> str | None:
    """Why a reply's body is not whole (longer than our limit, or fewer bytes than its
    Content-Length), else None: a cut reply must not pass for an empty answer or low counters."""
    if getattr(reply, "truncated", False):
        return f"the reply is longer than the {MAX_REPLY} bytes read"
    announced = (getattr(reply, "headers", None) or {}).get("content-length", "")
    if announced.isdigit() and len(reply.body) < int(announced):
        return (
            f"the reply was cut short: {len(reply.body)} of {announced} bytes arrived "
            "(the connection to the server lost the rest)"
        )
    return None


def _error_text(parsed: Any, text: str) -> str:
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("message", parsed))
        if isinstance(error, dict):
            error = error.get("message", error)
        return " ".join(str(error).split())[:400]
    return " ".join(text.split())[:400] or "empty reply"


def stage_completion(ctx: CheckContext, first: Completion, fatal_after: list[str]) -> StageResult:
    """d: the first smoke completion, as the proof that the server can serve at all."""
    name = STAGE_NAMES["d"]
    if first.ok:
        summary = f"completion of {first.tokens} tokens returned"
        return StageResult("d", name, StageStatus.PASSED, summary, [f"text: {first.text!r}"])
    summary = f"the completion failed (HTTP {first.status}): {first.error}"
    if fatal_after and fatal_after[0][:200] not in first.error:
        summary += f"; the server logged: {fatal_after[0][:300]}"
    evidence = [summary, *[f"log: {line[:300]}" for line in fatal_after[:3]]]
    return StageResult(
        "d",
        name,
        StageStatus.FAILED,
        summary,
        evidence,
        {"status": first.status},
        fix="the drafter does not fit this target (layer ids, hidden size): "
        f"dflash-provision validate {shlex.quote(ctx.target.display())} --target-config MODEL",
    )


def likely_causes(ctx: CheckContext, earlier: dict[str, StageResult], n: int | None) -> list[str]:
    """Why acceptance collapses, in the order an engineer should check, each with what the
    earlier stages already saw about it."""
    auth = ctx.auth_doc
    target = shlex.quote(ctx.target.display())
    size, where = block_size_of(auth)

    def seen(key: str) -> str:
        stage = earlier.get(key)
        return f"stage {key} {stage.status.value}: {stage.summary}" if stage else "not checked"

    inner = auth.get("dflash_config")
    mask = (inner if isinstance(inner, dict) else {}).get(
        "mask_token_id", auth.get("mask_token_id")
    )
    causes = [
        f"the file on disk is not the authoritative config ({seen('a')}); "
        f"fix: dflash-provision push {target} ...",
        "the loader normalised critical fields (use_sliding_window false nulls sliding_window, "
        f"layer_types rebuilt) ({seen('b')})",
        f"target_layer_ids / their +1 offset: expected aux layers {ctx.expected_aux} ({seen('c')})",
        f"mask_token_id {mask}: it must be the token the drafter was trained with "
        "(the incident had 248064 instead of 248070)",
        f"num_speculative_tokens {n} vs {where} {size}: more than {where} - 1 drafts are all "
        "rejected",
        "RoPE settings or a different target model than the drafter was trained for "
        f"(dflash-provision validate {target} --target-config MODEL)",
        "a vLLM build that drops the sliding-window fields of the draft config (stage b's vLLM "
        "resolution; speculators conversion without PR #40898)",
    ]
    return [f"{i}. {cause}" for i, cause in enumerate(causes, 1)]


def stage_acceptance(
    ctx: CheckContext,
    acceptance: Any,  # metrics.Acceptance
    *,
    present: bool,
    min_acceptance: float,
    prompts: int,
    earlier: dict[str, StageResult],
    num_spec: int | None,
) -> StageResult:
    """e: acceptance over the smoke prompts' counter difference, against ``min_acceptance``."""
    name = STAGE_NAMES["e"]
    data = acceptance.to_dict() | {"min_acceptance": min_acceptance, "prompts": prompts}
    delta = acceptance.delta
    evidence = [
        f"{prompts} greedy prompt(s), {acceptance.expected_max_drafts} tokens: "
        f"{delta.drafts:g} drafts, {delta.draft_tokens:g} draft tokens, {delta.accepted:g} accepted"
    ]
    warnings = []
    if acceptance.foreign_drafts:
        warnings.append(
            f"other traffic mixed into the counters: {acceptance.foreign_drafts} drafts more than "
            "the smoke prompts can explain; the rate includes other clients' requests"
        )
    if not present:
        why = "the server exports no spec-decode metrics: it is not speculating"
        return StageResult("e", name, StageStatus.FAILED, why, [why], data, warnings=warnings)
    if acceptance.rate is None:
        why = "no drafts were counted during the smoke prompts: the drafter is not drafting"
        return StageResult("e", name, StageStatus.FAILED, why, evidence, data, warnings=warnings)
    per_pos = ", ".join(f"{p:.3f}" for p in acceptance.per_position)
    evidence.append(
        f"acceptance rate {acceptance.rate:.1%}, mean acceptance length "
        f"{acceptance.mean_length:.2f}, per position {per_pos or '-'}"
    )
    if acceptance.rate >= min_acceptance:
        summary = f"acceptance {acceptance.rate:.1%} (>= {min_acceptance:.1%})"
        return StageResult(
            "e", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings
        )
    summary = f"acceptance {acceptance.rate:.1%} is below --min-acceptance {min_acceptance:.1%}"
    return StageResult(
        "e",
        name,
        StageStatus.FAILED,
        summary,
        evidence,
        data,
        causes=likely_causes(ctx, earlier, num_spec),
        warnings=warnings,
    )
