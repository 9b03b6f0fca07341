"""The acceptance diagnosis and doctor's fix lines for real: the CLI against an sshd host in
namespaces (and an LXC busybox container behind it) with the vLLM STAND-IN (a test double,
named so everywhere) serving the drafter. Causes are ranked by what the stages measured; a
cause a passed stage ruled out is never the first fix; a fix belongs to its cause."""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.cli import Done
from tests.fixtures.runtime import CONTROL, DRAFTER_DIR, put
from tests.fixtures.standin import Bed, ContainerBed, stages

pytestmark = [pytest.mark.integration, pytest.mark.root]


def cause_lines(out: str) -> list[str]:
    """The cause lines under "likely causes, in the order to check them:"."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "likely causes, in the order" in line)
    causes = []
    for line in lines[start + 1 :]:
        text = line.strip()
        if not (text[:1].isdigit() or text.startswith(("ruled out: ", "measured: "))):
            break
        causes.append(text)
    return causes


def numbered(causes: list[str]) -> list[str]:
    return [c for c in causes if c[:1].isdigit()]


def doctor(bed: Bed, *extra: str) -> Done:
    return bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), *bed.ssh(), "-v", *extra,
    )  # fmt: skip


def test_low_acceptance_with_the_right_file_does_not_lead_with_the_file(bed: Bed) -> None:
    bed.launch()
    bed.control(acceptance=0.011)
    proc = bed.check()
    assert proc.returncode == ExitCode.ACCEPTANCE_LOW, proc.stdout + proc.stderr
    assert "a  file on disk: PASSED" in proc.stdout
    causes = cause_lines(proc.stdout)
    assert causes[0].startswith("measured: every position is near zero")
    first = numbered(causes)[0]
    assert not first.startswith("1. the file on disk"), first
    assert "; fix: " in first
    ruled = next(c for c in causes if "the file on disk is not the authoritative config" in c)
    assert ruled.startswith("ruled out: stage a passed (")
    assert causes.index(ruled) > causes.index(numbered(causes)[-1])  # after every live cause


def test_doctor_with_a_target_python_without_transformers_names_python_as_the_fix(
    bed: Bed,
) -> None:
    # A python that cannot import transformers, whatever this machine installed: -I -S leaves
    # every site-packages directory out.
    put(bed.host, "/root/bare/python3", b'#!/bin/sh\nexec /usr/bin/python3 -I -S "$@"\n')
    bed.host.exec(["chmod", "755", "/root/bare/python3"], check=True)
    bed.launch()
    proc = doctor(bed, "--python", "/root/bare/python3")
    out = proc.stdout
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, out + proc.stderr
    assert "first broken link: loader on the target" in out
    assert "cannot import transformers" in out
    fix = next(line for line in out.splitlines() if line.startswith("fix: "))
    assert "--python" in fix, fix
    assert "use_sliding_window" not in fix, fix  # another cause's fix


def test_a_cliff_shaped_curve_puts_the_sliding_window_causes_first(bed: Bed) -> None:
    bed.launch()
    bed.control(per_position_acceptance=[0.9, 0.8, 0.0, 0.0])
    code, report = bed.check_json("--min-acceptance", "0.5")
    e = stages(report)["e"]
    assert code == ExitCode.ACCEPTANCE_LOW, e
    per_position = e["data"]["per_position"]
    assert [round(p, 1) for p in per_position[:3]] == [0.9, 0.8, 0.0]
    assert max(per_position[2:]) == 0.0
    causes = e["causes"]
    assert "falls off a cliff after position 1: " in causes[0]
    assert "then <= 0.05 from position 2" in causes[0]
    # the loader passed stage b: ruled out; vLLM's own window handling was not measured there
    first = numbered(causes)[0]
    assert first.startswith("1. vLLM runs the draft's sliding-window layers as full"), first
    assert any(
        c.startswith("ruled out: stage b passed (the target's transformers keeps every critical")
        for c in causes
    )


def test_doctor_prints_the_causes_once_and_the_fix_of_the_first(bed: Bed) -> None:
    bed.launch()
    bed.control(acceptance=0.011)
    proc = doctor(bed)
    out = proc.stdout
    assert proc.returncode == ExitCode.ACCEPTANCE_LOW, out + proc.stderr
    causes = cause_lines(out)
    assert len(causes) > 3
    for cause in causes:
        assert out.count(cause) == 1, cause
    first_fix = numbered(causes)[0].rpartition("; fix: ")[2]
    assert f"\nfix: {first_fix}\n" in out
    listed = json.loads(doctor(bed, "--json").stdout)
    text = json.dumps(listed)
    acceptance = next(link for link in listed["links"] if link["link"] == "acceptance")
    assert acceptance["causes"]
    for cause in acceptance["causes"]:
        assert text.count(json.dumps(cause)) == 1, cause


@pytest.mark.lxc
def test_in_a_container_the_passed_file_is_ruled_out_and_the_fix_is_the_first_causes(
    container_bed: ContainerBed,
) -> None:
    from testbed.vllm_standin_install import write_control

    container_bed.launch()
    write_control(container_bed.container, CONTROL, {"acceptance": 0.011})
    proc = container_bed.run("doctor")
    out = proc.stdout
    assert proc.returncode == ExitCode.ACCEPTANCE_LOW, out + proc.stderr
    assert "first broken link: acceptance" in out
    causes = cause_lines(out)
    assert not numbered(causes)[0].startswith("1. the file on disk")
    assert any(c.startswith("ruled out: stage a passed (") for c in causes)
    first_fix = numbered(causes)[0].rpartition("; fix: ")[2]
    assert f"\nfix: {first_fix}\n" in out
