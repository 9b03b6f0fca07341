"""The target-side probe (vllm/probe.py) run over a transport with a python of the target's:
its program text on stdin, bounded on the target at its deadline, its one JSON object back.
runtime-check's stage b and launch's pre-flight both ask it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_provision.server.bounded import EndedAtDeadline, run_bounded
from dflash_provision.vllm import probe

if TYPE_CHECKING:
    from dflash_provision.transport.base import Transport

_MAX_PROBE_OUTPUT = 256 * 1024


def probe_command(
    python: str,
    drafter_dir: str,
    model: str | None,
    num_spec: int | None,
    timeout: float,
    *,
    vllm_only: bool = False,
) -> list[str]:
    """argv for the target-side probe (its source goes on stdin, see vllm/probe.py)."""
    argv = [python, "-", "--drafter", drafter_dir, "--timeout", f"{timeout:g}"]
    if vllm_only:
        argv.append("--vllm-only")
    if model:
        argv += ["--model", model]
    if num_spec is not None:
        argv += ["--num-speculative-tokens", str(num_spec)]
    return argv


def probe_source() -> str:
    """The probe's program text (vllm/probe.py), shipped on stdin."""
    source = getattr(probe, "PROBE_SOURCE", None)
    if isinstance(source, str):
        return source
    maker = getattr(probe, "probe_source", None)
    if callable(maker):
        return str(maker())
    return Path(probe.__file__).read_text(encoding="utf-8")


def run_probe_on(
    transport: Transport,
    drafter_dir: str,
    python: str,
    model: str | None,
    num_spec: int | None,
    timeout: float,
    *,
    vllm_only: bool = False,
) -> dict[str, Any] | str:
    """The probe with ``python`` on the target (stage b, launch's pre-flight): its JSON
    object, or a one-line error."""
    budget = max(timeout, 30.0)
    argv = probe_command(python, drafter_dir, model, num_spec, budget, vllm_only=vllm_only)
    try:
        source = probe_source()
    except ImportError:
        return "the target-side probe (dflash_provision.vllm.probe) is not in this build"
    try:  # ended on the target at its deadline, not only abandoned here
        result = run_bounded(transport, argv, stdin=source.encode(), timeout=budget + 15)
    except EndedAtDeadline as exc:
        return f"the probe did not finish: {exc.message}"
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
