"""settle.sh, the step that decides what became of a write whose answer never arrived, and the
marks write.sh leaves for it, run by the real shells a host may have (dash with coreutils,
busybox's sh and applets). The cut-off pushes themselves are in test_push_outcome.py (real sshd
hosts); here, each verdict and the marks' life:

- a write that never came: "not landed", and the mark settle leaves makes that write refuse its
  rename if it comes late (the file keeps its bytes): "not landed" stays true;
- a write that landed and reported: "landed";
- a write whose answer was lost, replaced since: "landed", with the other bytes (push says
  "replaced");
- a write killed mid-rename: its temp file still there says not landed (and goes), else landed;
- later writes remove the marks nobody needs (reported, failed, a day old), a killed write's
  temp file and the evidence files of the versions before the mark; a recent unsettled mark
  stays.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from dflash_provision.remote.ops import WriteStatus, new_nonce, write_remote_config
from dflash_provision.remote.settle import Verdict, settle_write
from dflash_provision.transport.base import Transport
from dflash_provision.transport.local import LocalTransport
from testbed import samples
from tests.fixtures.transports import busybox_transport

REFERENCE = samples.REFERENCE_DRAFTER.read_bytes()
INCIDENT = samples.INCIDENT_DRAFTER.read_bytes()


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


def marks(directory: Path) -> dict[str, str]:
    """nonce -> what its mark holds."""
    backups = directory / ".dflash-backups"
    return {
        p.name.removeprefix("config.json.mark."): p.read_text().strip()
        for p in backups.glob("config.json.mark.*")
    }


def test_a_write_that_never_came_is_not_landed_and_can_no_longer_land(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    first = new_nonce()
    settled = settle(shell, config, first, REFERENCE)
    assert (settled.verdict, settled.sha256) == (Verdict.NOT_LANDED, sha(INCIDENT))
    assert marks(tmp_path) == {first: "cancelled"}
    late = write_remote_config(shell, str(config), REFERENCE, nonce=first, timeout=10)
    assert (late.status, late.failed_step, late.reason) == (
        WriteStatus.FAILED,
        "rename",
        "cancelled",
    )
    assert config.read_bytes() == INCIDENT
    assert not [p.name for p in (tmp_path / ".dflash-backups").iterdir() if "dflash-tmp" in p.name]
    again = settle(shell, config, first, REFERENCE)
    assert again.verdict is Verdict.NOT_LANDED, "asked twice, the same answer"


def test_a_write_that_reported_is_landed(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    first = new_nonce()
    done = write_remote_config(shell, str(config), REFERENCE, nonce=first, timeout=10)
    assert done.status is WriteStatus.WRITTEN
    assert marks(tmp_path) == {first: "reported"}, "its answer was handed over"
    settled = settle(shell, config, first, REFERENCE)
    assert (settled.verdict, settled.sha256) == (Verdict.LANDED, sha(REFERENCE))


def test_a_write_whose_answer_was_lost_and_was_replaced_is_landed(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    first, second = new_nonce(), new_nonce()
    assert write_remote_config(shell, str(config), REFERENCE, nonce=first, timeout=10).ok
    # What its mark holds when the answer never reached the caller: landed, not reported.
    (tmp_path / ".dflash-backups" / f"config.json.mark.{first}").write_text("landed\n")
    assert write_remote_config(shell, str(config), INCIDENT, nonce=second, timeout=10).ok
    assert marks(tmp_path)[first] == "landed", "a later write keeps an unsettled mark"
    settled = settle(shell, config, first, REFERENCE)
    assert (settled.verdict, settled.sha256) == (Verdict.LANDED, sha(INCIDENT))


@pytest.mark.parametrize("renamed", [False, True])
def test_a_write_killed_mid_rename_is_told_by_its_temp_file(shell, tmp_path, renamed):
    # SIGKILL between the mark and its update leaves "going TMP"; the temp file is the witness.
    config = tmp_path / "config.json"
    config.write_bytes(REFERENCE if renamed else INCIDENT)
    backups = tmp_path / ".dflash-backups"
    backups.mkdir(mode=0o700)
    nonce, tmp = new_nonce(), "config.json.dflash-tmp.4242"
    (backups / f"config.json.mark.{nonce}").write_text(f"going {tmp}\n")
    if not renamed:
        (backups / tmp).write_bytes(REFERENCE)
    settled = settle(shell, config, nonce, REFERENCE)
    assert settled.verdict is (Verdict.LANDED if renamed else Verdict.NOT_LANDED)
    assert not (backups / tmp).exists(), "a dead write's temp file does not stay"
    assert marks(tmp_path)[nonce] == ("reported" if renamed else "failed")


def test_later_writes_remove_the_marks_and_files_nobody_needs(shell, tmp_path):
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    backups = tmp_path / ".dflash-backups"
    backups.mkdir(mode=0o700)
    # A recent write whose answer was lost (kept), one two days old (removed), a killed
    # write's temp file, and the evidence files of the versions before the mark.
    recent = new_nonce()
    old = f"{int(time.time()) - 2 * 86400:08x}" + "c3" * 8
    (backups / f"config.json.mark.{recent}").write_text("landed\n")
    (backups / f"config.json.mark.{old}").write_text("landed\n")
    (backups / "config.json.dflash-tmp.999999").write_bytes(b"half")
    legacy_files = ("writer", "landed.ab12", "cancel.cd34", "out")
    for legacy in (f"config.json.{name}" for name in legacy_files):
        (backups / legacy).write_text("x\n")
    nonces = [new_nonce() for _ in range(4)]
    for i, nonce in enumerate(nonces):
        data = REFERENCE if i % 2 == 0 else INCIDENT
        done = write_remote_config(shell, str(config), data, nonce=nonce, keep_backups=1)
        assert done.status is WriteStatus.WRITTEN
    assert marks(tmp_path) == {recent: "landed", nonces[-1]: "reported"}
    names = sorted(p.name for p in backups.iterdir())
    assert len([n for n in names if n.startswith("config.json.2")]) == 1, names
    legacy = ("writer", "landed", "cancel", "dflash-tmp", "out")
    assert not [n for n in names if n.split(".")[2] in legacy], names


def test_each_write_removes_the_mark_of_the_write_before(shell, tmp_path):
    # Nothing else to prune (keep 5, two backups): the reported mark goes all the same, so a
    # directory holds the marks of the writes whose answer may still be missing, and no more.
    config = tmp_path / "config.json"
    config.write_bytes(INCIDENT)
    nonces = [new_nonce() for _ in range(3)]
    for i, nonce in enumerate(nonces):
        data = REFERENCE if i % 2 == 0 else INCIDENT
        done = write_remote_config(shell, str(config), data, nonce=nonce, keep_backups=5)
        assert done.status is WriteStatus.WRITTEN
        assert marks(tmp_path) == {nonce: "reported"}, i
