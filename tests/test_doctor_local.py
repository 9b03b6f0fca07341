"""doctor and runtime-check on this machine (a local TARGET: no SSH, no root), with the real
target-side probe run by this interpreter's python and real transformers, and no server. The CLI
runs in-process (the probe is still a process of its own), but for one real-process run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from tests.fixtures.cli import Cli
from tests.fixtures.runtime import NO_SWA, REFERENCE, free_port

pytestmark = [pytest.mark.integration]


@pytest.fixture
def here(tmp_path: Path) -> tuple[Cli, Path]:
    (tmp_path / "work").mkdir()
    (tmp_path / "drafter").mkdir()
    return Cli(tmp_path / "work", in_process=True), tmp_path


def test_doctor_names_an_invalid_authoritative_config_before_anything_else(
    here: tuple[Cli, Path],
) -> None:
    cli, tmp = here
    (tmp / "drafter" / "config.json").write_bytes(NO_SWA)
    (tmp / "authority.json").write_bytes(NO_SWA)
    proc = cli.run(
        "doctor", str(tmp / "drafter"), "--from", str(tmp / "authority.json"),
        "--port", str(free_port()), "--python", sys.executable, "--json",
    )  # fmt: skip
    assert proc.returncode == ExitCode.INVALID, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["first_broken_link"] == "authoritative config"
    links = {link["link"]: link for link in report["links"]}
    assert "use_sliding_window" in links["authoritative config"]["summary"]
    assert links["file on disk"]["status"] == "passed"  # the file IS the (bad) authoritative one
    # The target's own transformers nulls the window: the loader link says so too.
    assert any(
        "sliding_window: null → 2048" in e for e in links["loader on the target"]["evidence"]
    )
    assert links["running server"]["status"] == "failed"


def test_runtime_check_with_a_missing_file_fails_stage_a_and_names_the_push(
    here: tuple[Cli, Path],
) -> None:
    # A real process: the fast tier's run of the runtime commands through the entry point.
    _, tmp = here
    cli = Cli(tmp / "work")
    (tmp / "authority.json").write_bytes(REFERENCE)
    proc = cli.run(
        "runtime-check", str(tmp / "drafter"), "--from", str(tmp / "authority.json"),
        "--port", str(free_port()), "--python", sys.executable,
    )  # fmt: skip
    assert proc.returncode == ExitCode.RUNTIME_CHECK_FAILED, proc.stdout + proc.stderr
    assert f"a  file on disk: FAILED  {tmp}/drafter/config.json: no such file" in proc.stdout
    assert f"fix: dflash-provision push {tmp}/drafter --from {tmp}/authority.json" in proc.stdout
    assert "d  a real completion: skipped" in proc.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--min-acceptance", "2"], "--min-acceptance"),
        (["--port", "0"], "--port"),
        (["--revision", "abc"], "--revision needs --repo"),
    ],
)
def test_runtime_check_bad_arguments_are_usage_errors(
    here: tuple[Cli, Path], args: list[str], words: str
) -> None:
    cli, tmp = here
    proc = cli.run("runtime-check", str(tmp / "drafter"), *args)
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    assert words in proc.stderr


def test_runtime_check_without_an_authoritative_config_says_how_to_name_one(
    here: tuple[Cli, Path],
) -> None:
    cli, tmp = here
    proc = cli.run("runtime-check", str(tmp / "drafter"))
    assert proc.returncode == ExitCode.USAGE
    assert "no authoritative config" in proc.stderr and "--from" in proc.stderr


def test_an_authoritative_config_that_is_not_json_is_a_clear_error(
    here: tuple[Cli, Path],
) -> None:
    cli, tmp = here
    (tmp / "authority.json").write_bytes(b'{"architectures": [')
    proc = cli.run("runtime-check", str(tmp / "drafter"), "--from", str(tmp / "authority.json"))
    assert proc.returncode == ExitCode.INVALID, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: the authoritative config: ")
    assert "invalid JSON at line 1" in proc.stderr
