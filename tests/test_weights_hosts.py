"""The weights check for real: a config of one revision beside the weights of another (the
reference drafter's config, 5 layers and 5 taps, beside the safetensors of a 4-layer, 3-tap
revision) on an sshd host and inside an LXC busybox container behind it, refused by validate,
launch's pre-flight, runtime-check stage a and doctor, each naming the fields. Only the headers
are read on the target (the files hold GBs of sparse bf16 weights); a symlink out of the
drafter directory is not followed. The vLLM STAND-IN (a test double) is what launch would
start."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE, TARGET_DIR
from tests.fixtures.safetensors_files import put_weights, reference_shapes
from tests.fixtures.standin import Bed, ContainerBed, stages

pytestmark = [pytest.mark.integration, pytest.mark.root]

LAYERS = "num_hidden_layers: config 5, weights 4 (layers.0-3)"
TAPS = (
    "target_layer_ids: config 5 ids × hidden 5120 = 25600, weights fc.weight input width 15360 "
    "= 3 × 5120 (fc.weight [5120, 15360])"
)
OTHER_REVISION = reference_shapes(layers=4, taps=3)
Runner = Callable[[list[str], bytes], object]  # a host's or a container's exec


def _assert_refused_everywhere(bed: Bed, target: str) -> None:
    ssh = bed.ssh()
    authority = bed.authority(REFERENCE)

    validate = bed.cli.run("validate", target, "--no-effective", *ssh)
    assert validate.returncode == ExitCode.INVALID, validate.stdout + validate.stderr
    assert "✗ weights" in validate.stdout
    assert LAYERS in validate.stdout and TAPS in validate.stdout

    launch = bed.cli.run(
        "launch", target, "--model", TARGET_DIR, "--from", authority, "--vllm",
        bed.standin.vllm, "--python", bed.standin.python, "--port", str(bed.port),
        "--ready-timeout", "120", "--no-check", *ssh,
    )  # fmt: skip
    assert launch.returncode == ExitCode.INVALID, launch.stdout + launch.stderr
    assert "pre-flight: the drafter's weights do not fit its config" in launch.stderr
    assert LAYERS in launch.stderr and TAPS in launch.stderr
    status = bed.cli.run("status", target, "--port", str(bed.port), *ssh)
    assert status.returncode == ExitCode.NOT_RUNNING, status.stdout + status.stderr

    check = bed.cli.run(
        "runtime-check", target, "--from", authority, "--port", str(bed.port), "--json",
        "--skip-loader", *ssh,
    )  # fmt: skip
    assert check.returncode == ExitCode.RUNTIME_CHECK_FAILED, check.stdout + check.stderr
    a = stages(json.loads(check.stdout))["a"]
    assert a["status"] == "failed"
    assert a["summary"] == f"the weights do not fit the authoritative config: {LAYERS} (+1 more)"
    weights = a["data"]["weights"]
    assert (weights["checked"], weights["ok"]) == (True, False)
    assert weights["mismatches"] == [LAYERS, TAPS]
    assert "ONE revision" in a["fix"]

    doctor = bed.cli.run("doctor", target, "--from", authority, "--port", str(bed.port), *ssh)
    out = doctor.stdout
    assert doctor.returncode == ExitCode.INVALID, out + doctor.stderr
    assert "first broken link: file on disk: the weights do not fit" in out
    assert f"weights: {LAYERS}" in out and f"weights: {TAPS}" in out
    fix = next(line for line in out.splitlines() if line.startswith("fix: "))
    assert "ONE revision" in fix and "push" in fix


def test_a_config_of_another_revision_is_refused_by_all_four_on_a_host(bed: Bed) -> None:
    put_weights(
        lambda argv, data: bed.host.exec(argv, data, check=True),
        f"{DRAFTER_DIR}/model.safetensors",
        OTHER_REVISION,
    )
    _assert_refused_everywhere(bed, f"{bed.host.alias}:{DRAFTER_DIR}")


@pytest.mark.lxc
def test_a_config_of_another_revision_is_refused_by_all_four_in_a_busybox_container(
    container_bed: ContainerBed,
) -> None:
    container = container_bed.container
    put_weights(
        lambda argv, data: container.attach(argv, data),
        f"{DRAFTER_DIR}/model.safetensors",
        OTHER_REVISION,
    )
    _assert_refused_everywhere(container_bed.bed, container_bed.target)
    run: Runner = lambda argv, data: container.attach(argv, data)  # noqa: E731
    _assert_outside_link_not_followed(container_bed.bed, container_bed.target, run)


def _assert_outside_link_not_followed(bed: Bed, target: str, run: Runner) -> None:
    """The weights of another revision lie outside; a link to them in the drafter directory
    would fail the check if it were followed."""
    put_weights(run, "/root/elsewhere/model.safetensors", OTHER_REVISION)
    path = f"{DRAFTER_DIR}/model.safetensors"
    run(
        [
            "sh",
            "-c",
            'rm -f "$2" && ln -s "$1" "$2"',
            "sh",
            "/root/elsewhere/model.safetensors",
            path,
        ],
        b"",
    )
    check = bed.cli.run(
        "runtime-check", target, "--from", bed.authority(REFERENCE), "--port", str(bed.port),
        "--json", "--skip-loader", *bed.ssh(),
    )  # fmt: skip
    a = stages(json.loads(check.stdout))["a"]
    assert a["status"] == "passed", a
    weights = a["data"]["weights"]
    assert (weights["checked"], weights["ok"]) == (False, None)
    why = "model.safetensors: a symlink that points outside the directory: not followed"
    assert why in weights["detail"] and any(why in w for w in a["warnings"])

    validate = bed.cli.run("validate", target, "--no-effective", *bed.ssh())
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "- weights (skipped)" in validate.stdout and why in validate.stdout


def test_a_safetensors_symlink_out_of_the_drafter_directory_is_not_followed(bed: Bed) -> None:
    run: Runner = lambda argv, data: bed.host.exec(argv, data, check=True)  # noqa: E731
    _assert_outside_link_not_followed(bed, f"{bed.host.alias}:{DRAFTER_DIR}", run)
