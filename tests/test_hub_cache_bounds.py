"""A cached Hub file is read like every SOURCE: bounded and never waited on. The HF cache is a
plain directory; a FIFO or a huge file planted as the cached blob must end in one line (exit 16),
not a CLI that blocks forever or reads gigabytes, and the next fetch downloads the file again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from tests.fixtures.cli import run_cli

pytestmark = pytest.mark.integration

REPO = samples.REFERENCE_REPO


def _fifo(blob: Path) -> None:
    os.mkfifo(blob)


def _huge(blob: Path) -> None:
    with blob.open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of zeros that cost no disk


@pytest.mark.parametrize("plant", [_fifo, _huge], ids=["fifo", "64MiB"])
def test_a_planted_cache_blob_is_refused_in_one_line_and_fetched_again_later(
    hub_env: dict[str, str], hf_home: Path, tmp_path: Path, plant: Callable[[Path], None]
) -> None:
    assert run_cli("fetch", REPO, "--no-lock", cwd=tmp_path, base_env=hub_env).returncode == 0
    [blob] = [p for p in hf_home.rglob("blobs/*") if p.is_file()]
    blob.unlink()
    plant(blob)

    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    done = run_cli("fetch", REPO, "--no-lock", cwd=tmp_path, base_env=offline, timeout=60)

    assert done.returncode == ExitCode.HUB_INTEGRITY, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and "cached copy" in line, line
    assert ("not a regular file" in line) if plant is _fifo else ("larger than 1 MiB" in line)
    # The planted entry was evicted: a fetch from the healthy Hub downloads the real bytes.
    again = run_cli("fetch", REPO, "--no-lock", "-o", "out.json", cwd=tmp_path, base_env=hub_env)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out.json").read_bytes() == samples.REFERENCE_DRAFTER.read_bytes()
