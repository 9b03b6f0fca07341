"""Every failure names its real cause, not the step that noticed it (issue 35 finding 2), on
real sshd hosts.

A model directory on a tmpfs with room for the temp file and nothing more: the write once said
``verify`` / ``hash-mismatch``, "received bytes corrupted" (pointing at the network), when its
hash's output did not fit in its scratch file. The outcome was right (failed, old file untouched,
exit 7); the cause is a full disk, and that is what the write must say at whatever step meets it
(now the mark it writes before the rename).
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


def test_disk_with_room_for_the_temp_file_only_says_disk_full(ssh_host: Host, tmp_path):
    assert len(INCIDENT) <= PAGE and len(REFERENCE) <= PAGE  # one page each on the tmpfs
    directory = ssh_host.root_dir / "models" / "X"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(INCIDENT)
    # Two pages: the old file's and the temp file's; none left for anything the write adds.
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
