"""The node_exporter textfile of a rollout (``rollout --prometheus FILE``), written when it
stops (completed, paused, rolled back, aborted, refused, interrupted)::

    dflash_rollout_state{rollout,state}              1 for the state it is in, 0 for the others
    dflash_rollout_batch{rollout}                    the batch it reached (0: none started)
    dflash_rollout_host_passed{rollout,host,batch}   1 when the host passed its gate
    dflash_rollout_acceptance_rate{rollout,host,when}  when = baseline | new | after_rollback
    dflash_rollout_timestamp_seconds                 when the file was written (Unix time)
"""

from __future__ import annotations

from dflash_provision.fleet.report import prometheus_labels
from dflash_provision.rollout.record import Rollout, State


def prometheus_text(rollout: Rollout, *, timestamp: float) -> str:
    lines: list[str] = []

    def metric(name: str, help_text: str) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} gauge"])

    rid = rollout.id
    metric("dflash_rollout_state", "1 for the state the rollout is in.")
    for state in State:
        value = int(rollout.state is state)
        lines.append(
            f"dflash_rollout_state{prometheus_labels(rollout=rid, state=state.value)} {value}"
        )
    metric("dflash_rollout_batch", "The batch the rollout reached (0: none started).")
    lines.append(f"dflash_rollout_batch{prometheus_labels(rollout=rid)} {rollout.batch}")
    metric(
        "dflash_rollout_host_passed",
        "1 when the host passed the rollout's gate (or already ran the config: unchanged).",
    )
    for h in rollout.hosts:
        labels = prometheus_labels(rollout=rid, host=h.name, batch=str(h.batch))
        passed = h.phase in ("passed", "unchanged")
        lines.append(f"dflash_rollout_host_passed{labels} {int(passed)}")
    metric("dflash_rollout_acceptance_rate", "Acceptance before, with and after the rollout.")
    for h in rollout.hosts:
        for when, figures in (
            ("baseline", h.baseline),
            ("new", h.new),
            ("after_rollback", h.after),
        ):
            if figures.rate is not None:
                labels = prometheus_labels(rollout=rid, host=h.name, when=when)
                lines.append(f"dflash_rollout_acceptance_rate{labels} {figures.rate:.6f}")
    metric("dflash_rollout_timestamp_seconds", "Unix time when this file was written.")
    lines.append(f"dflash_rollout_timestamp_seconds {timestamp:.3f}")
    return "\n".join(lines) + "\n"
