"""The write-and-prove protocol, one call: replace a file atomically (scripts/write.sh), read it
back in a fresh exec (what a reader such as vLLM will see), and say what the old file was.

Which exec carries which bytes is this module's business. With a backup kept, the old bytes
come back with the read-back (one bounded ``head`` reads the backup and the new file) instead of
costing the write exec a process of its own; without one (``keep_backups`` 0), or when a
followed symlink keeps its backups elsewhere, the write exec sends them.

When the write's report never arrives (the connection is lost, the host freezes past the
timeout, the user presses Ctrl-C), the outcome is settled on a fresh connection from the evidence
the write leaves (remote/settle.py): landed, not landed, or unknown; never assumed. When a
reported write reads back other bytes, the host's record of the last writer tells "replaced by a
later write" from "did not take effect".
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from dflash_provision.errors import DflashProvisionError, RemoteStepFailed
from dflash_provision.remote.ops import (
    DEFAULT_KEEP_BACKUPS,
    RemoteRead,
    WriteOutcome,
    WriteStatus,
    present_read,
    read_back,
    read_remote_config,
    remote_deadline,
    write_remote_config,
)
from dflash_provision.remote.settle import Settled, Verdict, last_writer, settle_write
from dflash_provision.transport.base import Transport


@dataclass(frozen=True)
class WriteOptions:
    """How push, rollback and repair write: the same settings for all three.

    ``keep_backups``: old files kept in ``<dir>/.dflash-backups``; ``mkdir``: create a missing
    model directory; ``follow_symlinks``: replace the file a symlinked config points to;
    ``timeout``: seconds each remote command may run (None: the transport's command_timeout).
    """

    keep_backups: int = DEFAULT_KEEP_BACKUPS
    mkdir: bool = False
    follow_symlinks: bool = False
    timeout: float | None = None


@dataclass(frozen=True)
class OldFile:
    """The file the write replaced (or would have).

    ``known``: the write got as far as looking at it (else nothing below says anything).
    ``data`` None with ``present``: its bytes could not be read back from its backup.
    """

    known: bool
    present: bool
    data: bytes | None
    sha256: str | None


@dataclass(frozen=True)
class WriteProof:
    """What one write did (``outcome``), what reading the file back gave (``readback``; None
    when the write failed), and the old file.

    ``cut_off``: why the write's report (or its read-back) never arrived ("" when it did); then
    ``settled`` says what the host showed on a fresh connection. ``interrupted``: a Ctrl-C did
    the cutting. ``replaced``: the read-back found other bytes because a later write replaced
    this one (the host's record of the last writer names another push).
    """

    outcome: WriteOutcome
    readback: RemoteRead | None
    old: OldFile
    cut_off: str = ""
    settled: Settled | None = None
    interrupted: bool = False
    replaced: bool = False


#: Steps of a transport failure after which the write may have run on the host (for any other
#: failure, e.g. refused or authentication, the command never started).
_MAYBE_RAN = ("timeout", "connection")


def write_and_prove(
    transport: Transport,
    path: str,
    data: bytes,
    options: WriteOptions,
    *,
    unread: bool = False,
) -> WriteProof:
    """Write ``data`` to ``path`` and read it back; never raises for what a host reports, nor
    when the write is cut off (see WriteProof.cut_off): only when it never started.

    ``unread``: the caller has not read the file first (repair writes first). The write then
    refuses a file this login cannot read (it cannot be judged, so it is not replaced), and a
    file that already holds ``data`` is read by the write exec itself and checked here: that
    read is the proof, as an audit's read is, and no second exec is needed."""
    old_via_read_back = options.keep_backups > 0 and not options.follow_symlinks
    nonce = secrets.token_hex(8)
    try:
        outcome = write_remote_config(
            transport,
            path,
            data,
            keep_backups=options.keep_backups,
            mkdir=options.mkdir,
            follow_symlinks=options.follow_symlinks,
            timeout=options.timeout,
            send_old=not old_via_read_back,
            nonce=nonce,
            send_same=unread,
            readable_only=unread,
        )
    except KeyboardInterrupt:
        return _settled(transport, path, data, options, nonce, "interrupted (Ctrl-C)", None)
    except RemoteStepFailed as exc:
        if exc.step not in _MAYBE_RAN:
            raise
        return _settled(transport, path, data, options, nonce, exc.message, None)
    if outcome.failed_step == "transport":  # the shell ended without a verdict
        return _settled(transport, path, data, options, nonce, outcome.failure_text(), outcome)
    if not outcome.ok:
        old = OldFile(
            outcome.old_seen, outcome.old_present, outcome.old_data, _sha(outcome.old_data)
        )
        return WriteProof(outcome, None, old)
    if outcome.status is WriteStatus.UNCHANGED and outcome.same_data == data:
        # Other bytes (the file replaced between the script's hash and its read) fall through to
        # the separate read-back, which then says what is there.
        readback = present_read(path, data)
        return WriteProof(outcome, readback, OldFile(True, True, data, readback.sha256))
    backup = outcome.backup_path if outcome.old_present and outcome.old_data is None else None
    try:
        readback, kept = read_back(transport, path, data, timeout=options.timeout, before=backup)
    except (KeyboardInterrupt, RemoteStepFailed) as exc:
        if isinstance(exc, RemoteStepFailed) and exc.step not in _MAYBE_RAN:
            raise
        # The write reported; only its proof was cut off: read the file on a fresh connection.
        why = exc.message if isinstance(exc, RemoteStepFailed) else "interrupted (Ctrl-C)"
        return _settled(transport, path, data, options, nonce, f"read-back: {why}", outcome)
    old_data = outcome.old_data
    replaced = False
    # The outcome is proven by now: a Ctrl-C in these extras costs only what they add (the old
    # bytes for the diff, who replaced the file), never the truth about the write.
    try:
        if backup is not None:
            old_data = _old_bytes_from_backup(transport, outcome, backup, kept, options.timeout)
        replaced = (
            outcome.status is WriteStatus.WRITTEN
            and readback.data != data
            and _later_writer(transport, path, nonce, options)
        )
    except (KeyboardInterrupt, DflashProvisionError):
        pass
    old = OldFile(True, outcome.old_present, old_data, _sha(old_data) or outcome.old_sha256)
    return WriteProof(outcome, readback, old, replaced=replaced)


def _settled(
    transport: Transport,
    path: str,
    data: bytes,
    options: WriteOptions,
    nonce: str,
    cut_off: str,
    outcome: WriteOutcome | None,
) -> WriteProof:
    """The proof of a write cut off by ``cut_off``: what the host shows on a fresh connection.
    A write that reported ``outcome`` ok has landed (only its read-back was lost); else the
    settle step decides. Bounded: one command timeout of retries, each with its own timeouts;
    a second Ctrl-C gives up (the outcome is then unknown)."""
    limit = transport.command_timeout if options.timeout is None else options.timeout
    interrupted = "Ctrl-C" in cut_off
    try:
        if outcome is not None and outcome.ok:
            settled = _reread(transport, path, outcome, limit)
        else:
            settled = settle_write(
                transport,
                path,
                nonce=nonce,
                sha256=_sha(data) or "",
                follow_symlinks=options.follow_symlinks,
                # The write ends itself at its deadline (its watchdog): wait that long for it.
                lock_timeout=remote_deadline(limit) + 1,
                window=limit,
            )
    except KeyboardInterrupt:
        interrupted = True
        settled = Settled(Verdict.UNKNOWN, message="interrupted again while checking")
    if outcome is None:
        outcome = WriteOutcome(
            path=path,
            status=WriteStatus.FAILED,
            failed_step="transport",
            reason="cut-off",
            message=cut_off,
        )
    old = OldFile(outcome.old_seen, outcome.old_present, outcome.old_data, outcome.old_sha256)
    return WriteProof(outcome, None, old, cut_off=cut_off, settled=settled, interrupted=interrupted)


def _reread(transport: Transport, path: str, outcome: WriteOutcome, limit: float) -> Settled:
    """What ``path`` holds, read on a fresh connection, after a write that reported ``outcome``
    (ok: so it landed, or found the bytes already there)."""
    verdict = Verdict.LANDED if outcome.status is WriteStatus.WRITTEN else Verdict.NOT_LANDED
    transport.close()
    try:
        read = read_remote_config(transport, path, timeout=limit, metadata=False)
    except DflashProvisionError as exc:
        return Settled(Verdict.UNKNOWN, message=f"the write reported, its read-back: {exc}")
    return Settled(verdict, sha256=read.sha256 if read.present else None)


def _later_writer(transport: Transport, path: str, nonce: str, options: WriteOptions) -> bool:
    """Whether another write went for its rename after ours (the host's record names it)."""
    limit = transport.command_timeout if options.timeout is None else options.timeout
    try:
        writer = last_writer(
            transport,
            path,
            follow_symlinks=options.follow_symlinks,
            lock_timeout=remote_deadline(limit),
            timeout=options.timeout,
        )
    except DflashProvisionError:
        return False
    return writer is not None and writer != nonce


def _old_bytes_from_backup(
    transport: Transport,
    outcome: WriteOutcome,
    backup: str,
    kept: bytes | None,
    timeout: float | None,
) -> bytes | None:
    """The replaced file's bytes: what the read-back's head gave ahead of the new file, checked
    against the hash the write reported; else one read of the backup (another push may have
    pruned it meanwhile: None then)."""

    def matches(candidate: bytes) -> bool:
        return outcome.old_sha256 is None or _sha(candidate) == outcome.old_sha256

    if kept is not None and matches(kept):
        return kept
    read = read_remote_config(transport, backup, timeout=timeout, metadata=False)
    return read.data if read.present and read.data is not None and matches(read.data) else None


def _sha(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None
