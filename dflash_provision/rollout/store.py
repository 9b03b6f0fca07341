"""Rollout records in the history database (its own table, created on first use), and the
hold an open rollout has on its hosts.

One row per rollout: its id, state and the whole record as JSON, replaced on every save (one
``INSERT OR REPLACE`` in autocommit mode is atomic in SQLite, so a controller killed at any
moment leaves the previous or the new record, never half of one). The writes, restarts and
checks themselves are journaled as ordinary history rows (op ``rollout-write``...).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from dflash_provision.errors import DflashProvisionError, ExitCode, LocalWriteFailed, UsageError
from dflash_provision.history.store import BUSY_TIMEOUT_S, default_db_path, describe_failure
from dflash_provision.rollout.identity import Identity
from dflash_provision.rollout.record import HostState, Rollout, State

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rollouts (id TEXT PRIMARY KEY, created_at TEXT NOT NULL,"
    " updated_at TEXT NOT NULL, state TEXT NOT NULL, record TEXT NOT NULL)"
)
#: Config bytes by sha256: every rollout's new config and every config a rollback returns to
#: (what a server ran), so a rollback finds what ran when the host kept no backup of it.
_CONFIGS = (
    "CREATE TABLE IF NOT EXISTS rollout_configs (sha256 TEXT PRIMARY KEY, kept_at TEXT NOT NULL,"
    " data BLOB NOT NULL)"
)
#: A config is a few KiB; the store keeps nothing bigger (the remote read's own limit).
MAX_CONFIG_BYTES = 1024 * 1024
#: A record holds a few KiB per host; anything far bigger was not written by us.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class RolloutRefused(DflashProvisionError):
    """The rollout cannot start, resume or abort (exit 31); nothing was done."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.ROLLOUT_REFUSED)


class RolloutHeld(RolloutRefused):
    """A host is held by another open rollout."""


def new_id() -> str:
    return datetime.now(UTC).strftime("r%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class RolloutStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_db_path()

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(_SCHEMA)
            conn.execute(_CONFIGS)
        except (sqlite3.Error, OSError) as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None
        return conn

    def save(self, rollout: Rollout) -> None:
        """Replace the record; LocalWriteFailed when it cannot be kept (the rollout then
        stops: a step that is not journaled first could not be resumed or undone)."""
        now = _now()
        text = json.dumps(rollout.to_dict(), sort_keys=True)
        conn = self._connect()
        try:
            conn.execute(
                "INSERT OR REPLACE INTO rollouts (id, created_at, updated_at, state, record)"
                " VALUES (?, ?, ?, ?, ?)",
                (rollout.id, rollout.created_at, now, rollout.state.value, text),
            )
        except sqlite3.Error as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None
        finally:
            conn.close()

    def keep_config(self, data: bytes) -> str:
        """Keep ``data`` under its sha256 (once); returns the sha256."""
        sha = hashlib.sha256(data).hexdigest()
        if len(data) > MAX_CONFIG_BYTES:
            return sha
        conn = self._connect()
        try:
            conn.execute(
                "INSERT OR IGNORE INTO rollout_configs (sha256, kept_at, data) VALUES (?, ?, ?)",
                (sha, _now(), data),
            )
        except sqlite3.Error as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None
        finally:
            conn.close()
        return sha

    def config_with_sha(self, sha256: str) -> bytes | None:
        """The bytes kept under ``sha256`` (checked again: a row is only trusted for the
        bytes it hashes to), or None."""
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT data FROM rollout_configs WHERE sha256 = ?", (sha256,)
            ).fetchone()
        except sqlite3.Error:
            return None
        finally:
            conn.close()
        if row is None or not isinstance(row[0], bytes) or len(row[0]) > MAX_CONFIG_BYTES:
            return None
        return row[0] if hashlib.sha256(row[0]).hexdigest() == sha256 else None

    def load(self, rollout_id: str) -> Rollout:
        conn = self._connect()
        try:
            row = conn.execute("SELECT record FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        finally:
            conn.close()
        if row is None:
            raise UsageError(f"no rollout {rollout_id!r} (`dflash-provision rollout --status`)")
        if len(row[0]) > MAX_RECORD_BYTES:
            raise UsageError(f"rollout {rollout_id}: its record is too large to be ours")
        return Rollout.from_dict(json.loads(row[0]))

    def all(self, *, limit: int = 20) -> list[tuple[str, str, str, str]]:
        """(id, created_at, updated_at, state), newest first."""
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT id, created_at, updated_at, state FROM rollouts"
                " ORDER BY created_at DESC, id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        finally:
            conn.close()
        return [tuple(r) for r in rows]

    def open_rollouts(self) -> list[Rollout]:
        conn = self._connect()
        try:
            return _open_rollouts(conn)
        finally:
            conn.close()

    def hold(self, rollout: Rollout) -> None:
        """Take ``rollout``'s hosts and save it, in ONE write transaction: RolloutHeld when
        another open rollout holds one of them. Check and insert under the database's write
        lock, so two rollouts started at the same moment cannot both find the hosts free."""
        text = json.dumps(rollout.to_dict(), sort_keys=True)
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")  # waits (busy timeout) for any other writer
            try:
                _refuse_held(rollout, _open_rollouts(conn))
                conn.execute(
                    "INSERT OR REPLACE INTO rollouts (id, created_at, updated_at, state, record)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (rollout.id, rollout.created_at, _now(), rollout.state.value, text),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None
        finally:
            conn.close()

    def refuse_held(self, rollout: Rollout) -> None:
        """RolloutHeld when an open rollout other than this one holds one of its hosts (a
        read only: ``hold`` is the check that counts)."""
        _refuse_held(rollout, self.open_rollouts())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _open_rollouts(conn: sqlite3.Connection) -> list[Rollout]:
    rows = conn.execute("SELECT state, record FROM rollouts").fetchall()
    return [Rollout.from_dict(json.loads(r[1])) for r in rows if State(r[0]).open]


def _refuse_held(rollout: Rollout, open_rollouts: list[Rollout]) -> None:
    mine = [h for h in rollout.hosts if h.phase != "excluded"]
    for other in open_rollouts:
        if other.id == rollout.id:
            continue
        theirs = [h for h in other.hosts if h.phase != "excluded"]
        held = sorted({h.name for h in theirs for m in mine if same_host(h, m)})
        if held:
            raise RolloutHeld(
                f"rollout {other.id} ({other.state.value}) still holds {', '.join(held)}: "
                f"finish it with `{other.command('--resume')}` or undo "
                f"it with `{other.command('--abort')}`"
            )


def same_host(a: HostState, b: HostState) -> bool:
    """The same drafter file on the same machine: by the places the records saved (address
    after ssh_config, port, container, path), else (older records) by the TARGET and path."""
    if a.identity and b.identity:
        one, two = Identity.from_dict(a.identity), Identity.from_dict(b.identity)
        if one.place == two.place:
            return True
        keys = one.host_key and one.host_key == two.host_key
        return bool(keys) and (one.container, one.path) == (two.container, two.path)
    return (a.target, a.path) == (b.target, b.path)
