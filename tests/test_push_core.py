"""push / verify / rollback core and CLI on this machine (LocalTransport, real files).

The SSH and LXC paths are in test_push_hosts.py; the script-level failures in test_remote_ops.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_provision.errors import ConfigInvalid, ExitCode, UsageError
from dflash_provision.host_state.file_status import HostStatus
from dflash_provision.place.push import (
    NOT_APPLIED_MESSAGE,
    OLD_UNREADABLE,
    PushStatus,
    push_config,
    rollback_config,
    verify_config,
)
from dflash_provision.remote.ops import list_remote_backups
from dflash_provision.source.authority import Authority, SourceSpec
from dflash_provision.target import parse_target
from dflash_provision.transport.local import LocalTransport
from testbed import samples
from tests.fixtures.cli import run_cli, run_cli_in_process
from tests.fixtures.model_dirs import assert_no_temp_left
from tests.fixtures.transports import PrefixTransport

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()


def loaded(data: bytes, label: str = "test") -> Authority:
    return Authority(label=label, data=data)


@pytest.fixture
def model_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dfp-push-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def local() -> LocalTransport:
    return LocalTransport()


def invalid_config() -> bytes:
    doc = json.loads(REFERENCE)
    doc["layer_types"] = doc["layer_types"][:2]  # fewer layer types than layers
    return json.dumps(doc, indent=2).encode()


# ---------------------------------------------------------------------------------------------
# authority


def test_authority_needs_exactly_one_source(tmp_path):
    with pytest.raises(UsageError, match="one authoritative source"):
        SourceSpec.from_options(repo="a/b", from_file=str(samples.REFERENCE_DRAFTER))
    with pytest.raises(UsageError, match="--repo OWNER/NAME"):
        SourceSpec().load(default_lock=tmp_path / "dflash.lock")


def test_authority_from_file_keeps_bytes_exactly():
    assert SourceSpec(from_file=str(samples.REFERENCE_DRAFTER)).load().data == REFERENCE


# ---------------------------------------------------------------------------------------------
# push


def test_push_writes_exact_bytes_shows_diff_then_says_unchanged(local, model_dir):
    target = parse_target(str(model_dir))
    (model_dir / "config.json").write_bytes(INCIDENT)

    first = push_config(local, target, loaded(REFERENCE))
    assert first.status is PushStatus.WRITTEN
    assert (model_dir / "config.json").read_bytes() == REFERENCE
    assert "dflash_config.mask_token_id: 248064 → 248070" in first.diff.lines
    assert first.readback is not None and first.readback.data == REFERENCE
    assert first.write is not None and first.write.backup

    second = push_config(local, target, loaded(REFERENCE))
    assert second.status is PushStatus.UNCHANGED
    assert len(list_remote_backups(local, target.config_path)) == 1, "unchanged adds no backup"


class OldBytesChangedInFlight(LocalTransport):
    """Alters the old file's bytes the write sends after its read-back (as if the old file had
    been changed in place between the write's hash and its read): same length, other bytes."""

    def run(self, argv, *, stdin=None, timeout=60.0):  # type: ignore[no-untyped-def]
        result = super().run(argv, stdin=stdin, timeout=timeout)
        if argv[:1] == ["sh"] and argv[3] == "dflash-write" and result.stdout.endswith(INCIDENT):
            out = result.stdout[: -len(INCIDENT)] + INCIDENT.replace(b"248064", b"111111")
            return dataclasses.replace(result, stdout=out)
        return result


def test_push_whose_old_bytes_do_not_match_their_hash_still_proves_the_write(model_dir):
    (model_dir / "config.json").write_bytes(INCIDENT)
    result = push_config(OldBytesChangedInFlight(), parse_target(str(model_dir)), loaded(REFERENCE))
    assert result.status is PushStatus.WRITTEN
    assert result.readback is not None and result.readback.data == REFERENCE
    assert result.diff is not None and result.diff.note == OLD_UNREADABLE, "no diff from them"
    assert result.old_sha256 == hashlib.sha256(INCIDENT).hexdigest(), "hashed by the write"


def test_push_whose_read_back_finds_other_bytes_says_not_applied(model_dir, tmp_path):
    # Another program rewrites the file right after the rename (the fake `sync`, the step
    # between the rename and the read-back, does it for real): the push does not take the
    # write's word for it.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    config = model_dir / "config.json"
    (fake / "sync").write_text(
        f'#!/bin/sh\n/bin/sync "$@"\ncat {shlex.quote(str(model_dir / "other"))} > {config}\n'
    )
    (fake / "sync").chmod(0o755)
    (model_dir / "other").write_bytes(INCIDENT.replace(b"248064", b"111111"))
    config.write_bytes(INCIDENT)
    on_path = PrefixTransport(["/usr/bin/env", f"PATH={fake}:{os.environ['PATH']}"], "fake-sync")
    result = push_config(on_path, parse_target(str(config)), loaded(REFERENCE))
    assert result.status is PushStatus.NOT_APPLIED
    assert result.message.startswith(NOT_APPLIED_MESSAGE)
    assert "mask_token_id: 111111" in result.message
    assert result.exit_code is ExitCode.REMOTE_FAILED


def test_dry_run_shows_the_diff_and_writes_nothing(local, model_dir):
    (model_dir / "config.json").write_bytes(INCIDENT)
    before = (model_dir / "config.json").stat()
    result = push_config(local, parse_target(str(model_dir)), loaded(REFERENCE), dry_run=True)
    assert result.status is PushStatus.DRY_RUN
    assert "dflash_config.mask_token_id: 248064 → 248070" in result.diff.lines
    assert result.write is None
    after = (model_dir / "config.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(model_dir)) == ["config.json"]


def test_invalid_config_is_never_pushed_unless_forced_loudly(local, model_dir):
    target = parse_target(str(model_dir))
    (model_dir / "config.json").write_bytes(REFERENCE)
    with pytest.raises(ConfigInvalid, match="refusing to push"):
        push_config(local, target, loaded(invalid_config()))
    assert (model_dir / "config.json").read_bytes() == REFERENCE

    forced = push_config(local, target, loaded(invalid_config()), force=True)
    assert forced.status is PushStatus.WRITTEN
    assert forced.forced
    assert any("FAILS validation" in w for w in forced.warnings)


def test_push_failure_is_a_result_naming_the_step(local, model_dir):
    target = parse_target(str(model_dir / "missing"))
    result = push_config(local, target, loaded(REFERENCE))
    assert result.status is PushStatus.FAILED
    assert result.failed_step == "dir"
    assert result.exit_code is ExitCode.REMOTE_FAILED


@pytest.mark.root
def test_a_file_only_the_writing_session_sees_passes_the_push_and_verify_tells(model_dir):
    # Every exec on this "host" runs in its own mount namespace with a fresh tmpfs over the
    # model dir seeded from the real one. Push's proof is the read-back inside its own exec (a
    # fresh open of the path after the rename, as a reader on that host opens it), so it sees
    # its file; verify is another exec, and tells what any other session sees. Real mounts,
    # real scripts; not a mock.
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    seed = model_dir / "seed"
    live = model_dir / "live"
    seed.mkdir()
    live.mkdir()
    (seed / "config.json").write_bytes(INCIDENT)
    wrapper = 'mount -t tmpfs -o size=1m ephemeral "$0" && cp -p "$1"/* "$0"/ && shift && exec "$@"'
    ephemeral = PrefixTransport(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            wrapper,
            str(live),
            str(seed),
        ],
        "ephemeral",
    )
    target = parse_target(str(live))
    result = push_config(ephemeral, target, loaded(REFERENCE))
    assert result.status is PushStatus.WRITTEN
    seen = verify_config(ephemeral, target, loaded(REFERENCE))
    assert seen.status is HostStatus.DRIFTED, "another session still sees the old file"
    assert seen.exit_code is ExitCode.DRIFT


# ---------------------------------------------------------------------------------------------
# verify


def test_verify_reports_match_drift_and_missing(local, model_dir):
    target = parse_target(str(model_dir))
    assert verify_config(local, target, loaded(REFERENCE)).status is HostStatus.MISSING
    (model_dir / "config.json").write_bytes(INCIDENT)
    drift = verify_config(local, target, loaded(REFERENCE))
    assert drift.status is HostStatus.DRIFTED
    assert drift.exit_code is ExitCode.DRIFT
    assert "dflash_config.mask_token_id: 248064 → 248070" in drift.diff.lines
    (model_dir / "config.json").write_bytes(REFERENCE)
    assert verify_config(local, target, loaded(REFERENCE)).status is HostStatus.IN_SYNC


def test_verify_counts_reformatted_json_as_drift_with_a_clear_message(local, model_dir):
    (model_dir / "config.json").write_bytes(json.dumps(json.loads(REFERENCE)).encode())
    result = verify_config(local, parse_target(str(model_dir)), loaded(REFERENCE))
    assert result.status is HostStatus.SAME_VALUES  # a status of its own, exiting as drift
    assert result.exit_code is ExitCode.DRIFT
    assert result.diff.formatting_only
    assert "same JSON, different bytes" in result.message


# ---------------------------------------------------------------------------------------------
# rollback


def test_rollback_restores_previous_bytes_and_keeps_current_as_backup(local, model_dir):
    target = parse_target(str(model_dir))
    (model_dir / "config.json").write_bytes(INCIDENT)
    push_config(local, target, loaded(REFERENCE))
    result = rollback_config(local, target)
    assert result.status is PushStatus.WRITTEN
    assert (model_dir / "config.json").read_bytes() == INCIDENT
    assert result.restored_from is not None
    backups = list_remote_backups(local, target.config_path)
    assert backups[-1].sha256 == hashlib.sha256(REFERENCE).hexdigest(), "current became a backup"
    assert_no_temp_left(model_dir)


def test_rollback_to_a_named_backup(local, model_dir):
    target = parse_target(str(model_dir))
    versions = [b'{"v": %d}\n' % i for i in range(3)]
    for data in versions:
        push_config(local, target, loaded(data), validate=False)
    oldest = list_remote_backups(local, target.config_path)[0]
    assert oldest.sha256 == hashlib.sha256(versions[0]).hexdigest()
    # Not drafter configs: a rollback validates what it restores, so --force.
    rollback_config(local, target, to=oldest.name, force=True)
    assert (model_dir / "config.json").read_bytes() == versions[0]


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_push_dry_run_push_unchanged_verify_rollback(model_dir):
    ref, inc = str(samples.REFERENCE_DRAFTER), str(samples.INCIDENT_DRAFTER)
    target = str(model_dir / "m")

    missing_dir = run_cli("push", target, "--from", ref, entry_point=True)
    assert missing_dir.returncode == ExitCode.REMOTE_FAILED
    assert "--mkdir" in missing_dir.stderr

    assert run_cli("push", target, "--from", inc, "--mkdir", entry_point=True).returncode == 0
    dry = run_cli("push", target, "--from", ref, "--dry-run", entry_point=True)
    assert dry.returncode == 0
    assert "dflash_config.mask_token_id: 248064 → 248070" in dry.stdout
    assert "nothing written" in dry.stdout

    pushed = run_cli("push", target, "--from", ref, "--json", entry_point=True)
    assert pushed.returncode == 0
    doc = json.loads(pushed.stdout)
    assert doc["status"] == "written"
    assert doc["durability"] == "fsync-file+dir"

    again = run_cli("push", target, "--from", ref, entry_point=True)
    assert again.returncode == 0
    assert "unchanged" in again.stdout

    drift = run_cli("verify", target, "--from", inc, entry_point=True)
    assert drift.returncode == ExitCode.DRIFT
    assert "248070 → 248064" in drift.stdout
    assert run_cli("verify", target, "--from", ref, entry_point=True).returncode == 0

    listed = json.loads(run_cli("rollback", target, "--list", "--json", entry_point=True).stdout)
    assert len(listed["backups"]) == 1
    assert run_cli("rollback", target, entry_point=True).returncode == 0
    assert (model_dir / "m" / "config.json").read_bytes() == INCIDENT


def test_cli_push_without_a_source_explains_how_to_name_one(model_dir):
    result = run_cli_in_process("push", str(model_dir), cwd=model_dir)
    assert result.returncode == ExitCode.USAGE
    assert "--repo" in result.stderr and "--lock" in result.stderr


def test_cli_verify_of_missing_file_is_drift_with_clear_message(model_dir):
    result = run_cli_in_process("verify", str(model_dir), "--from", str(samples.REFERENCE_DRAFTER))
    assert result.returncode == ExitCode.DRIFT
    assert "no config file" in result.stdout
