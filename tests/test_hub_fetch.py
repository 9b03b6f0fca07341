"""`dflash-provision fetch` end to end: the real CLI in a subprocess, the real huggingface_hub
client, the local Hub stand-in. Nothing is patched in the subprocess."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.source.lockfile import read_lock
from testbed import samples
from testbed.hub_standin import (
    GATED_REPO,
    GATED_TOKEN,
    REFERENCE_MAIN_SHA,
    REFERENCE_OLD_SHA,
    HubStandin,
    older_reference_layout,
)
from tests.fixtures.cli import Done, run_cli

pytestmark = pytest.mark.integration

REPO = samples.REFERENCE_REPO
RESOLVE_MAIN = f"/{REPO}/resolve/main/config.json"


def run_fetch(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60) -> Done:
    return run_cli("fetch", *args, cwd=cwd, base_env=env, timeout=timeout)


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return proc.stderr.splitlines()


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_fetch_writes_the_config_and_records_commit_and_sha256_in_the_lock(
    hub_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()

    proc = run_fetch([REPO, "-o", "out/config.json"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    expected = samples.REFERENCE_DRAFTER.read_bytes()
    assert (tmp_path / "out" / "config.json").read_bytes() == expected
    lock = json.loads((tmp_path / "dflash.lock").read_text())
    [entry] = lock["entries"]
    assert entry["repo_id"] == REPO
    assert entry["revision"] == "main"
    assert entry["commit_sha"] == REFERENCE_MAIN_SHA
    assert re.fullmatch(r"[0-9a-f]{40}", entry["commit_sha"])
    assert entry["sha256"] == hashlib.sha256(expected).hexdigest()
    assert entry["size"] == len(expected)
    assert entry["fetched_at"].endswith("Z")
    assert f"main -> {REFERENCE_MAIN_SHA}" in proc.stdout


def test_fetch_by_branch_name_gets_that_branchs_commit_and_bytes(
    hub_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_fetch([REPO, "--revision", "v1", "--json", "-o", "v1.json"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["commit_sha"] == REFERENCE_OLD_SHA
    assert result["revision"] == "v1"
    assert (tmp_path / "v1.json").read_bytes() == older_reference_layout()
    assert read_lock(tmp_path / "dflash.lock")[0].revision == "v1"


def test_fetch_by_commit_sha_in_repo_spec_pins_that_commit(
    hub_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_fetch([f"{REPO}@{REFERENCE_OLD_SHA}", "--json"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["commit_sha"] == REFERENCE_OLD_SHA
    assert Path(result["cached_path"]).read_bytes() == older_reference_layout()


def test_fetch_again_with_a_new_commit_on_main_updates_the_lock(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    assert run_fetch([REPO], hub_env, tmp_path).returncode == 0
    new_sha = hub_standin.add_repo(REPO, {"config.json": b'{"changed": true}\n'})

    proc = run_fetch([REPO], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    [entry] = read_lock(tmp_path / "dflash.lock")
    assert entry.commit_sha == new_sha != REFERENCE_MAIN_SHA
    assert entry.sha256 == hashlib.sha256(b'{"changed": true}\n').hexdigest()


@pytest.mark.parametrize(
    ("args", "token", "exit_code", "words"),
    [
        (["nobody/missing-repo"], None, ExitCode.HUB_REPO_NOT_FOUND, ["not found"]),
        ([GATED_REPO], None, ExitCode.HUB_GATED, ["gated", "no token", "HF_TOKEN"]),
        ([GATED_REPO], "hf_wrong", ExitCode.HUB_GATED, ["gated", "not granted", "HF_TOKEN"]),
        ([REPO, "-r", "no-such-branch"], None, ExitCode.HUB_REVISION_NOT_FOUND, ["revision"]),
        ([REPO, "--filename", "nope.json"], None, ExitCode.HUB_FILE_NOT_FOUND, ["nope.json"]),
    ],
    ids=["repo-not-found", "gated-no-token", "gated-wrong-token", "bad-revision", "no-file"],
)
def test_hub_refusals_exit_with_their_own_code_and_one_line(
    hub_env: dict[str, str],
    tmp_path: Path,
    args: list[str],
    token: str | None,
    exit_code: ExitCode,
    words: list[str],
) -> None:
    if token is not None:
        hub_env["HF_TOKEN"] = token

    proc = run_fetch([*args, "-o", "out.json"], hub_env, tmp_path)

    assert proc.returncode == exit_code, proc.stderr
    [line] = error_lines(proc)
    assert line.startswith("error: ")
    repo_id = args[0]
    revision = args[2] if args[1:2] == ["-r"] else "main"
    filename = args[2] if args[1:2] == ["--filename"] else "config.json"
    for word in [repo_id, revision, filename, *words]:
        assert word in line
    assert not (tmp_path / "out.json").exists()
    assert not (tmp_path / "dflash.lock").exists()


def test_gated_repo_with_a_granted_token_succeeds(hub_env: dict[str, str], tmp_path: Path) -> None:
    hub_env["HF_TOKEN"] = GATED_TOKEN

    proc = run_fetch([GATED_REPO, "--json"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["repo_id"] == GATED_REPO


def test_cached_pinned_revision_makes_zero_requests_but_a_branch_is_revalidated(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    pinned = f"{REPO}@{REFERENCE_MAIN_SHA}"
    assert run_fetch([pinned], hub_env, tmp_path).returncode == 0
    assert hub_standin.count(f"/resolve/{REFERENCE_MAIN_SHA}/") > 0
    hub_standin.reset_counts()

    proc = run_fetch([pinned, "--json"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["commit_sha"] == REFERENCE_MAIN_SHA
    assert hub_standin.count() == 0
    # The contrast: a branch name can move, so the Hub is asked again.
    assert run_fetch([REPO], hub_env, tmp_path).returncode == 0
    assert hub_standin.count(RESOLVE_MAIN) > 0


def test_offline_with_the_file_cached_serves_the_branch_from_cache(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    assert run_fetch([REPO], hub_env, tmp_path).returncode == 0
    hub_standin.reset_counts()

    proc = run_fetch([REPO, "--json"], {**hub_env, "HF_HUB_OFFLINE": "1"}, tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["commit_sha"] == REFERENCE_MAIN_SHA
    assert hub_standin.count() == 0


def test_offline_with_nothing_cached_exits_15(
    hub_standin: HubStandin, hub_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_fetch([REPO], {**hub_env, "HF_HUB_OFFLINE": "1"}, tmp_path)

    assert proc.returncode == ExitCode.HUB_OFFLINE_NOT_CACHED
    [line] = error_lines(proc)
    assert "HF_HUB_OFFLINE" in line
    assert REPO in line
    assert hub_standin.count() == 0


def test_hub_down_with_nothing_cached_exits_14_without_the_clients_retry_delay(
    hub_env: dict[str, str], tmp_path: Path, closed_port_url: str
) -> None:
    started = time.monotonic()
    proc = run_fetch([REPO], {**hub_env, "HF_ENDPOINT": closed_port_url}, tmp_path)
    elapsed = time.monotonic() - started

    assert proc.returncode == ExitCode.HUB_UNREACHABLE
    [line] = error_lines(proc)
    assert "cannot reach" in line
    assert closed_port_url in line
    # The next step, as exit 15's message gives one.
    assert "check the network, HF_ENDPOINT and any proxy (HTTPS_PROXY), then run again" in line
    # huggingface_hub alone would back off 1+2+4+8+8 s before giving up.
    assert elapsed < 10, f"took {elapsed:.1f}s"


def test_hung_hub_exits_14_after_the_timeout(hub_env: dict[str, str], tmp_path: Path) -> None:
    # Listening but never accepting: the connection opens (kernel backlog), no answer comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        proc = run_fetch([REPO, "--timeout", "0.5"], {**hub_env, "HF_ENDPOINT": url}, tmp_path)
        elapsed = time.monotonic() - started

    assert proc.returncode == ExitCode.HUB_UNREACHABLE, proc.stderr
    [line] = error_lines(proc)
    assert "cannot reach" in line
    assert elapsed < 10, f"took {elapsed:.1f}s"


def test_hub_down_with_the_branch_cached_serves_the_cached_file(
    hub_env: dict[str, str], tmp_path: Path, closed_port_url: str
) -> None:
    assert run_fetch([REPO], hub_env, tmp_path).returncode == 0

    proc = run_fetch([REPO, "--json"], {**hub_env, "HF_ENDPOINT": closed_port_url}, tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["commit_sha"] == REFERENCE_MAIN_SHA


def test_no_lock_leaves_the_lock_file_alone(hub_env: dict[str, str], tmp_path: Path) -> None:
    proc = run_fetch([REPO, "--no-lock"], hub_env, tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "dflash.lock").exists()


def test_output_into_a_missing_directory_is_a_usage_error_and_records_nothing(
    hub_env: dict[str, str], tmp_path: Path
) -> None:
    proc = run_fetch([REPO, "-o", "missing-dir/config.json"], hub_env, tmp_path)

    assert proc.returncode == ExitCode.USAGE
    [line] = error_lines(proc)
    assert "missing-dir/config.json" in line
    assert not (tmp_path / "dflash.lock").exists()


def test_conflicting_revisions_are_a_usage_error(hub_env: dict[str, str], tmp_path: Path) -> None:
    proc = run_fetch([f"{REPO}@v1", "--revision", "main"], hub_env, tmp_path)

    assert proc.returncode == ExitCode.USAGE
    assert len(error_lines(proc)) == 1
