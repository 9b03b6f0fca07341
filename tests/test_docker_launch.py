"""``launch --docker IMAGE`` on the test bed's dockerd: the image is the busybox root with the
vLLM stand-in's ``serve`` as its ENTRYPOINT (as vllm/vllm-openai's is ``vllm serve``), this
machine's Python mounted read-only through ``--docker-args``; the drafter provisioned in a host
directory is mounted by launch itself. A user checks: the new container runs and answers, its
start is proved (this start's engine record names the mounted drafter and N) and runtime-check
passes; the same launch again is refused; --restart replaces it with a new container, proved;
a drifted drafter starts nothing; a server that dies at start-up is exit 20 with its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.docker import DockerDaemon
from testbed.docker_standin import python_mount_args, standin_image
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.docker import unique_container_name

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
FROM = ("--from", str(samples.REFERENCE_DRAFTER))

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.docker]


def drafter_dir(root: Path, data: bytes = REFERENCE) -> Path:
    (root / "drafter").mkdir(parents=True)
    (root / "drafter" / "config.json").write_bytes(data)
    return root / "drafter"


def launch(daemon: DockerDaemon, home: Path, drafter: Path, name: str, *more: str) -> Done:
    return run_cli(
        "launch", drafter, *FROM, "--model", "/models/base", "--docker", standin_image(daemon),
        "--container-name", name, "--docker-args", python_mount_args(), "--port", "8124",
        "--drafter-mount", "/models/drafter", "--ready-timeout", "120", *more,
        home=home, env=daemon.environment, timeout=300,
    )  # fmt: skip


def inspect(daemon: DockerDaemon, name: str) -> dict:  # type: ignore[type-arg]
    done = daemon.docker("container", "inspect", "--", name)
    return json.loads(done.stdout)[0]  # type: ignore[no-any-return]


def test_launch_docker_starts_a_proved_container_and_restart_replaces_it(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    drafter = drafter_dir(tmp_path / "srv")
    name = unique_container_name("ld")
    try:
        first = launch(docker_daemon, tmp_path, drafter, name, "--env", "HF_TOKEN=s3cret")
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stdout.startswith(f"started: docker container {name}")
        assert (
            "proved      its engine record (v0.32.0+dflash-standin): drafter "
            "/models/drafter, num_spec_tokens 15" in first.stdout
        )
        assert "runtime-check passed" in first.stdout
        record = inspect(docker_daemon, name)
        mount = next(m for m in record["Mounts"] if m["Destination"] == "/models/drafter")
        assert (mount["Source"], mount["RW"]) == (str(drafter), False)
        assert "s3cret" not in json.dumps(record["Args"])  # the value is not on its command line
        assert "VLLM_USE_V2_MODEL_RUNNER=1" in record["Config"]["Env"]  # the mixed layout

        again = launch(docker_daemon, tmp_path, drafter, name)
        assert again.returncode == ExitCode.PORT_TAKEN, again.stdout + again.stderr
        assert "--restart replaces it" in again.stderr
        assert inspect(docker_daemon, name)["Id"] == record["Id"]

        restarted = launch(docker_daemon, tmp_path, drafter, name, "--restart", "--json")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        data = json.loads(restarted.stdout)
        new = inspect(docker_daemon, name)
        assert data["launch"]["status"] == "restarted"
        assert (data["launch"]["replaced_id"], data["launch"]["container_id"]) == (
            record["Id"], new["Id"],
        )  # fmt: skip
        assert new["Id"] != record["Id"]
        assert f"the replaced container {record['Id'][:12]} is gone" in data["launch"]["proof"]
        assert data["runtime_check"]["ok"] is True
    finally:
        docker_daemon.docker("rm", "-f", name, check=False)


def test_launch_docker_refuses_a_drifted_drafter_and_starts_nothing(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    drafter = drafter_dir(tmp_path / "srv", samples.INCIDENT_DRAFTER.read_bytes())
    name = unique_container_name("ld")
    done = launch(docker_daemon, tmp_path, drafter, name)
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    assert "not the authoritative one" in done.stderr
    listed = docker_daemon.docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert name not in listed


def test_launch_docker_reports_a_server_that_dies_at_start_up(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    drafter = drafter_dir(tmp_path / "srv")
    fatal = "ValueError: DFlash sliding attention requires a window size"
    (drafter / "control.json").write_text(json.dumps({"die_at_start": fatal}))
    name = unique_container_name("ld")
    try:
        done = launch(docker_daemon, tmp_path, drafter, name,
                      "--env", "VLLM_STANDIN_CONTROL=/models/drafter/control.json")  # fmt: skip
        assert done.returncode == ExitCode.LAUNCH_FAILED, done.stdout + done.stderr
        assert f"docker container {name} exited during start-up" in done.stderr
        assert fatal in done.stderr
    finally:
        docker_daemon.docker("rm", "-f", name, check=False)
