"""Hints and messages that tell the truth (issue 19, item 2), on a real sshd host and the Hub
stand-in with the real huggingface_hub client: no --force hint where --force then refuses; a
fetch that fell back to the cache says so and does not stamp the lock "now"; ``history --host``
finds every command that named the host; ``rollback --dry-run`` and its authoritative note.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from testbed.hub_standin import REFERENCE_MAIN_SHA, HubStandin
from tests.fixtures.cli import Done, run_cli, the_error_line
from tests.fixtures.ssh import host_args

pytestmark = [pytest.mark.integration, pytest.mark.root]

MODEL = "/root/models/Qwen3.6-27B-DFlash"
REFERENCE = samples.REFERENCE_DRAFTER
INCIDENT = samples.INCIDENT_DRAFTER
NOT_JSON = b'{"architectures": ["DFlashDraftModel"],\n'


def config_file(host: Host) -> Path:
    return host.root_dir / "models" / "Qwen3.6-27B-DFlash" / "config.json"


def seed(host: Host, data: bytes) -> None:
    config_file(host).parent.mkdir(parents=True, exist_ok=True)
    config_file(host).write_bytes(data)


def on(host: Host, workdir: Path, *args: str) -> Done:
    return run_cli(*args, *host_args(host), cwd=workdir, home=workdir / "home")


def local(workdir: Path, *args: str) -> Done:
    """A command that reaches no host (history), with the same history store as ``on``."""
    return run_cli(*args, cwd=workdir, home=workdir / "home")


def backups(host: Host) -> list[str]:
    return sorted(p.name for p in (config_file(host).parent / ".dflash-backups").iterdir())


# -- --force is offered only where it works ----------------------------------------------------


def test_push_of_an_unparseable_file_does_not_offer_force(ssh_host: Host, tmp_path: Path) -> None:
    seed(ssh_host, INCIDENT.read_bytes())
    bad = tmp_path / "bad.json"
    bad.write_bytes(NOT_JSON)
    spec = f"{ssh_host.alias}:{MODEL}"
    refused = on(ssh_host, tmp_path, "push", spec, "--from", str(bad))
    line = the_error_line(refused, ExitCode.INVALID, "does not parse", "--force cannot override")
    assert "anyway" not in line
    forced = on(ssh_host, tmp_path, "push", spec, "--from", str(bad), "--force")
    the_error_line(forced, ExitCode.INVALID, "even with --force")
    assert config_file(ssh_host).read_bytes() == INCIDENT.read_bytes()


def test_rollback_to_an_unparseable_backup_does_not_offer_force(
    ssh_host: Host, tmp_path: Path
) -> None:
    seed(ssh_host, NOT_JSON)
    spec = f"{ssh_host.alias}:{MODEL}"
    pushed = on(ssh_host, tmp_path, "push", spec, "--from", str(REFERENCE))
    assert pushed.returncode == 0, pushed.stderr  # the unparseable file is now a backup
    refused = on(ssh_host, tmp_path, "rollback", spec)
    line = the_error_line(refused, ExitCode.INVALID, "refusing to restore", "cannot override")
    assert "anyway" not in line and "pushes" not in line
    forced = on(ssh_host, tmp_path, "rollback", spec, "--force")
    the_error_line(forced, ExitCode.INVALID, "even with --force")
    assert config_file(ssh_host).read_bytes() == REFERENCE.read_bytes()


# -- rollback --dry-run, and whether the restored bytes are the authoritative config ------------


def test_rollback_dry_run_shows_the_restore_and_touches_nothing(
    ssh_host: Host, tmp_path: Path
) -> None:
    seed(ssh_host, INCIDENT.read_bytes())
    spec = f"{ssh_host.alias}:{MODEL}"
    assert on(ssh_host, tmp_path, "push", spec, "--from", str(REFERENCE)).returncode == 0
    before = (config_file(ssh_host).read_bytes(), backups(ssh_host))
    (backup,) = [name for name in before[1] if name.startswith("config.json.2")]

    dry = on(ssh_host, tmp_path, "rollback", spec, "--dry-run", "--from", str(REFERENCE))
    assert dry.returncode == 0, dry.stderr
    assert f"restoring backup {backup}" in dry.stdout
    assert "dflash_config.mask_token_id: 248070 → 248064" in dry.stdout  # what would change
    assert "dry run: nothing written" in dry.stdout
    assert "is NOT the authoritative config" in dry.stdout
    assert (config_file(ssh_host).read_bytes(), backups(ssh_host)) == before
    history = local(tmp_path, "history", "--op", "rollback", "--json")
    assert json.loads(history.stdout) == []  # nothing happened, nothing recorded

    done = on(ssh_host, tmp_path, "rollback", spec, "--from", str(REFERENCE), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "written"
    assert result["authoritative"]["matches"] is False
    assert config_file(ssh_host).read_bytes() == INCIDENT.read_bytes()
    text = on(ssh_host, tmp_path, "rollback", spec, "--from", str(REFERENCE))
    assert "note        the restored file is the authoritative config" in text.stdout, text.stdout


# -- history --host ----------------------------------------------------------------------------


def test_history_host_finds_audits_of_plain_targets(ssh_host: Host, tmp_path: Path) -> None:
    seed(ssh_host, REFERENCE.read_bytes())
    spec = f"{ssh_host.alias}:{MODEL}"
    assert on(ssh_host, tmp_path, "audit", spec, "--from", str(REFERENCE)).returncode == 0
    assert on(ssh_host, tmp_path, "push", spec, "--from", str(INCIDENT)).returncode == 0

    found = local(tmp_path, "history", "--host", ssh_host.alias, "--json")
    assert {row["op"] for row in json.loads(found.stdout)} == {"audit", "push"}
    assert {row["host"] for row in json.loads(found.stdout)} == {ssh_host.alias}
    by_spec = local(tmp_path, "history", "--host", spec, "--json")
    assert {row["op"] for row in json.loads(by_spec.stdout)} == {"audit", "push"}
    table = local(tmp_path, "history", "--host", ssh_host.alias, "--op", "audit")
    (row,) = [line for line in table.stdout.splitlines() if " audit " in line]
    assert f" audit  {ssh_host.alias} " in row, table.stdout  # the host column is not empty

    none = local(tmp_path, "history", "--host", "elsewhere")
    assert none.returncode == 0
    assert "no history yet" not in none.stdout
    assert "no records match --host elsewhere" in none.stdout


# -- fetch when the Hub cannot be reached ------------------------------------------------------


def test_fetch_from_the_cache_says_so_and_keeps_the_lock_time(
    tmp_path: Path, hub_env: dict[str, str], hub_standin: HubStandin, hf_home: Path
) -> None:
    repo = samples.REFERENCE_REPO
    first = run_cli("fetch", repo, cwd=tmp_path, base_env=hub_env)
    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr
    # The cache learnt main -> REFERENCE_MAIN_SHA at a known time; then main moves on and the
    # Hub goes away.
    ref = hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    known = datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)
    os.utime(ref, (known.timestamp(), known.timestamp()))
    hub_standin.add_repo(repo, {"config.json": INCIDENT.read_bytes()})
    hub_standin.stop()
    (tmp_path / "dflash.lock").unlink()

    text = run_cli("fetch", repo, cwd=tmp_path, base_env=hub_env)
    assert text.returncode == 0, text.stderr
    assert "could not be reached" in text.stderr and "may have moved" in text.stderr
    assert "(from the cache, not resolved now)" in text.stdout
    (entry,) = json.loads((tmp_path / "dflash.lock").read_text())["entries"]
    assert entry["commit_sha"] == REFERENCE_MAIN_SHA
    assert entry["fetched_at"] == "2020-01-02T03:04:05Z"  # the cache's time, not now

    as_json = run_cli("fetch", repo, "--json", "--no-lock", cwd=tmp_path, base_env=hub_env)
    document = json.loads(as_json.stdout)
    assert document["resolved_on_hub"] is False
    assert "could not be reached" in document["cache_fallback"]
    assert document["cached_since"] == "2020-01-02T03:04:05Z"


def test_a_repo_source_taken_from_the_cache_says_so_in_its_label(
    ssh_host: Host, tmp_path: Path, hub_env: dict[str, str], hub_standin: HubStandin
) -> None:
    seed(ssh_host, REFERENCE.read_bytes())
    repo = samples.REFERENCE_REPO
    assert run_cli("fetch", repo, "--no-lock", cwd=tmp_path, base_env=hub_env).returncode == 0
    hub_standin.stop()
    spec = f"{ssh_host.alias}:{MODEL}"
    done = run_cli(
        "verify", spec, "--repo", repo, *host_args(ssh_host), cwd=tmp_path, base_env=hub_env,
        home=tmp_path / "home",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{repo}@{REFERENCE_MAIN_SHA[:12]} (main as cached: the Hub could not be reached" in (
        done.stdout
    )
