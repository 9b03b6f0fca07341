"""The one Prometheus text writer (formats/prometheus_text.py) and its three callers' textfiles
(audit, fleet runtime-check, rollout), judged by prometheus_client's own parser: every line
parses, every family has HELP and TYPE, and a label value with a backslash, a quote or a line
feed comes back exactly as it went in."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dflash_provision.fleet import HostAudit, HostStatus, Timings, report
from dflash_provision.formats.prometheus_text import (
    MetricFamily,
    escape_help,
    escape_label_value,
    render,
    value_text,
)
from dflash_provision.rollout import prometheus as rollout_prometheus
from dflash_provision.rollout.record import Gate, HostState, Rollout, State
from dflash_provision.verify import fleet_check
from dflash_provision.verify.runtime_check import CheckReport, StageResult, StageStatus

# What an inventory may put in a host name, a group or a path: every character the format escapes.
ODD = 'gpu"7\\rack\nb'


def parsed(text: str) -> dict[str, Any]:
    """name -> (help, type, [(labels, value)]) as prometheus_client reads ``text``; a line it
    cannot read raises."""
    assert text.endswith("\n") and not text.endswith("\n\n")
    return {
        f.name: (f.documentation, f.type, [(s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_label_values_escape_backslash_quote_and_line_feed() -> None:
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert escape_help('a\\b"c\nd') == 'a\\\\b"c\\nd'  # HELP keeps the quote as it is


def test_a_family_round_trips_through_the_reference_parser() -> None:
    family = MetricFamily("dflash_test_gauge", 'help with \\ and "quotes"\nand a second line')
    family.add(1, host=ODD, path="/m/config.json")
    family.add(0.25, host="plain", path="")
    bare = MetricFamily("dflash_test_timestamp_seconds", "when", digits=3)
    bare.add(1700000000.5)
    text = render([family, bare])
    families = parsed(text)
    help_text, kind, samples = families["dflash_test_gauge"]
    assert help_text == 'help with \\ and "quotes"\nand a second line'
    assert kind == "gauge"
    assert samples == [
        ({"host": ODD, "path": "/m/config.json"}, 1.0),
        ({"host": "plain", "path": ""}, 0.25),
    ]
    assert families["dflash_test_timestamp_seconds"][2] == [({}, 1700000000.5)]
    assert "dflash_test_timestamp_seconds 1700000000.500\n" in text


def test_values_are_written_as_the_format_spells_them() -> None:
    assert [value_text(v) for v in (True, 0, 7, 0.5)] == ["1", "0", "7", "0.500000"]
    assert [value_text(v) for v in (float("nan"), float("inf"), -float("inf"))] == [
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_what_the_format_cannot_hold_is_refused_not_written() -> None:
    bad_label = MetricFamily("dflash_x", "a label name with a dash")
    bad_label.add(1, **{"bad-label": "x"})
    for family in (
        MetricFamily("2bad", "a metric name must not start with a digit"),
        MetricFamily("dflash_x", "a type the format has not", kind="gaugey"),
        bad_label,
    ):
        with pytest.raises(ValueError, match="not a Prometheus"):
            render([family])


def _audit(name: str, status: HostStatus, *, group: str, path: str) -> HostAudit:
    return HostAudit(
        name=name,
        group=group,
        target=f"{name}:{path}",
        path=path,
        status=status,
        detail=status.value,
        authority="z-lab/Qwen3.6-27B-DFlash@abc",
        expected_sha256="e" * 64,
        timings=Timings(read_s=0.01, total_s=0.02),
    )


def test_the_audit_textfile_is_well_formed_with_odd_names() -> None:
    audits = [
        _audit("h01", HostStatus.IN_SYNC, group="gpu", path="/m/config.json"),
        _audit(ODD, HostStatus.DRIFTED, group=ODD, path=f"/m/{ODD}/config.json"),
    ]
    families = parsed(report.prometheus_text(audits, timestamp=1700000000.5, run_duration_s=2.5))
    assert all(kind == "gauge" and help_text for help_text, kind, _ in families.values())
    _, _, in_sync = families["dflash_config_in_sync"]
    assert in_sync == [
        ({"host": "h01", "group": "gpu", "path": "/m/config.json"}, 1.0),
        ({"host": ODD, "group": ODD, "path": f"/m/{ODD}/config.json"}, 0.0),
    ]
    assert families["dflash_config_audit_run_duration_seconds"][2] == [({}, 2.5)]


def _check(name: str, e_status: StageStatus) -> fleet_check.HostCheck:
    check = CheckReport(f"{name}:/m", 8000, "test")
    for key in "abcd":
        check.stages.append(StageResult(key, key, StageStatus.PASSED, "s"))
    check.stages.append(StageResult("e", "acceptance", e_status, "too few"))
    verdict, detail = fleet_check.verdict_of(check)
    return fleet_check.HostCheck(name, ODD, f"{name}:/m", f"/m/{ODD}", verdict, detail, check)


def test_the_runtime_check_textfile_is_well_formed_with_odd_names() -> None:
    rows = [_check("gpu1", StageStatus.PASSED), _check(ODD, StageStatus.INCONCLUSIVE)]
    families = parsed(fleet_check.prometheus_text(rows, timestamp=12.25))
    assert all(kind == "gauge" and help_text for help_text, kind, _ in families.values())
    _, _, inconclusive = families["dflash_runtime_check_inconclusive"]
    assert inconclusive == [
        ({"host": "gpu1", "group": ODD, "path": f"/m/{ODD}"}, 0.0),
        ({"host": ODD, "group": ODD, "path": f"/m/{ODD}"}, 1.0),
    ]
    stages = families["dflash_runtime_stage_passed"][2]
    assert len(stages) == 2 * len(fleet_check.STAGE_KEYS)
    assert families["dflash_runtime_check_timestamp_seconds"][2] == [({}, 12.25)]


def test_the_rollout_textfile_is_well_formed_with_odd_names() -> None:
    hosts = [
        HostState(name="g0", target="h0:/m", path="/m", batch=1, phase="passed"),
        HostState(name=ODD, target="h1:/m", path="/m", batch=2, phase="failed"),
    ]
    hosts[0].baseline.rate, hosts[0].new.rate = 0.5, 0.25
    rollout = Rollout(
        id="r1", created_at="t", source="s", new_config="{}", new_sha256="a" * 64,
        batches=["g0", ODD], gate=Gate(), hosts=hosts, state=State.PAUSED, batch=2,
    )  # fmt: skip
    families = parsed(rollout_prometheus.prometheus_text(rollout, timestamp=99.5))
    assert all(kind == "gauge" and help_text for help_text, kind, _ in families.values())
    states = families["dflash_rollout_state"][2]
    assert ({"rollout": "r1", "state": "paused"}, 1.0) in states
    assert sum(value for _, value in states) == 1.0
    assert families["dflash_rollout_host_passed"][2] == [
        ({"rollout": "r1", "host": "g0", "batch": "1"}, 1.0),
        ({"rollout": "r1", "host": ODD, "batch": "2"}, 0.0),
    ]
    assert families["dflash_rollout_acceptance_rate"][2] == [
        ({"rollout": "r1", "host": "g0", "when": "baseline"}, 0.5),
        ({"rollout": "r1", "host": "g0", "when": "new"}, 0.25),
    ]
