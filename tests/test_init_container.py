"""``dflash-provision init`` as a pod's init container would run it: a real ``docker run`` (the
test bed's dockerd) on a volume holding the lock file, the target model's config and the
drafter directory, before any server starts. The container runs this machine's Python and the
project's venv, bind-mounted read-only (no registry is reachable here to pull an image with
them); it shares the host's network so that it can fetch from the Hub stand-in.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.docker import DockerDaemon
from testbed.hub_standin import HubStandin
from tests.fixtures.cli import run_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
#: A real drafter config for another model (Qwen3-8B): it does not fit the 27B target.
OTHER_MODEL = samples.REFERENCE_DRAFTER.parent / "qwen3-8b-dflash-b16.config.json"


def python_mounts() -> list[tuple[str, str, str]]:
    """What the container needs, read-only, to run this checkout's CLI: the system libraries,
    the interpreter's installation, the venv and the source tree (an editable install)."""
    wanted = ["/usr", "/lib", "/lib64", sys.base_prefix, sys.prefix, str(REPO_ROOT)]
    mounts: list[tuple[str, str, str]] = []
    for path in wanted:
        if os.path.exists(path) and not any(path == m[1] for m in mounts):
            mounts.append((os.path.realpath(path), path, "ro"))
    return mounts


def init_in_container(
    daemon: DockerDaemon,
    volume: Path,
    *args: str,
    environment: dict[str, str] | None = None,
    volume_mode: str = "rw",
) -> tuple[int, str, str]:
    done = daemon.run_once(
        [f"{sys.prefix}/bin/python", "-m", "dflash_provision", "init", *args],
        volumes=[*python_mounts(), (str(volume), "/vol", volume_mode)],
        environment={"HF_HUB_DISABLE_TELEMETRY": "1", **(environment or {})},
        network="host",
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """The pod's shared volume: the target model's config and last start's (wrong) drafter."""
    root = tmp_path / "vol"
    (root / "models" / "base").mkdir(parents=True)
    (root / "models" / "drafter").mkdir()
    shutil.copy(samples.REFERENCE_TARGET, root / "models" / "base" / "config.json")
    (root / "models" / "drafter" / "config.json").write_bytes(INCIDENT)
    return root


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_init_container_fetches_the_locked_config_checks_it_and_writes_it_on_the_volume(
    docker_daemon: DockerDaemon, hub_standin: HubStandin, volume: Path, tmp_path: Path
) -> None:
    controller = tmp_path / "controller"
    controller.mkdir()
    fetched = run_cli(
        "fetch", samples.REFERENCE_REPO, cwd=controller, env={"HF_ENDPOINT": hub_standin.url,
        "HF_HOME": str(tmp_path / "hf-controller")},
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    shutil.copy(controller / "dflash.lock", volume / "dflash.lock")
    hub_standin.reset_counts()

    status, out, err = init_in_container(
        docker_daemon,
        volume,
        "--lock", "/vol/dflash.lock", "--target-config", "/vol/models/base",
        "/vol/models/drafter",
        environment={"HF_ENDPOINT": hub_standin.url, "HF_HOME": "/vol/hf"},
    )  # fmt: skip
    assert status == 0, err
    assert out.startswith("ready: /vol/models/drafter/config.json holds "), out
    assert out.count("\n") == 1 and "written, read back and matched" in out
    assert (volume / "models" / "drafter" / "config.json").read_bytes() == REFERENCE
    assert hub_standin.count("config.json") >= 1  # the bytes came from the Hub, in the container

    again = init_in_container(
        docker_daemon,
        volume,
        "--lock", "/vol/dflash.lock", "--target-config", "/vol/models/base",
        "/vol/models/drafter",
        environment={"HF_HUB_OFFLINE": "1", "HF_HOME": "/vol/hf"},
    )  # fmt: skip
    assert again[0] == 0 and "unchanged" in again[1], again  # the next start: from the cache


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_init_container_refuses_a_drafter_that_does_not_fit_the_target(
    docker_daemon: DockerDaemon, volume: Path
) -> None:
    shutil.copy(OTHER_MODEL, volume / "other.json")
    status, out, err = init_in_container(
        docker_daemon,
        volume,
        "--from", "/vol/other.json", "--target-config", "/vol/models/base",
        "/vol/models/drafter",
    )  # fmt: skip
    assert status == ExitCode.INVALID, out + err
    assert out == ""
    assert err.startswith("error: /vol/other.json does not pass validation for target ")
    assert err.count("\n") == 1 and "hidden_size" in err
    drafter = volume / "models" / "drafter"
    assert (drafter / "config.json").read_bytes() == INCIDENT
    assert sorted(p.name for p in drafter.iterdir()) == ["config.json"]  # nothing else written


@pytest.mark.integration
@pytest.mark.root
@pytest.mark.docker
def test_the_init_container_on_a_read_only_volume_fails_with_one_line(
    docker_daemon: DockerDaemon, volume: Path
) -> None:
    status, out, err = init_in_container(
        docker_daemon,
        volume,
        "--from", str(samples.REFERENCE_DRAFTER), "--target-config", "/vol/models/base",
        "/vol/models/drafter",
        volume_mode="ro",
    )  # fmt: skip
    assert status == ExitCode.REMOTE_FAILED, out + err
    assert err.startswith("error: /vol/models/drafter/config.json: ") and err.count("\n") == 1
    assert (volume / "models" / "drafter" / "config.json").read_bytes() == INCIDENT


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (("--repo", samples.REFERENCE_REPO), "pinned to a 40-hex commit sha (got none"),
        (("--repo", samples.REFERENCE_REPO, "--revision", "main"), "(got 'main'"),
        ((), "init needs a pinned source"),
    ],
)
def test_init_without_a_pinned_source_is_refused_before_anything_is_read(
    tmp_path: Path, source: tuple[str, ...], words: str
) -> None:
    shutil.copy(samples.REFERENCE_TARGET, tmp_path / "target.json")
    (tmp_path / "dflash.lock").write_text("not read\n")  # the default lock is not a pin
    done = run_cli(
        "init", *source, "--target-config", str(tmp_path / "target.json"),
        str(tmp_path / "drafter"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert words in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "drafter").exists()
