"""The vLLM STAND-IN (``testbed/vllm_standin.py``) serving inside a container of the test bed's
dockerd, as ``docker run … vllm/vllm-openai --model … --speculative-config …`` would serve vLLM.

No registry is reachable, so the image is the test bed's busybox (``DockerDaemon.busybox_image``)
and the container gets this machine's Python, read-only, at the same paths: the system
libraries (/usr, /lib, /lib64), the interpreter's installation, the venv (transformers) and the
source tree (the stand-in's file). The container's command is the server itself (PID 1, as in
the official image, whose entrypoint ``exec``s vLLM): ``PYTHON vllm_standin.py serve MODEL --host
127.0.0.1 --port P --speculative-config JSON``, so ``docker logs`` holds its start-up records.
It runs with ``--network none``: the port is reachable only from inside (docker exec), as the
product reaches containers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed import vllm_standin
from testbed.docker import DockerContainer, DockerDaemon

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDIN = Path(vllm_standin.__file__).resolve()
PYTHON = f"{sys.prefix}/bin/python"
READY_TIMEOUT_S = 120.0  # importing transformers on a loaded 2-core machine takes seconds
# A stdlib probe run inside the container by its (mounted) Python: exit 0 when /health is 200.
HEALTH_PROBE = (
    "import sys, urllib.request\n"
    "try:\n"
    "    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=5).status == 200 else 1)\n"
    "except Exception:\n"
    "    sys.exit(1)\n"
)


def python_mounts() -> list[tuple[str, str]]:
    """(host path, path inside) of what runs the stand-in, all mounted read-only."""
    wanted = ["/usr", "/lib", "/lib64", sys.base_prefix, sys.prefix, str(REPO_ROOT)]
    mounts: list[tuple[str, str]] = []
    for path in wanted:
        if os.path.exists(path) and not any(path == inside for _, inside in mounts):
            mounts.append((os.path.realpath(path), path))
    return mounts


def serve_argv(
    model: str, drafter: str, *, port: int = 8000, num_spec: int = 15, extra: Sequence[str] = ()
) -> list[str]:
    """The container's command: the stand-in as ``vllm serve``."""
    spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": num_spec}
    return [
        PYTHON, str(STANDIN), "serve", model, "--host", "127.0.0.1", "--port", str(port),
        "--speculative-config", json.dumps(spec), *extra,
    ]  # fmt: skip


def standin_container(
    daemon: DockerDaemon,
    name: str,
    *,
    volumes: Sequence[tuple[str | Path, str]],
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> DockerContainer:
    """``docker run -d --network none`` the stand-in (``command``: ``serve_argv``), with
    ``volumes`` (host path, path inside) read-write and the Python mounts read-only; waits for
    /health when ``wait``."""
    args = ["run", "-d", "--network", "none", "--name", name]
    for source, inside in python_mounts():
        args += ["-v", f"{source}:{inside}:ro"]
    for volume, inside in volumes:
        args += ["-v", f"{volume}:{inside}"]
    # The reference drafter mixes sliding and full layers: vLLM needs its V2 runner for that.
    for key, value in {"VLLM_USE_V2_MODEL_RUNNER": "1", **(env or {})}.items():
        args += ["-e", f"{key}={value}"]
    daemon.docker(*args, daemon.busybox_image(), *command)
    container = DockerContainer(daemon, name)
    if wait:
        port = command[command.index("--port") + 1] if "--port" in command else "8000"
        wait_ready(container, int(port))
    return container


def wait_ready(container: DockerContainer, port: int, timeout: float = READY_TIMEOUT_S) -> None:
    """Until /health answers 200 inside the container (one deadline); RuntimeError with the
    container's log when it exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() < deadline:
        if container.state() != "running":
            break
        if container.exec([PYTHON, "-c", HEALTH_PROBE, url], timeout=30).returncode == 0:
            return
        time.sleep(0.5)
    logs = container.daemon.docker("logs", "--tail", "20", container.name, check=False)
    raise RuntimeError(
        f"stand-in in {container.name} not ready ({container.state()}): "
        f"{(logs.stdout + logs.stderr)[-1500:]}"
    )


STANDIN_IMAGE = "dflash-testbed/vllm-standin:1"


def standin_image(daemon: DockerDaemon) -> str:
    """An image whose ENTRYPOINT is the stand-in's ``serve``, as vllm/vllm-openai's is ``vllm
    serve``: the busybox root (``docker import --change``); the Python it names must be mounted
    (``python_mounts``) by whoever runs it."""
    from testbed.docker import busybox_rootfs_tar

    entrypoint = json.dumps([PYTHON, str(STANDIN), "serve"])
    if daemon.docker("image", "inspect", STANDIN_IMAGE, check=False).returncode != 0:
        daemon.docker(
            "import", "--change", f"ENTRYPOINT {entrypoint}", "-", STANDIN_IMAGE,
            stdin=busybox_rootfs_tar(), timeout=120,
        )  # fmt: skip
    return STANDIN_IMAGE


def python_mount_args() -> str:
    """``-v SRC:DST:ro ...`` of ``python_mounts``, as one ``--docker-args`` value."""
    import shlex

    return " ".join(f"-v {shlex.quote(f'{src}:{dst}:ro')}" for src, dst in python_mounts())
