"""The remote scripts, run for real on this machine: under the system sh with coreutils, and
under busybox sh with a PATH holding only busybox applets (no flock there: the mkdir lock).

Failures are produced for real (tmpfs too small, read-only bind mount, immutable file, an
unprivileged user, a fake ``mv``); each checks that the old bytes survive and no temp file is left.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dflash_provision.errors import RemoteStepFailed, UsageError
from dflash_provision.remote.ops import (
    Durability,
    ReadStatus,
    RemoteRead,
    WriteStatus,
    list_remote_backups,
    read_remote_config,
    write_remote_config,
)
from dflash_provision.remote.protocol import script_argv
from dflash_provision.transport.base import CommandResult
from dflash_provision.transport.local import LocalTransport
from tests.fixtures.model_dirs import assert_no_temp_left, listing
from tests.fixtures.transports import PrefixTransport, busybox_transport

OLD = b'{"mask_token_id": 248064}\n'
NEW = b'{"mask_token_id": 248070}\n'


def with_path(extra: Path) -> PrefixTransport:
    return PrefixTransport(
        ["/usr/bin/env", f"PATH={extra}:{os.environ.get('PATH', '/usr/bin:/bin')}"], "fake-path"
    )


@pytest.fixture(scope="session")
def bb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("busybox") is None:
        pytest.skip("busybox not installed")
    return tmp_path_factory.mktemp("bb")


@pytest.fixture(params=["coreutils", "busybox"])
def transport(request: pytest.FixtureRequest, bb_root: Path) -> LocalTransport:
    if request.param == "busybox":
        return busybox_transport(bb_root)
    return LocalTransport()


@pytest.fixture
def model_dir() -> Iterator[Path]:
    # World-traversable (pytest's tmp_path is 0700), so an unprivileged user can reach it.
    path = Path(tempfile.mkdtemp(prefix="dfp-model-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# read


def test_read_reports_present_file_with_bytes_size_hash_and_mode(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    config.chmod(0o640)
    read = read_remote_config(transport, str(config))
    assert read.status is ReadStatus.PRESENT
    assert read.data == OLD
    assert read.size == len(OLD)
    assert read.sha256 == sha(OLD)
    assert read.mode == "640"
    assert read.uid == os.getuid()


def test_read_without_metadata_still_reports_bytes_and_hash(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    read = read_remote_config(transport, str(config), metadata=False)
    assert (read.status, read.data, read.sha256, read.size) == (
        ReadStatus.PRESENT,
        OLD,
        sha(OLD),
        len(OLD),
    )
    assert (read.mode, read.uid, read.mtime) == (None, None, None)


def test_read_is_binary_safe_even_when_bytes_look_like_protocol_lines(transport, model_dir):
    config = model_dir / "config.json"
    tricky = b"status missing\ndata\n\x00\xff\nresult ok\n"
    config.write_bytes(tricky)
    assert read_remote_config(transport, str(config)).data == tricky


def test_read_tells_missing_file_from_missing_directory(transport, model_dir):
    assert read_remote_config(transport, str(model_dir / "config.json")).status is (
        ReadStatus.MISSING
    )
    assert read_remote_config(transport, str(model_dir / "nope" / "config.json")).status is (
        ReadStatus.DIR_MISSING
    )


def test_read_reports_a_directory_as_not_regular(transport, model_dir):
    (model_dir / "config.json").mkdir()
    read = read_remote_config(transport, str(model_dir / "config.json"))
    assert read.status is ReadStatus.NOT_REGULAR
    assert "directory" in read.message


def test_read_follows_a_symlink_and_says_so(transport, model_dir):
    (model_dir / "real.json").write_bytes(OLD)
    (model_dir / "config.json").symlink_to("real.json")
    read = read_remote_config(transport, str(model_dir / "config.json"))
    assert read.data == OLD
    assert read.is_symlink


def test_read_reports_permission_denied_for_an_unprivileged_user(model_dir):
    if shutil.which("setpriv") is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    config.chmod(0o600)
    nobody = PrefixTransport(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], "n")
    for metadata, remote_hash in ((True, True), (False, True), (False, False)):
        read = read_remote_config(nobody, str(config), metadata=metadata, remote_hash=remote_hash)
        assert read.status is ReadStatus.PERMISSION_DENIED
        assert "Permission denied" in read.message
        assert read.data is None


def as_nobody(transport: LocalTransport, reachable: Path) -> PrefixTransport:
    """The same shell (coreutils or busybox), run as uid/gid 65534 ("nobody"). ``reachable``:
    a directory nobody can traverse, for busybox's applet links (pytest's tmp dirs are 0700)."""
    if shutil.which("setpriv") is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    if isinstance(transport, PrefixTransport) and transport.description == "busybox":
        transport = busybox_transport(reachable)
    prefix = transport.prefix if isinstance(transport, PrefixTransport) else []
    return PrefixTransport(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *prefix], "nobody"
    )


@pytest.fixture
def behind_closed_dir(model_dir: Path) -> Path:
    """``locked/models/X/config.json`` (with one backup) under a 0700 root-owned ``locked``: as
    /root/models/X is for a non-root login."""
    directory = model_dir / "locked" / "models" / "X"
    (directory / ".dflash-backups").mkdir(parents=True)
    (directory / "config.json").write_bytes(OLD)
    (directory / ".dflash-backups" / "config.json.20260101T000000Z").write_bytes(OLD)
    (model_dir / "locked").chmod(0o700)
    return directory / "config.json"


def test_read_behind_a_directory_the_user_cannot_enter_is_permission_denied_not_missing(
    transport, model_dir, behind_closed_dir
):
    nobody = as_nobody(transport, model_dir)
    read = read_remote_config(nobody, str(behind_closed_dir))
    assert read.status is ReadStatus.PERMISSION_DENIED
    assert f"cannot enter {behind_closed_dir.parents[2]}" in read.message
    # A file missing right inside the closed directory is not "missing" either.
    inside = behind_closed_dir.parents[2] / "config.json"
    assert read_remote_config(nobody, str(inside)).status is ReadStatus.PERMISSION_DENIED
    # root sees the file: the layout itself is fine.
    assert read_remote_config(transport, str(behind_closed_dir)).data == OLD


def test_write_behind_a_directory_the_user_cannot_enter_fails_dir_step_permission_denied(
    transport, model_dir, behind_closed_dir
):
    nobody = as_nobody(transport, model_dir)
    for mkdir in (False, True):
        outcome = write_remote_config(nobody, str(behind_closed_dir), NEW, mkdir=mkdir)
        assert (outcome.failed_step, outcome.reason, outcome.exit_status) == (
            "dir",
            "permission-denied",
            12,
        )
        assert not outcome.created_dir
        text = outcome.failure_text()
        assert "permission denied" in text and "--sudo" in text
        assert text.count(str(behind_closed_dir.parents[2])) == 1, text
    assert behind_closed_dir.read_bytes() == OLD


def test_backups_behind_a_directory_the_user_cannot_enter_are_an_error_not_none(
    transport, model_dir, behind_closed_dir
):
    with pytest.raises(RemoteStepFailed) as caught:
        list_remote_backups(as_nobody(transport, model_dir), str(behind_closed_dir))
    assert caught.value.step == "backups"
    assert "cannot enter" in caught.value.message and "--sudo" in caught.value.message
    assert [b.name for b in list_remote_backups(transport, str(behind_closed_dir))] == [
        "config.json.20260101T000000Z"
    ]


def test_missing_directory_under_a_searchable_parent_is_still_dir_missing_for_any_user(
    transport, model_dir
):
    nobody = as_nobody(transport, model_dir)
    target = model_dir / "nope" / "deeper" / "config.json"
    assert read_remote_config(nobody, str(target)).status is ReadStatus.DIR_MISSING
    outcome = write_remote_config(nobody, str(target), NEW)
    assert (outcome.failed_step, outcome.reason) == ("dir", "dir-missing")
    (model_dir / "plain").write_bytes(b"")
    beneath_a_file = write_remote_config(nobody, str(model_dir / "plain" / "config.json"), NEW)
    assert (beneath_a_file.failed_step, beneath_a_file.reason) == ("dir", "not-a-directory")


def test_read_refuses_paths_with_line_breaks_before_running_anything():
    with pytest.raises(UsageError):
        read_remote_config(LocalTransport(), "/tmp/a\nb/config.json")


def test_read_without_remote_hash_brings_the_bytes_and_hashes_them_here(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    read = read_remote_config(transport, str(config), metadata=False, remote_hash=False)
    assert (read.status, read.data, read.sha256) == (ReadStatus.PRESENT, OLD, sha(OLD))


def test_read_without_remote_hash_never_streams_a_device(transport, model_dir):
    # A config.json that is a symlink to /dev/zero must not make the host stream zeros forever.
    (model_dir / "config.json").symlink_to("/dev/zero")
    read = read_remote_config(
        transport, str(model_dir / "config.json"), metadata=False, remote_hash=False, timeout=10
    )
    assert read.status is ReadStatus.NOT_REGULAR


class CountingTransport(PrefixTransport):
    def __init__(self, inner: PrefixTransport | None = None) -> None:
        super().__init__(inner.prefix if inner else [], "counting")
        self.commands: list[list[str]] = []

    def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:  # type: ignore[override]
        self.commands.append(list(argv))
        return super().run(argv, **kwargs)  # type: ignore[arg-type]


# The fleet audit's read (remote_hash=False): the read script in bytes mode, one exec for every
# kind of file. Compared here with the script's answer with a remote hash (mode 0).


def plain_and_described(
    flavour: str, bb_root: Path, path: Path
) -> tuple[RemoteRead, RemoteRead, list[list[str]]]:
    """The bytes-only read of ``path`` (and the commands it ran) and the script's read."""
    inner = busybox_transport(bb_root) if flavour == "busybox" else None
    counting = CountingTransport(inner)
    plain = read_remote_config(counting, str(path), metadata=False, remote_hash=False, timeout=10)
    described = read_remote_config(CountingTransport(inner), str(path), metadata=False, timeout=10)
    return plain, described, counting.commands


def as_judged(read: RemoteRead) -> tuple[object, ...]:
    """What the judge and the audit's report use of a read (not is_symlink: see ops)."""
    return (read.path, read.status, read.data, read.sha256, read.size, read.message)


def test_bytes_only_read_of_a_config_is_one_exec_of_the_read_script(model_dir):
    config = model_dir / "config.json"
    config.write_bytes(NEW)
    plain, described, commands = plain_and_described("coreutils", Path("/"), config)
    assert as_judged(plain) == as_judged(described)
    assert plain.status is ReadStatus.PRESENT and plain.data == NEW and plain.sha256 == sha(NEW)
    assert len(commands) == 1


def _fifo_with_a_writer(path: Path) -> subprocess.Popen[bytes]:
    """A process holding ``path`` (a FIFO) open for writing and never writing (opened read-write,
    so that the open itself does not wait for a reader)."""
    os.mkfifo(path)
    return subprocess.Popen(["sh", "-c", 'exec 3<>"$1"; exec sleep 60', "-", str(path)])


CASES = {
    "empty file": lambda d: (d / "config.json").write_bytes(b""),
    "not JSON first": lambda d: (d / "config.json").write_bytes(b"status missing\n{}"),
    "symlink to a file": lambda d: (
        (d / "real.json").write_bytes(OLD),
        (d / "config.json").symlink_to("real.json"),
    ),
    "missing": lambda d: None,
    "directory missing": lambda d: shutil.rmtree(d),
    "a directory": lambda d: (d / "config.json").mkdir(),
    "a FIFO": lambda d: os.mkfifo(d / "config.json"),
    "a device": lambda d: (d / "config.json").symlink_to("/dev/zero"),
    "too large": lambda d: (d / "config.json").write_bytes(b"{" + b" " * (1024 * 1024 + 8)),
}
#: The status each case has (the script's word): the bytes mode must not change any of them.
CASE_STATUS = {
    "empty file": ReadStatus.PRESENT,
    "not JSON first": ReadStatus.PRESENT,
    "symlink to a file": ReadStatus.PRESENT,
    "missing": ReadStatus.MISSING,
    "directory missing": ReadStatus.DIR_MISSING,
    "a directory": ReadStatus.NOT_REGULAR,
    "a FIFO": ReadStatus.NOT_REGULAR,
    "a device": ReadStatus.NOT_REGULAR,
    "too large": ReadStatus.TOO_LARGE,
}


@pytest.mark.parametrize("flavour", ["coreutils", "busybox"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bytes_only_read_reports_what_the_read_script_reports(flavour, case, bb_root, model_dir):
    directory = model_dir / "m"
    directory.mkdir()
    CASES[case](directory)
    started = time.monotonic()
    plain, described, commands = plain_and_described(flavour, bb_root, directory / "config.json")
    assert as_judged(plain) == as_judged(described)
    assert plain.status is CASE_STATUS[case]
    assert time.monotonic() - started < 5, "nothing waited for its deadline (a FIFO least)"
    assert len(commands) == 1


def test_bytes_only_read_of_a_fifo_that_a_writer_holds_open_does_not_wait(model_dir):
    fifo = model_dir / "config.json"
    writer = _fifo_with_a_writer(fifo)
    try:
        started = time.monotonic()
        plain, described, commands = plain_and_described("coreutils", Path("/"), fifo)
        assert time.monotonic() - started < 5
        assert plain.status is ReadStatus.NOT_REGULAR
        assert as_judged(plain) == as_judged(described)
        assert len(commands) == 1
    finally:
        writer.kill()
        writer.wait()


def test_bytes_only_read_ended_at_its_deadline_is_a_timeout_not_the_files_bytes(model_dir):
    # A head that never returns (a frozen disk, a stuck mount), first on PATH: the script's
    # watchdog (it looks once a second) ends it at the deadline (3 s for a 4 s limit) and the
    # read reports a timeout.
    config = model_dir / "config.json"
    config.write_bytes(NEW)
    fake = model_dir / "bin"
    fake.mkdir()
    # Here the script leads no process group, so its watchdog ends its children: a head with a
    # child of its own is tests/test_audit_read.py's, on a real sshd host.
    (fake / "head").write_text(f"#!/bin/sh\nexec sleep {STUCK_S}\n")
    (fake / "head").chmod(0o755)
    counting = CountingTransport(with_path(fake))
    started = time.monotonic()
    with pytest.raises(RemoteStepFailed) as raised:
        read_remote_config(counting, str(config), metadata=False, remote_hash=False, timeout=4)
    # Ended by the watchdog at its 3 s deadline, or (on a slow machine) given up on by the
    # caller at 4 s: either way a timeout, never bytes taken for the file's.
    assert raised.value.step == "timeout"
    assert time.monotonic() - started < 4.5
    assert len(counting.commands) == 1
    until = time.monotonic() + 3  # the watchdog looks once a second
    while stuck_processes() and time.monotonic() < until:
        time.sleep(0.2)
    assert stuck_processes() == [], "the stuck head was ended at the deadline"


STUCK_S = "3599.5"  # a sleep no other test starts


def stuck_processes() -> list[str]:
    found = subprocess.run(["pgrep", "-af", f"sleep {STUCK_S}"], capture_output=True, text=True)
    return found.stdout.splitlines()


@pytest.mark.parametrize("keep", [0, 5])
def test_write_reads_back_and_brings_the_old_bytes_in_the_same_exec(transport, model_dir, keep):
    # The whole write-and-prove protocol is one exec: after the rename the script reads the
    # file back by the path it was given and sends the old file's bytes after it.
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    counting = CountingTransport(transport if isinstance(transport, PrefixTransport) else None)
    outcome = write_remote_config(counting, str(config), NEW, keep_backups=keep)
    assert outcome.status is WriteStatus.WRITTEN
    assert len(counting.commands) == 1
    assert (outcome.readback_data, outcome.old.data) == (NEW, OLD)
    assert (outcome.old.present, outcome.old.sha256) == (True, sha(OLD))
    backups = [p for p in listing(model_dir / ".dflash-backups") if p.startswith("config.json.2")]
    assert len(backups) == (1 if keep else 0), "--keep-backups 0: the backup went once sent"
    # A new file: the read-back alone.
    fresh = write_remote_config(transport, str(model_dir / "new.json"), NEW)
    assert (fresh.readback_data, fresh.old.data, fresh.old.present) == (NEW, None, False)


def test_a_file_changed_between_the_rename_and_the_read_back_is_not_taken_as_proof(
    model_dir, tmp_path
):
    # Another program (not a push: pushes wait for the lock) writes the file right after our
    # rename: the fake `sync`, the step between the rename and the read-back, does it for real.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    config = model_dir / "config.json"
    (fake / "sync").write_text(f"#!/bin/sh\n/bin/sync \"$@\"\nprintf '{{}}\\n' > {config}\n")
    (fake / "sync").chmod(0o755)
    config.write_bytes(OLD)
    outcome = write_remote_config(with_path(fake), str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN, "the script did rename"
    assert outcome.readback_data == b"{}\n", "what it read back, not the bytes sent"
    assert outcome.old.data == OLD, "the old bytes are still told apart (their own part)"
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    config.write_bytes(OLD)
    proof = write_and_prove(with_path(fake), str(config), NEW, WriteOptions())
    assert proof.readback is not None and proof.readback.data == b"{}\n", (
        "described as verify would"
    )
    assert proof.old.data == OLD


# ---------------------------------------------------------------------------------------------
# write: the happy paths


def test_write_creates_directory_only_with_mkdir(transport, model_dir):
    target = model_dir / "sub" / "config.json"
    refused = write_remote_config(transport, str(target), NEW)
    assert refused.status is WriteStatus.FAILED
    assert (refused.failed_step, refused.reason) == ("dir", "dir-missing")
    assert not target.parent.exists()

    done = write_remote_config(transport, str(target), NEW, mkdir=True)
    assert done.status is WriteStatus.WRITTEN
    assert done.created_dir
    assert done.old.data is None
    assert target.read_bytes() == NEW
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert done.sha256_after == sha(NEW)


def test_write_replaces_file_returns_old_bytes_and_keeps_a_backup(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    config.chmod(0o600)
    outcome = write_remote_config(transport, str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN
    assert outcome.old.data == OLD
    assert config.read_bytes() == NEW
    assert oct(config.stat().st_mode & 0o777) == "0o600", "mode copied from the old file"
    assert outcome.durability is Durability.FSYNC_FILE_AND_DIR
    backups = list_remote_backups(transport, str(config))
    assert [b.name for b in backups] == [outcome.backup]
    assert backups[0].sha256 == sha(OLD)
    assert backups[0].size == len(OLD)
    assert (model_dir / ".dflash-backups" / outcome.backup).read_bytes() == OLD
    assert listing(model_dir) == [".dflash-backups", "config.json"]


@pytest.mark.root
@pytest.mark.parametrize("mode", [0o640, 0o755, 0o2644, 0o000, 0o044, 0o004, 0o444])
def test_write_gives_the_new_file_the_old_files_mode_and_owner(transport, model_dir, mode):
    # The temp file (mktemp's 0600) gets its owner before the write and the mode after it:
    # 0755 and 0o2644 (x, set-gid, which a chown would clear), 000, 044, 004 (`stat -c %a`
    # drops their leading zeros) and 0444 (no w for the owner) all come out as they were.
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    os.chown(config, 65534, 65534)
    config.chmod(mode)
    outcome = write_remote_config(transport, str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    st = config.stat()
    assert (oct(st.st_mode & 0o7777), st.st_uid, st.st_gid) == (oct(mode), 65534, 65534)
    assert config.read_bytes() == NEW
    assert_no_temp_left(model_dir)


@pytest.mark.root
@pytest.mark.parametrize("mode", [0o640, 0o444, 0o004, 0o000])
def test_the_temp_file_is_never_more_open_than_the_old_file_while_it_fills(model_dir, mode):
    # A dd first on PATH notes the temp file's mode and owner as it starts writing (the bytes
    # go in while it runs): no permission for the group or others that the old file lacks, and
    # already the old file's owner.
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    os.chown(config, 65534, 65534)
    config.chmod(mode)
    fake = model_dir / "bin"
    fake.mkdir()
    noted = model_dir / "noted"
    (fake / "dd").write_text(
        "#!/bin/sh\nfor a; do case $a in of=*) "
        f"stat -c '%a %u:%g' \"${{a#of=}}\" >>{noted} ;; esac; done\n"
        f'exec {shutil.which("dd")} "$@"\n'
    )
    (fake / "dd").chmod(0o755)
    outcome = write_remote_config(with_path(fake), str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    [line] = noted.read_text().splitlines()
    temp_mode, owner = line.split()
    assert int(temp_mode, 8) & 0o077 & ~mode == 0, (oct(int(temp_mode, 8)), oct(mode))
    assert owner == "65534:65534"
    assert oct(config.stat().st_mode & 0o7777) == oct(mode)


def test_unprivileged_owner_rewrites_its_own_read_only_config_keeping_mode_0444(
    transport, model_dir
):
    # Without root, a temp file made 0444 up front could not be written: the mode comes after.
    nobody = as_nobody(transport, model_dir)
    directory = model_dir / "own"
    directory.mkdir()
    config = directory / "config.json"
    config.write_bytes(OLD)
    config.chmod(0o444)
    for path in (directory, config):
        os.chown(path, 65534, 65534)
    outcome = write_remote_config(nobody, str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    assert (oct(config.stat().st_mode & 0o777), config.read_bytes()) == ("0o444", NEW)
    assert_no_temp_left(directory)


def test_new_file_is_0644_and_backup_is_named_after_the_utc_time(transport, model_dir):
    config = model_dir / "config.json"
    write_remote_config(transport, str(config), OLD)
    assert oct(config.stat().st_mode & 0o777) == "0o644"
    before = datetime.now(UTC).replace(microsecond=0)
    outcome = write_remote_config(transport, str(config), NEW)
    after = datetime.now(UTC)
    [backup] = list_remote_backups(transport, str(config))
    assert backup.name == outcome.backup
    assert backup.backed_up_at is not None
    assert before - timedelta(seconds=1) <= backup.backed_up_at <= after


@pytest.mark.root
@pytest.mark.parametrize("shell", ["coreutils", "busybox"])
def test_write_never_follows_a_symlink_planted_at_the_temp_files_name(bb_root, model_dir, shell):
    # In a new PID namespace the script's shell is pid 1, so a temp name made of its pid would
    # be predictable: plant a symlink there, as an attacker sharing the directory could. The
    # temp file is mktemp's (O_EXCL, a random name); the symlink's target is never written.
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a PID namespace")
    inner = busybox_transport(bb_root).prefix if shell == "busybox" else []
    transport = PrefixTransport(["unshare", "--pid", "--fork", *inner], shell)
    victim = model_dir / "victim"
    victim.write_bytes(b"precious\n")
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    planted = model_dir / ".config.json.dflash-tmp.1"
    planted.symlink_to(victim)
    config.chmod(0o640)
    outcome = write_remote_config(transport, str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN, outcome.failure_text()
    assert victim.read_bytes() == b"precious\n"
    assert config.read_bytes() == NEW and not config.is_symlink()
    assert oct(config.stat().st_mode & 0o777) == "0o640", "the new file keeps the old mode"
    assert planted.is_symlink()
    planted.unlink()
    assert_no_temp_left(model_dir)


def test_write_of_identical_bytes_says_unchanged_and_touches_nothing(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(NEW)
    before = config.stat()
    outcome = write_remote_config(transport, str(config), NEW)
    assert outcome.status is WriteStatus.UNCHANGED
    after = config.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert listing(model_dir) == ["config.json"], "no backup dir, no lock, no temp file"


def test_write_prunes_backups_to_keep_n(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    for i in range(5):
        write_remote_config(transport, str(config), b'{"v": %d}\n' % i, keep_backups=2)
    backups = list_remote_backups(transport, str(config))
    assert len(backups) == 2
    assert [b.sha256 for b in backups] == [sha(b'{"v": 2}\n'), sha(b'{"v": 3}\n')]


def test_backup_names_keep_their_order_when_a_later_named_backup_is_already_there(
    transport, model_dir
):
    # Another controller whose clock runs ahead pushed first: the next backup must still sort
    # after it, or pruning would delete the newest backup instead of the oldest.
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    backups = model_dir / ".dflash-backups"
    backups.mkdir()
    (backups / "config.json.29990101T000000Z").write_bytes(b'{"v": "future"}\n')
    first = write_remote_config(transport, str(config), NEW)
    second = write_remote_config(transport, str(config), b'{"v": 3}\n')
    assert (first.backup, second.backup) == (
        "config.json.29990101T000000Z.001",
        "config.json.29990101T000000Z.002",
    )
    names = [b.name for b in list_remote_backups(transport, str(config))]
    assert names == sorted(names) and names[-1] == second.backup


def test_write_with_keep_zero_leaves_no_backup_but_still_returns_old_bytes(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    outcome = write_remote_config(transport, str(config), NEW, keep_backups=0)
    assert outcome.old.data == OLD
    assert list_remote_backups(transport, str(config)) == []
    assert outcome.backup is None, "no backup is named that is not there"


def test_write_refuses_a_symlinked_destination_unless_told_to_follow(transport, model_dir):
    real = model_dir / "real.json"
    real.write_bytes(OLD)
    link = model_dir / "config.json"
    link.symlink_to("real.json")

    refused = write_remote_config(transport, str(link), NEW)
    assert (refused.failed_step, refused.reason) == ("symlink", "symlink-refused")
    assert real.read_bytes() == OLD
    assert link.is_symlink()

    followed = write_remote_config(transport, str(link), NEW, follow_symlinks=True)
    assert followed.status is WriteStatus.WRITTEN
    assert followed.followed_symlink
    assert link.is_symlink(), "the link is kept; the file it points to is replaced"
    assert real.read_bytes() == NEW
    assert_no_temp_left(model_dir)


def test_write_refuses_a_directory_in_place_of_the_file(transport, model_dir):
    (model_dir / "config.json").mkdir()
    outcome = write_remote_config(transport, str(model_dir / "config.json"), NEW)
    assert (outcome.failed_step, outcome.reason) == ("dest", "not-regular")


def test_hostile_path_is_used_literally_never_executed(transport, model_dir):
    canary = model_dir / "canary"
    nasty_dir = model_dir / f"a b'c\"$(touch {canary});`touch {canary}`;touch {canary} &"
    target = nasty_dir / "config.json"
    outcome = write_remote_config(transport, str(target), NEW, mkdir=True)
    assert outcome.status is WriteStatus.WRITTEN
    assert target.read_bytes() == NEW
    assert read_remote_config(transport, str(target)).data == NEW
    write_remote_config(transport, str(target), OLD)
    assert len(list_remote_backups(transport, str(target))) == 1
    assert not canary.exists()


def test_write_refuses_a_path_with_a_newline():
    with pytest.raises(UsageError):
        write_remote_config(LocalTransport(), "/tmp/x\n/config.json", NEW)


# ---------------------------------------------------------------------------------------------
# write: failures keep the old file and leave no temp file


def run_write_script_directly(transport, path: Path, claimed: bytes, sent: bytes):
    """Run write.sh promising ``claimed`` but sending ``sent``: what a cut connection looks like."""
    args = [str(path), str(len(claimed)), sha(claimed), "5", "0", "0", "5"]
    return transport.run(script_argv("write", *args), stdin=sent, timeout=30)


def test_short_input_from_a_cut_connection_aborts_and_keeps_old_file(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    big = b"x" * 200_000
    result = run_write_script_directly(transport, config, big, big[:70_000])
    assert result.exit_status == 17
    assert b"failed verify short-write" in result.stdout
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


def test_corrupted_input_is_detected_by_hash(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    result = run_write_script_directly(transport, config, NEW, NEW.replace(b"0", b"1"))
    assert b"failed verify hash-mismatch" in result.stdout
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


def test_lock_held_by_another_push_times_out_and_writes_nothing(model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    (model_dir / ".dflash-backups").mkdir()
    with open(model_dir / ".dflash-backups" / "config.json.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        outcome = write_remote_config(LocalTransport(), str(config), NEW, lock_timeout=1)
    assert (outcome.failed_step, outcome.reason) == ("lock", "lock-timeout")
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


def test_busybox_mkdir_lock_waits_for_a_live_holder_and_breaks_a_dead_ones(bb_root, model_dir):
    bb = busybox_transport(bb_root)
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    lockdir = model_dir / ".dflash-backups" / "config.json.lockdir"
    lockdir.mkdir(parents=True)
    (lockdir / "pid").write_text(str(os.getpid()))  # alive: this test process
    outcome = write_remote_config(bb, str(config), NEW, lock_timeout=1)
    assert (outcome.failed_step, outcome.reason) == ("lock", "lock-timeout")
    assert config.read_bytes() == OLD

    dead = subprocess.Popen(["true"])
    dead.wait()
    (lockdir / "pid").write_text(str(dead.pid))
    outcome = write_remote_config(bb, str(config), NEW, lock_timeout=1)
    assert outcome.status is WriteStatus.WRITTEN
    assert outcome.lock_method == "mkdir"
    assert not lockdir.exists(), "the mkdir lock is released"


def test_permission_denied_for_an_unprivileged_user_keeps_old_file(model_dir):
    if shutil.which("setpriv") is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    (model_dir / ".dflash-backups").mkdir()
    (model_dir / ".dflash-backups" / "config.json.lock").touch(mode=0o666)
    (model_dir / ".dflash-backups" / "config.json.lock").chmod(0o666)
    nobody = PrefixTransport(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], "n")
    outcome = write_remote_config(nobody, str(config), NEW)
    assert (outcome.failed_step, outcome.reason) == ("tmp", "permission-denied")
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


def test_immutable_file_refuses_replacement_and_stays_intact(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    if subprocess.run(["chattr", "+i", str(config)], capture_output=True).returncode != 0:
        pytest.skip("filesystem does not support chattr +i")
    outcome = write_remote_config(transport, str(config), NEW)
    assert outcome.status is WriteStatus.FAILED
    assert outcome.failed_step == "rename"
    assert outcome.reason == "not-permitted"
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


@pytest.fixture
def small_tmpfs(model_dir: Path) -> Iterator[Path]:
    if os.getuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = model_dir / "full"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount_point)], check=True
    )
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.root
def test_disk_full_fails_the_write_step_and_keeps_old_file(transport, small_tmpfs):
    config = small_tmpfs / "config.json"
    config.write_bytes(OLD)
    outcome = write_remote_config(transport, str(config), b"{" + b" " * 40_000 + b"}")
    assert (outcome.failed_step, outcome.reason) == ("write", "no-space")
    assert outcome.old.data == OLD
    assert config.read_bytes() == OLD
    assert_no_temp_left(small_tmpfs)


@pytest.mark.root
def test_read_only_filesystem_fails_and_keeps_old_file(transport, model_dir):
    if os.getuid() != 0:
        pytest.skip("bind mounts need root")
    ro = model_dir / "ro"
    ro.mkdir()
    (ro / "config.json").write_bytes(OLD)
    subprocess.run(["mount", "--bind", str(ro), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        outcome = write_remote_config(transport, str(ro / "config.json"), NEW)
        assert outcome.status is WriteStatus.FAILED
        assert outcome.reason == "read-only"
        assert (ro / "config.json").read_bytes() == OLD
        assert listing(ro) == ["config.json"]
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_write_that_does_not_take_effect_is_caught_by_the_read_back(model_dir, tmp_path):
    # A real host quirk, reproduced for real: an `mv` that reports success and does nothing.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "mv").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mv").chmod(0o755)
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    outcome = write_remote_config(with_path(fake), str(config), NEW)
    assert (outcome.failed_step, outcome.reason) == ("readback", "not-applied")
    assert "did not take effect" in outcome.message
    assert outcome.sha256_after == sha(OLD)
    assert config.read_bytes() == OLD
    assert_no_temp_left(model_dir)


def test_durability_falls_back_when_sync_ignores_file_arguments(bb_root, model_dir, tmp_path):
    # An old sync(1) that accepts no FILE: the script must not claim a per-file fsync it did not
    # get from `sync FILE`; it uses dd conv=fsync for the file and a global sync for the dir.
    fake = tmp_path / "oldsync"
    fake.mkdir()
    (fake / "sync").write_text(
        '#!/bin/sh\n[ "$1" = --help ] && { echo "Usage: sync [OPTION]"; exit 0; }\n'
        '[ $# -eq 0 ] || { echo "sync: extra operand" >&2; exit 1; }\nexit 0\n'
    )
    (fake / "sync").chmod(0o755)
    config = model_dir / "config.json"
    outcome = write_remote_config(busybox_transport(bb_root, fake), str(config), NEW)
    assert outcome.status is WriteStatus.WRITTEN
    assert outcome.durability is Durability.FSYNC_FILE_GLOBAL_SYNC


def test_concurrent_writes_of_two_configs_leave_exactly_one_complete(transport, model_dir):
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    first = b'{"who": "first", "pad": "' + b"a" * 50_000 + b'"}\n'
    second = b'{"who": "second", "pad": "' + b"b" * 50_000 + b'"}\n'
    outcomes = []

    def push(data: bytes) -> None:
        for _ in range(4):
            outcomes.append(write_remote_config(transport, str(config), data, lock_timeout=20))

    threads = [threading.Thread(target=push, args=(d,)) for d in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(o.ok for o in outcomes), [o.failure_text() for o in outcomes if not o.ok]
    assert config.read_bytes() in (first, second)
    assert_no_temp_left(model_dir)


# -- the write-and-prove protocol in one call (remote/proof.py) ---------------------------------


@pytest.mark.parametrize("keep_backups", [0, 3])
def test_write_and_prove_returns_the_read_back_and_the_old_file_however_its_bytes_travel(
    transport, model_dir, keep_backups: int
):
    # With a backup or without one, the old bytes come back with the write's read-back.
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    config = model_dir / "config.json"
    config.write_bytes(OLD)
    proof = write_and_prove(transport, str(config), NEW, WriteOptions(keep_backups=keep_backups))
    assert proof.outcome.ok and config.read_bytes() == NEW
    assert proof.readback is not None and proof.readback.data == NEW
    assert (proof.old.known, proof.old.present, proof.old.data) == (True, True, OLD)
    assert proof.old.sha256 == sha(OLD)


def test_write_and_prove_of_a_failed_write_has_no_read_back_and_keeps_the_old_file(
    transport, model_dir
):
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    missing = model_dir / "not-there" / "config.json"
    proof = write_and_prove(transport, str(missing), NEW, WriteOptions())
    assert not proof.outcome.ok and proof.outcome.failed_step == "dir"
    assert proof.readback is None
    assert not proof.old.present and proof.old.data is None


# ---------------------------------------------------------------------------------------------
# write first, read only what is needed (repair: write_and_prove(..., unread=True))


def test_unread_write_of_identical_bytes_is_one_exec_that_brings_them(transport, model_dir):
    from dflash_provision.fleet.run import CountingTransport
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    config = model_dir / "config.json"
    config.write_bytes(NEW)
    counted = CountingTransport(transport)
    proof = write_and_prove(counted, str(config), NEW, WriteOptions(), unread=True)
    assert proof.outcome.status is WriteStatus.UNCHANGED
    assert proof.readback is not None and proof.readback.data == NEW
    assert counted.execs == 1  # the write exec read the file: no read-back exec
    assert listing(model_dir) == ["config.json"]  # nothing created, not even .dflash-backups
    # Push too: the same one exec, whether the file was right already or is replaced.
    counted = CountingTransport(transport)
    write_and_prove(counted, str(config), NEW, WriteOptions())
    config.write_bytes(OLD)
    proof = write_and_prove(counted, str(config), NEW, WriteOptions())
    assert (proof.outcome.status, counted.execs) == (WriteStatus.WRITTEN, 2)
    assert proof.readback is not None and proof.readback.data == NEW and proof.old.data == OLD


class _OtherBytesAfterData(LocalTransport):
    """Runs the command, then swaps the bytes an unchanged write sends back for others (as if
    the file had been replaced between the script's hash and its read)."""

    def run(self, argv, *, stdin=None, timeout=None):  # type: ignore[no-untyped-def]
        result = super().run(argv, stdin=stdin, timeout=timeout)
        out = result.stdout
        if b"result unchanged\n" in out and out.endswith(NEW):
            out = out[: -len(NEW)] + OLD
        return dataclasses.replace(result, stdout=out)


def test_unread_write_checks_the_bytes_it_brings_and_reads_back_when_they_differ(model_dir):
    from dflash_provision.fleet.run import CountingTransport
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    config = model_dir / "config.json"
    config.write_bytes(NEW)
    counted = CountingTransport(_OtherBytesAfterData())
    proof = write_and_prove(counted, str(config), NEW, WriteOptions(), unread=True)
    # The script's bytes are evidence, not a verdict: the read-back decided (2 execs).
    assert counted.execs == 2
    assert proof.readback is not None and proof.readback.data == NEW


def test_unread_write_refuses_a_file_this_login_cannot_read_before_creating_anything(
    transport, model_dir
):
    from dflash_provision.remote.proof import WriteOptions, write_and_prove

    config = model_dir / "config.json"
    config.write_bytes(OLD)
    config.chmod(0o600)  # root's
    model_dir.chmod(0o777)  # the login may write the directory, not read the file
    nobody = as_nobody(transport, model_dir)
    proof = write_and_prove(nobody, str(config), NEW, WriteOptions(), unread=True)
    assert (proof.outcome.failed_step, proof.outcome.reason) == ("dest", "permission-denied")
    assert "cannot be judged" in proof.outcome.message
    assert proof.readback is None
    assert config.read_bytes() == OLD
    # No lock, no temp file, no .dflash-backups.
    assert [n for n in listing(model_dir) if n != "busybox-bin"] == ["config.json"]


@pytest.mark.root
def test_a_host_without_proc_writes_and_still_checks_the_backup_dir(model_dir):
    # /proc hidden (a tmpfs over it, in a mount namespace of its own): the write needs none of
    # it, and refuses a planted link all the same.
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    no_proc = PrefixTransport(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs none /proc && exec "$@"', "no-proc"],
        "no-proc",
    )  # fmt: skip
    config = model_dir / "config.json"
    config.write_bytes(OLD)
    first = write_remote_config(no_proc, str(config), NEW)
    second = write_remote_config(no_proc, str(config), OLD)
    assert (first.status, second.status) == (WriteStatus.WRITTEN, WriteStatus.WRITTEN)
    assert (second.readback_data, second.old.data) == (OLD, NEW)
    elsewhere = Path(tempfile.mkdtemp(prefix="dfp-elsewhere-"))
    (model_dir / ".dflash-backups").rename(model_dir / "moved")
    (model_dir / ".dflash-backups").symlink_to(elsewhere)
    refused = write_remote_config(no_proc, str(config), NEW)
    assert (refused.failed_step, refused.reason) == ("trust", "unsafe-dir")
    assert config.read_bytes() == OLD and os.listdir(elsewhere) == []
    shutil.rmtree(elsewhere)


@pytest.mark.parametrize("size", [2_000, 900_000])
def test_a_write_refused_before_reading_its_input_never_leaves_the_sender_blocked(
    transport, model_dir, size
):
    # A config that fits in a pipe's least capacity (one page) is left unread: no process to
    # drain it. A bigger one is drained, or the sender would wait on a full pipe forever (the
    # transport's timeout would end it as a failure of the connection, not of the directory).
    payload = b'{"pad": "' + b"x" * (size - 12) + b'"}\n'
    outcome = write_remote_config(
        transport, str(model_dir / "missing" / "config.json"), payload, timeout=20
    )
    assert (outcome.status, outcome.failed_step, outcome.reason) == (
        WriteStatus.FAILED,
        "dir",
        "dir-missing",
    )
