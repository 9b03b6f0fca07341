"""doctor for real: the CLI against an sshd host in namespaces and an LXC busybox container
inside it, with the vLLM STAND-IN (a test double, named so everywhere) serving the drafter.
The incident's state is rebuilt exactly: the wrong file inside the container, a server started
with it, drafts accepted 1.1% of the time."""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.runtime import DRAFTER_DIR, INCIDENT
from tests.fixtures.standin import Bed, ContainerBed

# `bed` and `container_bed` (tests/fixtures/standin.py) are the beds runtime-check uses too.

pytestmark = [pytest.mark.integration, pytest.mark.root]


@pytest.mark.lxc
def test_doctor_on_the_incident_names_the_file_on_disk_and_the_push_that_fixes_it(
    container_bed: ContainerBed,
) -> None:
    container_bed.put(f"{DRAFTER_DIR}/config.json", INCIDENT)
    container_bed.launch(INCIDENT)  # the server runs the wrong file, as in the incident
    from testbed.vllm_standin_install import write_control

    write_control(container_bed.container, "/root/standin/control.json", {"acceptance": 0.011})

    proc = container_bed.run("doctor")
    out = proc.stdout
    assert proc.returncode == ExitCode.DRIFT, out + proc.stderr
    lines = out.splitlines()
    # The trace, top to bottom, in the pipeline's order.
    heads = [line.split()[1] for line in lines if line[:1].isdigit()]
    assert heads == ["authoritative", "file", "validation", "loader", "vLLM", "running",
                     "acceptance"]  # fmt: skip
    assert any(
        line.startswith("2 file on disk") and line.endswith("<-- first broken link")
        for line in lines
    )
    for wrong in (
        "dflash_config.mask_token_id: 248064 → 248070",
        "dflash_config.target_layer_ids[1]: 17 → 16",
        "sliding_window: null → 2048",
    ):
        assert wrong in out
    assert "acceptance 1.1% is below --min-acceptance 10.0%" in out
    assert "first broken link: file on disk" in out
    fix = next(line for line in lines if line.startswith("fix: "))
    assert fix.startswith(f"fix: dflash-provision push {container_bed.target} --from ")
    assert "--restart" in fix  # the server read the wrong file at start-up

    report = json.loads(container_bed.run("doctor", "--json").stdout)
    assert report["first_broken_link"] == "file on disk"
    assert [link["status"] for link in report["links"]][:2] == ["passed", "failed"]


def test_doctor_on_a_healthy_server_finds_nothing_broken(bed: Bed) -> None:
    bed.launch()
    proc = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), *bed.ssh(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing broken" in proc.stdout


def test_doctor_with_low_acceptance_and_a_right_file_names_acceptance_with_causes(bed: Bed) -> None:
    bed.launch()
    bed.control(acceptance=0.011)
    proc = bed.cli.run(
        "doctor", f"{bed.host.alias}:{DRAFTER_DIR}", "--from", bed.authority(),
        "--port", str(bed.port), *bed.ssh(),
    )  # fmt: skip
    assert proc.returncode == ExitCode.ACCEPTANCE_LOW, proc.stdout + proc.stderr
    assert "first broken link: acceptance" in proc.stdout
    assert "likely causes, in the order to check them:" in proc.stdout
