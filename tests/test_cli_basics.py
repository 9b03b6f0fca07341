"""The CLI as a whole: entry points, --help hygiene, and SOURCE forms shared by diff/validate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_provision import __version__
from testbed import samples
from testbed.hosts import Fleet
from tests.fixtures.cli import Done, run_cli

HEAVY_MODULES = ("paramiko", "transformers", "huggingface_hub", "deepdiff", "jsonschema")


def test_help_lists_every_command_without_importing_heavy_libraries() -> None:
    probe = (
        "import sys\n"
        "from dflash_provision.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', [m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    for name in ("fetch", "validate", "diff", "push", "verify", "rollback", "audit", "repair"):
        assert f"  {name} " in done.stdout
    assert "LOADED []" in done.stdout


def test_version_and_module_entry_point_agree() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"dflash-provision, version {__version__}"


def test_unknown_command_is_a_usage_error() -> None:
    done = run_cli("pusj")
    assert done.returncode == 2
    assert "No such command" in done.stderr


def test_missing_source_is_one_line_usage_error(tmp_path: Path) -> None:
    done = run_cli("validate", str(tmp_path / "nope.json"), "--no-effective")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ") and "nope.json" in lines[0]


@pytest.mark.integration
@pytest.mark.root
def test_diff_and_validate_read_a_remote_target_over_ssh(fleet: Fleet, tmp_path: Path) -> None:
    host = fleet.hosts[0]
    model = host.root_dir / "models" / "diff-remote"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_bytes(samples.INCIDENT_DRAFTER.read_bytes())
    assert fleet.client is not None
    # diff and validate take no SSH options: the user's ~/.ssh/config is the way in, so give
    # the alias's config through HOME like a user would have it.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(fleet.client.ssh_config.read_text())
    target = f"{host.alias}:/root/models/diff-remote"

    def cli(*args: str) -> Done:
        return run_cli(*args, env={"HOME": str(home)})  # ~/.ssh/config names the host

    diff = cli("diff", target, str(samples.REFERENCE_DRAFTER))
    assert diff.returncode == 4, diff.stderr
    assert "dflash_config.mask_token_id: 248064 → 248070" in diff.stdout
    validate = cli("validate", target, "--against", str(samples.REFERENCE_DRAFTER), "--json")
    assert validate.returncode == 3, validate.stderr
    report = json.loads(validate.stdout)
    assert report["source"] == target
    assert report["layers"]["against"] == "failed"
    against = {f["path"] for f in report["findings"] if f["layer"] == "against"}
    assert {"dflash_config.mask_token_id", "sliding_window", "use_sliding_window"} <= against


@pytest.mark.parametrize("how", ["flag", "env", "neither"])
def test_debug_flag_or_variable_shows_the_traceback_behind_an_error_line(how: str) -> None:
    # A target with an empty host name: a usage error raised by the core, not by click.
    args = ["verify", "--from", str(samples.REFERENCE_DRAFTER), "root@:/models/x"]
    if how == "flag":
        args.insert(0, "--debug")
    done = run_cli(*args, env={"DFLASH_PROVISION_DEBUG": "1"} if how == "env" else None)
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith("error: target 'root@:/models/x': empty host name")
    shown = "Traceback (most recent call last)" in done.stderr
    assert shown is (how != "neither")
    if shown:
        assert "UsageError" in done.stderr
