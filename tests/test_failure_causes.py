"""Every failure names its real cause, not the step that noticed it (issue 35 finding 2), on
real sshd hosts.

A model directory on a tmpfs with room for the temp file but not for the ~150 bytes the write's
hash leaves in its scratch file: the hash came back empty and the write said ``verify`` /
``hash-mismatch``, "received bytes corrupted" (pointing at the network). The outcome was right
(failed, old file untouched, exit 7); the cause is a full disk.
"""

from __future__ import annotations

import json

import pytest

from dflash_provision.errors import ExitCode
from testbed import samples
from testbed.hosts import Host
from tests.fixtures.cli import run_cli
from tests.fixtures.ssh import host_args

pytestmark = [pytest.mark.integration, pytest.mark.root]

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
MODEL = "/root/models/X"
PAGE = 4096


def test_disk_with_room_for_the_temp_file_but_not_the_hash_says_disk_full(ssh_host: Host, tmp_path):
    assert len(INCIDENT) <= PAGE and len(REFERENCE) <= PAGE  # one page each on the tmpfs
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    # Two pages: the old file's and the temp file's; none left for the scratch file's bytes.
    ssh_host.fill_disk(MODEL, size=f"{2 * PAGE}", fill=False)
    try:
        done = run_cli(
            "push",
            f"{ssh_host.alias}:{MODEL}",
            "--from",
            str(samples.REFERENCE_DRAFTER),
            "--json",
            *host_args(ssh_host),
            home=tmp_path,
        )
        seen = ssh_host.exec(["cat", f"{MODEL}/config.json"], text=False, check=True).stdout
        left = ssh_host.exec(["ls", "-A", f"{MODEL}/.dflash-backups"], check=True).stdout
    finally:
        ssh_host.undo_mounts()
    assert done.returncode == ExitCode.REMOTE_FAILED, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "failed"
    assert result["reason"] == "no-space", (result["failed_step"], result["message"])
    assert "disk full" in result["message"]
    assert "corrupt" not in result["message"]
    assert seen == INCIDENT, "the old file is untouched"
    assert "dflash-tmp" not in left
