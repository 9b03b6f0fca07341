"""The node_exporter textfile of a rollout (``rollout --prometheus FILE``), written when it
stops (completed, paused, rolled back, aborted, refused, interrupted)::

    dflash_rollout_state{rollout,state}              1 for the state it is in, 0 for the others
    dflash_rollout_batch{rollout}                    the batch it reached (0: none started)
    dflash_rollout_host_passed{rollout,host,batch}   1 when the host passed its gate
    dflash_rollout_acceptance_rate{rollout,host,when}  when = baseline | new | after_rollback
    dflash_rollout_timestamp_seconds                 when the file was written (Unix time)
"""

from __future__ import annotations

from dflash_provision.formats.prometheus_text import MetricFamily, render
from dflash_provision.rollout.record import Rollout, State


def prometheus_text(rollout: Rollout, *, timestamp: float) -> str:
    rid = rollout.id
    state = MetricFamily("dflash_rollout_state", "1 for the state the rollout is in.")
    for each in State:
        state.add(rollout.state is each, rollout=rid, state=each.value)
    batch = MetricFamily("dflash_rollout_batch", "The batch the rollout reached (0: none started).")
    batch.add(rollout.batch, rollout=rid)
    passed = MetricFamily(
        "dflash_rollout_host_passed",
        "1 when the host passed the rollout's gate (or already ran the config: unchanged).",
    )
    for h in rollout.hosts:
        passed.add(h.phase in ("passed", "unchanged"), rollout=rid, host=h.name, batch=str(h.batch))
    rate = MetricFamily(
        "dflash_rollout_acceptance_rate", "Acceptance before, with and after the rollout."
    )
    for h in rollout.hosts:
        for when, figures in (
            ("baseline", h.baseline),
            ("new", h.new),
            ("after_rollback", h.after),
        ):
            if figures.rate is not None:
                rate.add(figures.rate, rollout=rid, host=h.name, when=when)
    written = MetricFamily(
        "dflash_rollout_timestamp_seconds", "Unix time when this file was written.", digits=3
    )
    written.add(timestamp)
    return render([state, batch, passed, rate, written])
