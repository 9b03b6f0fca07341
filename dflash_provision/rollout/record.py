"""The rollout record: the whole state of one rollout as plain data, saved before every step.

A rollout's ``state`` goes ``planned → preflight → baseline → batch → completed``, or from
``batch`` to ``paused`` (an inconclusive check), ``rolled_back`` (a batch failed and was
restored), ``rollback_failed`` (a restore could not be proved) or ``aborted``. Each host keeps
its own ``phase``: ``pending → writing → written → restarting → restarted → checking →
passed | failed | inconclusive``, and on the way back ``rolling_back → rolled_back |
rollback_failed``; ``excluded`` hosts failed pre-flight and were left out on request;
``unchanged`` hosts already held the new bytes and their server was proved to run them (nothing
written, nothing restarted, nothing to roll back). A phase
ending in ``-ing`` was started and not known to be finished: ``--resume`` and ``--abort`` read
the host again before acting on it.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any


class State(enum.StrEnum):
    PLANNED = "planned"
    PREFLIGHT = "preflight"
    BASELINE = "baseline"
    BATCH = "batch"
    PAUSED = "paused"
    COMPLETED = "completed"
    ROLLED_BACK = "rolled_back"
    ROLLBACK_FAILED = "rollback_failed"
    ABORTED = "aborted"
    REFUSED = "refused"  # pre-flight failed: nothing was written
    INTERRUPTED = "interrupted"  # Ctrl-C in pre-flight or baseline: nothing was written

    @property
    def open(self) -> bool:
        """Still holds its hosts: it can be resumed or aborted (rollback_failed: aborted)."""
        open_states = (State.PLANNED, State.PREFLIGHT, State.BASELINE, State.BATCH, State.PAUSED)
        # A rollback not proved keeps its hosts too: only --abort knows what they hold.
        return self in (*open_states, State.ROLLBACK_FAILED)


#: Host phases in which this rollout may have changed the host's file or server.
CHANGED = frozenset(
    {
        "writing",
        "written",
        "restarting",
        "restarted",
        "checking",
        "passed",
        "failed",
        "inconclusive",
        "rolling_back",
        "rollback_failed",
    }
)


@dataclass
class Figures:
    """Acceptance as stage e measured it (or a recorded reference)."""

    rate: float | None = None
    mean_length: float | None = None
    source: str = ""  # "measured" | "reference" | ""

    def show(self) -> str:
        return f"{self.rate:.1%}" if self.rate is not None else "-"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Figures:
        data = data or {}
        return cls(data.get("rate"), data.get("mean_length"), str(data.get("source", "")))


@dataclass
class HostState:
    name: str
    target: str  # the TARGET form (for the commands printed)
    path: str
    batch: int = 0  # 1-based; 0: not placed (excluded)
    phase: str = "pending"
    port: int | None = None
    restart: bool = False  # a live server started by launch serves this drafter dir
    launch: dict[str, Any] | None = None  # its LaunchRecord (argv, env NAMES, model, ...)
    old_sha256: str | None = None
    new_sha256: str | None = None
    backup: str | None = None  # the backup push kept of the old bytes
    diff: list[str] = field(default_factory=list)
    baseline: Figures = field(default_factory=Figures)
    new: Figures = field(default_factory=Figures)
    after: Figures = field(default_factory=Figures)
    detail: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # write_s, restart_s, check_s
    # Where the name led when the rollout began (identity.Identity as a dict): the host the
    # record speaks of, whatever the inventory says later. None in records from before it.
    identity: dict[str, Any] | None = None
    write_row: int | None = None  # the history row of a write in flight (closed at --resume)
    # What a rollback returns to (rollout/what_ran.py): the sha256 of the config the server ran
    # at baseline and its bytes as text when they were found (None: not recoverable).
    return_sha256: str | None = None
    return_config: str | None = None
    # The container the server runs in (rollout --container): {"container": "docker:NAME"} from
    # the options, then what pre-flight found (runtime/container_restart.ServedBy). The record
    # is the truth: --resume and --abort restart that container, whatever the options say.
    server_container: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostState:
        values = dict(data)
        for key in ("baseline", "new", "after"):
            values[key] = Figures.from_dict(values.get(key))
        return cls(**values)

    def add_time(self, key: str, seconds: float) -> None:
        self.timings[key] = round(self.timings.get(key, 0.0) + seconds, 3)


@dataclass
class Gate:
    max_fail_percentage: float = 0.0
    min_acceptance: float = 0.10
    max_regression: float | None = None

    def describe(self) -> str:
        regression = (
            f", mean acceptance length at most {self.max_regression:.0%} below baseline"
            if self.max_regression is not None
            else ""
        )
        return (
            f"a host passes when stages a-d pass, acceptance >= {self.min_acceptance:.0%}"
            f"{regression}; a batch passes when at most {self.max_fail_percentage:g}% of its "
            "hosts fail; an inconclusive check pauses"
        )


@dataclass
class Rollout:
    id: str
    created_at: str
    source: str  # the new config's label
    new_config: str  # its bytes (a config is a few KiB; resume needs no Hub)
    new_sha256: str
    batches: list[str]
    gate: Gate
    hosts: list[HostState]
    state: State = State.PLANNED
    batch: int = 0  # the batch being worked on (1-based; 0 before the first)
    rollback_all: bool = False
    check: dict[str, Any] = field(default_factory=dict)  # runtime-check settings (prompts...)
    connection_args: list[str] = field(default_factory=list)  # for the printed commands
    message: str = ""
    walls: dict[str, float] = field(default_factory=dict)  # seconds per step: preflight_s...
    # The files the new config's lock pins beside it (PinnedFile.to_dict each; none for a
    # lock of the config alone): each host's pre-flight checks them; --resume as well.
    pinned_files: list[dict[str, Any]] = field(default_factory=list)
    rehash_files: bool = False  # hash them all, not relying on recorded proofs

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        values = dict(data)
        values["state"] = State(values["state"])
        values["gate"] = Gate(**values["gate"])
        values["hosts"] = [HostState.from_dict(h) for h in values["hosts"]]
        return cls(**values)

    def add_wall(self, key: str, seconds: float) -> None:
        self.walls[key] = round(self.walls.get(key, 0.0) + seconds, 3)

    def in_batch(self, batch: int) -> list[HostState]:
        return [h for h in self.hosts if h.batch == batch]

    @property
    def batch_count(self) -> int:
        return max((h.batch for h in self.hosts), default=0)

    def command(self, verb: str) -> str:
        """The exact command that resumes (``--resume``) or aborts this rollout."""
        return shlex.join(["dflash-provision", "rollout", verb, self.id, *self.connection_args])
