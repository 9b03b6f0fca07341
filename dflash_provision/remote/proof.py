"""The write-and-prove protocol, one call: replace a file atomically (scripts/write.sh), read it
back in a fresh exec (what a reader such as vLLM will see), and say what the old file was.

Which exec carries which bytes is this module's business. With a backup kept, the old bytes
come back with the read-back (one ``cat`` reads the backup and the new file) instead of costing
the write exec a process of its own; without one (``keep_backups`` 0), or when a followed
symlink keeps its backups elsewhere, the write exec sends them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from dflash_provision.remote.ops import (
    DEFAULT_KEEP_BACKUPS,
    RemoteRead,
    WriteOutcome,
    read_back,
    read_remote_config,
    write_remote_config,
)
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
    when the write failed), and the old file."""

    outcome: WriteOutcome
    readback: RemoteRead | None
    old: OldFile


def write_and_prove(
    transport: Transport, path: str, data: bytes, options: WriteOptions
) -> WriteProof:
    """Write ``data`` to ``path`` and read it back; never raises for what a host reports."""
    old_via_read_back = options.keep_backups > 0 and not options.follow_symlinks
    outcome = write_remote_config(
        transport,
        path,
        data,
        keep_backups=options.keep_backups,
        mkdir=options.mkdir,
        follow_symlinks=options.follow_symlinks,
        timeout=options.timeout,
        send_old=not old_via_read_back,
    )
    if not outcome.ok:
        old = OldFile(
            outcome.old_seen, outcome.old_present, outcome.old_data, _sha(outcome.old_data)
        )
        return WriteProof(outcome, None, old)
    backup = outcome.backup_path if outcome.old_present and outcome.old_data is None else None
    readback, kept = read_back(transport, path, data, timeout=options.timeout, before=backup)
    old_data = outcome.old_data
    if backup is not None:
        old_data = _old_bytes_from_backup(transport, outcome, backup, kept, options.timeout)
    old = OldFile(True, outcome.old_present, old_data, _sha(old_data) or outcome.old_sha256)
    return WriteProof(outcome, readback, old)


def _old_bytes_from_backup(
    transport: Transport,
    outcome: WriteOutcome,
    backup: str,
    kept: bytes | None,
    timeout: float | None,
) -> bytes | None:
    """The replaced file's bytes: what the read-back's cat gave ahead of the new file, checked
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
