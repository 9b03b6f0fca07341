"""Help and docs agree (issue 19, item 3): every command's ``--help`` names the SOURCE / TARGET
forms it takes and every exit code it can return, and docs/cli.md is generated from that help."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from dflash_provision.cli.main import COMMANDS, cli
from tests.fixtures.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "cli.md"


def help_of(name: str) -> str:
    done = run_cli(name, "--help", in_process=True, env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def exit_codes_in(text: str) -> set[int]:
    section = text.split("Exit codes:", 1)[1]
    return {int(m) for m in re.findall(r"^\s+(\d+)  ", section, flags=re.MULTILINE)}


def test_docs_cli_md_is_the_generated_reference() -> None:
    from dflash_provision.cli.docs import REGENERATE, render

    assert DOCS.is_file(), f"docs/cli.md is missing: run {REGENERATE}"
    assert DOCS.read_text(encoding="utf-8") == render(), (
        f"docs/cli.md is stale (the commands' --help changed): run {REGENERATE}"
    )


def test_the_readme_links_the_command_reference() -> None:
    assert "](docs/cli.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_help_lists_exit_codes_including_usage_and_success(name: str) -> None:
    text = help_of(name)
    assert "Exit codes:" in text, text
    assert {0, 1, 2} <= exit_codes_in(text)


@pytest.mark.parametrize("name", ["validate", "diff"])
def test_validate_and_diff_help_name_remote_targets(name: str) -> None:
    text = help_of(name)
    assert "SOURCE:" in text and "TARGET:" in text
    assert "root@gpu1:/root/models/X" in text and "gpu1/lxc:c1:/root/models/X" in text


def test_audit_help_lists_every_code_an_audit_returns() -> None:
    # 4 drift; 7, 8, 6, 5 hosts not checked (cli/audit.py's rule); 9 history / --prometheus;
    # 3 and 10-16 when the authoritative config cannot be loaded; 130 Ctrl-C.
    assert exit_codes_in(help_of("audit")) >= {0, 2, 3, 4, 5, 6, 7, 8, 9, *range(10, 17), 130}


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in ("fetch", "history", "init")])
def test_every_command_that_reaches_a_target_names_the_target_forms(name: str) -> None:
    text = help_of(name)
    assert "TARGET:" in text and "/KIND:NAME:/PATH" in text, text


def test_help_codes_are_documented_in_the_exit_code_table() -> None:
    from dflash_provision.cli._help import COMMAND_HELP

    table = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    listed = {code for _, codes in COMMAND_HELP.values() for code in codes}
    assert listed - {130} <= documented
    assert set(COMMAND_HELP) == set(COMMANDS)


def test_docs_generation_is_one_command() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^docs:.*\n\t.*-m dflash_provision\.cli\.docs > docs/cli\.md", makefile, re.M)
    ctx = click.Context(cli)
    assert all(cli.get_command(ctx, name) is not None for name in COMMANDS)


def test_push_help_and_the_module_docs_put_the_read_back_in_the_write_command() -> None:
    """The read-back is the write script's last step (one exec: tests/test_remote_ops.py's
    test_unread_write_of_identical_bytes_is_one_exec_that_brings_them); the help and the Ansible
    module said it was a command of its own, which sends a user reading a trace or a sudo log
    looking for a second command that is not there."""
    import ast

    import yaml

    push = " ".join(help_of("push").split())
    assert "in one remote command" in push, push
    assert not re.search(r"read (it )?back in another|separate read-back", push), push
    module = ROOT / "ansible_collections/dflash/provision/plugins/modules/drafter_config.py"
    namespace = {
        node.targets[0].id: node.value.value
        for node in ast.parse(module.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }  # fmt: skip
    documentation = yaml.safe_load(str(namespace["DOCUMENTATION"]))
    returned = yaml.safe_load(str(namespace["RETURN"]))
    words = " ".join([*documentation["description"], returned["readback_sha256"]["description"]])
    assert "separate read-back" not in words and "another command" not in words, words
    assert "in one remote command" in " ".join(words.split()), words
