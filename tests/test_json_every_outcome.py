"""``--json`` is one JSON document on stdout for every outcome (issue 31, item 4): a script that
runs ``dflash-provision verify TARGET --json | jq .status`` reads a status and an exit code
whether the host answered, refused the connection, refused the login or the command line was
wrong. Before, a single target that could not be reached left stdout empty (one ``error:`` line
on stderr), while ``audit --json`` gave a row for the same host.

Every command whose ``--help`` has ``--json`` is run (the real CLI, in-process: what it prints
and the code it returns) against an address where nothing listens, then a real sshd host whose
key is not in known_hosts (the login refused), then with a bad option; the Hub's own command
(fetch) against a port that refuses, in a subprocess (huggingface_hub reads HF_ENDPOINT when it
is imported), and on a terminal (a real process under script(1)).
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflash_provision.cli.main import COMMANDS, cli
from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host, refused_address
from tests.fixtures.cli import Done, cli_env, run_cli, run_cli_in_process

REF = str(samples.REFERENCE_DRAFTER)
MODEL = "/root/models/Qwen3.6-27B-DFlash"

# What each command with --json is given besides its target ({t}): enough to reach the host.
ARGS: dict[str, list[str]] = {
    "validate": ["{t}"],
    "diff": ["{t}", REF],
    "push": ["{t}", "--from", REF],
    "verify": ["{t}", "--from", REF],
    "rollback": ["{t}"],
    "audit": ["{t}", "--from", REF],
    "repair": ["{t}", "--from", REF],
    "launch": ["{t}", "--from", REF, "--model", "Qwen/Qwen3.6-27B"],
    "status": ["{t}"],
    "stop": ["{t}"],
    "runtime-check": ["{t}", "--from", REF],
    "doctor": ["{t}", "--from", REF],
    "rollout": ["{t}", "--from", REF],
}
NO_TARGET = ("fetch", "history")  # the Hub's command; the local history


def has_json(name: str) -> bool:
    import click

    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return any("--json" in getattr(p, "opts", ()) for p in command.params)


def the_document(done: Done) -> dict[str, Any]:
    """stdout is exactly one JSON object (strict: no NaN/Infinity) naming status and code."""
    assert done.stdout.strip(), f"nothing on stdout; stderr: {done.stderr}"
    doc = json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert isinstance(doc, dict), doc
    assert doc["exit_code"] == done.returncode, doc
    assert isinstance(doc["status"], str) and doc["status"], doc
    return doc


# rollout's runs here are a real process: the fast tier's one run of that command family
# through the entry point (the others: tests/test_cli_basics.py and its neighbours).
REAL_PROCESS = ("rollout",)


def run(tmp_path: Path, name: str, target: str, *extra: str) -> Done:
    args = [a.format(t=target) for a in ARGS[name]]
    runner = run_cli if name in REAL_PROCESS else run_cli_in_process
    return runner(name, *args, *extra, "--json", cwd=tmp_path, home=tmp_path / "home")


def test_every_command_with_json_is_covered_here() -> None:
    with_json = {name for name in COMMANDS if has_json(name)}
    assert with_json == set(ARGS) | set(NO_TARGET)


@pytest.fixture(scope="module")
def nowhere() -> str:
    address, port = refused_address()
    return f"ssh://root@{address}:{port}{MODEL}"


@pytest.mark.parametrize("name", sorted(ARGS))
def test_an_unreachable_target_is_a_document_with_its_status_and_code(
    name: str, nowhere: str, tmp_path: Path
) -> None:
    done = run(tmp_path, name, nowhere, "--connect-timeout", "5")
    doc = the_document(done)
    assert done.returncode != ExitCode.OK
    if name == "rollout":  # its pre-flight refuses the rollout: the host is in its document
        assert done.returncode == ExitCode.ROLLOUT_REFUSED
        assert "refused" in json.dumps(doc)
        return
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    if name in ("audit", "repair"):  # a fleet document: the host is a row
        assert doc["status"] == "unreachable"
        return
    # The word audit --json uses for the same host, and the stderr line as the error.
    assert doc["status"] == "unreachable_refused", doc
    assert doc["reason"] == "refused"
    assert f"error: {doc['error']}" in done.stderr.splitlines()
    assert doc["command"] == name
    # The target it could not reach, also for the fleet commands' single form (runtime-check)
    # and for the SOURCEs of validate and diff (here diff's A).
    assert doc["target"] == nowhere, doc


def test_diffs_document_names_the_side_it_could_not_read(nowhere: str, tmp_path: Path) -> None:
    # Either side may be the one that fails: the document names that one, as given.
    done = run_cli_in_process("diff", REF, nowhere, "--connect-timeout", "5", "--json",
                              cwd=tmp_path, home=tmp_path / "home")  # fmt: skip
    doc = the_document(done)
    assert (doc["command"], doc["target"]) == ("diff", nowhere), doc
    (tmp_path / "broken.json").write_text('{"a": 1,')
    done = run_cli_in_process(
        "diff", REF, "broken.json", "--json", cwd=tmp_path, home=tmp_path / "home"
    )
    doc = the_document(done)
    assert done.returncode == ExitCode.INVALID, done.stderr
    assert doc["target"] == "broken.json", doc


@pytest.fixture(scope="module")
def host_not_known(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Path]]:
    """A real sshd host and an empty known_hosts: every login is refused (host key unknown)."""
    from testbed.hosts import Fleet
    from tests.fixtures.hosts import skip_unless_testbed

    skip_unless_testbed()
    base = tmp_path_factory.mktemp("json-host")
    known = base / "empty_known_hosts"
    known.write_text("")
    with Fleet(base / "fleet", 1, address_prefix=None) as one:
        yield one.hosts[0], known


@pytest.mark.hosts  # host_not_known starts a real sshd host
@pytest.mark.parametrize("name", ["push", "verify", "status", "doctor", "runtime-check", "diff"])
def test_a_refused_login_is_a_document_with_its_status_and_code(
    name: str, host_not_known: tuple[Host, Path], tmp_path: Path
) -> None:
    host, known = host_not_known
    assert host.client is not None
    target = f"ssh://root@{host.address}:{host.port}{MODEL}"
    done = run(
        tmp_path, name, target, "--known-hosts", str(known),
        "--identity", str(host.client.identity), "--no-agent",
    )  # fmt: skip
    doc = the_document(done)
    assert (done.returncode, doc["status"]) == (ExitCode.AUTH, "host_key_unknown"), doc
    assert "--accept-new-host-key" in doc["error"]


@pytest.mark.parametrize("name", sorted([*ARGS, *NO_TARGET]))
def test_a_usage_error_is_a_document_too(name: str, tmp_path: Path) -> None:
    done = run_cli_in_process(
        name, "--json", "--no-such-option", cwd=tmp_path, home=tmp_path / "home"
    )
    doc = the_document(done)
    assert (done.returncode, doc["status"]) == (ExitCode.USAGE, "usage")
    assert "--no-such-option" in doc["error"]


def test_fetch_with_the_hub_unreachable_is_a_document(tmp_path: Path) -> None:
    with socket.socket() as closed:  # bound, not listening: refused at once
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done = run_cli(
            "fetch", samples.REFERENCE_REPO, "--json", cwd=tmp_path, home=tmp_path / "home",
            env={"HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf")},
        )  # fmt: skip
    doc = the_document(done)
    assert (done.returncode, doc["status"]) == (ExitCode.HUB_UNREACHABLE, "hub_unreachable")


def test_a_result_document_carries_its_exit_code(tmp_path: Path) -> None:
    """The documents commands print themselves get the code they exit with: drift (4) here."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(samples.INCIDENT_DRAFTER.read_bytes())
    done = run_cli_in_process(
        "verify", str(model), "--from", REF, "--json", cwd=tmp_path, home=tmp_path / "home"
    )
    doc = the_document(done)
    assert (done.returncode, doc["status"]) == (ExitCode.DRIFT, "drifted")
    done = run_cli_in_process("validate", REF, "--json", cwd=tmp_path, home=tmp_path / "home")
    assert the_document(done)["exit_code"] == ExitCode.OK


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a terminal")
def test_on_a_terminal_json_is_still_one_document(tmp_path: Path) -> None:
    """A --json run on a terminal: no progress bar or colour codes around the document."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(samples.REFERENCE_DRAFTER.read_bytes())
    command = shlex.join(
        [sys.executable, "-m", "dflash_provision", "audit", str(model), "--from", REF, "--json"]
    )
    done = subprocess.run(
        ["script", "-qec", command, "/dev/null"], capture_output=True, text=True,
        timeout=120, check=False, cwd=tmp_path,
        env=cli_env(home=tmp_path / "home", env={"COLUMNS": "80"}),
    )  # fmt: skip
    doc = json.loads(done.stdout.replace("\r\n", "\n"))
    assert (done.returncode, doc["exit_code"], doc["summary"]["hosts"]) == (0, 0, 1)
