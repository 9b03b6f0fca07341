"""A vLLM server in a Docker (or Podman) container on the host: ``--container
[docker:|podman:]NAME`` of ``status``, ``runtime-check``, ``doctor`` and ``stop``.

TARGET names the drafter directory *on the host* (where it was provisioned: ``gpu1:/srv/models/X``);
the server in the container was given a path *inside* it (``/models/X``). The container's own
record (``docker container inspect``: its command, its environment's names, its mounts and
published ports; transport/docker_inspect.py) joins the two:

- host → container: where the container sees the provisioned directory (``container_paths``:
  the innermost bind or volume mount); stage b's probe loads the file there with the container's
  Python (``docker exec``), and the server's port is reached from inside;
- container → host: the host directory behind the drafter the server was given (``host_path``);
  stage c compares THAT with the provisioned directory, so one directory seen under two names
  passes, and a container whose ``/models`` is another host directory fails naming both.

The start-up records come from ``docker logs --since <State.StartedAt>`` (this start's output
only: a restarted container keeps the earlier runs' lines), cut at a size limit on the host, and
count only when the server is the container's main process (pid 1, or the container's own
command): what a process started by ``docker exec`` prints is not in Docker's log.

``stop`` is ``docker stop --time T NAME`` (the container is the server's unit: what runs in it
ends with it, and ``docker run``'s restart policy does not bring back a container stopped by
hand), after checking that a vLLM server listens on the port inside; then the container's state
is read again.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any

from dflash_provision.errors import ContainerError, DflashProvisionError, UsageError
from dflash_provision.server.access import NoProbePython, open_server
from dflash_provision.server.bounded import run_bounded
from dflash_provision.server.process import find_server
from dflash_provision.server.readiness import fatal_lines
from dflash_provision.target import ContainerKind, ContainerRef, Target
from dflash_provision.transport.base import Transport
from dflash_provision.transport.container import ContainerTransport
from dflash_provision.transport.docker_exec import tool_argv
from dflash_provision.transport.docker_inspect import ContainerRecord, read_record

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
DEFAULT_PORT = 8000
#: docker logs of one start is read up to this many bytes on the host (start-up comes first).
LOG_BYTES = 512 * 1024
_POLL_S = 1.0  # between two readiness probes
_STOP_GRACE_S = 30.0  # beyond --timeout: docker stop's own SIGKILL and the daemon's bookkeeping
# `"$@"` is the docker argv; its output (both streams: vLLM logs to stdout, Python's tracebacks
# go to stderr) is cut at $1 bytes on the host, never carried whole over the connection.
_LOG_SCRIPT = 'limit=$1; shift; "$@" 2>&1 | head -c "$limit"'


@dataclass(frozen=True)
class ContainerOption:
    """``--container [docker:|podman:]NAME`` parsed."""

    kind: ContainerKind  # "docker" | "podman"
    name: str

    def display(self) -> str:
        return f"{self.kind}:{self.name}"


def parse_container_option(text: str) -> ContainerOption:
    """``docker:vllm``, ``podman:vllm`` or ``vllm`` (docker); UsageError otherwise."""
    kind, sep, name = text.partition(":")
    if not sep:
        kind, name = "docker", text
    chosen: ContainerKind
    if kind == "docker":
        chosen = "docker"
    elif kind == "podman":
        chosen = "podman"
    else:
        raise UsageError(f"--container {text!r}: the kind must be docker or podman")
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"--container {text!r}: {name!r} is not a container name or ID (letters, digits, "
            "_ . -, starting with a letter or digit)"
        )
    return ContainerOption(chosen, name)


@dataclass
class ContainerServer:
    """The container a server runs in, its record, and the provisioned directory mapped in."""

    host: Transport  # the machine that runs the container (docker runs there)
    option: ContainerOption
    record: ContainerRecord
    provisioned: str  # the drafter directory on the host (TARGET's)
    docker_host: str | None = None
    inside: str | None = field(init=False)

    def __post_init__(self) -> None:
        seen = self.record.container_paths(self.provisioned)
        self.inside = seen[0] if seen else None

    @property
    def what(self) -> str:
        return f"{self.option.kind} container {self.option.name}"

    @cached_property
    def transport(self) -> ContainerTransport:
        """``docker exec -i -- NAME ...`` on the host: the container's processes, its Python."""
        return ContainerTransport(
            self.host, self.option.kind, self.option.name, docker_host=self.docker_host
        )

    def inside_target(self, target: Target) -> Target:
        """TARGET as the container sees it (the server's side): the mapped directory, else the
        host path itself (which then names nothing the server can read: stage c says so)."""
        ref = ContainerRef(self.option.kind, self.option.name)
        return replace(target, container=ref, path=self.inside or self.provisioned)

    def tool_argv(self, *args: str) -> list[str]:
        """``docker [-H DOCKER_HOST] args...`` (or podman) for this container's daemon."""
        return tool_argv(self.option.kind, *args, docker_host=self.docker_host)

    # -- the drafter path, both ways --------------------------------------------------------

    def drafter_mismatch(self, given: Any, which: str = "") -> str | None:
        """None when the drafter the server was given is the provisioned host directory (through
        the mounts), else why not, naming the path inside and both host directories."""
        if not isinstance(given, str) or not given.startswith("/"):
            return (
                f"the server in {self.what} runs drafter {given!r}{which}: not a path in the "
                f"container, so not the provisioned {self.provisioned!r}"
            )
        behind = self.record.host_path(given)
        if behind is not None and _same(behind, self.provisioned):
            return None
        seen = (
            f"the container sees it at {self.inside!r}"
            if self.inside
            else "no mount brings it into the container"
        )
        if behind is None:
            return (
                f"the server in {self.what} runs drafter {given!r}{which}, which no bind or "
                f"volume mount brings from the host (the container's own files): not the "
                f"provisioned host directory {self.provisioned!r} ({seen})"
            )
        return (
            f"the server in {self.what} runs drafter {given!r}{which}, which is host directory "
            f"{behind!r}, not the provisioned {self.provisioned!r} ({seen})"
        )

    def mapping_lines(self, given: Any = None) -> list[str]:
        """Evidence: how the provisioned directory and the server's drafter map."""
        lines = [
            f"{self.what} ({self.record.image}, {self.record.status}, id {self.record.id[:12]})"
        ]
        if self.inside:
            lines.append(f"provisioned host {self.provisioned} = {self.inside} in the container")
        else:
            lines.append(f"provisioned host {self.provisioned}: not mounted in the container")
        if isinstance(given, str) and given.startswith("/"):
            behind = self.record.host_path(given)
            lines.append(
                f"the server's drafter {given} = host {behind}"
                if behind
                else f"the server's drafter {given}: the container's own files (no host mount)"
            )
        return lines

    def not_visible(self) -> str:
        mounts = ", ".join(f"{m.source or m.kind} -> {m.destination}" for m in self.record.mounts)
        return (
            f"{self.what} does not see the provisioned {self.provisioned}: no bind or volume "
            f"mount brings it in (its mounts: {mounts or 'none'})"
        )

    # -- the server's port and log ----------------------------------------------------------

    def port(self) -> tuple[int, str]:
        """The port the server listens on inside: ``--port`` of the container's command (the
        last one, as argparse reads it), else its one published TCP port, else 8000."""
        argv = list(self.record.command)
        found: int | None = None
        for index, arg in enumerate(argv):
            value = None
            if arg == "--port" and index + 1 < len(argv):
                value = argv[index + 1]
            elif arg.startswith("--port="):
                value = arg.split("=", 1)[1]
            if value is not None and value.isdigit() and 0 < int(value) < 65536:
                found = int(value)
        if found is not None:
            return found, "container command"
        published = {p.container_port for p in self.record.ports if p.protocol == "tcp"}
        if len(published) == 1:
            return published.pop(), "published port"
        return DEFAULT_PORT, "default"

    def is_main_process(self, server: Any) -> bool:
        """The server is the container's own process: its output is what docker logs keeps."""
        argv = [str(a) for a in getattr(server, "argv", None) or []]
        return getattr(server, "pid", None) == 1 or (
            bool(argv) and argv == list(self.record.command)
        )

    def startup_log(self, *, max_bytes: int = LOG_BYTES, timeout: float | None = None) -> str:
        """``docker logs --since <this start> -- NAME`` on the host, both streams, the first
        ``max_bytes`` bytes (cut there by ``head -c``: the start-up records come first)."""
        since = ["--since", self.record.started_at] if self.record.started_at else []
        argv = self.tool_argv("logs", *since, "--", self.option.name)
        result = run_bounded(
            self.host, ["sh", "-c", _LOG_SCRIPT, "sh", str(max_bytes), *argv], timeout=timeout
        )
        if result.exit_status != 0 and not result.stdout:
            said = result.stderr.decode("utf-8", "replace").strip()[-300:]
            raise ContainerError(f"{self.what} on {self.host.description}: docker logs: {said}")
        return result.stdout[:max_bytes].decode("utf-8", errors="replace")

    def why_it_exited(self, *, timeout: float | None, tail: int) -> str:
        """An exited container's reason: its log's fatal lines (readiness's judgement), else its
        last ``tail`` lines; at most three, each cut at 300 characters."""
        log = self.startup_log(timeout=timeout)
        fatal = fatal_lines(log, exited=True) or log.strip().splitlines()[-tail:]
        return " | ".join(line[:300] for line in fatal[:3])

    def fix_hint(self, given: Any = None) -> str:
        """Start the container again with the provisioned directory where the server reads it
        (a running container's mounts cannot change: a new container is the fix)."""
        inside = given if isinstance(given, str) and given.startswith("/") else self.inside
        mount = f"{shlex.quote(self.provisioned)}:{shlex.quote(inside or '/models/DRAFTER')}"
        return (
            f"start a new container with the provisioned directory mounted where its "
            f"--speculative-config points (docker run -v {mount} ...), or provision the "
            f"directory the server reads (push to the host path behind it)"
        )


def _same(a: str, b: str) -> bool:
    return posixpath.normpath(a) == posixpath.normpath(b)


def open_container_server(
    host: Transport,
    option: ContainerOption,
    target: Target,
    *,
    docker_host: str | None = None,
    running: bool = True,
) -> ContainerServer:
    """The container's record, read on ``host`` (one ``docker container inspect``), with
    TARGET's host directory mapped in. ContainerError when it does not exist, or (``running``)
    is not running."""
    if target.container is not None:
        raise UsageError(
            f"--container names the server's container; TARGET {target.display()} must be the "
            "drafter directory on the host (e.g. gpu1:/srv/models/X), not a container path"
        )
    record = read_record(host, option.name, tool=option.kind, docker_host=docker_host)
    found = ContainerServer(host, option, record, target.model_dir, docker_host)
    if running and not record.running:
        raise ContainerError(
            f"{found.what} on {host.description} is not running (state {record.status})"
        )
    return found


class Readiness(Enum):
    READY = "ready"
    EXITED = "exited"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class ContainerReadiness:
    """What :func:`wait_ready` found: the container's last record read, and why it is not
    ready (exited: its log's fatal lines, else its last lines; timed out: the last probe's
    answer or error)."""

    outcome: Readiness
    found: ContainerServer
    why: str = ""


def wait_ready(
    host: Transport,
    option: ContainerOption,
    target: Target,
    port: int,
    *,
    ready_s: float,
    docker_host: str | None = None,
    python: str | None = None,
    tail: int = 3,
    command_timeout: float | None = None,
    waiting: Callable[[ContainerServer], None] | None = None,
) -> ContainerReadiness:
    """Until /health answers 200 inside the container (one deadline, ``ready_s``), the
    container exits, or the deadline passes: the record is read again before each probe, so an
    exit is reported with its reason, also one that comes as the deadline passes.

    A probe that fails (refused, reset, no answer, ``docker exec`` refused while the container
    changes state, a python that cannot make the request yet) is "not ready yet": a starting
    container may do any of that, and only the deadline tells a server that will not come up
    from one that is still starting; the last failure is the TIMED_OUT result's ``why``. Only
    a container with no such python (NoProbePython: exit 126/127) stops the wait at once,
    raised: no later probe could ask, and a mistyped ``--python`` would otherwise cost the
    whole deadline; unless the container's record, read again, says it has exited since
    (docker exec gives 126 there too), which is EXITED. ``waiting`` is called after each
    probe that was not ready."""
    timeout = command_timeout if command_timeout is not None else host.command_timeout
    deadline = time.monotonic() + ready_s
    last = "no probe was made"
    while True:
        found = open_container_server(host, option, target, docker_host=docker_host, running=False)
        if not found.record.running:
            why = found.why_it_exited(timeout=timeout, tail=tail)
            return ContainerReadiness(Readiness.EXITED, found, why)
        left = deadline - time.monotonic()
        if left <= 0:
            return ContainerReadiness(Readiness.TIMED_OUT, found, last)
        try:
            status, last = _probe_health(found, port, python, timeout=max(1.0, min(10.0, left)))
        except NoProbePython:
            # docker exec answers 126 for a container that died between the read and the
            # probe too: its own record decides between "exited" and "no such python"
            again = open_container_server(
                host, option, target, docker_host=docker_host, running=False
            )
            if not again.record.running:
                why = again.why_it_exited(timeout=timeout, tail=tail)
                return ContainerReadiness(Readiness.EXITED, again, why)
            raise
        if status == 200:
            return ContainerReadiness(Readiness.READY, found)
        if waiting is not None:
            waiting(found)
        time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))


def _probe_health(
    found: ContainerServer, port: int, python: str | None, *, timeout: float
) -> tuple[int | None, str]:
    """/health's status asked from inside, and what the probe met, in words (for a timeout)."""

    try:
        with open_server(found.transport, port, python=python) as access:
            reply = access.request("GET", "/health", timeout=timeout, max_bytes=4096)
    except NoProbePython:
        raise
    except DflashProvisionError as exc:
        return None, exc.message
    return reply.status, f"/health answered HTTP {reply.status}"


@dataclass(frozen=True)
class ContainerStop:
    """What ``stop --container`` did."""

    status: str  # "stopped" | "not-running"
    container: str
    state_before: str
    state_after: str
    pid: int | None = None  # the server's pid inside, when one listened
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "container": self.container,
            "state_before": self.state_before,
            "state_after": self.state_after,
            "pid": self.pid,
            "message": self.message,
        }


def stop_container(
    found: ContainerServer, port: int, *, timeout: float, command_timeout: float | None = None
) -> ContainerStop:
    """``docker stop --time TIMEOUT -- NAME`` when a vLLM server listens on ``port`` inside;
    the container's state read again after. Nothing is stopped when none listens there."""
    where = f"{found.what} on {found.host.description}"
    before = found.record.status
    if not found.record.running:
        return ContainerStop("not-running", where, before, before, None, f"state {before}")
    server = find_server(found.transport, port, timeout=command_timeout)
    if server is None:
        return ContainerStop(
            "not-running", where, before, before, None,
            f"no server listens on port {port} in it: the container was left running",
        )  # fmt: skip
    argv = found.tool_argv("stop", "--time", str(round(timeout)), "--", found.option.name)
    result = found.host.run(argv, timeout=timeout + _STOP_GRACE_S)
    if result.exit_status != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[-300:]
        raise ContainerError(f"{where}: docker stop failed: {said}")
    after = read_record(
        found.host, found.option.name, tool=found.option.kind, docker_host=found.docker_host
    )
    if after.running:
        raise ContainerError(f"{where}: still running after docker stop (state {after.status})")
    return ContainerStop(
        "stopped", where, before, after.status, server.pid,
        f"docker stop --time {round(timeout)}: the server (pid {server.pid} in the "
        f"container) and the container ended (state {after.status})",
    )  # fmt: skip
