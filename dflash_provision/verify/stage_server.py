"""runtime-check stage c: the process on the port (method dflash, this drafter, N, engine version,
aux layers == target_layer_ids + 1 from its start-up log).

The server is read the way vLLM reads itself: its command line with ``vllm serve``'s rules
(vllm/argv.py: the last of repeated options wins), cross-checked with the engine's own start-up
record (vllm/log.py: only vLLM's records of this launch, before ready). A disagreement between the
two, or with the provisioned drafter, fails the stage naming both values."""

from __future__ import annotations

import shlex
from typing import Any

from dflash_provision.server.fix_lines import noted
from dflash_provision.server.locate import same_path
from dflash_provision.validation.invariants import block_size_of
from dflash_provision.verify.reference import vllm_version
from dflash_provision.verify.speculators_serve import served_spec
from dflash_provision.verify.stages import STAGE_NAMES, CheckContext, StageResult, StageStatus
from dflash_provision.vllm.argv import LOGGING_ENV, inferred_method, logging_settings

# -- c: the running server ---------------------------------------------------------------------


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
            fix=noted(
                shlex.join(
                    ["dflash-provision", "status", ctx.target.display(), "--port", str(port)]
                ),
                "no server listens there: status shows what launch recorded for it; start one "
                "with dflash-provision launch (--model names the target model)",
            ),
        )
    # `vllm serve <speculators drafter dir>`: the spec comes from its speculators_config.
    spec, problems = served_spec(ctx, server, server_spec(server))
    argv = list(getattr(server, "argv", []) or [])
    evidence = [f"pid {getattr(server, 'pid', '?')}: {shlex.join(argv)[:400]}"]
    read = getattr(server, "argv_spec", None)
    evidence += _argv_evidence(read)
    if ctx.container is not None:
        evidence += ctx.container.mapping_lines(server_spec(server).get("model"))
    engine = ctx.log.engine if ctx.log is not None else None
    unknown = getattr(read, "unknown", None) if not spec else None
    if unknown and engine is not None:
        spec = _engine_spec(engine)  # vLLM's own record stands in for the unreadable argv
        evidence.append(f"{unknown}: judged by the engine's start-up record")
    data = {"port": port, "pid": getattr(server, "pid", None), "argv": argv, "spec": spec}
    spec = _with_method(ctx, spec, evidence, data)
    problems += list(getattr(read, "problems", []) or [])
    problems += [] if unknown and not spec else _argv_problems(ctx, spec, read)
    problems += _log_problems(ctx, spec, evidence)
    fabricated, undecided = sampling_findings(spec, _version(ctx))
    problems += fabricated
    data["figures_not_evidence"] = fabricated[0] if fabricated else None
    blind = _log_blind(ctx)
    undecided += [blind] if blind else []
    warnings = _repeat_warnings(read, problems)
    if ctx.log is None and ctx.container is not None:
        data["log"] = None
        warnings.append(
            f"the server is not the main process of {ctx.container.what}: what it prints is "
            "not in docker logs, so the engine version and auxiliary layers are not verified"
        )
    elif ctx.log is None:
        data["log"] = None
        warnings.append(
            "the server's start-up log is not readable (not started by dflash-provision launch): "
            "engine version and auxiliary layers not verified"
        )
    else:
        data["log"] = ctx.log.to_dict()
    if problems:
        fix = _server_fix(ctx, problems, port)
        if ctx.container is not None:
            fix = ctx.container.fix_hint(spec.get("model"))
        return StageResult(
            "c", name, StageStatus.FAILED, problems[0], evidence + problems, data, fix, [], warnings
        )
    if unknown and not spec:
        why = f"{unknown}, and no engine start-up record says it: the drafter it runs is unknown"
        return StageResult(
            "c", name, StageStatus.INCONCLUSIVE, why, [*evidence, why], data, None, [], warnings
        )
    if undecided:
        return StageResult(
            "c", name, StageStatus.INCONCLUSIVE, undecided[0], evidence + undecided, data,
            None, [], warnings,
        )  # fmt: skip
    n = spec.get("num_speculative_tokens")
    summary = f"dflash with {ctx.target.model_dir}, {n} speculative tokens, aux {ctx.expected_aux}"
    return StageResult("c", name, StageStatus.PASSED, summary, evidence, data, warnings=warnings)


def _argv_evidence(read: Any) -> list[str]:
    """How the command line's speculative options were read (vLLM's rules: the last wins)."""
    given = list(getattr(read, "given", []) or [])
    if len(given) < 2:
        return []
    dotted = any("." in g.split(" ", 1)[0].split("=", 1)[0] for g in given)
    rule = "the dotted ones, merged, replace the rest" if dotted else "vLLM uses the last"
    lines = [f"{len(given)} speculative options on the command line; {rule}:"]
    return lines + [f"  {i}. {g[:300]}" for i, g in enumerate(given, 1)]


def _repeat_warnings(read: Any, problems: list[str]) -> list[str]:
    if read is None or not getattr(read, "repeated", False) or problems:
        return []
    return [
        "the command line carries --speculative-config more than once (vLLM uses the last): "
        "pass it once so that every reader sees the same drafter"
    ]


def _with_method(
    ctx: CheckContext, spec: dict[str, Any], evidence: list[str], data: dict[str, Any]
) -> dict[str, Any]:
    """``spec`` with the method vLLM gives it when the command line names none (vllm/argv.py's
    ``inferred_method``: from the drafter's path and its config's architectures)."""
    if not spec or spec.get("method") is not None:
        return spec
    method, why = inferred_method(spec.get("model"), ctx.auth_doc.get("architectures"))
    evidence.append(f"no method in the speculative config: vLLM infers {method!r} ({why})")
    data["method_inferred"] = {"method": method, "why": why}
    return {**spec, "method": method}


# The sampling settings that make vLLM's acceptance figures something other than the target's
# verdict on the drafter's tokens (vllm/config/speculative.py): the rate gate would judge them.
_FABRICATED = {
    "synthetic": (
        "rejection_sample_method 'synthetic' fabricates acceptance: vLLM accepts drafts at the "
        "configured synthetic rate, not by the target's verdict (vLLM 0.20+), so the acceptance "
        "figures say nothing about the drafter"
    ),
    "fly": (
        "rejection_sample_method 'fly' is lossy (vLLM 0.33+: entropy-gated acceptance of tokens "
        "the target would not have produced), so acceptance overstates what the drafter earns "
        "and the output differs from the target's"
    ),
}
_LOSSY_RELEASE = "0.28."  # draft_sample_method 'probabilistic' was not lossless there


def sampling_findings(spec: dict[str, Any], version: str | None) -> tuple[list[str], list[str]]:
    """(failures, cannot-tell lines) of the speculative config's sampling settings: acceptance
    counts only when it is the target's verdict on the drafter's own tokens."""
    failures, undecided = [], []
    fix = "; serve with the default (remove the key) to measure acceptance"
    rejection = spec.get("rejection_sample_method")
    if isinstance(rejection, str) and rejection in _FABRICATED:
        failures.append(_FABRICATED[rejection] + fix)
    if spec.get("draft_sample_method") == "probabilistic":
        if version is not None and version.startswith(_LOSSY_RELEASE):
            failures.append(
                f"draft_sample_method 'probabilistic' is not lossless in vLLM {version}: its "
                f"acceptance figures are no evidence{fix} (or use another vLLM release)"
            )
        elif version is None or not version[:1].isdigit() or ".dev" in version:
            undecided.append(
                "draft_sample_method 'probabilistic' was not lossless in vLLM 0.28, and this "
                f"server's vLLM version is {version or 'unknown'}: cannot tell whether its "
                "acceptance figures are evidence"
            )
    return failures, undecided


def _version(ctx: CheckContext) -> str | None:
    return vllm_version(ctx)


def _log_blind(ctx: CheckContext) -> str | None:
    """Why the server's start-up log, read, holds no record stage c can use (no INFO record of
    vLLM's before ready), naming the setting that explains it; None when it holds some (or when
    there is no log to read: that is a warning, see stage_server)."""
    facts = ctx.log
    if facts is None or facts.info_records or facts.engine is not None or facts.aux is not None:
        return None
    server = ctx.server
    argv = [str(a) for a in getattr(server, "argv", None) or []]
    settings = logging_settings(argv)
    record = getattr(server, "record", None)
    env = [n for n in getattr(record, "env_names", None) or [] if n in LOGGING_ENV]
    settings += [f"{name} set in its environment" for name in env]
    if settings:
        why = f"the server was started with {', '.join(settings)}"
    elif facts.records:
        why = f"its log holds {facts.records} vLLM record(s), none at INFO (a level above INFO?)"
    else:
        why = (
            f"none of its {facts.lines_read} log line(s) is a vLLM record in the text or JSON "
            "format (a VLLM_LOGGING_PREFIX or a custom logging config?)"
        )
    return (
        "cannot tell which auxiliary layers and drafter the engine runs: its start-up log "
        f"shows no readable INFO record ({why}); serve with vLLM's default logging (INFO, no "
        "prefix; the JSON formatter is read too) to have them checked"
    )


def _engine_spec(engine: Any) -> dict[str, Any]:
    return {
        "method": engine.spec_method,
        "model": engine.spec_model,
        "num_speculative_tokens": engine.num_spec_tokens,
    }


def _argv_problems(ctx: CheckContext, spec: dict[str, Any], read: Any = None) -> list[str]:
    if not spec:
        return ["the server's command line has no --speculative-config: it is not speculating"]
    problems = []
    many = len(getattr(read, "given", []) or [])
    which = f" (of {many} speculative options, the one vLLM uses)" if many > 1 else ""
    if many > 1 and getattr(read, "repeated", False):
        which = f" (the last of {many} speculative options: the one vLLM uses)"
    if spec.get("method") != "dflash":
        problems.append(f"speculative method {spec.get('method')!r}{which}, expected 'dflash'")
    if ctx.container is not None:  # through the container's mounts, to the host directory
        mismatch = ctx.container.drafter_mismatch(spec.get("model"), which)
        problems += [mismatch] if mismatch else []
    elif not same_path(spec.get("model"), ctx.target.model_dir):
        problems.append(
            f"the server runs drafter {spec.get('model')!r}{which}, not {ctx.target.model_dir!r}"
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
    where = "this launch's start-up records" + ("" if facts.launch else " (no launch line)")
    if facts.ready is None:
        evidence.append(f"{where}: no line where the server reports ready")
    if facts.not_records:
        evidence.append(
            f"{facts.not_records} start-up phrase(s) outside vLLM's own records: not evidence"
        )
    if engine is None:
        evidence.append(f"no engine start-up record in {where} ({facts.lines_read} lines)")
    else:
        evidence.append(
            f"engine v{engine.version}: speculative method {engine.spec_method}, drafter "
            f"{engine.spec_model}, num_spec_tokens {engine.num_spec_tokens}"
        )
        problems += _engine_disagrees(ctx, engine, spec)
    aux = facts.aux
    if aux is None and not facts.info_records and engine is None:
        pass  # nothing readable at all: "cannot tell" (_log_blind), not a finding
    elif aux is None:
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


def _engine_disagrees(ctx: CheckContext, engine: Any, spec: dict[str, Any]) -> list[str]:
    """The engine's own start-up record against the command line and the provisioned drafter:
    any difference means one of them does not say what runs."""
    out = []
    if engine.spec_method is None:
        out.append(
            "the engine's start-up record has no speculative config, the command line says "
            f"method {spec.get('method')!r} with drafter {spec.get('model')!r}"
        )
        return out
    if engine.spec_method != spec.get("method"):
        out.append(
            f"the engine's start-up record says speculative method {engine.spec_method!r}, the "
            f"command line says {spec.get('method')!r}"
        )
    if not same_path(engine.spec_model, str(spec.get("model"))):
        out.append(
            f"the engine's start-up record says drafter {engine.spec_model!r}, the command line "
            f"says {spec.get('model')!r}"
        )
    if ctx.container is not None:
        if not ctx.container.drafter_mismatch(spec.get("model")):
            mismatch = ctx.container.drafter_mismatch(engine.spec_model)
            out += [f"the engine's start-up record: {mismatch}"] if mismatch else []
    elif not same_path(engine.spec_model, ctx.target.model_dir) and same_path(
        spec.get("model"), ctx.target.model_dir
    ):
        out.append(
            f"the engine runs drafter {engine.spec_model!r}, not the provisioned "
            f"{ctx.target.model_dir!r}"
        )
    if engine.num_spec_tokens != spec.get("num_speculative_tokens"):
        out.append(
            f"the engine runs {engine.num_spec_tokens} speculative tokens, the command line "
            f"says {spec.get('num_speculative_tokens')}"
        )
    return out


def _server_fix(ctx: CheckContext, problems: list[str], port: int) -> str:
    """Restart with the right settings; after a push first when the file on disk is wrong (the
    server read it at start-up)."""
    target = shlex.quote(ctx.target.display())
    wrong_file = ctx.disk is not None and ctx.disk.data != ctx.authority.data
    first = f"{ctx.push_fix} && " if wrong_file else ""
    size, _ = block_size_of(ctx.auth_doc)
    n = (
        f" --num-speculative-tokens {size - 1}"
        if size and any("num_speculative_tokens" in p for p in problems)
        else ""
    )
    launch = f"dflash-provision launch {target} --port {port}"
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
