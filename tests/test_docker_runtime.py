"""The runtime of a vLLM server in a Docker container (``--container``) on a real dockerd: the
vLLM stand-in serving in a container of the test bed's dockerd (testbed.docker_standin), the
drafter provisioned on the host and bind-mounted at ANOTHER path inside, as ``docker run -v
/srv/models:/models vllm/vllm-openai ...`` does. TARGET is the host directory; the container's
own record maps it in and maps the server's drafter back out.

What a user checks: runtime-check a-e passes, with the mapping and this start's engine record
(from docker logs) in stage c's evidence; a container whose /models is another host directory
fails stage c naming both directories; status finds the server and its port from the container's
command; doctor reports nothing broken; stop ends the container, and a second stop finds nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.docker import DockerContainer, DockerDaemon
from testbed.docker_standin import python_mounts, serve_argv, standin_container, wait_ready
from testbed.hosts import Host
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.docker import unique_container_name
from tests.fixtures.fix_lines import parse as parse_fix
from tests.fixtures.ssh import host_args

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
FROM = ("--from", str(samples.REFERENCE_DRAFTER))
PORT = 8123  # not vLLM's default: the port must come from the container's own command

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.docker]


@dataclass
class Served:
    container: DockerContainer
    models: Path  # the host directory mounted at /models
    drafter: Path  # the provisioned drafter directory on the host

    @property
    def option(self) -> str:
        return f"docker:{self.container.name}"


def host_models(root: Path) -> Path:
    """A host models directory with the reference drafter and its target model's config."""
    (root / "drafter").mkdir(parents=True)
    (root / "base").mkdir()
    (root / "drafter" / "config.json").write_bytes(REFERENCE)
    shutil.copy(samples.REFERENCE_TARGET, root / "base" / "config.json")
    return root


def serve(daemon: DockerDaemon, models: Path, drafter: Path, **mounts: Path) -> Served:
    volumes = [(models, "/models"), *((path, f"/{name}") for name, path in mounts.items())]
    container = standin_container(
        daemon,
        unique_container_name("vs"),
        volumes=volumes,
        command=serve_argv("/models/base", "/models/drafter", port=PORT),
    )
    return Served(container, models, drafter)


@pytest.fixture(scope="module")
def served(
    docker_daemon: DockerDaemon, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One stand-in container for the read-only tests: host .../srv-models at /models."""
    models = host_models(tmp_path_factory.mktemp("srv-models"))
    box = serve(docker_daemon, models, models / "drafter")
    yield box
    box.container.remove()


def cli(daemon: DockerDaemon, home: Path, *args: str | Path) -> Done:
    return run_cli(*args, home=home, env=daemon.environment, timeout=300)


def test_runtime_check_in_a_container_maps_the_host_drafter_and_passes_a_to_e(
    docker_daemon: DockerDaemon, served: Served, tmp_path: Path
) -> None:
    done = cli(
        docker_daemon, tmp_path, "runtime-check", served.drafter, *FROM,
        "--container", served.option, "--json",
    )  # fmt: skip
    report = json.loads(done.stdout)
    stages = {s["stage"]: s for s in report["stages"]}
    assert done.returncode == 0, [(k, s["status"], s["summary"]) for k, s in stages.items()]
    assert report["port"] == PORT  # from the container's command, not 8000
    assert [s["status"] for s in report["stages"]] == ["passed"] * 5
    c = "\n".join(stages["c"]["evidence"])
    assert f"provisioned host {served.drafter} = /models/drafter in the container" in c
    assert f"the server's drafter /models/drafter = host {served.drafter}" in c
    assert "pid 1:" in c  # the container's own process
    # this start's engine record, read from docker logs
    assert "engine v0.32.0+dflash-standin: speculative method dflash, drafter /models/drafter" in c
    assert stages["c"]["data"]["log"] is not None
    # stage b ran the container's Python on the path it sees
    assert "/models/drafter" in json.dumps(stages["b"])


def test_status_in_a_container_finds_the_server_and_its_port_from_the_container_record(
    docker_daemon: DockerDaemon, served: Served, tmp_path: Path
) -> None:
    done = cli(docker_daemon, tmp_path, "status", served.drafter, "--container", served.option,
               "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert (status["state"], status["port"], status["port_from"]) == (
        "ready", PORT, "container command",
    )  # fmt: skip
    assert status["pid"] == 1
    container = status["container"]
    assert container["name"] == served.container.name and container["state"] == "running"
    assert container["provisioned_in_container"] == "/models/drafter"
    assert container["server_drafter_on_host"] == str(served.drafter)
    assert container["drafter_mismatch"] is None
    assert "VLLM_USE_V2_MODEL_RUNNER" in container["env_names"]
    assert {"source": str(served.models), "destination": "/models"}.items() <= {
        k: v for m in container["mounts"] if m["destination"] == "/models" for k, v in m.items()
    }.items()

    text = cli(docker_daemon, tmp_path, "status", served.drafter, "--container", served.option)
    assert text.returncode == 0, text.stderr
    assert f"port {PORT} on docker:{served.container.name}" in text.stdout
    assert f"the server's drafter /models/drafter = host {served.drafter}" in text.stdout


def test_doctor_in_a_container_finds_nothing_broken(
    docker_daemon: DockerDaemon, served: Served, tmp_path: Path
) -> None:
    done = cli(docker_daemon, tmp_path, "doctor", served.drafter, *FROM,
               "--container", served.option)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing broken" in done.stdout


def test_doctor_in_a_container_fixes_a_drifted_file_by_a_push_and_a_restart_of_the_container(
    docker_daemon: DockerDaemon, served: Served, tmp_path: Path
) -> None:
    """The authority is another config than the file on the host: the fix is the push to the
    host path, then a restart of the container (the server reads its drafter at start-up)."""
    other = ("--from", str(samples.INCIDENT_DRAFTER))
    done = cli(docker_daemon, tmp_path, "doctor", served.drafter, *other,
               "--container", served.option)  # fmt: skip
    assert done.returncode == ExitCode.DRIFT, done.stdout + done.stderr
    fix = next(line for line in done.stdout.splitlines() if line.startswith("fix: "))
    assert f"dflash-provision push {served.drafter}" in fix
    assert fix.endswith(f"&& docker restart -- {served.container.name}"), fix
    parse_fix(fix.removeprefix("fix: "))  # the container's restart too, as a user pastes it


def test_a_container_whose_models_mount_is_another_host_directory_fails_stage_c_naming_both(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    provisioned = host_models(tmp_path / "srv-models")
    other = host_models(tmp_path / "old-models")  # the same bytes: only the path tells
    box = serve(docker_daemon, other, provisioned / "drafter")
    try:
        done = cli(
            docker_daemon, tmp_path, "runtime-check", provisioned / "drafter", *FROM,
            "--container", box.option, "--json",
        )  # fmt: skip
    finally:
        box.container.remove()
    report = json.loads(done.stdout)
    stages = {s["stage"]: s for s in report["stages"]}
    assert done.returncode == ExitCode.RUNTIME_CHECK_FAILED, done.stdout
    assert stages["a"]["status"] == "passed"  # the provisioned file is right on the host
    assert stages["c"]["status"] == "failed"
    summary = stages["c"]["summary"]
    assert "'/models/drafter'" in summary
    assert f"host directory '{other / 'drafter'}'" in summary
    assert f"not the provisioned '{provisioned / 'drafter'}'" in summary
    assert f"-v {provisioned / 'drafter'}:/models/drafter" in stages["c"]["fix"]
    # the container cannot see the provisioned directory: its loader cannot tell (never a pass)
    assert stages["b"]["status"] == "inconclusive"
    assert f"does not see the provisioned {provisioned / 'drafter'}" in stages["b"]["summary"]


def test_one_host_directory_under_two_mounts_is_the_provisioned_drafter(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    """The server was given /models/drafter, and the provisioned directory is also mounted at
    /alt: one host directory under two names passes stage c."""
    models = host_models(tmp_path / "srv-models")
    box = serve(docker_daemon, models, models / "drafter", alt=models / "drafter")
    try:
        done = cli(
            docker_daemon, tmp_path, "runtime-check", models / "drafter", *FROM,
            "--container", box.option, "--skip-loader", "--json",
        )  # fmt: skip
    finally:
        box.container.remove()
    report = json.loads(done.stdout)
    c = next(s for s in report["stages"] if s["stage"] == "c")
    assert c["status"] == "passed", c
    assert f"the server's drafter /models/drafter = host {models / 'drafter'}" in c["evidence"]


def test_stop_in_a_container_ends_it_and_a_second_stop_finds_nothing(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    models = host_models(tmp_path / "srv-models")
    box = serve(docker_daemon, models, models / "drafter")
    try:
        done = cli(docker_daemon, tmp_path, "stop", models / "drafter", "--container", box.option,
                   "--timeout", "10")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        head = f"stopped: port {PORT} in docker container {box.container.name}"
        assert done.stdout.startswith(head), done.stdout
        assert box.container.state() == "exited"

        again = cli(docker_daemon, tmp_path, "stop", models / "drafter", "--container", box.option)
        assert again.returncode == ExitCode.NOT_RUNNING, again.stdout + again.stderr
        assert "not running" in again.stdout and "state exited" in again.stdout

        status = cli(docker_daemon, tmp_path, "status", models / "drafter", "--container",
                     box.option)  # fmt: skip
        assert status.returncode == ExitCode.NOT_RUNNING
        assert "not running (state exited)" in status.stdout
        check = cli(docker_daemon, tmp_path, "runtime-check", models / "drafter", *FROM,
                    "--container", box.option)  # fmt: skip
        assert check.returncode == ExitCode.CONTAINER, check.stderr
        assert "is not running (state exited)" in check.stderr
    finally:
        box.container.remove()


def test_stop_leaves_a_container_alone_when_no_server_listens_on_the_port(
    docker_daemon: DockerDaemon, served: Served, tmp_path: Path
) -> None:
    done = cli(docker_daemon, tmp_path, "stop", served.drafter, "--container", served.option,
               "--port", "8999")  # fmt: skip
    assert done.returncode == ExitCode.NOT_RUNNING, done.stdout + done.stderr
    assert "no server listens on port 8999" in done.stdout
    assert served.container.state() == "running"


def test_runtime_check_and_status_in_a_container_through_an_ssh_host(
    docker_daemon: DockerDaemon, served: Served, ssh_host: Host, tmp_path: Path
) -> None:
    """TARGET on a host reached over SSH: the host's docker (named by --docker-host, as sshd
    passes no DOCKER_HOST on) reads the record, execs in the container and reads its log."""
    target = f"{ssh_host.alias}:{served.drafter}"
    reach = [*host_args(ssh_host), "--docker-host", docker_daemon.host_url]
    done = run_cli("runtime-check", target, *FROM, "--container", served.option, *reach,
                   "--json", home=tmp_path, timeout=300)  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, [(s["stage"], s["summary"]) for s in report["stages"]]
    c = next(s for s in report["stages"] if s["stage"] == "c")
    assert f"the server's drafter /models/drafter = host {served.drafter}" in c["evidence"]
    status = run_cli("status", target, "--container", served.option, *reach, "--json",
                     home=tmp_path)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["container"]["provisioned_in_container"] == "/models/drafter"


def test_a_server_started_by_docker_exec_is_checked_without_docker_logs(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    """docker logs is the main process's output: a server started later by ``docker exec``
    is not in it, so its records are not looked for there (a warning says what is unverified)."""
    models = host_models(tmp_path / "srv-models")
    # read-only, as standin_container mounts them ("SRC:DST:ro" through container()'s -v)
    volumes = [*((src, f"{dst}:ro") for src, dst in python_mounts()), (models, "/models")]
    with docker_daemon.container(unique_container_name("vx"), volumes=volumes) as idle:
        docker_daemon.docker(
            "exec", "-d", "-e", "VLLM_USE_V2_MODEL_RUNNER=1", idle.name,
            *serve_argv("/models/base", "/models/drafter", port=PORT),
        )  # fmt: skip
        wait_ready(idle, PORT)
        done = cli(docker_daemon, tmp_path, "runtime-check", models / "drafter", *FROM,
                   "--container", f"docker:{idle.name}", "--port", str(PORT), "--skip-loader",
                   "--json")  # fmt: skip
    report = json.loads(done.stdout)
    c = next(s for s in report["stages"] if s["stage"] == "c")
    assert c["status"] == "passed", c
    assert c["data"]["log"] is None
    assert any("not the main process of docker container" in w for w in c["warnings"])


def test_container_option_wants_the_host_path_and_a_container_name(tmp_path: Path) -> None:
    bad = run_cli("status", "docker:vllm:/models/X", "--container", "vllm", home=tmp_path)
    assert bad.returncode == ExitCode.USAGE, bad.stderr
    assert "must be the drafter directory on the host" in bad.stderr
    kind = run_cli("status", "/srv/models/X", "--container", "lxc:vllm", home=tmp_path)
    assert kind.returncode == ExitCode.USAGE and "docker or podman" in kind.stderr
