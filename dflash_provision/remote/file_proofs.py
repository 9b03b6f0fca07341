"""Proofs of pinned files, kept in the history database: "on this host, the file at this path
with this identity (device, inode, size, mtime, ctime) hashed to this pinned digest, then".

A later ``--all-files`` check sends the identity of the newest proof of each file's pinned
digest to the host; a file whose identity is still that one is not hashed again (a multi-GB
shard costs a ``stat`` instead of a read), and the verdict says it relied on that proof.

Any write to a file changes its ctime, and nobody can set a ctime back but by setting the clock;
a replaced file has another inode. The host reports times in whole seconds, so a file changed in
the same second as its hash began could keep all five numbers: such a proof is not recorded (git
calls these files "racily clean" and treats them the same way). Only a proof with both mtime and
ctime before the host's clock at the start of the hash is kept.

The table lives beside ``events`` in the history database (history.py); failures of the store
are the store's (``HistoryStore.problem``): a proof not kept costs a hash next time, nothing else.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import HistoryStore, utc_now

if TYPE_CHECKING:
    from dflash_provision.remote.files_read import FileFacts
    from dflash_provision.source.pinned_files import PinnedFile

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS file_proofs (id INTEGER PRIMARY KEY, recorded_at TEXT NOT NULL,"
    " machine TEXT NOT NULL, login TEXT, port INTEGER, container TEXT, path TEXT NOT NULL,"
    " algorithm TEXT NOT NULL, digest TEXT NOT NULL, identity TEXT NOT NULL)"
)
_INDEX = (
    "CREATE INDEX IF NOT EXISTS file_proofs_by_file ON file_proofs"
    " (machine, path, algorithm, digest)"
)


@dataclass(frozen=True)
class Proof:
    identity: str
    recorded_at: str


def _ensure(conn: sqlite3.Connection) -> None:
    conn.execute(_SCHEMA)
    conn.execute(_INDEX)


def latest_proofs(
    store: HistoryStore, host: HostKey, directory: str, pinned: Sequence[PinnedFile]
) -> dict[str, Proof]:
    """Name -> the newest proof of that file's pinned digest at ``directory/name`` on ``host``.
    Empty when the store cannot be read: every file is then hashed."""
    sql = (
        "SELECT identity, recorded_at FROM file_proofs WHERE machine = ? AND login IS ?"
        " AND port IS ? AND container IS ? AND path = ? AND algorithm = ? AND digest = ?"
        " ORDER BY id DESC LIMIT 1"
    )

    def lookup(conn: sqlite3.Connection) -> dict[str, Proof]:
        _ensure(conn)
        found: dict[str, Proof] = {}
        for p in pinned:
            params = (*host.columns(), _path(directory, p.path), p.algorithm, p.digest)
            row = conn.execute(sql, params).fetchone()
            if row is not None:
                found[p.path] = Proof(str(row[0]), str(row[1]))
        return found

    if store.problem is not None:
        return {}
    result = store.transaction(lookup)
    return result or {}


def record_proofs(
    store: HistoryStore,
    host: HostKey,
    directory: str,
    proved: Sequence[tuple[PinnedFile, FileFacts]],
) -> int:
    """Keep the proofs of files hashed on the host to their pinned digest (only those old
    enough to be told apart from a later change: see the module doc). Returns how many."""
    now = utc_now()
    rows = [
        (now, *host.columns(), _path(directory, p.path), p.algorithm, p.digest, facts.identity)
        for p, facts in proved
        if reusable(facts)
    ]
    if not rows:
        return 0

    def insert(conn: sqlite3.Connection) -> int:
        _ensure(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT INTO file_proofs (recorded_at, machine, login, port, container, path,"
                " algorithm, digest, identity) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(rows)

    return store.transaction(insert) or 0


def reusable(facts: FileFacts) -> bool:
    """A proof that a later identical identity may stand for: mtime and ctime both before the
    second the hash began on the host's clock."""
    if facts.identity is None or facts.clock is None:
        return False
    mtime, ctime = facts.mtime, facts.ctime
    return mtime is not None and ctime is not None and max(mtime, ctime) < facts.clock


def _path(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"
