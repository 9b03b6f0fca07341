"""``rollout --container``: a host whose vLLM server runs in a Docker container (the vLLM STAND-IN
as the container's main process in the test bed's dockerd, testbed.docker_standin), the drafter
provisioned on the host and bind-mounted at /models, as ``docker run -v /srv/models:/models
vllm/vllm-openai ...`` does. The rollout writes the host directory, restarts the container with
``docker restart`` (the mount is kept, so the server reads the new file), proves the restart (a
new main process, this start's engine record naming the drafter and N, answering) and judges
the gate; a bad config is caught at the canary and rolled back, proved the same way.

The stand-in's acceptance follows from the config it LOADED (its control file, mounted in:
``by_mask_token``), so only a restart that really re-read the file changes what is measured.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.docker import DockerContainer, DockerDaemon
from testbed.docker_standin import serve_argv, standin_container
from testbed.vllm_standin_install import CONTROL_ENV
from tests.fixtures.cli import Done, run_cli
from tests.fixtures.docker import unique_container_name

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.docker]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
PORT = 8124
BAD_MASK = 248064


def _variant(**changes: Any) -> bytes:
    doc = json.loads(REFERENCE)
    mask = changes.pop("mask_token_id", None)
    if mask is not None:
        doc["dflash_config"] = {**doc["dflash_config"], "mask_token_id": mask}
    doc.update(changes)
    return (json.dumps(doc, indent=2) + "\n").encode()


GOOD = _variant(max_position_embeddings=131072)
BAD = _variant(mask_token_id=BAD_MASK)  # the stand-in serves ~1 % acceptance with it


class Served:
    def __init__(self, daemon: DockerDaemon, root: Path) -> None:
        self.daemon, self.models = daemon, root / "srv-models"
        (self.models / "drafter").mkdir(parents=True)
        (self.models / "base").mkdir()
        self.config.write_bytes(REFERENCE)
        shutil.copy(samples.REFERENCE_TARGET, self.models / "base" / "config.json")
        rules = {"by_mask_token": {str(BAD_MASK): {"acceptance": 0.01}}}
        (self.models / "control.json").write_text(json.dumps(rules))
        self.container: DockerContainer = standin_container(
            daemon,
            unique_container_name("ro"),
            volumes=[(self.models, "/models")],
            command=serve_argv("/models/base", "/models/drafter", port=PORT, num_spec=7),
            env={CONTROL_ENV: "/models/control.json"},
        )
        self.home = root / "home"
        self.home.mkdir()

    @property
    def config(self) -> Path:
        return self.models / "drafter" / "config.json"

    def inspect(self) -> dict[str, Any]:
        done = self.daemon.docker("container", "inspect", self.container.name)
        return dict(json.loads(done.stdout)[0])

    def rollout(self, new: bytes, name: str) -> tuple[Done, dict[str, Any]]:
        source = self.home / f"{name}.json"
        source.write_bytes(new)
        done = run_cli(
            "rollout", str(self.models / "drafter"), "--from", str(source),
            "--container", f"docker:{self.container.name}", "--batches", "1",
            "--ready-timeout", "150", "--json",
            home=self.home, env=self.daemon.environment, timeout=600,
        )  # fmt: skip
        assert done.stdout.strip(), done.stderr
        return done, json.loads(done.stdout)


@pytest.fixture
def served(docker_daemon: DockerDaemon, tmp_path: Path) -> Iterator[Served]:
    box = Served(docker_daemon, tmp_path)
    yield box
    box.container.remove()


def _restarts(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "(docker restart of" in line]


def test_rollout_of_a_good_config_restarts_the_server_container_proved_and_completes(
    served: Served,
) -> None:
    before = served.inspect()
    done, doc = served.rollout(GOOD, "good")
    host = doc["hosts"][0]
    assert done.returncode == ExitCode.OK, done.stderr
    assert doc["state"] == "completed" and host["phase"] == "passed", host
    assert served.config.read_bytes() == GOOD
    # the record names the container, as pre-flight found it (the truth for --resume/--abort)
    record = host["server_container"]
    assert record["container"] == f"docker:{served.container.name}"
    assert (record["id"], record["port"]) == (before["Id"], PORT)
    assert (record["drafter"], record["num_speculative_tokens"]) == ("/models/drafter", 7)
    # docker restart: the same container, a new main process
    after = served.inspect()
    assert after["Id"] == before["Id"] and after["State"]["Running"]
    assert after["State"]["StartedAt"] != before["State"]["StartedAt"]
    assert after["State"]["Pid"] != before["State"]["Pid"]
    [restart] = _restarts(done.stderr)
    assert f"host pid {before['State']['Pid']} gone, host pid {after['State']['Pid']}" in restart
    assert "the server is its main process" in restart
    assert f"drafter /models/drafter = host {served.models / 'drafter'}" in restart
    assert "num_spec_tokens 7, /health 200" in restart
    assert "docker restart of docker:" in done.stderr  # pre-flight said what it would do
    assert host["new"]["rate"] >= 0.10 and host["baseline"]["rate"] >= 0.10
    # --resume/--abort act on the container the record names, never on another one given
    other = run_cli(
        "rollout", "--abort", doc["id"], "--container", "docker:elsewhere",
        home=served.home, env=served.daemon.environment, timeout=120,
    )  # fmt: skip
    assert other.returncode == ExitCode.USAGE, other.stderr
    assert f"was started with docker:{served.container.name}" in other.stderr


def test_a_bad_config_is_caught_at_the_canary_and_the_container_restarted_on_the_old_bytes(
    served: Served,
) -> None:
    done, doc = served.rollout(BAD, "bad")
    host = doc["hosts"][0]
    assert done.returncode == ExitCode.ROLLED_BACK, done.stderr
    assert doc["state"] == "rolled_back" and host["phase"] == "rolled_back", host
    assert served.config.read_bytes() == REFERENCE  # the old bytes, proved by read-back
    assert host["new"]["rate"] < 0.10  # the gate measured the restarted server on BAD
    assert host["after"]["rate"] >= 0.10  # and again after the rollback's restart
    forward, back = _restarts(done.stderr)
    assert "docker restart of" in forward
    assert "restarted on the restored bytes (docker restart of" in back
    assert "the server is its main process" in back and "/health 200" in back
    # The host line says what was restored in the journal's words, and which bytes: what ran.
    ran = hashlib.sha256(REFERENCE).hexdigest()[:12]
    assert f"rolled_back (restored what the server ran (sha256 {ran}), proved; acceptance" in (
        done.stderr
    )
    assert served.inspect()["State"]["Running"]


def test_a_server_started_by_docker_exec_is_refused_at_pre_flight_and_nothing_is_written(
    docker_daemon: DockerDaemon, tmp_path: Path
) -> None:
    """``docker restart`` brings back the container's own command only: a server started later
    by ``docker exec`` would not come back, so the rollout refuses before writing."""
    from testbed.docker_standin import python_mounts, wait_ready

    models = tmp_path / "srv-models"
    (models / "drafter").mkdir(parents=True)
    (models / "base").mkdir()
    (models / "drafter" / "config.json").write_bytes(REFERENCE)
    shutil.copy(samples.REFERENCE_TARGET, models / "base" / "config.json")
    volumes = [*((src, f"{dst}:ro") for src, dst in python_mounts()), (models, "/models")]
    source = tmp_path / "good.json"
    source.write_bytes(GOOD)
    with docker_daemon.container(unique_container_name("rx"), volumes=volumes) as idle:
        docker_daemon.docker(
            "exec", "-d", "-e", "VLLM_USE_V2_MODEL_RUNNER=1", idle.name,
            *serve_argv("/models/base", "/models/drafter", port=8000),
        )  # fmt: skip
        wait_ready(idle, 8000)
        done = run_cli(
            "rollout", str(models / "drafter"), "--from", str(source),
            "--container", f"docker:{idle.name}", "--batches", "1",
            home=tmp_path, env=docker_daemon.environment, timeout=300,
        )  # fmt: skip
    assert done.returncode == ExitCode.ROLLOUT_REFUSED, done.stdout + done.stderr
    assert "is not the container's main process" in done.stdout + done.stderr
    assert (models / "drafter" / "config.json").read_bytes() == REFERENCE
