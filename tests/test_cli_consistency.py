"""One default source, one set of source options and one status vocabulary across commands
(issue 19, item 1), on real sshd hosts and the Hub stand-in with the real huggingface_hub client.

Layout: two fresh hosts per module (h01, h02), their model directory re-seeded by each test;
a lock made by a real ``fetch`` from the stand-in where a test needs ``./dflash.lock``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Fleet
from testbed.hub_standin import REFERENCE_MAIN_SHA, REFERENCE_OLD_SHA
from tests.fixtures.cli import Done, run_cli, the_error_line
from tests.fixtures.ssh import ssh_args

pytestmark = [pytest.mark.integration, pytest.mark.root]

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
NOT_JSON = b'{"architectures": ["DFlashDraftModel"],\n'
REPO = samples.REFERENCE_REPO


@pytest.fixture(scope="module")
def two(make_fleet) -> Fleet:  # type: ignore[no-untyped-def]
    return make_fleet(2)


def seed(fleet: Fleet, **files: bytes | None) -> None:
    """Each named host's config.json (None: no file); the others get the reference."""
    for host in fleet.hosts:
        directory = host.root_dir / "models" / "Qwen3.6-27B-DFlash"
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "config.json"
        config.unlink(missing_ok=True)
        data = files.get(host.name, REFERENCE)
        if data is not None:
            config.write_bytes(data)


def target(name: str) -> str:
    return f"{name}:{MODEL}"


def run(workdir: Path, *args: str, env: dict[str, str] | None = None, fleet: Fleet) -> Done:
    return run_cli(
        *args, *ssh_args(fleet), cwd=workdir, home=workdir / "home", base_env=env,
        env={"COLUMNS": "200"},
    )  # fmt: skip


def fetched_lock(workdir: Path, hub_env: dict[str, str], *args: str) -> Path:
    """``dflash-provision fetch REPO`` in ``workdir``: the real client against the stand-in."""
    done = run_cli("fetch", REPO, *args, cwd=workdir, base_env=hub_env)
    assert done.returncode == 0, done.stderr
    return workdir / "dflash.lock"


# -- one default source ------------------------------------------------------------------------


def test_audit_and_repair_use_the_default_lock_like_push(
    two: Fleet, tmp_path: Path, hub_env: dict[str, str]
) -> None:
    seed(two, h02=INCIDENT)
    fetched_lock(tmp_path, hub_env)
    pushed = run(tmp_path, "push", target("h01"), "--dry-run", env=hub_env, fleet=two)
    assert pushed.returncode == 0, pushed.stderr  # the rule push already had

    audited = run(tmp_path, "audit", target("h01"), target("h02"), "--json", env=hub_env, fleet=two)
    assert audited.returncode == ExitCode.DRIFT, audited.stderr
    hosts = {h["target"]: h for h in json.loads(audited.stdout)["hosts"]}
    assert hosts[target("h01")]["status"] == "in_sync"
    assert hosts[target("h02")]["status"] == "drifted"
    assert f"{REPO}@{REFERENCE_MAIN_SHA[:12]}" in hosts[target("h01")]["authority"]

    repaired = run(tmp_path, "repair", target("h02"), env=hub_env, fleet=two)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert (two.host("h02").root_dir / "models/Qwen3.6-27B-DFlash/config.json").read_bytes() == (
        REFERENCE
    )


def test_the_default_lock_is_for_plain_targets_not_the_inventory_hosts(
    two: Fleet, tmp_path: Path, hub_env: dict[str, str]
) -> None:
    seed(two, h01=INCIDENT)  # h01's inventory drafter is the incident file: in sync with it
    fetched_lock(tmp_path, hub_env)
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        f"defaults:\n  path: {MODEL}\n  drafter:\n    from: {samples.INCIDENT_DRAFTER}\n"
        "hosts: [h01]\n"
    )
    done = run(
        tmp_path, "audit", "-i", str(inventory), target("h02"), "--json", env=hub_env, fleet=two
    )
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["h01"]["authority"] == str(samples.INCIDENT_DRAFTER)
    assert "dflash.lock" in hosts[target("h02")]["authority"]


def test_audit_without_any_source_names_the_default_lock(two: Fleet, tmp_path: Path) -> None:
    done = run(tmp_path, "audit", target("h01"), fleet=two)
    the_error_line(done, ExitCode.USAGE, "no authoritative config", "dflash.lock", "fetch")


# -- --revision wherever --repo ----------------------------------------------------------------


def test_revision_is_an_option_wherever_repo_is() -> None:
    import click

    from dflash_provision.cli.main import COMMANDS, cli

    with_repo = []
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        options = {opt: param for param in command.params for opt in param.opts}
        if "--repo" in options:
            with_repo.append(name)
            assert "--revision" in options, f"{name} takes --repo but not --revision"
            assert options["--revision"].help == options_help("push", "--revision")
    assert {"push", "verify", "launch", "doctor", "runtime-check", "audit", "repair"} <= set(
        with_repo
    )


def options_help(command_name: str, option: str) -> str | None:
    import click

    from dflash_provision.cli.main import cli

    command = cli.get_command(click.Context(cli), command_name)
    assert command is not None
    (param,) = [p for p in command.params if option in p.opts]
    return getattr(param, "help", None)


def test_verify_and_push_take_revision_from_the_hub(
    two: Fleet, tmp_path: Path, hub_env: dict[str, str]
) -> None:
    seed(two)  # h01 holds main's bytes; v1 is an older commit with another layout
    verify_v1 = run(
        tmp_path, "verify", target("h01"), "--repo", REPO, "--revision", "v1", "--json",
        env=hub_env, fleet=two,
    )  # fmt: skip
    assert verify_v1.returncode == ExitCode.DRIFT, verify_v1.stderr
    assert REFERENCE_OLD_SHA[:12] in json.loads(verify_v1.stdout)["source"]
    verify_main = run(
        tmp_path, "verify", target("h01"), "--repo", REPO, "--revision", "main",
        env=hub_env, fleet=two,
    )  # fmt: skip
    assert verify_main.returncode == 0, verify_main.stderr
    # The same option with the same meaning on a command that writes.
    pushed = run(
        tmp_path, "push", target("h01"), "--repo", REPO, "--revision", REFERENCE_MAIN_SHA,
        "--dry-run", env=hub_env, fleet=two,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr


def test_an_inventory_repo_and_repo_treat_a_missing_revision_alike(
    two: Fleet, tmp_path: Path, hub_env: dict[str, str]
) -> None:
    seed(two)
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        f"defaults:\n  path: {MODEL}\n  drafter:\n    repo: {REPO}\nhosts: [h01]\n"
    )
    from_inventory = run(tmp_path, "audit", "-i", str(inventory), "--json", env=hub_env, fleet=two)
    from_option = run(
        tmp_path, "audit", target("h01"), "--repo", REPO, "--json", env=hub_env, fleet=two
    )
    for done in (from_inventory, from_option):
        assert done.returncode == 0, done.stderr
        (host,) = json.loads(done.stdout)["hosts"]
        # Both resolve main now and say to which commit.
        assert host["authority"] == f"{REPO}@{REFERENCE_MAIN_SHA[:12]} (main)", host


# -- one status vocabulary ---------------------------------------------------------------------


def test_verify_says_what_audit_says_in_text_and_json(two: Fleet, tmp_path: Path) -> None:
    seed(two, h01=INCIDENT, h02=NOT_JSON)
    ref = str(samples.REFERENCE_DRAFTER)
    audited = run(
        tmp_path, "audit", target("h01"), target("h02"), "--from", ref, "--json", fleet=two
    )
    audit_words = {h["target"]: h["status"] for h in json.loads(audited.stdout)["hosts"]}
    assert audit_words == {target("h01"): "drifted", target("h02"): "invalid"}
    for name in ("h01", "h02"):
        as_json = run(tmp_path, "verify", target(name), "--from", ref, "--json", fleet=two)
        as_text = run(tmp_path, "verify", target(name), "--from", ref, fleet=two)
        word = audit_words[target(name)]
        assert json.loads(as_json.stdout)["status"] == word
        assert as_text.stdout.startswith(f"{word}: {target(name)}"), as_text.stdout
        assert as_json.returncode == as_text.returncode == ExitCode.DRIFT  # codes unchanged
    seed(two)
    in_sync = run(tmp_path, "verify", target("h01"), "--from", ref, fleet=two)
    assert in_sync.returncode == 0 and in_sync.stdout.startswith("in_sync: "), in_sync.stdout


def test_repair_dry_run_shows_the_audit_detail_of_every_host(two: Fleet, tmp_path: Path) -> None:
    seed(two, h01=None, h02=NOT_JSON)
    ref = str(samples.REFERENCE_DRAFTER)
    done = run(
        tmp_path, "repair", target("h01"), target("h02"), "--from", ref, "--dry-run", "--json",
        fleet=two,
    )  # fmt: skip
    assert done.returncode == ExitCode.DRIFT, done.stderr
    rows = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    for name, words in ((target("h01"), "no such file"), (target("h02"), "parse: invalid JSON")):
        assert rows[name]["action"] == "would_write"
        assert words in rows[name]["message"], rows[name]
    text = run(
        tmp_path, "repair", target("h01"), target("h02"), "--from", ref, "--dry-run", fleet=two
    )
    assert "no such file" in text.stdout and "parse: invalid JSON" in text.stdout, text.stdout
    assert (two.host("h02").root_dir / "models/Qwen3.6-27B-DFlash/config.json").read_bytes() == (
        NOT_JSON
    )


def test_audit_dash_i_with_a_private_key_says_so(two: Fleet, tmp_path: Path) -> None:
    assert two.client is not None
    key = str(two.client.identity)
    ref = str(samples.REFERENCE_DRAFTER)
    done = run(tmp_path, "audit", "-i", key, "--from", ref, fleet=two)
    the_error_line(done, ExitCode.USAGE, f"-i {key}", "private key", f"--identity {key}")
