"""The five stages of ``runtime-check``, each a function from what is known so far to a
:class:`StageResult` (status, one-line summary, evidence lines, data for JSON, the fix).

    a  file on disk        the target's config.json equals the authoritative config, and the
                           weights beside it (their safetensors headers) fit it; with a lock
                           that pins the other files, each is the pinned one where it lies
    b  loader and vLLM     the config as the target's own transformers loads it, and (where vLLM
                           is importable there) vLLM's own resolution of the draft: aux layer ids,
                           per-layer windows, draft hf_config, field by field vs authoritative
    c  running server      the process on the port: method dflash, this drafter, N, engine
                           version, aux layers == target_layer_ids + 1 from its start-up log
    d  completion          one real completion succeeds
    e  acceptance          spec-decode counters before/after greedy smoke prompts

The stages live in stage_disk.py (a, b), stage_server.py (c) and stage_traffic.py (d, e); this
module holds what they share: the result type, the stage names and the context.

Stages never raise for what a target reports (a missing file, a dead server, a probe error):
those are failed stages with evidence. Connection failures propagate (the caller classifies
them as for every other command).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflash_provision.validation.speculators_layout import runtime_view

if TYPE_CHECKING:
    from dflash_provision.remote.ops import RemoteRead
    from dflash_provision.source.authority import Authority
    from dflash_provision.target import Target
    from dflash_provision.transport.base import Transport
    from dflash_provision.verify.acceptance_gate import AcceptanceVerdict
    from dflash_provision.vllm.log import LogFacts


class StageStatus(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    # The evidence could not decide (too few draft tokens, a counter that went backwards): as
    # Argo Rollouts' analysis has it, neither Successful nor Failed. Never counted as a pass.
    INCONCLUSIVE = "inconclusive"


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
    acceptance: AcceptanceVerdict | None = None  # stage e: the gate's typed verdict

    @property
    def passed(self) -> bool:
        return self.status is StageStatus.PASSED

    @property
    def failed(self) -> bool:
        return self.status is StageStatus.FAILED

    @property
    def inconclusive(self) -> bool:
        return self.status is StageStatus.INCONCLUSIVE

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
    rehash_files: bool = False  # stage a: the pinned files hashed whatever the proofs say
    disk: RemoteRead | None = None
    probe: dict[str, Any] | None = None
    server: Any = None  # process.RunningServer
    log: LogFacts | None = None
    log_size: int | None = None  # the log's size when it was read: later lines come after
    # runtime/container_server.ContainerServer: the server runs in a Docker/Podman container;
    # stages b-e then reach it through ``docker exec`` and stage c maps its drafter to the host.
    container: Any = None
    server_version: str | None = None  # the server's GET /version (verify/reference_version.py)

    @property
    def target_layer_ids(self) -> list[int] | None:
        # The speculators layout as vLLM converts it: its aux ids - 1.
        inner = runtime_view(self.auth_doc).get("dflash_config")
        ids = inner.get("target_layer_ids") if isinstance(inner, dict) else None
        ids = ids if ids is not None else self.auth_doc.get("target_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return ids
        return None

    @property
    def expected_aux(self) -> list[int] | None:
        ids = self.target_layer_ids
        return [i + 1 for i in ids] if ids is not None else None
