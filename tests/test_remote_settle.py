"""settle.sh, the step that decides what became of a write whose report never arrived, run by
the real shells a host may have (dash with coreutils, busybox's sh and applets). The cut-off
pushes themselves are in test_push_outcome.py (real sshd hosts); here, each verdict:

- a write that never came: "not landed", and the cancel mark it leaves makes that write refuse
  its rename if it comes late (the file keeps its bytes): "not landed" stays true;
- a write that landed and reported (its mark removed), still the last writer: "landed";
- a write whose report was lost (its landed mark still there), replaced since: "landed", with
  the other bytes (push says "replaced").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dflash_provision.remote.ops import WriteStatus, write_remote_config
from dflash_provision.remote.settle import Verdict, settle_write
from dflash_provision.transport.base import Transport
from dflash_provision.transport.local import LocalTransport
from testbed import samples
from tests.fixtures.transports import busybox_transport

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()
FIRST, SECOND = "a1" * 8, "b2" * 8


@pytest.fixture(params=["dash", "busybox"])
def shell(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Transport:
    if request.param == "dash":
        return LocalTransport()
    return busybox_transport(tmp_path_factory.mktemp("bb"))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def settle(shell: Transport, path: Path, nonce: str, data: bytes):  # type: ignore[no-untyped-def]
    return settle_write(
        shell, str(path), nonce=nonce, sha256=sha(data), follow_symlinks=False,
        lock_timeout=2, window=5,
    )  # fmt: skip


def test_a_write_that_never_came_is_not_landed_and_can_no_longer_land(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    settled = settle(shell, config, FIRST, REFERENCE)
    assert (settled.verdict, settled.sha256) == (Verdict.NOT_LANDED, sha(INCIDENT))
    late = write_remote_config(shell, str(config), REFERENCE, nonce=FIRST, timeout=10)
    assert (late.status, late.failed_step, late.reason) == (
        WriteStatus.FAILED,
        "rename",
        "cancelled",
    )
    assert config.read_bytes() == INCIDENT
    assert not [p.name for p in (tmp_path / ".dflash-backups").iterdir() if "dflash-tmp" in p.name]


def test_a_write_that_reported_and_is_still_last_is_landed(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    done = write_remote_config(shell, str(config), REFERENCE, nonce=FIRST, timeout=10)
    assert done.status is WriteStatus.WRITTEN
    marks = sorted(p.name for p in (tmp_path / ".dflash-backups").iterdir() if "landed" in p.name)
    assert marks == [], "a write whose report went out leaves no landed mark"
    settled = settle(shell, config, FIRST, REFERENCE)
    assert (settled.verdict, settled.sha256, settled.writer) == (
        Verdict.LANDED, sha(REFERENCE), FIRST,
    )  # fmt: skip


def test_a_write_whose_report_was_lost_and_was_replaced_is_landed(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    assert write_remote_config(shell, str(config), REFERENCE, nonce=FIRST, timeout=10).ok
    # What write.sh leaves when its report never reached the caller: its landed mark.
    (tmp_path / ".dflash-backups" / f"config.json.landed.{FIRST}").touch()
    assert write_remote_config(shell, str(config), INCIDENT, nonce=SECOND, timeout=10).ok
    settled = settle(shell, config, FIRST, REFERENCE)
    assert (settled.verdict, settled.sha256, settled.writer) == (
        Verdict.LANDED, sha(INCIDENT), SECOND,
    )  # fmt: skip
    assert not (tmp_path / ".dflash-backups" / f"config.json.landed.{FIRST}").exists()
