"""The file operations on a host (read, atomic write, backups) through a Transport, their
script answers turned into result values.

Each operation is ONE exec of a script from ``scripts/*.sh``, loaded, run and parsed by the one
protocol module (remote/protocol.py). Paths with NUL or line breaks are refused here (the line
protocol could not carry them).

Transport-level failures (refused, timed out, auth, container not running) are raised by the
transport as DflashProvisionError subclasses; everything the script could report comes back as a
value: RemoteRead, WriteOutcome, list[Backup].
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dflash_provision.errors import RemoteStepFailed, UsageError
from dflash_provision.remote.protocol import (
    MalformedReply,
    RemoteProtocolError,
    Reply,
    reply_parts,
    run_script,
    stderr_line,
)
from dflash_provision.transport.base import CommandResult, Transport

BACKUP_DIRNAME = ".dflash-backups"
#: The most bytes of a config any read brings over the wire (the scripts stop sending past it:
#: common.sh's max_bytes). Published DFlash configs are about 2 KB.
MAX_CONFIG_BYTES = 1024 * 1024
LIMIT_TEXT = "1 MiB"
DEFAULT_KEEP_BACKUPS = 5
_BACKUP_STAMP = re.compile(r"\.(\d{8}T\d{6}Z)(?:\.\d{3})?$")


# --------------------------------------------------------------------------------------------
# Paths


def check_remote_path(path: str) -> str:
    """Refuse paths the protocol cannot carry literally; return the path unchanged otherwise."""
    if not path.startswith("/"):
        raise UsageError(f"remote path {path!r} must be absolute")
    if any(ch in path for ch in ("\x00", "\n", "\r")):
        raise UsageError(f"remote path {path!r} contains a NUL byte or a line break")
    if path.endswith("/"):
        raise UsageError(f"remote path {path!r} must name a file, not a directory")
    return path


# --------------------------------------------------------------------------------------------
# read


class ReadStatus(enum.StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    PERMISSION_DENIED = "permission-denied"
    NOT_REGULAR = "not-regular"
    DIR_MISSING = "dir-missing"
    TOO_LARGE = "too-large"  # larger than MAX_CONFIG_BYTES: never brought over whole
    ERROR = "error"  # the file exists but could not be read for another reason


@dataclass(frozen=True)
class RemoteRead:
    """One file's state on a target, from one exec."""

    path: str
    status: ReadStatus
    data: bytes | None = None  # the bytes, when PRESENT
    sha256: str | None = None  # of ``data`` (checked against the remote's own hash)
    size: int | None = None
    mode: str | None = None  # octal, e.g. "644"
    uid: int | None = None
    gid: int | None = None
    mtime: datetime | None = None
    # PATH is a symlink (followed for reading): the read script says so.
    is_symlink: bool = False
    message: str = ""  # the remote's wording when not PRESENT

    @property
    def present(self) -> bool:
        return self.status is ReadStatus.PRESENT

    def describe(self) -> str:
        """One human line for the status, e.g. "/m/config.json: permission denied"."""
        if self.present:
            return f"{self.path}: {self.size} bytes, sha256 {self.sha256}"
        words = _READ_STATUS_TEXT[self.status]
        detail = self.message if self.message and self.message.lower() != words else ""
        return f"{self.path}: {words}" + (f" ({detail})" if detail else "")


# The statuses' tokens are for machines (--json, history); people read these.
_READ_STATUS_TEXT = {
    ReadStatus.PRESENT: "present",
    ReadStatus.MISSING: "no such file",
    ReadStatus.PERMISSION_DENIED: "permission denied",
    ReadStatus.NOT_REGULAR: "not a regular file",
    ReadStatus.DIR_MISSING: "directory does not exist",
    ReadStatus.TOO_LARGE: f"larger than {LIMIT_TEXT}, the limit for a config",
    ReadStatus.ERROR: "cannot be read",
}


def read_remote_config(
    transport: Transport,
    path: str,
    *,
    timeout: float | None = None,
    metadata: bool = True,
    remote_hash: bool = True,
) -> RemoteRead:
    """Read ``path`` on the transport's machine in one exec: status, bytes, size, sha256, mode.

    ``metadata=False`` leaves mode, uid, gid and mtime None (the remote side then spawns no
    ``stat``). ``remote_hash=False`` (fleet audits; implies no metadata) spawns no ``sha256sum``
    either: the bytes are hashed here. With the remote hash, a file that changes while being
    read (the remote hash no longer matches the bytes) is read again once; a second mismatch
    raises RemoteStepFailed(step="read"). Without it, such a file is judged as read, as any
    reader would have seen it at that moment.
    """
    check_remote_path(path)
    mode = "bytes" if not remote_hash else "1" if metadata else "0"
    # No timeout given: the transport's command_timeout, which also bounds the remote side (its
    # watchdog ends a read stuck on a FIFO or a frozen disk before the caller gives up).
    limit = transport.command_timeout if timeout is None else timeout
    deadline = remote_deadline(limit)
    args = [path, mode, str(deadline)]
    for _attempt in range(2):
        result, parsed = run_script(transport, "read", args, stdin=None, timeout=timeout)
        if "status" not in parsed.fields or parsed.data is None:
            raise RemoteProtocolError(
                f"{transport.description}: reading {path} failed: {stderr_line(result)}",
                step="read",
            )
        if result.exit_status != 0:
            # The script saw a readable regular file, then its last step failed (an I/O error, a
            # race) or its watchdog ended it at the deadline: the bytes after "data" are not the
            # file's, whatever the mode.
            _raise_if_ended_at_deadline(transport, path, result, deadline)
            message = stderr_line(result)
            denied = "Permission denied" in message
            return RemoteRead(
                path=path,
                status=ReadStatus.PERMISSION_DENIED if denied else ReadStatus.ERROR,
                message=message,
            )
        read = _read_from_fields(path, parsed)
        if read.present and read.data is not None and len(read.data) > MAX_CONFIG_BYTES:
            return too_large(path)
        if not read.present or not remote_hash or read.sha256 == parsed.fields.get("sha256"):
            return read
    raise RemoteStepFailed(
        f"{transport.description}: {path} kept changing while it was read", step="read"
    )


# Exit statuses of a script ended by a signal: 128 + SIGTERM/SIGKILL from the login shell, 255
# over SSH when the exit status was dropped, negative from a local subprocess.
_ENDED_BY_SIGNAL = {143, 137, 255, -15, -9}


def _raise_if_ended_at_deadline(
    transport: Transport, path: str, result: CommandResult, deadline: int
) -> None:
    """RemoteStepFailed(step="timeout") for a read its watchdog ended (by a signal, at the
    deadline)."""
    if result.exit_status in _ENDED_BY_SIGNAL and result.duration_s >= deadline:
        raise RemoteStepFailed(
            f"{transport.description}: reading {path} did not finish within its {deadline} s "
            "deadline and was ended there (a FIFO swapped in for the file, a stuck disk?)",
            step="timeout",
        )


def too_large(path: str, size: int | None = None) -> RemoteRead:
    """The RemoteRead of a file over MAX_CONFIG_BYTES (its size when the remote said it);
    ``describe`` says "larger than 1 MiB, the limit for a config (N bytes)"."""
    return RemoteRead(
        path=path,
        status=ReadStatus.TOO_LARGE,
        size=size,
        message=f"{size} bytes" if size is not None else "",
    )


def present_read(path: str, data: bytes) -> RemoteRead:
    """A read of ``path`` that found ``data`` (already checked by the caller): bytes, hash, size."""
    return RemoteRead(
        path=path,
        status=ReadStatus.PRESENT,
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
    )


def _read_from_fields(path: str, parsed: Reply) -> RemoteRead:
    f = parsed.fields
    try:
        status = ReadStatus(f["status"])
    except ValueError:
        status = ReadStatus.ERROR
    if status is ReadStatus.TOO_LARGE:
        return too_large(path, _int_or_none(f.get("size")))
    if status is not ReadStatus.PRESENT:
        return RemoteRead(
            path=path, status=status, is_symlink="symlink" in f, message=f.get("error", "")
        )
    data = parsed.data or b""
    return RemoteRead(
        path=path,
        status=status,
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        mode=f.get("mode"),
        uid=_int_or_none(f.get("uid")),
        gid=_int_or_none(f.get("gid")),
        mtime=_epoch(f.get("mtime")),
        is_symlink="symlink" in f,
    )


# --------------------------------------------------------------------------------------------
# write


class WriteStatus(enum.StrEnum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"  # the file already had these bytes; nothing was written
    FAILED = "failed"


class Durability(enum.StrEnum):
    """What the remote could do to make the new file survive a crash."""

    FSYNC_FILE_AND_DIR = "fsync-file+dir"
    FSYNC_FILE_GLOBAL_SYNC = "fsync-file+global-sync"  # file fsynced; dir only by global sync
    GLOBAL_SYNC = "global-sync"  # no per-file fsync available: `sync` for everything
    UNKNOWN = "unknown"

    def describe(self) -> str:
        return {
            "fsync-file+dir": "fsync file+dir",
            "fsync-file+global-sync": "fsync file, global sync for the directory",
            "global-sync": "global sync only (no per-file fsync on this host)",
            "unknown": "unknown",
        }[self.value]


_REASON_TEXT = {
    "no-space": "disk full",
    "read-only": "read-only filesystem",
    "permission-denied": "permission denied",
    "not-permitted": "operation not permitted (immutable file?)",
    "dir-missing": "directory missing",
    "symlink-refused": "destination is a symlink",
    "lock-timeout": "lock timeout",
    "short-write": "connection lost mid-write",
    "hash-mismatch": "received bytes corrupted",
    "not-applied": "write did not take effect",
    "not-regular": "destination is not a regular file",
    "unsafe-dir": "unsafe backup directory",
    "interrupted": "remote deadline passed",
    "untrusted-link": "symlink made by another user",
    "cancelled": "already reported as not done",
}


# What to do about a failure, for the reasons a user can fix by logging in differently.
REASON_HINTS = {
    "permission-denied": "use --sudo, or log in as a user that can write there",
}


@dataclass(frozen=True)
class OldFile:
    """The file a write replaced (or found, or would have replaced), from the write's reply.

    ``known``: the write got as far as looking at it (else nothing below says anything, e.g. the
    directory could not be entered). ``data``: its bytes as the script sent them (checked
    against the hash it took under the lock; an unchanged file's are the bytes sent); None when
    there was none, or they did not come back as hashed. ``sha256``: of ``data``, else the hash
    the script reported.
    """

    known: bool = False
    present: bool = False
    data: bytes | None = field(default=None, repr=False)
    sha256: str | None = None


NO_OLD_FILE = OldFile()


@dataclass(frozen=True)
class WriteOutcome:
    """What one run of the write protocol did."""

    path: str
    status: WriteStatus
    #: The file the write replaced (or found, or would have replaced).
    old: OldFile = NO_OLD_FILE
    #: What DEST holds after the script: the sha256 it verified in the temp file the rename put
    #: in place (the old file's when the rename did not happen). The proof from disk is
    #: ``readback_data``.
    sha256_after: str | None = None
    durability: Durability | None = None  # set when a rename happened
    backup: str | None = None  # backup file name inside <dir>/.dflash-backups
    pruned: int = 0
    lock_method: str | None = None  # "flock" or "mkdir"
    created_dir: bool = False
    followed_symlink: bool = False
    failed_step: str | None = None  # write.sh's step name; "transport" when the script died
    reason: str | None = None  # token such as "no-space", "read-only", "lock-timeout"
    message: str = ""
    exit_status: int = 0
    stderr: str = ""
    #: The read-back: DEST's bytes as the script read them by the caller's path after the
    #: rename and the fsyncs (or, unchanged, after the hash matched), its reply's "readback"
    #: part. Evidence for the caller to compare with what it sent, not trusted here; None when
    #: none came.
    readback_data: bytes | None = None
    #: Why the reply's bytes could not be taken apart ("" when they could): its framed parts
    #: did not add up (cut off, or not what write.sh sends), so neither part is known.
    reply_error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not WriteStatus.FAILED

    def failure_text(self) -> str:
        """One line: which step failed and why, e.g. "step write failed (disk full): ..."."""
        reason = _REASON_TEXT.get(self.reason or "", self.reason or "error")
        hint = REASON_HINTS.get(self.reason or "")
        return f"step {self.failed_step} failed ({reason}): {self.message}" + (
            f"; {hint}" if hint else ""
        )


def write_remote_config(
    transport: Transport,
    path: str,
    data: bytes,
    *,
    keep_backups: int = DEFAULT_KEEP_BACKUPS,
    mkdir: bool = False,
    follow_symlinks: bool = False,
    timeout: float | None = None,
    lock_timeout: float | None = None,
    nonce: str = "",
    readable_only: bool = False,
) -> WriteOutcome:
    """Replace ``path`` with ``data`` through the atomic write protocol (scripts/write.sh) and
    read it back, in one exec with ``data`` on stdin.

    Returns a WriteOutcome whatever the remote reported; raises only for transport failures
    (unreachable, auth, timeout, container down). ``nonce`` (see new_nonce): names this write in
    the mark it leaves for remote.settle. ``readable_only``: a file this login cannot read is
    refused (step ``dest``), not replaced.
    """
    check_remote_path(path)
    if keep_backups < 0:
        raise UsageError("--keep-backups must be 0 or more")
    # No timeout given: the transport's command_timeout, which also bounds the remote side.
    limit = transport.command_timeout if timeout is None else timeout
    if lock_timeout is None:
        lock_timeout = max(1.0, min(10.0, limit / 3))
    args = [
        path,
        str(len(data)),
        hashlib.sha256(data).hexdigest(),
        str(keep_backups),
        "1" if mkdir else "0",
        "1" if follow_symlinks else "0",
        str(max(1, int(lock_timeout))),
        # The backup's name: this machine's UTC time, as in the history (the script keeps names
        # in order should the host already hold a backup named after a later time).
        datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        str(remote_deadline(limit)),
        nonce,
        "1" if readable_only else "0",
    ]
    result, parsed = run_script(transport, "write", args, stdin=data, timeout=timeout)
    return _outcome_from(path, data, result, parsed)


def new_nonce() -> str:
    """A name for one write (write.sh's NONCE): this machine's clock in 8 hex digits (the host
    ages marks by it), then 64 random bits."""
    return f"{int(time.time()) & 0xFFFFFFFF:08x}{secrets.token_hex(8)}"


def remote_deadline(timeout: float) -> int:
    """Seconds after which a remote read or write ends itself (its watchdog): before the caller
    gives up waiting at ``timeout``, so that what times out here has already cleaned up there
    (no process left; for a write the temp file removed and the lock released) and the next
    command works at once."""
    margin = max(1.0, min(5.0, timeout / 5))
    return max(1, int(timeout - margin))


#: The parts of write.sh's reply, in the order it sends them (see its "Output").
WRITE_PARTS = ("readback", "old")


def _outcome_from(path: str, data: bytes, result: CommandResult, parsed: Reply) -> WriteOutcome:
    f = parsed.fields
    old_present = f.get("old") == "present"
    old_sha256 = f.get("old_sha256") or None
    word = f.get("result") if result.exit_status == 0 else None
    try:
        parts = reply_parts(parsed, WRITE_PARTS, limit=MAX_CONFIG_BYTES + 1)
        reply_error = ""
    except MalformedReply as exc:
        # Neither part is taken: the bytes cannot be told apart without a guess.
        parts, reply_error = {}, f"the host's reply was cut off or malformed: {exc}"
    readback_data, old_data = parts.get("readback"), parts.get("old")
    if word == "unchanged":
        old_data = data  # the script found the bytes we sent
    elif not old_present or (
        old_data is not None
        and (len(old_data) > MAX_CONFIG_BYTES or old_sha256 not in (None, _sha(old_data)))
    ):
        old_data = None  # cut off by the remote side, or not the bytes it hashed: not the old file
    durability = Durability(f["durability"]) if f.get("durability") in set(Durability) else None
    old = OldFile(
        "old" in f, old_present, old_data, _sha(old_data) if old_data is not None else old_sha256
    )
    common = {
        "path": path,
        "old": old,
        "sha256_after": f.get("sha256_after") or None,
        "durability": durability,
        "backup": f.get("backup"),
        "pruned": _int_or_none(f.get("pruned")) or 0,
        "lock_method": f.get("lock"),
        "created_dir": "created-dir" in f,
        "followed_symlink": "followed-symlink" in f,
        "exit_status": result.exit_status,
        "stderr": result.stderr.decode("utf-8", errors="replace"),
        "readback_data": readback_data,
        "reply_error": reply_error,
    }
    if word == "written":
        return WriteOutcome(status=WriteStatus.WRITTEN, **common)  # type: ignore[arg-type]
    if word == "unchanged":
        return WriteOutcome(status=WriteStatus.UNCHANGED, **common)  # type: ignore[arg-type]
    if "failed" in f:
        step, _, reason = f["failed"].partition(" ")
        return WriteOutcome(
            status=WriteStatus.FAILED,
            failed_step=step,
            reason=reason or None,
            message=f.get("error", ""),
            **common,  # type: ignore[arg-type]
        )
    # No verdict: the shell was killed, the connection dropped, or the container is gone.
    return WriteOutcome(
        status=WriteStatus.FAILED,
        failed_step="transport",
        reason="no-result",
        message=(
            "the remote shell ended without reporting a result"
            f" (last step seen: {parsed.lines[-1] if parsed.lines else 'none'};"
            f" {stderr_line(result)})"
        ),
        **common,  # type: ignore[arg-type]
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------
# backups


@dataclass(frozen=True)
class Backup:
    """One backup kept by the write protocol."""

    name: str  # e.g. "config.json.20260101T120000Z"
    path: str  # absolute path on the target
    size: int
    sha256: str
    backed_up_at: datetime | None  # from the name (UTC), when the backup was taken
    modified_at: datetime | None  # the file's mtime: when that config was last written


def backup_dir(path: str) -> str:
    directory = path.rsplit("/", 1)[0] or "/"
    return f"{directory.rstrip('/')}/{BACKUP_DIRNAME}"


def list_remote_backups(
    transport: Transport, path: str, *, timeout: float | None = None
) -> list[Backup]:
    """The backups of ``path``, oldest first (one exec)."""
    check_remote_path(path)
    result, parsed = run_script(transport, "backups", [path], stdin=None, timeout=timeout)
    if parsed.fields.get("result") == "failed" and "failed" in parsed.fields:
        reason = parsed.fields["failed"]
        denied = reason == "permission-denied"
        hint = "; use --sudo, or log in as a user that can read it" if denied else ""
        raise RemoteStepFailed(
            f"{transport.description}: cannot list the backups of {path}: "
            f"{parsed.fields.get('error') or reason}{hint}",
            step="backups",
        )
    if parsed.fields.get("result") != "ok":
        raise RemoteProtocolError(
            f"{transport.description}: listing backups of {path} failed: {stderr_line(result)}",
            step="backups",
        )
    folder = backup_dir(path)
    backups = []
    for line in parsed.lines:
        key, _, rest = line.partition(" ")
        if key != "backup":
            continue
        parts = rest.split(" ", 3)
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        size, mtime, sha, name = parts
        stamp = _BACKUP_STAMP.search(name)
        backups.append(
            Backup(
                name=name,
                path=f"{folder}/{name}",
                size=int(size),
                sha256=sha,
                backed_up_at=(
                    datetime.strptime(stamp.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
                    if stamp
                    else None
                ),
                modified_at=_epoch(mtime),
            )
        )
    return backups


def read_backup(
    transport: Transport, path: str, name: str, *, timeout: float | None = None
) -> bytes:
    """The bytes of backup ``name`` of ``path``, for a rollback (one exec).

    The remote side sends them only when the backup directory is the push's own (see write.sh
    "trust") and the backup is a regular file, not a symlink, with no other name, owned by root,
    the login user or the owner of the config or its directory; else RemoteStepFailed with the
    reason (nothing is read through a planted link)."""
    check_remote_path(path)
    if not name or "/" in name or any(ch in name for ch in ("\x00", "\n", "\r")):
        raise UsageError(f"not a backup name: {name!r}")
    result, parsed = run_script(transport, "backups", [path, name], stdin=None, timeout=timeout)
    fields = parsed.fields
    if fields.get("result") == "failed" and "failed" in fields:
        raise RemoteStepFailed(
            f"{transport.description}: cannot restore {name}: "
            f"{fields.get('error') or fields['failed']}",
            step="backups",
        )
    if fields.get("result") != "ok" or parsed.data is None or result.exit_status != 0:
        raise RemoteProtocolError(
            f"{transport.description}: reading backup {name} failed: {stderr_line(result)}",
            step="backups",
        )
    return parsed.data


# --------------------------------------------------------------------------------------------


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _epoch(text: str | None) -> datetime | None:
    value = _int_or_none(text)
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None
