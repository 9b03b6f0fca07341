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


LATE_IMAGE = "dflash-testbed/vllm-standin-late-python:1"
LATE_PYTHON = "/opt/late/python"


def late_python_image(daemon: DockerDaemon, ready_after_s: int) -> str:
    """The stand-in image whose entrypoint first puts a python at LATE_PYTHON that fails (as a
    packed environment does while it unpacks), and only after ``ready_after_s`` seconds the
    real one, then execs the server (``ready_after_s`` 0: never the real one, and no server)."""
    from testbed.docker import busybox_rootfs_tar
    from testbed.docker_standin import PYTHON, STANDIN

    image = f"{LATE_IMAGE}-{ready_after_s}"
    unpacking = r"'#!/bin/sh\necho env: still unpacking >&2\nexit 1\n'"  # printf's format
    real = (
        f"sleep {ready_after_s}; printf '#!/bin/sh\\nexec {PYTHON} \"$@\"\\n' > /opt/late/new "
        f"&& chmod +x /opt/late/new && mv /opt/late/new {LATE_PYTHON}; exec {PYTHON} {STANDIN} "
        '"$0" "$@"'
        if ready_after_s
        else "exec sleep 2147483647"
    )
    script = (
        f"mkdir -p /opt/late && printf {unpacking} > {LATE_PYTHON} && "
        f"chmod +x {LATE_PYTHON}; {real}"
    )
    entrypoint = json.dumps(["/bin/sh", "-c", script, "serve"])
    if daemon.docker("image", "inspect", image, check=False).returncode != 0:
        daemon.docker(
            "import", "--change", f"ENTRYPOINT {entrypoint}", "-", image,
            stdin=busybox_rootfs_tar(), timeout=120,
        )  # fmt: skip
    return image


def launch_late(
    daemon: DockerDaemon, home: Path, drafter: Path, name: str, image: str, *more: str
) -> Done:
    return run_cli(
        "launch", drafter, *FROM, "--model", "/models/base", "--docker", image,
        "--container-name", name, "--docker-args", python_mount_args(), "--port", "8124",
        "--drafter-mount", "/models/drafter", "--python", LATE_PYTHON, *more,
        home=home, env=daemon.environment, timeout=300,
    )  # fmt: skip


def test_a_probe_that_fails_while_the_container_starts_is_not_ready_yet(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    # The first probes find a python that cannot make the request (exit 1): a container still
    # starting, as `docker restart` in a rollout already took it; launch waited too little.
    drafter = drafter_dir(tmp_path / "srv")
    name = unique_container_name("ld")
    image = late_python_image(docker_daemon, ready_after_s=4)
    try:
        done = launch_late(docker_daemon, tmp_path, drafter, name, image, "--ready-timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"started: docker container {name}")
        assert "runtime-check passed" in done.stdout
    finally:
        docker_daemon.docker("rm", "-f", name, check=False)


def test_a_container_never_ready_fails_at_the_deadline_naming_the_last_probe_error(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    drafter = drafter_dir(tmp_path / "srv")
    name = unique_container_name("ld")
    image = late_python_image(docker_daemon, ready_after_s=0)
    try:
        done = launch_late(docker_daemon, tmp_path, drafter, name, image, "--ready-timeout", "6")
        assert done.returncode == ExitCode.LAUNCH_FAILED, done.stdout + done.stderr
        line = next(x for x in done.stderr.splitlines() if x.startswith("error:"))
        assert f"docker container {name} not ready within 6 s (last probe: " in line, line
        assert "env: still unpacking" in line, line  # what the last probe met
        assert inspect(docker_daemon, name)["State"]["Running"] is True  # left running, said so
    finally:
        docker_daemon.docker("rm", "-f", name, check=False)
