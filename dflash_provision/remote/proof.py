"""The write-and-prove protocol, one call: replace a file atomically (scripts/write.sh), read it
back (what a reader such as vLLM will see), and say what the old file was.

All of it is one exec: the script reads the file back by the caller's path once it is renamed
into place and fsynced, still under the push's lock, and sends the old file's bytes after it.
Only a read-back that does not hold the bytes sent costs one more exec, a describing read of
what is there (missing, other bytes, permission denied), as verify would report it.

When the write's report never arrives (the connection is lost, the host freezes past the
timeout, the user presses Ctrl-C), the outcome is settled on a fresh connection from the mark
the write leaves (remote/settle.py): landed, not landed, or unknown; never assumed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from dflash_provision.errors import DflashProvisionError, RemoteStepFailed
from dflash_provision.remote.ops import (
    DEFAULT_KEEP_BACKUPS,
    OldFile,
    RemoteRead,
    WriteOutcome,
    WriteStatus,
    new_nonce,
    present_read,
    read_remote_config,
    remote_deadline,
    write_remote_config,
)
from dflash_provision.remote.settle import Settled, Verdict, settle_write
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
class WriteProof:
    """The one record of a write's outcome: what the write reported (``outcome``, parsed from
    its reply once, the old file included), what reading the file back gave (``readback``; None
    when the write failed), and, for a write cut off, what the host showed afterwards. Push,
    rollback, repair, rollout's write step and the Ansible module render from it (through
    place.push.PushResult, which holds it).

    ``cut_off``: why the write's report (or its describing read) never arrived, or did not add
    up ("" when it did); then ``settled`` says what the host showed on a fresh connection.
    ``interrupted``: a Ctrl-C did the cutting.
    """

    outcome: WriteOutcome
    readback: RemoteRead | None
    cut_off: str = ""
    settled: Settled | None = None
    interrupted: bool = False

    @property
    def old(self) -> OldFile:
        """The file the write replaced (or found): the write's own record of it."""
        return self.outcome.old

    @property
    def sha256_after(self) -> str | None:
        """What the file held when last seen: its read-back's sha256, else (a cut-off write)
        what the host showed when it was settled."""
        if self.readback is not None:
            return self.readback.sha256
        return self.settled.sha256 if self.settled is not None else None


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

    ``unread``: the caller has not read the file first (repair writes first): the write then
    refuses a file this login cannot read (it cannot be judged, so it is not replaced)."""
    nonce = new_nonce()
    try:
        outcome = write_remote_config(
            transport,
            path,
            data,
            keep_backups=options.keep_backups,
            mkdir=options.mkdir,
            follow_symlinks=options.follow_symlinks,
            timeout=options.timeout,
            nonce=nonce,
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
        return WriteProof(outcome, None)
    if outcome.readback_data == data:
        # Read by the script after the rename and the fsyncs (or, unchanged, after its hash
        # matched), by the path a reader opens: the proof, and no second exec.
        return WriteProof(outcome, present_read(path, data))
    # Other bytes, or none (also when the reply's parts did not add up: none of its bytes is
    # taken): describe what is there, as verify would (one more exec).
    try:
        readback = read_remote_config(transport, path, timeout=options.timeout, metadata=False)
    except (KeyboardInterrupt, RemoteStepFailed) as exc:
        if isinstance(exc, RemoteStepFailed) and exc.step not in _MAYBE_RAN:
            raise
        # The write reported; only its describing read was cut off: read on a new connection.
        why = exc.message if isinstance(exc, RemoteStepFailed) else "interrupted (Ctrl-C)"
        return _settled(transport, path, data, options, nonce, f"read-back: {why}", outcome)
    return WriteProof(outcome, readback)


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
    return WriteProof(outcome, None, cut_off=cut_off, settled=settled, interrupted=interrupted)


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


def _sha(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None
