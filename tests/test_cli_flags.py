"""One meaning per flag across commands, help on every option, old spellings that still work
with a warning, and "Did you mean" for mistyped commands and options."""

from __future__ import annotations

import importlib
from collections import defaultdict
from pathlib import Path

import click
import pytest

from dflash_provision.cli.main import COMMANDS
from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import refused_address
from tests.fixtures.cli import Cli

# The same file under two parameter names: fetch writes the pin into it, the others read it.
SAME_MEANING = {"--lock": {"lock", "lock_path"}}


def commands() -> dict[str, click.Command]:
    return {
        name: importlib.import_module(f"dflash_provision.cli.{module}").command
        for name, (module, _) in COMMANDS.items()
    }


def visible_options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


def test_every_option_of_every_command_has_help_text() -> None:
    missing = [
        f"{name} {param.opts[0]}"
        for name, command in commands().items()
        for param in visible_options(command)
        if not (param.help or "").strip()
    ]
    assert missing == []


def test_no_flag_means_two_things_across_commands() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for command in commands().values():
        for param in visible_options(command):
            for flag in (*param.opts, *param.secondary_opts):
                meanings[flag].add(str(param.name))
    clashes = {
        flag: names
        for flag, names in meanings.items()
        if len(names) > 1 and names != SAME_MEANING.get(flag)
    }
    assert clashes == {}
    assert meanings["-i"] == {"inventory"}  # Ansible's -i
    assert meanings["-l"] == meanings["--limit"] == {"limit"}  # a host pattern, as Ansible's
    assert meanings["--identity"] == {"identity"}


def test_a_mistyped_command_suggests_the_closest_one(tmp_path: Path) -> None:
    done = Cli(tmp_path).run("pussh", "x")
    assert done.returncode == ExitCode.USAGE
    assert "No such command 'pussh'. Did you mean 'push'?" in done.stderr
    far = Cli(tmp_path).run("frobnicate")
    assert far.returncode == ExitCode.USAGE
    assert "No such command 'frobnicate'." in far.stderr and "Did you mean" not in far.stderr


def test_a_mistyped_option_suggests_the_closest_one(tmp_path: Path) -> None:
    done = Cli(tmp_path).run("repair", "--dryrun")
    assert done.returncode == ExitCode.USAGE
    assert "Did you mean '--dry-run'?" in done.stderr


@pytest.mark.parametrize("command", ["push", "verify", "rollback"])
def test_the_key_file_is_identity_and_dash_i_is_no_longer_taken_for_it(
    tmp_path: Path, command: str
) -> None:
    # -i was the key file here before 0.1.0; it is the inventory (audit, repair, rollout).
    key = tmp_path / "id_test"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "config.json").write_bytes(samples.REFERENCE_DRAFTER.read_bytes())
    address, port = refused_address()
    target = f"ssh://root@{address}:{port}/root/models/x"
    source = [] if command == "rollback" else ["--from", "config.json"]
    old = Cli(tmp_path).run(command, target, *source, "-i", str(key))
    assert old.returncode == ExitCode.USAGE
    assert "No such option '-i'" in old.stderr
    new = Cli(tmp_path).run(command, target, *source, "--identity", str(key))
    assert new.returncode == ExitCode.UNREACHABLE, new.stderr  # the key was taken, then refused
    assert new.stderr.strip().startswith("error: ") and "refused" in new.stderr


def test_history_row_count_is_last_and_limit_is_no_option_there(tmp_path: Path) -> None:
    new = Cli(tmp_path).run("history", "-n", "3")
    assert new.returncode == 0 and new.stderr == ""
    old = Cli(tmp_path).run("history", "--limit", "3")
    assert old.returncode == ExitCode.USAGE
    assert "No such option '--limit'" in old.stderr


@pytest.mark.parametrize("command", ["push", "verify", "audit"])
def test_the_ssh_config_can_come_from_the_environment(tmp_path: Path, command: str) -> None:
    done = Cli(tmp_path).run(
        command,
        "h01:/root/models/x",
        "--from",
        str(samples.REFERENCE_DRAFTER),
        env={"DFLASH_PROVISION_SSH_CONFIG": str(tmp_path / "no-such-ssh-config")},
    )
    assert done.returncode == ExitCode.USAGE
    assert "DFLASH_PROVISION_SSH_CONFIG" in done.stderr and "does not exist" in done.stderr
