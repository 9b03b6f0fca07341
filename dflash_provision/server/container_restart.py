"""A proved restart of a vLLM server that runs in a Docker (or Podman) container: what ``rollout``
does to a host whose server is the container's (``rollout --container NAME``), forward and on
the way back.

Why ``docker restart`` and not a new container: the drafter is read from a bind mount of the
host directory the rollout writes, so the same container started again reads the new file. A
``docker restart`` keeps everything its ``docker run`` said (``--gpus``, ``--ipc``, ``--shm-size``,
networks, published ports, restart policy, labels, env values): a new container could only copy
what ``docker inspect`` shows, and would drop whatever the site's run script added. It is what
an operator types after changing a mounted config. (``launch --docker --restart`` makes a new
container: there the tool wrote the ``docker run`` itself.)

Before anything is stopped (a refusal leaves the server running): the container runs, a server
listens on the port inside, and it is the container's main process (pid 1 or the container's
own command): a server started by ``docker exec`` would not come back with the container.

Then ``docker restart --time T -- NAME`` (a stopped container, in a rollback whose server died
on the bad config, is started by the same command), and until the ready deadline: the
container's state (exited: the fatal lines of this start's ``docker logs``) and ``/health``
asked from inside. The proof: the container's main process is a new one (its ``State.Pid`` on
the host and ``State.StartedAt`` both changed; the old process is gone from the host), the
server is its main process, this start's engine record (``docker logs --since StartedAt``)
names a drafter that maps through the container's mounts to the provisioned host directory,
with the N the container's command gives, and /health answered 200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_provision.errors import ExitCode
from dflash_provision.server.access import NoProbePython
from dflash_provision.server.container_server import (
    ContainerOption,
    ContainerServer,
    Readiness,
    open_container_server,
    wait_ready,
)
from dflash_provision.server.process import find_server
from dflash_provision.server.restart import RestartDone, RestartFailed, refused
from dflash_provision.target import Target
from dflash_provision.transport.base import Transport
from dflash_provision.vllm.argv import read_speculative, serve_args
from dflash_provision.vllm.log import parse_startup

_RESTART_GRACE_S = 60.0  # beyond --time: docker's own SIGKILL, and the start of the new process


@dataclass(frozen=True)
class ServedBy:
    """What pre-flight found of the server in the container (kept in the rollout record)."""

    container: str  # "docker:vllm"
    id: str
    port: int
    drafter: str  # the path the server was given, inside
    num_speculative_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "id": self.id,
            "port": self.port,
            "drafter": self.drafter,
            "num_speculative_tokens": self.num_speculative_tokens,
        }


def served_by(found: ContainerServer, *, timeout: float | None) -> ServedBy:
    """The server a restart would act on, or RestartFailed (nothing stopped) saying why not."""
    port = found.port()[0]
    where = f"{found.what} on {found.host.description}"
    server = find_server(found.transport, port, timeout=timeout)
    if server is None:
        raise refused(f"{where}: no server listens on port {port} in it", ExitCode.NOT_RUNNING)
    if not found.is_main_process(server):
        raise refused(
            f"{where}: the server on port {port} (pid {server.pid} inside) is not the "
            "container's main process (started by docker exec?): a restart of the container "
            "would not bring it back"
        )
    spec = read_speculative(list(found.record.command)).config or {}
    drafter, n = spec.get("model"), spec.get("num_speculative_tokens")
    mismatch = found.drafter_mismatch(drafter, " (its command's --speculative-config)")
    if mismatch is not None:
        raise refused(mismatch, ExitCode.RUNTIME_CHECK_FAILED)
    return ServedBy(
        found.option.display(), found.record.id, port, str(drafter),
        n if isinstance(n, int) and not isinstance(n, bool) else None,
    )  # fmt: skip


def restart_container(
    host: Transport,
    option: ContainerOption,
    target: Target,
    *,
    ready_s: float,
    stop_timeout: float = 30.0,
    docker_host: str | None = None,
    python: str | None = None,
    may_be_down: bool = False,
) -> RestartDone:
    """The module docstring's restart; RestartFailed saying what was found otherwise.
    ``may_be_down``: a rollback, whose container may have exited on the bad config."""
    timeout = host.command_timeout
    before = open_container_server(
        host, option, target, docker_host=docker_host, running=not may_be_down
    )
    # A container that exited on the new config: what its command says is all there is.
    running = before.record.running
    served = served_by(before, timeout=timeout) if running else _from_command(before)
    argv = before.tool_argv("restart", "--time", str(round(stop_timeout)), "--", option.name)
    result = host.run(argv, timeout=stop_timeout + _RESTART_GRACE_S)
    if result.exit_status != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[-300:]
        raise RestartFailed(
            f"{before.what} on {host.description}: docker restart failed: {said}",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    after = _await(host, option, target, served.port, ready_s, docker_host, python)
    return RestartDone(_prove(before, after, served, timeout), {})


def _from_command(found: ContainerServer) -> ServedBy:
    spec = read_speculative(list(found.record.command)).config or {}
    n = spec.get("num_speculative_tokens")
    return ServedBy(
        found.option.display(), found.record.id, found.port()[0], str(spec.get("model")),
        n if isinstance(n, int) and not isinstance(n, bool) else None,
    )  # fmt: skip


def _await(
    host: Transport,
    option: ContainerOption,
    target: Target,
    port: int,
    ready_s: float,
    docker_host: str | None,
    python: str | None,
) -> ContainerServer:
    """The container ready again (container_server.wait_ready); RestartFailed when it exits
    first (with its log's fatal lines) or the deadline passes (with the last probe's error)."""
    try:
        waited = wait_ready(
            host, option, target, port, ready_s=ready_s, docker_host=docker_host, python=python
        )
    except NoProbePython as exc:  # restarted, but no way to ask whether it is ready
        raise RestartFailed(
            f"{exc.message} (after docker restart)", exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        ) from exc  # fmt: skip
    found = waited.found
    if waited.outcome is Readiness.EXITED:
        raise RestartFailed(
            f"{found.what} on {host.description} exited after docker restart (state "
            f"{found.record.status}): {waited.why}",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    if waited.outcome is Readiness.TIMED_OUT:
        raise RestartFailed(
            f"{found.what} on {host.description}: the server did not come back ready "
            f"within {ready_s:g} s after docker restart (last probe: {waited.why})",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    return found


def _prove(
    before: ContainerServer, after: ContainerServer, served: ServedBy, timeout: float | None
) -> str:
    """One line of evidence, or RestartFailed naming what is missing."""
    old, new = before.record, after.record
    problems: list[str] = []
    if new.id != old.id:
        problems.append(f"the container is {new.id[:12]} now, not {old.id[:12]}")
    if new.started_at == old.started_at or (old.pid and new.pid == old.pid):
        problems.append(f"its main process is still the old one (host pid {old.pid})")
    elif old.pid and _alive(before.host, old.pid, timeout):
        problems.append(f"the old main process (host pid {old.pid}) still runs")
    server = find_server(after.transport, served.port, timeout=timeout)
    if server is None or not after.is_main_process(server):
        problems.append(f"the server on port {served.port} is not the container's main process")
    engine = parse_startup(after.startup_log(timeout=timeout)).engine
    if engine is None:
        problems.append("this start's docker logs hold no engine start-up record")
    else:
        mismatch = after.drafter_mismatch(engine.spec_model, " (this start's engine record)")
        if mismatch is not None:
            problems.append(mismatch)
        if served.num_speculative_tokens is not None and (
            engine.num_spec_tokens != served.num_speculative_tokens
        ):
            problems.append(
                f"its engine record says num_spec_tokens {engine.num_spec_tokens}, the "
                f"container's command {served.num_speculative_tokens}"
            )
    where = f"{after.what} on {after.host.description}"
    if problems:
        raise RestartFailed(
            f"{where}: restart not proved: {'; '.join(problems)}",
            exit_code=ExitCode.LAUNCH_FAILED,
            stopped=True,
        )
    assert engine is not None
    old_pid = f"host pid {old.pid} gone, " if old.pid else ""
    return (
        f"docker restart of {after.option.name}: {old_pid}host pid {new.pid} started "
        f"{new.started_at}, the server is its main process, its engine record (v"
        f"{engine.version}): drafter {engine.spec_model} = host {after.provisioned}, "
        f"num_spec_tokens {engine.num_spec_tokens}, /health 200"
    )


def _alive(host: Transport, pid: int, timeout: float | None) -> bool:
    """The host still has a process ``pid`` (a ``/proc`` entry: no signal is sent)."""
    result = host.run(["sh", "-c", 'test -d "/proc/$1"', "sh", str(pid)], timeout=timeout)
    return result.exit_status == 0


def served_model(command: tuple[str, ...] | list[str]) -> str | None:
    """The target model a container's command serves: ``--model M``, else the word after
    ``serve`` (``vllm serve M``, the official image's entrypoint); None when neither is there."""
    argv = list(command)
    args = serve_args(argv)
    for index, arg in enumerate(args):
        if arg == "--model" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    if "serve" in argv and args and not args[0].startswith("-"):
        return args[0]
    return None
