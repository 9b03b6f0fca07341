"""Rollout records in the history database (its own table, created on first use), and the
hold an open rollout has on its hosts.

One row per rollout: its id, state and the whole record as JSON, replaced on every save (one
``INSERT OR REPLACE`` in autocommit mode is atomic in SQLite, so a controller killed at any
moment leaves the previous or the new record, never half of one). The writes, restarts and
checks themselves are journaled as ordinary history rows (op ``rollout-write``...).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from dflash_provision.errors import DflashProvisionError, ExitCode, LocalWriteFailed, UsageError
from dflash_provision.history import BUSY_TIMEOUT_S, default_db_path, describe_failure
from dflash_provision.rollout.record import Rollout, State

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rollouts (id TEXT PRIMARY KEY, created_at TEXT NOT NULL,"
    " updated_at TEXT NOT NULL, state TEXT NOT NULL, record TEXT NOT NULL)"
)
#: A record holds a few KiB per host; anything far bigger was not written by us.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class RolloutHeld(DflashProvisionError):
    """A host is held by another open rollout."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.ROLLOUT_REFUSED)


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
        except (sqlite3.Error, OSError) as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None
        return conn

    def save(self, rollout: Rollout) -> None:
        """Replace the record; LocalWriteFailed when it cannot be kept (the rollout then
        stops: a step that is not journaled first could not be resumed or undone)."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
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
            rows = conn.execute("SELECT state, record FROM rollouts").fetchall()
        finally:
            conn.close()
        return [Rollout.from_dict(json.loads(r[1])) for r in rows if State(r[0]).open]

    def refuse_held(self, rollout: Rollout) -> None:
        """RolloutHeld when an open rollout other than this one holds one of its hosts."""
        mine = {(h.target, h.path) for h in rollout.hosts}
        for other in self.open_rollouts():
            if other.id == rollout.id:
                continue
            held = sorted(h.name for h in other.hosts if (h.target, h.path) in mine)
            if held:
                raise RolloutHeld(
                    f"rollout {other.id} ({other.state.value}) still holds {', '.join(held)}: "
                    f"finish it with `{other.command('--resume')}` or undo "
                    f"it with `{other.command('--abort')}`"
                )
