"""docker:NAME targets on a real dockerd (testbed.docker): push with read-back, verify, audit,
repair and rollback into a busybox container (no Python, no bash), on this machine and through a
real sshd host; a planted symlink refused; a stopped and a missing container, each with its
status and exit code.

The daemon is the test bed's own (its socket under a temp dir): on this machine the CLI finds it
by DOCKER_HOST, as docker itself does; through a fake host (whose sshd passes no DOCKER_HOST on)
by ``--docker-host``. Every test that needs it is skipped, saying why, when dockerd cannot run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dflash_provision.errors import AuthError, ContainerError, ExitCode
from dflash_provision.target import parse_target
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.container import ContainerTransport
from dflash_provision.transport.factory import open_transport
from dflash_provision.transport.local import LocalTransport
from testbed import samples
from testbed.docker import DockerDaemon
from testbed.hosts import Host
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.docker import ModelsContainer, unique_container_name
from tests.fixtures.ssh import host_args, options_for

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
FROM = ("--from", str(samples.REFERENCE_DRAFTER))


def seed(box: ModelsContainer, data: bytes = INCIDENT) -> Path:
    """/models/X/config.json in the container holds ``data``; its controller-side path."""
    directory = box.models / "X"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_bytes(data)
    return directory / "config.json"


def local(daemon: DockerDaemon, home: Path, *args: str) -> Done:
    """The CLI on this machine, finding the test daemon by DOCKER_HOST as docker does."""
    return run_cli(*args, home=home, env=daemon.environment)


def through(host: Host, daemon: DockerDaemon, home: Path, *args: str) -> Done:
    """The CLI reaching ``host`` over SSH, naming the daemon's socket with --docker-host."""
    return run_cli(*args, *host_args(host), "--docker-host", daemon.host_url, home=home)


# ---------------------------------------------------------------------------------------------
# on this machine


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_push_into_a_busybox_docker_container_is_read_back_and_kept_backup(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, tmp_path: Path
) -> None:
    probe = docker_models.container.exec(["sh", "-c", "command -v python3 python bash; echo end"])
    assert probe.stdout == "end\n"  # busybox only: the host side is POSIX sh
    config = seed(docker_models)
    target = f"docker:{docker_models.name}:/models/X"

    done = local(docker_daemon, tmp_path, "push", *FROM, target)
    assert done.returncode == 0, done.stderr
    assert "read back and matched" in done.stdout
    assert config.read_bytes() == REFERENCE  # seen from the host side of the bind mount
    backups = list((config.parent / ".dflash-backups").glob("config.json.*T*Z"))
    assert [b.read_bytes() for b in backups] == [INCIDENT]

    again = local(docker_daemon, tmp_path, "push", *FROM, target)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_verify_audit_repair_and_rollback_in_a_docker_container(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, tmp_path: Path
) -> None:
    config = seed(docker_models)
    target = f"docker:{docker_models.name}:/models/X"

    drifted = local(docker_daemon, tmp_path, "verify", *FROM, target)
    assert drifted.returncode == ExitCode.DRIFT, drifted.stderr
    assert drifted.stdout.startswith(f"drifted: {target}")
    audit = local(docker_daemon, tmp_path, "audit", *FROM, target)
    assert audit.returncode == ExitCode.DRIFT, audit.stderr
    assert f"{target}  drifted" in audit.stdout

    repaired = local(docker_daemon, tmp_path, "repair", *FROM, target)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert config.read_bytes() == REFERENCE
    in_sync = local(docker_daemon, tmp_path, "verify", *FROM, target)
    assert in_sync.returncode == 0 and in_sync.stdout.startswith("in_sync:"), in_sync.stdout

    rolled = local(docker_daemon, tmp_path, "rollback", target)
    assert rolled.returncode == 0, rolled.stderr
    assert "read back and matched" in rolled.stdout
    assert config.read_bytes() == INCIDENT


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_a_planted_symlink_at_config_json_in_a_docker_container_is_refused(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, tmp_path: Path
) -> None:
    box = docker_models.container
    secret = b"root only\n"
    assert box.exec(["sh", "-c", "cat > /secret && chmod 600 /secret"], secret).returncode == 0
    plant = "mkdir -p /models/X && ln -s /secret /models/X/config.json"
    assert box.exec(["sh", "-c", plant]).returncode == 0
    target = f"docker:{docker_models.name}:/models/X"

    refused = local(docker_daemon, tmp_path, "push", *FROM, target)
    assert refused.returncode == ExitCode.REMOTE_FAILED, refused.stdout + refused.stderr
    assert "symlink" in refused.stdout + refused.stderr
    # A link root did not make is refused even when told to follow links.
    assert box.exec(["chown", "-h", "65534:65534", "/models/X/config.json"]).returncode == 0
    followed = local(docker_daemon, tmp_path, "push", *FROM, "--follow-symlinks", target)
    assert followed.returncode == ExitCode.REMOTE_FAILED, followed.stdout + followed.stderr
    assert "uid 65534" in followed.stdout + followed.stderr

    assert box.exec(["cat", "/secret"]).stdout == secret.decode()
    assert box.exec(["readlink", "/models/X/config.json"]).stdout == "/secret\n"


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_a_stopped_docker_container_is_container_not_running_exit_8(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, tmp_path: Path
) -> None:
    config = seed(docker_models)
    docker_models.container.stop()
    assert docker_models.container.state() == "exited"
    target = f"docker:{docker_models.name}:/models/X"
    said = f"docker container {docker_models.name} on local is not running (state exited)"

    for command in ("push", "verify"):
        done = local(docker_daemon, tmp_path, command, *FROM, target)
        assert done.returncode == ExitCode.CONTAINER, (command, done.stdout, done.stderr)
        assert done.stderr == f"error: {said}\n", command
    audit = local(docker_daemon, tmp_path, "audit", *FROM, target)
    assert audit.returncode == ExitCode.CONTAINER, audit.stdout + audit.stderr
    assert f"{target}  container_not_running  {said}" in audit.stdout
    rolled = local(docker_daemon, tmp_path, "rollback", target)
    assert rolled.returncode == ExitCode.CONTAINER, rolled.stdout + rolled.stderr
    assert config.read_bytes() == INCIDENT  # nothing was written by any of them


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_a_missing_docker_container_is_container_not_running_exit_8(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    name = unique_container_name("gone")
    target = f"docker:{name}:/models/X"
    said = f"docker container {name} on local does not exist"
    for command in ("push", "verify"):
        done = local(docker_daemon, tmp_path, command, *FROM, target)
        assert done.returncode == ExitCode.CONTAINER, (command, done.stdout, done.stderr)
        assert done.stderr == f"error: {said}\n", command
    audit = local(docker_daemon, tmp_path, "audit", *FROM, target)
    assert audit.returncode == ExitCode.CONTAINER, audit.stdout + audit.stderr
    assert f"{target}  container_not_running  {said}" in audit.stdout


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_a_docker_daemon_that_cannot_be_reached_is_exit_8_naming_the_socket(
    docker_models: ModelsContainer, tmp_path: Path
) -> None:
    nowhere = f"unix://{tmp_path}/no-such.sock"
    target = f"docker:{docker_models.name}:/models/X"
    done = run_cli("verify", *FROM, "--docker-host", nowhere, target, home=tmp_path)
    assert done.returncode == ExitCode.CONTAINER, done.stdout + done.stderr
    assert f"cannot reach the Docker daemon at {nowhere}" in done.stderr
    assert "--docker-host" in done.stderr


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_docker_transport_passes_bytes_status_and_argv_literally(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_LEAK_CHECK", "from-the-caller")
    target = parse_target(f"docker:{docker_models.name}:/models/X")
    hostile = ["$(touch /canary)", "; touch /canary", 'it\'s "q"', "a\nb", "*", "-e"]
    payload = bytes(range(256)) * 64
    with open_transport(target, docker_host=docker_daemon.host_url) as transport:
        echoed = transport.run(
            ["sh", "-c", 'cat; printf "%s\\0" "$@" >&2; exit 9', "sh", *hostile], stdin=payload
        )
        env = transport.run(["env"])
        missing = transport.run(["no-such-command", "x"])
    assert (echoed.exit_status, echoed.stdout) == (9, payload)
    assert echoed.stderr.decode().split("\0")[:-1] == hostile
    assert docker_models.container.exec(["ls", "/canary"]).returncode != 0
    assert "DFLASH_LEAK_CHECK" not in env.stdout.decode()  # the caller's environment stays out
    assert missing.exit_status == 127, missing.stderr  # as sh says, not docker exec's 126


# ---------------------------------------------------------------------------------------------
# through a real sshd host


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_push_verify_audit_repair_rollback_through_an_ssh_host(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, ssh_host: Host, tmp_path: Path
) -> None:
    config = seed(docker_models)
    target = f"{ssh_host.alias}/docker:{docker_models.name}:/models/X"

    # The host's docker talks to its default socket unless told: no daemon there.
    blind = run_cli("push", *FROM, *host_args(ssh_host), target, home=tmp_path)
    assert blind.returncode == ExitCode.CONTAINER, blind.stdout + blind.stderr
    assert config.read_bytes() == INCIDENT

    pushed = through(ssh_host, docker_daemon, tmp_path, "push", *FROM, target)
    assert pushed.returncode == 0, pushed.stderr
    assert "read back and matched" in pushed.stdout
    assert config.read_bytes() == REFERENCE
    verified = through(ssh_host, docker_daemon, tmp_path, "verify", *FROM, target)
    assert verified.returncode == 0 and verified.stdout.startswith(f"in_sync: {target}")

    rolled = through(ssh_host, docker_daemon, tmp_path, "rollback", target)
    assert rolled.returncode == 0, rolled.stderr
    assert config.read_bytes() == INCIDENT
    audit = through(ssh_host, docker_daemon, tmp_path, "audit", *FROM, target)
    assert audit.returncode == ExitCode.DRIFT, audit.stdout + audit.stderr
    assert f"{target}  drifted" in audit.stdout
    repaired = through(ssh_host, docker_daemon, tmp_path, "repair", *FROM, target)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert config.read_bytes() == REFERENCE


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_stopped_and_missing_containers_through_an_ssh_host_are_exit_8(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, ssh_host: Host, tmp_path: Path
) -> None:
    docker_models.container.stop()
    gone = unique_container_name("gone")
    stopped = f"{ssh_host.alias}/docker:{docker_models.name}:/models/X"
    missing = f"{ssh_host.alias}/docker:{gone}:/models/X"
    audit = through(ssh_host, docker_daemon, tmp_path, "audit", *FROM, stopped, missing)
    assert audit.returncode == ExitCode.CONTAINER, audit.stdout + audit.stderr
    where = f"on {ssh_host.alias}"
    exited = f"docker container {docker_models.name} {where} is not running (state exited)"
    assert f"container_not_running  {exited}" in audit.stdout
    assert f"container_not_running  docker container {gone} {where} does not exist" in audit.stdout
    done = through(ssh_host, docker_daemon, tmp_path, "push", *FROM, stopped)
    assert done.returncode == ExitCode.CONTAINER, done.stdout + done.stderr


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_docker_transport_through_an_ssh_host_keeps_argv_and_stdin(
    docker_daemon: DockerDaemon, docker_models: ModelsContainer, ssh_host: Host
) -> None:
    target = parse_target(f"{ssh_host.alias}/docker:{docker_models.name}:/m")
    hostile = ["$(touch /canary)", "; touch /canary", 'it\'s "q"', "a\nb", "*", "$PATH"]
    with open_transport(target, options_for(ssh_host), docker_host=docker_daemon.host_url) as t:
        result = t.run(
            ["sh", "-c", 'cat; printf "%s\\0" "$@" >&2; env', "sh", *hostile], stdin=b"in"
        )
    assert result.exit_status == 0
    out = result.stdout.decode()
    assert out.startswith("in")
    assert "SSH_CONNECTION" not in out  # the SSH session's environment did not leak in
    assert result.stderr.decode().split("\0")[:-1] == hostile
    assert docker_models.container.exec(["ls", "/canary"]).returncode != 0
    assert ssh_host.alias in t.description and "docker:" in t.description


# ---------------------------------------------------------------------------------------------
# the wrapper's argv and the tools' refusals (no daemon needed)


def test_docker_and_podman_exec_argv() -> None:
    inner = LocalTransport()
    assert ContainerTransport(inner, "docker", "vllm").wrap(["cat", "a b"]) == [
        "docker", "exec", "-i", "--", "vllm", "cat", "a b",
    ]  # fmt: skip
    assert ContainerTransport(
        inner, "docker", "vllm", docker_host="unix:///run/user/1000/docker.sock"
    ).wrap(["true"]) == [
        "docker", "-H", "unix:///run/user/1000/docker.sock", "exec", "-i", "--", "vllm", "true",
    ]  # fmt: skip
    # --docker-host is Docker's: Podman is given no -H.
    assert ContainerTransport(inner, "podman", "vllm", docker_host="unix:///x").wrap(["true"]) == [
        "podman", "exec", "-i", "--", "vllm", "true",
    ]  # fmt: skip


def test_the_daemon_option_is_built_in_one_place_for_every_docker_command() -> None:
    import dflash_provision
    from dflash_provision.server.docker_launch import DockerLaunch, run_argv
    from dflash_provision.server.preflight import LaunchRequest
    from dflash_provision.transport.docker_exec import tool_argv
    from dflash_provision.transport.docker_inspect import inspect_argv

    # Written once (transport/docker_exec.tool_argv): a copy elsewhere drifts (podman given -H).
    package = Path(dflash_provision.__file__).parent
    builders = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if '["-H", ' in path.read_text(encoding="utf-8")
    )
    assert builders == ["transport/docker_exec.py"], builders
    sock = "unix:///run/user/1000/docker.sock"
    assert tool_argv("docker", "logs", "--", "v", docker_host=sock) == [
        "docker", "-H", sock, "logs", "--", "v",
    ]  # fmt: skip
    assert tool_argv("podman", "logs", "--", "v", docker_host=sock) == ["podman", "logs", "--", "v"]
    assert inspect_argv("docker", "v", docker_host=sock)[:3] == ["docker", "-H", sock]
    request = LaunchRequest(model="m")
    for kind, daemon in (("docker", ["-H", sock]), ("podman", [])):
        spec = DockerLaunch("img", "v", kind=kind, docker_host=sock)  # type: ignore[arg-type]
        argv = run_argv(spec, request, ["vllm", "serve"], "/m", "/srv/m", 15)
        assert argv[: 2 + len(daemon)] == [kind, *daemon, "run"]


class _Answers(Transport):
    """Answers every command with one fixed result (a tool's own refusal)."""

    description = "alice@gpu1"

    def __init__(self, status: int, stderr: bytes) -> None:
        self.result = CommandResult(status, b"", stderr, 0.01)

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        return self.result


@pytest.mark.parametrize(
    ("kind", "stderr", "words"),
    [
        # Podman v4's texts, as its sources print them (podman does not run on the test machine).
        (
            "podman",
            b'Error: no container with name or ID "vllm" found: no such container\n',
            "podman container vllm on alice@gpu1 does not exist",
        ),
        (
            "podman",
            b"Error: can only create exec sessions on running containers: container state "
            b"improper\n",
            "podman container vllm on alice@gpu1 is not running",
        ),
        # docker 28.2 against dockerd 20.10, measured.
        (
            "docker",
            b"Error response from daemon: Container vllm is paused, unpause the container "
            b"before exec\n",
            "docker container vllm on alice@gpu1 is not running (state paused)",
        ),
    ],
)
def test_podman_and_paused_docker_refusals_are_container_errors(
    kind: str, stderr: bytes, words: str
) -> None:
    with pytest.raises(ContainerError) as caught:
        ContainerTransport(_Answers(125, stderr), kind, "vllm").run(["true"])  # type: ignore[arg-type]
    assert caught.value.message == words


def test_a_docker_socket_closed_to_the_login_is_an_auth_error_naming_the_fix() -> None:
    # Measured: docker 28.2 as user nobody on a 0660 root:docker socket.
    stderr = (
        b"permission denied while trying to connect to the Docker daemon socket at "
        b'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.50/containers/'
        b'vllm/json": dial unix /var/run/docker.sock: connect: permission denied\n'
    )
    with pytest.raises(AuthError) as caught:
        ContainerTransport(_Answers(1, stderr), "docker", "vllm").run(["true"])
    assert "add the user to the docker group" in caught.value.message
    assert caught.value.reason == "needs-root"


def test_a_command_that_prints_docker_like_words_is_not_taken_for_a_refusal() -> None:
    # The command's own stderr, not a whole line of the tool's: returned as it is.
    stderr = b"cat: /models/Error response from daemon: No such container: x: No such file\n"
    result = ContainerTransport(_Answers(1, stderr), "docker", "vllm").run(["cat", "x"])
    assert result.exit_status == 1
