"""ContainerTransport on real LXC 5 busybox containers, inside testbed hosts over SSH and locally.

``pct`` (Proxmox VE), ``incus`` and LXD's ``lxc`` cannot run on this machine: those tests use the
testbed's emulators (POSIX sh scripts over real lxc-* that mimic the tools' exec syntax, error
texts and exit codes; see testbed.lxc_host_side.emulator_scripts). The
containers behind them are real.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest

from dflash_provision.errors import AuthError, ContainerError, RemoteStepFailed
from dflash_provision.target import parse_target
from dflash_provision.transport.base import CommandResult, Transport
from dflash_provision.transport.container import ContainerTransport
from dflash_provision.transport.factory import open_transport
from dflash_provision.transport.local import LocalTransport
from dflash_provision.transport.options import SshOptions
from dflash_provision.transport.ssh import SshTransport
from testbed.hosts import Host
from testbed.lxc import Container, busybox_container, unique_name

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.lxc]

HOSTILE = ["$(touch /root/canary)", "; touch /root/canary", 'it\'s "q"', "a\nb", "*", "$PATH"]


def options_for(host: Host) -> SshOptions:
    assert host.client is not None
    return SshOptions(ssh_config_path=str(host.client.ssh_config), use_agent=False)


@pytest.fixture
def local_container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    from testbed.hosts import missing_prerequisites

    reason = missing_prerequisites(need_lxc=True)
    if reason:
        pytest.skip(f"testbed: {reason}")
    container = busybox_container(lxcpath=tmp_path_factory.mktemp("lxc"))
    yield container
    container.destroy()


def test_lxc_container_through_ssh_host_passes_stdin_and_exit_status(
    lxc_container_on_host: Container,
) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    target = parse_target(f"{host.alias}/lxc:{lxc_container_on_host.name}:/root/models/X")
    with open_transport(target, options_for(host)) as transport:
        result = transport.run(["sh", "-c", 'cat; echo "$container" >&2; exit 7'], stdin=b"hi")
    assert result.exit_status == 7
    assert result.stdout == b"hi"
    assert result.stderr == b"lxc\n"  # proves the command ran inside the container
    assert "lxc:" in transport.description and host.alias in transport.description


def test_lxc_attach_runs_with_a_clean_environment_and_busybox_path(
    lxc_container_on_host: Container,
) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    transport = ContainerTransport(
        SshTransport(host.alias, options=options_for(host)), "lxc", lxc_container_on_host.name
    )
    with transport:
        result = transport.run(["env"])
    env = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert "SSH_CONNECTION" not in env  # the SSH session's environment did not leak in


def test_hostile_argv_reaches_the_container_literally(lxc_container_on_host: Container) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    target = parse_target(f"{host.alias}/lxc:{lxc_container_on_host.name}:/m")
    with open_transport(target, options_for(host)) as transport:
        result = transport.run(["printf", "%s\\0", *HOSTILE])
        canary = transport.run(["ls", "/root/canary"])
    assert result.stdout.split(b"\0")[:-1] == [arg.encode() for arg in HOSTILE]
    assert canary.exit_status != 0
    assert not (host.root_dir / "canary").exists()


def test_stopped_lxc_container_is_a_container_error(lxc_container_on_host: Container) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    lxc_container_on_host.stop()
    target = parse_target(f"{host.alias}/lxc:{lxc_container_on_host.name}:/m")
    with (
        open_transport(target, options_for(host)) as transport,
        pytest.raises(ContainerError) as caught,
    ):
        transport.run(["true"])
    assert caught.value.message == (
        f"lxc container {lxc_container_on_host.name} on {host.alias} is not running (state STOPPED)"
    )


def test_missing_lxc_container_is_a_container_error(ssh_host: Host) -> None:
    name = unique_name()
    with (
        open_transport(parse_target(f"{ssh_host.alias}/lxc:{name}:/m"), options_for(ssh_host)) as t,
        pytest.raises(ContainerError) as caught,
    ):
        t.run(["true"])
    assert caught.value.message == f"lxc container {name} on {ssh_host.alias} does not exist"


def test_command_missing_inside_the_container_is_a_result_not_an_error(
    lxc_container_on_host: Container,
) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    target = parse_target(f"{host.alias}/lxc:{lxc_container_on_host.name}:/m")
    with open_transport(target, options_for(host)) as transport:
        result = transport.run(["python3", "-c", "print(1)"])  # busybox has no python
    assert result.exit_status == 127


def test_local_lxc_container_passes_stdin_and_exit_status(local_container: Container) -> None:
    target = parse_target(f"lxc:{local_container.name}:/root/models/X")
    transport = open_transport(target, lxc_path=local_container.lxcpath)
    assert isinstance(transport, ContainerTransport)
    assert isinstance(transport.inner, LocalTransport)
    payload = os.urandom(256 * 1024)
    result = transport.run(["sh", "-c", "cat; exit 5"], stdin=payload)
    assert result.exit_status == 5
    assert result.stdout == payload


def test_local_stopped_container_is_a_container_error(local_container: Container) -> None:
    local_container.stop()
    transport = open_transport(
        parse_target(f"lxc:{local_container.name}:/m"), lxc_path=local_container.lxcpath
    )
    with pytest.raises(ContainerError, match="is not running"):
        transport.run(["true"])


# -- emulated pct / incus / lxd -----------------------------------------------------------------


@pytest.fixture
def emulated_host(ssh_host: Host) -> Iterator[Host]:
    ssh_host.install_container_cli_emulators()
    yield ssh_host


@pytest.mark.parametrize(("kind", "name"), [("pct", "101"), ("incus", "web-1"), ("lxd", "web-2")])
def test_emulated_tool_runs_command_in_container_with_stdin_and_status(
    emulated_host: Host, kind: str, name: str
) -> None:
    container = busybox_container(emulated_host.container_name(name), host=emulated_host)
    try:
        target = parse_target(f"{emulated_host.alias}/{kind}:{name}:/root/models/X")
        with open_transport(target, options_for(emulated_host)) as transport:
            result = transport.run(["sh", "-c", "cat; exit 4"], stdin=b"payload")
            printed = transport.run(["printf", "%s\\0", *HOSTILE])
            container.stop()
            with pytest.raises(ContainerError, match=f"{kind} container {name} .* not running"):
                transport.run(["true"])
    finally:
        container.destroy()
    assert (result.exit_status, result.stdout) == (4, b"payload")
    assert printed.stdout.split(b"\0")[:-1] == [arg.encode() for arg in HOSTILE]


@pytest.mark.parametrize(("kind", "name"), [("pct", "999"), ("incus", "nope"), ("lxd", "nope")])
def test_emulated_tool_reports_missing_container(emulated_host: Host, kind: str, name: str) -> None:
    target = parse_target(f"{emulated_host.alias}/{kind}:{name}:/m")
    transport = open_transport(target, options_for(emulated_host))
    with transport, pytest.raises(ContainerError) as caught:
        transport.run(["true"])
    assert (
        caught.value.message == f"{kind} container {name} on {emulated_host.alias} does not exist"
    )


def test_container_tool_not_installed_is_a_container_error(ssh_host: Host) -> None:
    target = parse_target(f"{ssh_host.alias}/pct:101:/m")
    transport = open_transport(target, options_for(ssh_host))
    with transport, pytest.raises(ContainerError) as caught:
        transport.run(["true"])
    assert caught.value.message.startswith(f"pct is not installed on {ssh_host.alias} ")


def test_wrapped_argv_for_each_kind() -> None:
    inner = LocalTransport()
    assert ContainerTransport(inner, "pct", "101").wrap(["cat", "a b"]) == [
        "pct",
        "exec",
        "101",
        "--",
        "cat",
        "a b",
    ]
    assert ContainerTransport(inner, "incus", "web").wrap(["true"]) == [
        "incus",
        "exec",
        "web",
        "--",
        "true",
    ]
    assert ContainerTransport(inner, "lxd", "web").wrap(["true"]) == [
        "lxc",
        "exec",
        "web",
        "--",
        "true",
    ]
    lxc = ContainerTransport(inner, "lxc", "c1", lxc_path="/srv/lxc").wrap(["true"])
    assert lxc[:5] == ["lxc-attach", "-P", "/srv/lxc", "-n", "c1"]
    assert lxc[-2:] == ["--", "true"]


def test_ssh_command_timeout_applies_inside_the_container(
    lxc_container_on_host: Container,
) -> None:
    host = lxc_container_on_host.host
    assert host is not None
    assert host.client is not None
    options = SshOptions(
        ssh_config_path=str(host.client.ssh_config), use_agent=False, command_timeout=1.0
    )
    target = parse_target(f"{host.alias}/lxc:{lxc_container_on_host.name}:/m")
    transport = open_transport(target, options)
    with transport, pytest.raises(RemoteStepFailed) as caught:
        transport.run(["sleep", "30"])
    assert caught.value.step == "timeout"


class _Answers(Transport):
    """Answers every command with one fixed result (the tool's own refusal, as measured)."""

    description = "alice@pve1"

    def __init__(self, status: int, stderr: bytes) -> None:
        self.result = CommandResult(status, b"", stderr, 0.01)

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60
    ) -> CommandResult:
        return self.result


@pytest.mark.parametrize(
    ("kind", "stderr", "words"),
    [
        # LXC 5.0 as a non-root login, measured on this machine: without -P, then with -P.
        (
            "lxc",
            b"lxc-attach: c1: ../src/lxc/tools/lxc_attach.c: main: 302 You lack access to "
            b"/home/alice/.local/share/lxc\n",
            "lxc container c1 on alice@pve1: lxc-attach needs root on alice@pve1: use --sudo "
            "or log in as root",
        ),
        (
            "lxc",
            b"lxc-attach: c1: ../src/lxc/tools/lxc_attach.c: main: 327 Insufficent privileges "
            b"to control c1\n",
            "needs root on alice@pve1",
        ),
        (
            "incus",
            b'Error: Get "http://unix.socket/1.0": dial unix /var/lib/incus/unix.socket: '
            b"connect: permission denied\n",
            "this login may not use incus on alice@pve1",
        ),
    ],
)
def test_container_tool_refusing_a_non_root_login_is_an_auth_error_naming_the_fix(
    kind: str, stderr: bytes, words: str
) -> None:
    # AuthError (exit 6), not ContainerError (exit 8): the container is fine, the login is not,
    # and a fleet audit must not file the host as "container not running".
    with pytest.raises(AuthError) as caught:
        ContainerTransport(_Answers(1, stderr), kind, "c1").run(["true"])  # type: ignore[arg-type]
    assert words in caught.value.message
    assert "--sudo" in caught.value.message
