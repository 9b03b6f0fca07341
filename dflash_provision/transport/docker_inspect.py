"""A Docker container's own record (``docker container inspect``), checked, and its drafter path
mapped through its mounts in both directions.

What a server in a container was given names paths *inside* it (``--speculative-config
{"model": "/models/X"}``), while the drafter was provisioned at a path on the host
(``gpu1:/srv/models/X``) or in the container (``gpu1/docker:vllm:/models/X``). The mounts in
the record say which is which: :meth:`ContainerRecord.host_path` maps a path in the container to
the host directory behind it (None when no bind or volume mount holds it: the container's own
layer or a tmpfs, where no host path provisions it), :meth:`ContainerRecord.container_paths`
maps a host path to every path inside that shows it. The mapping is by path prefix, as the
kernel's mounts are: it does not follow symlinks on either side (it cannot see them from here).

The record is the daemon's JSON, read with a size limit and checked field by field: nothing in
it is trusted by shape alone. Environment *values* are dropped at once (they hold tokens:
``HF_TOKEN``); only the names are kept.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from dflash_provision.errors import ContainerError, RemoteStepFailed
from dflash_provision.transport.base import Transport
from dflash_provision.transport.docker_exec import tool_argv

#: ``docker container inspect`` of one container is a few KB; a record beyond this is refused.
MAX_RECORD_BYTES = 1024 * 1024
_INSPECT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Mount:
    """One mount of the container: ``source`` on the host, ``destination`` inside."""

    kind: str  # "bind", "volume", "tmpfs", ...
    source: str  # the host path ("" for tmpfs)
    destination: str
    read_write: bool


@dataclass(frozen=True)
class PublishedPort:
    """``container_port``/``protocol`` inside, published on ``host_ip``:``host_port``."""

    container_port: int
    protocol: str
    host_ip: str
    host_port: int


@dataclass(frozen=True)
class ContainerRecord:
    """What the daemon says about one container (see the module docstring)."""

    id: str
    name: str
    image: str
    status: str  # "running", "exited", "created", "paused", ...
    command: tuple[str, ...]  # the process it runs: Path, then Args
    env_names: tuple[str, ...]
    mounts: tuple[Mount, ...]
    ports: tuple[PublishedPort, ...]
    # State.StartedAt (RFC 3339, nanoseconds): when this run of the container began; ``docker
    # logs --since`` of it is this start's output only (a restarted container keeps its log).
    started_at: str = ""
    # State.Pid: the host's pid of the container's main process (0 when it does not run); a
    # restart of the container is a new process, so a new pid.
    pid: int = 0

    @property
    def running(self) -> bool:
        return self.status == "running"

    def host_path(self, container_path: str) -> str | None:
        """The host path behind ``container_path`` (absolute), through the innermost bind or
        volume mount that holds it; None when none does (the container's own layer, a tmpfs)."""
        path = _clean(container_path)
        holder = None
        for mount in self.mounts:
            if _under(path, mount.destination) and (
                holder is None or len(mount.destination) > len(holder.destination)
            ):
                holder = mount
        if holder is None or holder.kind not in ("bind", "volume") or not holder.source:
            return None
        rest = posixpath.relpath(path, holder.destination)
        return holder.source if rest == "." else posixpath.join(holder.source, rest)

    def container_paths(self, host_path: str) -> list[str]:
        """Every path inside that shows ``host_path`` (absolute), innermost mounts first; an
        entry is left out when a deeper mount inside covers it with something else."""
        path = _clean(host_path)
        found: list[str] = []
        for mount in self.mounts:
            if mount.kind not in ("bind", "volume") or not mount.source:
                continue
            if _under(path, mount.source):
                rest = posixpath.relpath(path, mount.source)
                inside = (
                    mount.destination if rest == "." else posixpath.join(mount.destination, rest)
                )
                if self.host_path(inside) == path:
                    found.append(inside)
        return sorted(set(found), key=lambda p: (-p.count("/"), p))


def inspect_argv(tool: str, name: str, *, docker_host: str | None = None) -> list[str]:
    """The argv that prints the container's record as a JSON array of one."""
    return tool_argv(tool, "container", "inspect", "--", name, docker_host=docker_host)


def read_record(
    host: Transport, name: str, *, tool: str = "docker", docker_host: str | None = None
) -> ContainerRecord:
    """``docker container inspect NAME`` on ``host`` (the machine that runs the container, not
    the container): ContainerError when it does not exist or the daemon cannot be reached,
    RemoteStepFailed for a record that is too large or not the shape Docker writes."""
    result = host.run(inspect_argv(tool, name, docker_host=docker_host), timeout=_INSPECT_TIMEOUT_S)
    where = f"{tool} container {name} on {host.description}"
    if result.exit_status != 0:
        said = result.stderr.decode("utf-8", "replace").strip().splitlines()
        last = said[-1][:300] if said else f"exit {result.exit_status}"
        if "No such container" in last or "No such object" in last or "no such container" in last:
            raise ContainerError(f"{where} does not exist")
        raise ContainerError(f"{where}: {tool} container inspect failed: {last}")
    if len(result.stdout) > MAX_RECORD_BYTES:
        raise RemoteStepFailed(
            f"{where}: its record is larger than {MAX_RECORD_BYTES} bytes: refused", step="read"
        )
    try:
        document = json.loads(result.stdout)
        if not isinstance(document, list) or len(document) != 1:
            raise ValueError("expected a list of one record")
        return parse_record(document[0])
    except (ValueError, TypeError, KeyError) as exc:
        raise RemoteStepFailed(
            f"{where}: its record is not what {tool} writes ({exc})", step="read"
        ) from None


def parse_record(raw: Any) -> ContainerRecord:
    """A ContainerRecord from one element of ``docker container inspect``'s array; ValueError
    (or TypeError, KeyError) for anything not of the shape Docker writes."""
    record = _mapping(raw, "record")
    config = _mapping(record.get("Config") or {}, "Config")
    state = _mapping(record["State"], "State")
    path = _text(record.get("Path", ""), "Path")
    args = [_text(a, "Args") for a in _list(record.get("Args") or [], "Args")]
    env_names = []
    for entry in _list(config.get("Env") or [], "Env"):
        name, _, _ = _text(entry, "Env").partition("=")  # the value is never kept
        env_names.append(name)
    mounts = [_mount(m) for m in _list(record.get("Mounts") or [], "Mounts")]
    host_config = _mapping(record.get("HostConfig") or {}, "HostConfig")
    for destination in _mapping(host_config.get("Tmpfs") or {}, "Tmpfs"):
        mounts.append(Mount("tmpfs", "", _absolute(_text(destination, "Tmpfs")), True))
    network = _mapping(record.get("NetworkSettings") or {}, "NetworkSettings")
    ports = _ports(_mapping(network.get("Ports") or {}, "Ports"))
    return ContainerRecord(
        id=_text(record["Id"], "Id"),
        name=_text(record.get("Name", ""), "Name").lstrip("/"),
        image=_text(config.get("Image", ""), "Image"),
        status=_text(state["Status"], "State.Status"),
        command=tuple([path, *args] if path else args),
        env_names=tuple(env_names),
        mounts=tuple(mounts),
        ports=ports,
        started_at=_text(state.get("StartedAt", ""), "State.StartedAt"),
        pid=_pid(state.get("Pid", 0)),
    )


def _pid(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"State.Pid: {value!r} is not a pid")
    return value


def _mount(raw: Any) -> Mount:
    mount = _mapping(raw, "Mounts[]")
    return Mount(
        kind=_text(mount.get("Type", ""), "Mounts[].Type"),
        source=_clean(_text(mount.get("Source", ""), "Mounts[].Source"))
        if mount.get("Source")
        else "",
        destination=_absolute(_text(mount["Destination"], "Mounts[].Destination")),
        read_write=bool(mount.get("RW", False)),
    )


def _ports(raw: dict[str, Any]) -> tuple[PublishedPort, ...]:
    ports = []
    for key, bindings in raw.items():
        number, _, protocol = _text(key, "Ports").partition("/")
        for binding in _list(bindings or [], f"Ports[{key}]"):
            entry = _mapping(binding, f"Ports[{key}][]")
            host_port = _text(entry.get("HostPort", ""), "HostPort")
            ports.append(
                PublishedPort(
                    int(number), protocol or "tcp", _text(entry.get("HostIp", ""), "HostIp"),
                    int(host_port),
                )
            )  # fmt: skip
    return tuple(ports)


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError(f"{what} is not a string")
    return value


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"mount destination {path!r} is not absolute")
    return _clean(path)


def _clean(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path")
    return posixpath.normpath(path).replace("//", "/")


def _under(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top + "/")
