"""``launch --docker IMAGE``: start vLLM in a NEW container with the provisioned drafter mounted,
and prove the start (a restart: a new container, this start's engine record, answering).

TARGET is the drafter directory on the host (as provisioned); it is bind-mounted read-only at
``--drafter-mount`` (default: the same path inside), and the server is given that path. What
runs, in order, on the host (one connection):

    pre-flight    the drafter file on the host is the authoritative config (the same judgement as
                  launch's, exit 4 with the push that fixes it), it validates (exit 3), N <=
                  block_size - 1 (exit 3), the mixed sliding/full layout gets
                  VLLM_USE_V2_MODEL_RUNNER=1 (launch's rule: preflight.drafter_preflight). Not
                  checked before the start: the image's vLLM version (it is read from this
                  start's engine record), the weights' headers (runtime-check's stage a does);
    image         ``docker image inspect`` of its Entrypoint: ``... serve`` (vllm/vllm-openai
                  since 0.6: ``vllm serve``) takes MODEL as its first argument; the older
                  ``python3 -m vllm.entrypoints.openai.api_server`` takes ``--model MODEL``; an
                  image without an entrypoint gets ``vllm serve MODEL`` as its command;
    old container ``docker container inspect NAME``: one that exists is refused (exit 22)
                  unless --restart, which stops (``docker stop --time``) and removes it, only
                  after the pre-flight has passed;
    start         ``docker run -d --name NAME --env-file /dev/stdin -v DRAFTER:MOUNT:ro
                  DOCKER_ARGS IMAGE [MODEL] --speculative-config JSON --host 0.0.0.0 --port P
                  VLLM_ARGS``; env values travel on stdin (never on a command line ``ps``
                  shows); ``--host 0.0.0.0`` inside the container's own network namespace: Docker
                  publishes nothing unless DOCKER_ARGS say ``-p``;
    readiness     until --ready-timeout (one deadline): the container's state (exited: exit 20
                  with its log's fatal lines) and /health asked from inside (docker exec of the
                  container's python, --python); a failed probe is "not ready yet", the
                  deadline's exit 20 names the last one (container_server.wait_ready);
    proof         the container is a new one (another id; the replaced one is gone), its engine
                  start-up record of THIS start (``docker logs --since StartedAt``) names the
                  mounted drafter and N, and /health answered 200. Anything short: exit 20.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflash_provision.errors import (
    ContainerError,
    ExitCode,
    RuntimeFailure,
    UsageError,
)
from dflash_provision.server.container_server import (
    ContainerOption,
    ContainerServer,
    Readiness,
    wait_ready,
)
from dflash_provision.server.locate import same_path
from dflash_provision.server.preflight import LaunchRequest, drafter_preflight
from dflash_provision.source.authority import Authority
from dflash_provision.target import ContainerKind, Target
from dflash_provision.transport.base import Transport
from dflash_provision.transport.docker_exec import tool_argv
from dflash_provision.transport.docker_inspect import read_record
from dflash_provision.vllm.log import parse_startup

_DOCKER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DockerLaunch:
    """What ``--docker`` adds to a LaunchRequest."""

    image: str
    name: str
    docker_args: tuple[str, ...] = ()
    mount: str | None = None  # where the drafter shows inside (default: the host path)
    kind: ContainerKind = "docker"
    docker_host: str | None = None


@dataclass
class DockerLaunchResult:
    status: str  # "started" | "restarted"
    container: str
    container_id: str
    argv: list[str]  # docker run's argv, env values not in it
    drafter_inside: str
    num_speculative_tokens: int
    env_names: list[str]
    replaced_id: str | None = None
    proof: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds_to_ready: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "container": self.container,
            "container_id": self.container_id,
            "argv": self.argv,
            "drafter_inside": self.drafter_inside,
            "num_speculative_tokens": self.num_speculative_tokens,
            "env_names": self.env_names,
            "replaced_id": self.replaced_id,
            "proof": self.proof,
            "warnings": self.warnings,
            "seconds_to_ready": round(self.seconds_to_ready, 3),
        }


def launch_in_container(
    host: Transport,
    target: Target,
    authority: Authority,
    request: LaunchRequest,
    spec: DockerLaunch,
    *,
    progress: Callable[[str], None] = lambda _line: None,
) -> DockerLaunchResult:
    """The module docstring's steps; RuntimeFailure (exit 20/22) or the pre-flight's refusal."""
    if target.container is not None:
        raise UsageError("launch --docker: TARGET must be the drafter directory on the host")
    timeout = request.command_timeout
    n, env, warnings = drafter_preflight(host, target, authority, request)
    inside = spec.mount or target.model_dir
    argv = run_argv(spec, request, _entrypoint(host, spec, timeout), inside, target.model_dir, n)
    option = ContainerOption(spec.kind, spec.name)
    old_id = _replace_old(host, option, spec, request)
    progress(f"docker run {spec.image} as {spec.name}")
    result = host.run(argv, stdin=_env_file(env), timeout=_DOCKER_TIMEOUT_S)
    if result.exit_status != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[-400:]
        raise RuntimeFailure(f"docker run failed: {said}", exit_code=ExitCode.LAUNCH_FAILED)
    started = time.monotonic()
    found = _await(host, option, target, spec, request, progress)
    proof = _prove(found, old_id, inside, n, timeout)
    return DockerLaunchResult(
        status="restarted" if old_id else "started",
        container=f"{spec.kind} container {spec.name} on {host.description}",
        container_id=found.record.id,
        argv=argv,
        drafter_inside=inside,
        num_speculative_tokens=n,
        env_names=sorted(env),
        replaced_id=old_id,
        proof=proof,
        warnings=warnings,
        seconds_to_ready=time.monotonic() - started,
    )


def run_argv(
    spec: DockerLaunch,
    request: LaunchRequest,
    entrypoint: list[str],
    inside: str,
    drafter_dir: str,
    n: int,
) -> list[str]:
    """``docker run -d ...`` for this launch (the module docstring's start line)."""
    speculative = {"method": "dflash", "model": inside, "num_speculative_tokens": n}
    speculative.update(request.speculative_extra)
    if entrypoint and entrypoint[-1] == "serve":
        model = [request.model]
    elif any("api_server" in part for part in entrypoint):
        model = ["--model", request.model]
    else:
        model = ["vllm", "serve", request.model]
    # 0.0.0.0 is the container's own network namespace: Docker publishes nothing unless
    # --docker-args say -p (a server on 127.0.0.1 there could not be published at all).
    anywhere = "0.0.0.0"  # noqa: S104
    return tool_argv(
        spec.kind, "run", "-d", "--name", spec.name, "--env-file", "/dev/stdin",
        "--label", f"dflash-provision.drafter={drafter_dir}",
        "-v", f"{drafter_dir}:{inside}:ro", *spec.docker_args, "--", spec.image,
        *model, "--speculative-config", json.dumps(speculative, separators=(",", ":")),
        "--host", anywhere, "--port", str(request.port), *request.extra_args,
        docker_host=spec.docker_host,
    )  # fmt: skip


def _env_file(env: dict[str, str]) -> bytes:
    for name, value in env.items():
        if "\n" in value or "\x00" in value or "\n" in name:
            raise UsageError(f"--env {name}: the value holds a line break or NUL byte")
    return "".join(f"{name}={value}\n" for name, value in env.items()).encode()


def _entrypoint(host: Transport, spec: DockerLaunch, timeout: float) -> list[str]:
    fmt = ["--format", "{{json .Config.Entrypoint}}"]
    argv = tool_argv(spec.kind, "image", "inspect", *fmt, "--", spec.image,
                     docker_host=spec.docker_host)  # fmt: skip
    result = host.run(argv, timeout=timeout)
    if result.exit_status != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[-300:]
        raise RuntimeFailure(
            f"image {spec.image} on {host.description}: {said} (pull it first: launch pulls "
            "nothing)",
            exit_code=ExitCode.VLLM_UNUSABLE,
        )
    try:
        value = json.loads(result.stdout[:65536] or b"null")
    except ValueError:
        value = None
    return [str(part) for part in value] if isinstance(value, list) else []


def _replace_old(
    host: Transport, option: ContainerOption, spec: DockerLaunch, request: LaunchRequest
) -> str | None:
    """The id of the container of that name that --restart stops and removes; None when there
    is none. One that exists without --restart is refused (exit 22)."""
    try:
        old = read_record(host, option.name, tool=option.kind, docker_host=spec.docker_host)
    except ContainerError as exc:
        if "does not exist" in exc.message:
            return None
        raise
    if not request.restart:
        raise RuntimeFailure(
            f"{option.kind} container {option.name} exists on {host.description} (state "
            f"{old.status}, image {old.image}): --restart replaces it",
            exit_code=ExitCode.PORT_TAKEN,
        )
    stop, daemon = round(request.stop_timeout), spec.docker_host
    for argv, limit in (
        (tool_argv(option.kind, "stop", "--time", str(stop), "--", option.name,
                   docker_host=daemon), stop + 30.0),
        (tool_argv(option.kind, "rm", "--", option.name, docker_host=daemon), _DOCKER_TIMEOUT_S),
    ):  # fmt: skip
        result = host.run(argv, timeout=limit)
        if result.exit_status != 0:
            said = result.stderr.decode("utf-8", "replace").strip()[-300:]
            raise RuntimeFailure(
                f"--restart: `{shlex.join(argv[:3])}` of {option.name} failed: {said}; nothing "
                "was started",
                exit_code=ExitCode.LAUNCH_FAILED,
            )
    return old.id


def _await(
    host: Transport,
    option: ContainerOption,
    target: Target,
    spec: DockerLaunch,
    request: LaunchRequest,
    progress: Callable[[str], None],
) -> ContainerServer:
    """The new container ready (container_server.wait_ready, --ready-timeout); exit 20 when it
    exits first (with its log's fatal lines) or the deadline passes (with the last probe's
    error)."""
    waited = wait_ready(
        host, option, target, request.port, ready_s=request.ready_timeout,
        docker_host=spec.docker_host, python=request.python, tail=5,
        command_timeout=request.command_timeout,
        waiting=lambda found: progress(f"waiting for /health in {found.what}"),
    )  # fmt: skip
    found = waited.found
    if waited.outcome is Readiness.EXITED:
        raise RuntimeFailure(
            f"launch failed: {found.what} exited during start-up (state "
            f"{found.record.status}): {waited.why}",
            exit_code=ExitCode.LAUNCH_FAILED,
        )
    if waited.outcome is Readiness.TIMED_OUT:
        raise RuntimeFailure(
            f"launch failed: {found.what} not ready within {request.ready_timeout:g} s (last "
            f"probe: {waited.why}; it keeps running: `dflash-provision stop TARGET --container "
            "NAME` ends it)",
            exit_code=ExitCode.LAUNCH_FAILED,
        )
    return found


def _prove(
    found: ContainerServer, old_id: str | None, inside: str, n: int, timeout: float
) -> list[str]:
    """This start's evidence (module docstring): exit 20 when any part is missing."""
    proof = [
        f"container {found.record.id[:12]} (started {found.record.started_at}) answers /health"
    ]
    problems = []
    if old_id is not None:
        if found.record.id == old_id:
            problems.append(f"the container is still {old_id[:12]}: not a new one")
        else:
            try:
                read_record(found.host, old_id, tool=found.option.kind,
                            docker_host=found.docker_host)  # fmt: skip
                problems.append(f"the replaced container {old_id[:12]} still exists")
            except ContainerError:
                proof.append(f"the replaced container {old_id[:12]} is gone")
    engine = parse_startup(found.startup_log(timeout=timeout)).engine
    if engine is None:
        problems.append("this start's docker logs hold no engine start-up record")
    elif not same_path(engine.spec_model, inside) or engine.num_spec_tokens != n:
        problems.append(
            f"this start's engine record says drafter {engine.spec_model!r}, num_spec_tokens "
            f"{engine.num_spec_tokens}; launched with {inside!r}, {n}"
        )
    else:
        proof.append(
            f"its engine record (v{engine.version}): drafter {engine.spec_model}, "
            f"num_spec_tokens {engine.num_spec_tokens}"
        )
    if problems:
        raise RuntimeFailure(
            f"launch not proved: {'; '.join(problems)} ({'; '.join(proof)})",
            exit_code=ExitCode.LAUNCH_FAILED,
        )
    return proof
