"""Exit codes and messages as docs/exit-codes.md promises them, for the cases that used to break it:
a rollback with nothing to restore, a file that cannot be read (the same code from diff, verify
and audit), a key file that is not a key, internal status tokens, and JSON errors cut mid-phrase.

Local targets (``/abs/dir``) go through the same read and write scripts as remote ones, so the
cases that need no SSH run without root; the SSH cases use a real sshd host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from dflash_provision.validation.validate import parse_config
from testbed import samples
from testbed.hosts import Host, refused_address
from tests.fixtures.cli import Cli, run_cli, the_error_line

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
REFERENCE_PATH = samples.REFERENCE_DRAFTER
MODEL = "/root/models/Qwen3.6-27B-DFlash"


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_bytes(REFERENCE)
    return path


def test_rollback_of_a_target_without_backups_is_a_usage_error_not_a_bug(
    tmp_path: Path, reference: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(REFERENCE)
    line = the_error_line(Cli(tmp_path).run("rollback", str(model)), ExitCode.USAGE)
    assert "no backups" in line and "push keeps one" in line


def test_a_missing_directory_is_said_in_words_not_internal_tokens(
    tmp_path: Path, reference: Path
) -> None:
    done = Cli(tmp_path).run("verify", str(tmp_path / "nowhere"), "--from", str(reference))
    assert done.returncode == ExitCode.DRIFT, done.stderr
    assert "its directory does not exist; push --mkdir creates it" in done.stdout
    assert "dir-missing" not in done.stdout + done.stderr


def test_json_errors_are_whole_phrases_with_their_position() -> None:
    half = REFERENCE[: len(REFERENCE) // 2]
    (finding,) = parse_config(half).findings
    assert "unterminated string starting at line" in finding.message
    assert finding.message.endswith(tuple("0123456789"))
    (finding,) = parse_config(b'{"a": }').findings
    assert finding.message == "invalid JSON at line 1, column 7: Expecting value"


def test_a_trailing_comma_is_named_at_the_comma(tmp_path: Path) -> None:
    """The most common hand edit gone wrong. Python's decoder says "Expecting property name
    enclosed in double quotes" at the closing brace, two lines below the comma to delete."""
    text = REFERENCE.decode().rstrip().removesuffix("}").rstrip() + ",\n\n}\n"
    (tmp_path / "edited.json").write_text(text)
    comma_line = text[: text.rindex(",")].count("\n") + 1
    done = Cli(tmp_path).run("validate", "edited.json", "--no-effective")
    assert done.returncode == ExitCode.INVALID
    assert f"invalid JSON at line {comma_line}, column " in done.stdout, done.stdout
    assert "a trailing comma after the last key" in done.stdout and "delete it" in done.stdout
    assert "Expecting property name" not in done.stdout
    (finding,) = parse_config(b'{"layers": [1, 2, ],\n "a": 1}').findings
    assert finding.message.startswith("invalid JSON at line 1, column 17: a trailing comma after")


def test_a_port_written_as_scp_would_says_how_to_give_a_port(tmp_path: Path) -> None:
    done = Cli(tmp_path).run("verify", "gpu1:2222:/root/models/X", "--from", str(REFERENCE_PATH))
    line = the_error_line(done, ExitCode.USAGE, "ssh://gpu1:2222/root/models/X")
    assert "must be absolute" not in line


def test_push_to_a_mistyped_file_name_creates_nothing_and_names_the_directory(
    tmp_path: Path, reference: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"{}")
    cli = Cli(tmp_path)
    for extra in ([], ["--dry-run"]):
        done = cli.run("push", str(model / "confg.json"), "--from", str(reference), *extra)
        the_error_line(done, ExitCode.USAGE, "no confg.json", f"give the directory ({model})")
        assert sorted(p.name for p in model.iterdir()) == ["config.json"]  # nothing created
    # A file of another name that is there is the user's own: written as asked.
    (model / "config.base.json").write_bytes(b"{}")
    done = cli.run("push", str(model / "config.base.json"), "--from", str(reference))
    assert done.returncode == ExitCode.OK, done.stderr
    assert (model / "config.base.json").read_bytes() == REFERENCE


def test_a_half_written_file_reads_as_a_whole_phrase_in_validate(tmp_path: Path) -> None:
    (tmp_path / "half.json").write_bytes(REFERENCE[: len(REFERENCE) // 2])
    done = Cli(tmp_path).run("validate", "half.json", "--no-effective")
    assert done.returncode == ExitCode.INVALID
    assert "invalid JSON: unterminated string starting at line" in done.stdout
    assert not any(line.rstrip().endswith(" at") for line in done.stdout.splitlines())


# ---------------------------------------------------------------------------------------------
# --identity files: checked before any connection (the address refuses: 5 would mean we tried)


@pytest.fixture
def nowhere() -> str:
    address, port = refused_address()
    return f"ssh://root@{address}:{port}{MODEL}"


def test_a_file_that_is_not_a_key_is_a_usage_error_before_connecting(
    tmp_path: Path, reference: Path, nowhere: str
) -> None:
    (tmp_path / "notes.txt").write_text("not a key\n")
    done = Cli(tmp_path).run("push", nowhere, "--from", str(reference), "--identity", "notes.txt")
    line = the_error_line(done, ExitCode.USAGE)
    assert "notes.txt: not a private key file" in line


def test_a_public_key_given_as_identity_names_the_private_one(
    tmp_path: Path, reference: Path, nowhere: str
) -> None:
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEx demo@host\n")
    for command in (["verify", nowhere], ["audit", nowhere]):
        done = Cli(tmp_path).run(*command, "--from", str(reference), "--identity", str(pub))
        line = the_error_line(done, ExitCode.USAGE)
        assert "this is a public key" in line and f"{tmp_path / 'id_ed25519'} " in line


def test_a_fifo_given_as_identity_is_refused_without_waiting_on_it(
    tmp_path: Path, reference: Path, nowhere: str
) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    done = Cli(tmp_path).run("push", nowhere, "--from", str(reference), "--identity", str(fifo))
    assert "not a regular file" in the_error_line(done, ExitCode.USAGE)


# ---------------------------------------------------------------------------------------------
# a file that cannot be read: one exit code from diff, verify and audit


@pytest.mark.integration
@pytest.mark.root
def test_an_unreadable_remote_file_exits_7_from_diff_verify_and_audit(
    ssh_host: Host, tmp_path: Path, reference: Path
) -> None:
    assert ssh_host.client is not None
    # config.json is a directory: the host answers, the file cannot be read.
    (ssh_host.root_dir / MODEL.removeprefix("/root/") / "config.json").mkdir(parents=True)
    target = f"{ssh_host.alias}:{MODEL}"
    ssh = ["--ssh-config", str(ssh_host.client.ssh_config)]
    home = {"HOME": str(tmp_path / "userhome")}
    # diff reads remote SOURCEs through ~/.ssh/config: give it the fleet's file there.
    (tmp_path / "userhome" / ".ssh").mkdir(parents=True)
    (tmp_path / "userhome" / ".ssh" / "config").write_bytes(ssh_host.client.ssh_config.read_bytes())
    env_diff = run_cli("diff", target, str(reference), cwd=tmp_path, env=home)
    line = the_error_line(env_diff, ExitCode.REMOTE_FAILED)
    assert "not a regular file" in line
    verify = Cli(tmp_path).run("verify", target, "--from", str(reference), *ssh)
    assert "not a regular file" in the_error_line(verify, ExitCode.REMOTE_FAILED)
    audit = Cli(tmp_path).run("audit", target, "--from", str(reference), *ssh, "--json")
    assert audit.returncode == ExitCode.REMOTE_FAILED, audit.stdout + audit.stderr
    (host,) = json.loads(audit.stdout)["hosts"]
    assert "not a regular file" in host["detail"]


@pytest.mark.parametrize("command", ["audit", "repair"])
def test_an_inventory_given_without_dash_i_says_to_give_it_with_dash_i(
    tmp_path: Path, command: str
) -> None:
    """`audit fleet.yaml` (-i forgotten) said the default dflash.lock was missing."""
    (tmp_path / "fleet.yaml").write_text("hosts: [h01]\n")
    done = Cli(tmp_path).run(command, "fleet.yaml")
    line = the_error_line(done, ExitCode.USAGE, "with -i fleet.yaml")
    assert "dflash.lock" not in line
