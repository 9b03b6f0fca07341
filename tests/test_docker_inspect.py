"""A container's own record from a real dockerd (the test bed's), and the drafter path mapped
through its mounts both ways: a read-only bind mount, a named volume, a tmpfs, a bind mount
nested inside another; the environment's names kept and its values (a token) dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ContainerError
from dflash_provision.transport.docker_inspect import Mount, parse_record, read_record
from dflash_provision.transport.local import LocalTransport
from dflash_provision.transport.ssh import SshTransport
from testbed.docker import DockerDaemon
from testbed.hosts import Host
from tests.fixtures.docker import unique_container_name
from tests.fixtures.ssh import options_for


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_record_names_command_env_names_and_maps_paths_through_every_mount(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    models, other = tmp_path / "models", tmp_path / "other"
    (models / "X" / "sub").mkdir(parents=True)  # the inner mount's mount point
    other.mkdir()
    name = unique_container_name("rec")
    docker_daemon.docker(
        "run", "-d", "--network", "none", "--name", name, "-e", "HF_TOKEN=hf_sekrit",
        "-e", "VLLM_USE_V1=1", "-v", f"{models}:/models:ro", "-v", f"{other}:/models/X/sub",
        "-v", f"{name}-vol:/data", "--tmpfs", "/scratch", docker_daemon.busybox_image(),
        "sleep", "1000",
    )  # fmt: skip
    try:
        record = read_record(LocalTransport(), name, docker_host=docker_daemon.host_url)
    finally:
        docker_daemon.docker("rm", "-f", "-v", name)
    assert (record.name, record.status, record.running) == (name, "running", True)
    assert record.command == ("sleep", "1000")
    assert record.env_names == ("HF_TOKEN", "VLLM_USE_V1")
    assert "hf_sekrit" not in repr(record)  # values are never kept
    binds = {m.destination: m for m in record.mounts}
    assert binds["/models"] == Mount("bind", str(models), "/models", False)
    assert binds["/scratch"].kind == "tmpfs"

    assert record.host_path("/models/X") == str(models / "X")
    assert record.host_path("/models/X/config.json") == str(models / "X" / "config.json")
    assert record.host_path("/models/X/sub/a.json") == str(other / "a.json")  # the inner mount
    volume = record.host_path("/data/d")
    assert volume is not None and volume.endswith(f"/volumes/{name}-vol/_data/d")
    assert record.host_path("/scratch/y") is None  # a tmpfs: no host path provisions it
    assert record.host_path("/etc/passwd") is None  # the container's own layer

    assert record.container_paths(str(models / "X")) == ["/models/X"]
    assert record.container_paths(str(other / "a.json")) == ["/models/X/sub/a.json"]
    # Hidden by the inner mount: the host's models/X/sub is not what the container sees there.
    assert record.container_paths(str(models / "X" / "sub")) == []
    assert record.container_paths(str(tmp_path / "elsewhere")) == []


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_record_is_read_on_the_host_over_ssh_and_a_missing_container_is_exit_8(
    docker_daemon: DockerDaemon, ssh_host: Host
) -> None:
    name = unique_container_name("rec")
    with docker_daemon.container(name):
        host = SshTransport(ssh_host.alias, options=options_for(ssh_host))
        with host:
            record = read_record(host, name, docker_host=docker_daemon.host_url)
            assert record.name == name and record.running
            gone = unique_container_name("gone")
            with pytest.raises(ContainerError) as caught:
                read_record(host, gone, docker_host=docker_daemon.host_url)
    assert caught.value.message == f"docker container {gone} on {ssh_host.alias} does not exist"
    assert int(caught.value.exit_code) == 8


def _record(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "Id": "9464fb0380b1",
        "Name": "/vllm",
        "Path": "vllm",
        "Args": ["serve", "/models/base"],
        "State": {"Status": "running"},
        "Config": {"Image": "vllm/vllm-openai:v0.32.0", "Env": ["PATH=/usr/bin"]},
        "Mounts": [{"Type": "bind", "Source": "/srv/m", "Destination": "/models", "RW": True}],
        "NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8001"}]}},
    }
    raw.update(changes)
    return raw


def test_published_ports_are_read_as_docker_writes_them() -> None:
    record = parse_record(_record())
    assert [(p.container_port, p.protocol, p.host_port) for p in record.ports] == [
        (8000, "tcp", 8001)
    ]
    assert record.command == ("vllm", "serve", "/models/base")


@pytest.mark.parametrize(
    "changes",
    [
        {"Mounts": [{"Type": "bind", "Source": "/srv/m", "Destination": "models"}]},
        {"Mounts": "not a list"},
        {"Args": ["serve", 7]},
        {"State": {}},
        {"Config": {"Env": ["A=\x00"]}},
        {"NetworkSettings": {"Ports": {"8000/tcp": [{"HostPort": "eighty"}]}}},
    ],
)
def test_a_record_not_of_dockers_shape_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError, KeyError)):
        parse_record(_record(**changes))
