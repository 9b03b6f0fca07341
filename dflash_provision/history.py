"""The local history store: every push, repair, rollback and audit this controller ran, in SQLite.

Where: ``platformdirs.user_data_dir("dflash-provision")/history.sqlite3`` (on Linux
``~/.local/share/dflash-provision/``); ``$DFLASH_PROVISION_HOME`` replaces the directory (tests,
shared controllers).

One row per host and operation: who (``user@controller``), when (UTC, ISO 8601), the command line,
the operation, host, path, sha256 before and after, status, message and duration. A write is
recorded as ``started`` *before* the remote write begins and updated when it ends, so a write whose
process was killed stays visible as ``started`` (shown as "incomplete"): the host may hold either
file and deserves a ``verify``.

Concurrency: each thread gets its own connection (sqlite3 connections must not be shared across
threads without care); processes coordinate through WAL mode, a busy timeout and a bounded retry
for the moments SQLite reports "database is locked" without waiting (see ``_when_not_busy``), so
two audits started by cron at the same minute both get recorded.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shlex
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

HOME_ENV = "DFLASH_PROVISION_HOME"
DB_FILENAME = "history.sqlite3"
BUSY_TIMEOUT_S = 30.0

STARTED = "started"  # written before the remote change; stays so if the process dies
OK = "ok"
FAILED = "failed"

OPERATIONS = ("push", "repair", "rollback", "audit", "verify")

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at    TEXT NOT NULL,   -- UTC, ISO 8601 with offset
    finished_at   TEXT,            -- NULL while the operation runs (or if it was interrupted)
    duration_s    REAL,
    who           TEXT NOT NULL,   -- user@controller
    command       TEXT NOT NULL,   -- the command line that did it
    op            TEXT NOT NULL,   -- push, repair, rollback, audit, verify
    host          TEXT NOT NULL,
    path          TEXT NOT NULL,
    sha256_before TEXT,
    sha256_after  TEXT,
    status        TEXT NOT NULL,   -- started, ok, failed, or an audit status (in_sync, drifted...)
    message       TEXT NOT NULL DEFAULT '',
    pid           INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_host_time ON events (host, id);
"""


def data_dir() -> Path:
    """The directory holding the history database (created on first write)."""
    override = os.environ.get(HOME_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs  # deferred: only commands that record history need it

    return Path(platformdirs.user_data_dir("dflash-provision"))


def default_db_path() -> Path:
    return data_dir() / DB_FILENAME


def whoami() -> str:
    """``user@controller`` for the ``who`` column."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers with arbitrary uids)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def current_command() -> str:
    """The running command line, with the program's path shortened to its name."""
    argv = list(sys.argv) or ["dflash-provision"]
    argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    started_at: str
    finished_at: str | None
    duration_s: float | None
    who: str
    command: str
    op: str
    host: str
    path: str
    sha256_before: str | None
    sha256_after: str | None
    status: str
    message: str
    pid: int

    @property
    def incomplete(self) -> bool:
        """A write that began and never recorded its end (killed, crashed, power loss)."""
        return self.status == STARTED

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["incomplete"] = self.incomplete
        return data


@dataclass(frozen=True)
class AuditRecord:
    """One host's audit outcome, for :meth:`HistoryStore.record_audits` (one transaction)."""

    host: str
    path: str
    status: str
    sha256: str | None
    message: str
    duration_s: float


class HistoryStore:
    """SQLite-backed history. Cheap to create; connections open lazily, one per thread."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_db_path()
        self._local = threading.local()
        self._init_lock = threading.Lock()
        self._initialised = False

    # -- connections -------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit; multi-row writes use explicit BEGIN/COMMIT.
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._local.conn = conn
            self._ensure_schema(conn)
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        with self._init_lock:
            if self._initialised:
                return
            _when_not_busy(lambda: _set_up(conn))
            self._initialised = True

    def close(self) -> None:
        """Close this thread's connection (other threads' close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- writing -----------------------------------------------------------------------------

    def record_start(
        self,
        op: str,
        host: str,
        path: str,
        *,
        sha256_before: str | None = None,
        command: str | None = None,
        who: str | None = None,
    ) -> int:
        """Record that ``op`` is about to change ``host:path``; returns the row id."""
        conn = self._conn()
        cursor = _when_not_busy(
            lambda: conn.execute(
                "INSERT INTO events (started_at, who, command, op, host, path, sha256_before,"
                " status, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    utc_now(),
                    who or whoami(),
                    command or current_command(),
                    op,
                    host,
                    path,
                    sha256_before,
                    STARTED,
                    os.getpid(),
                ),
            )
        )
        row_id = cursor.lastrowid
        assert row_id is not None
        return row_id

    def record_finish(
        self,
        entry_id: int,
        *,
        status: str,
        sha256_before: str | None = None,
        sha256_after: str | None = None,
        message: str = "",
        duration_s: float | None = None,
    ) -> None:
        """Close a row opened by :meth:`record_start`. ``None`` hashes keep what was stored."""
        conn = self._conn()
        _when_not_busy(
            lambda: conn.execute(
                "UPDATE events SET finished_at = ?, duration_s = ?, status = ?, message = ?,"
                " sha256_before = COALESCE(?, sha256_before),"
                " sha256_after = COALESCE(?, sha256_after) WHERE id = ?",
                (utc_now(), duration_s, status, message, sha256_before, sha256_after, entry_id),
            )
        )

    def record_audits(
        self,
        records: Iterable[AuditRecord],
        *,
        op: str = "audit",
        command: str | None = None,
        who: str | None = None,
    ) -> int:
        """Record many finished audit results in one transaction (one fsync for a whole fleet)."""
        now = utc_now()
        rows = [
            (
                now,
                now,
                r.duration_s,
                who or whoami(),
                command or current_command(),
                op,
                r.host,
                r.path,
                r.sha256,
                r.sha256,
                r.status,
                r.message,
                os.getpid(),
            )
            for r in records
        ]
        conn = self._conn()

        def insert_all() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO events (started_at, finished_at, duration_s, who, command, op,"
                    " host, path, sha256_before, sha256_after, status, message, pid)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        _when_not_busy(insert_all)
        return len(rows)

    @contextlib.contextmanager
    def recorded(
        self,
        op: str,
        host: str,
        path: str,
        *,
        sha256_before: str | None = None,
        command: str | None = None,
    ) -> Iterator[Recording]:
        """Wrap a remote change: the row says ``started`` before the body runs.

        The body fills in ``sha256_before`` / ``sha256_after`` / ``message`` and may set
        ``status``; a body that raises is recorded as ``failed`` with the exception's message.
        """
        rec = Recording(sha256_before=sha256_before)
        rec.id = self.record_start(op, host, path, sha256_before=sha256_before, command=command)
        started = time.monotonic()
        try:
            yield rec
        except BaseException as exc:
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            self.record_finish(
                rec.id,
                status=FAILED,
                sha256_before=rec.sha256_before,
                sha256_after=rec.sha256_after,
                message=message,
                duration_s=time.monotonic() - started,
            )
            raise
        self.record_finish(
            rec.id,
            status=rec.status,
            sha256_before=rec.sha256_before,
            sha256_after=rec.sha256_after,
            message=rec.message,
            duration_s=time.monotonic() - started,
        )

    # -- reading -----------------------------------------------------------------------------

    def query(
        self,
        *,
        host: str | None = None,
        op: str | None = None,
        status: str | None = None,
        limit: int | None = 50,
    ) -> list[HistoryEntry]:
        """Newest first. ``limit=None`` returns everything.

        ``host`` names a machine the way a user would (see same_machine): ``gpu1`` finds rows
        recorded as ``gpu1`` (fleet commands, inventory names), ``root@gpu1`` and
        ``root@gpu1:2222`` (push and rollback, which name the login) and ``gpu1/lxc:c1`` (its
        containers).
        """
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("op", op), ("status", status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if host is not None:
            # A cheap pre-filter in SQL; same_machine decides.
            clauses.append("host LIKE ? ESCAPE '\\'")
            params.append(f"%{_like_escaped(_machine_of(host)[0])}%")
        sql = "SELECT * FROM events"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY id DESC"
        entries: list[HistoryEntry] = []
        conn = self._conn()
        for row in _when_not_busy(lambda: conn.execute(sql, params).fetchall()):
            if host is not None and not same_machine(row["host"], host):
                continue
            entries.append(HistoryEntry(**dict(row)))
            if limit is not None and len(entries) >= limit:
                break
        return entries


def same_machine(recorded: str, wanted: str) -> bool:
    """Whether the host column ``recorded`` is on the machine ``wanted`` names.

    Both are read as ``[user@]machine[:port][/container]``. The login and port of ``wanted``
    count only when given, and so does its container: ``gpu1`` covers ``root@gpu1:22`` and
    ``gpu1/lxc:c1``; ``gpu1/lxc:c1`` covers only that container.
    """
    if recorded == wanted:
        return True
    have_machine, have_user, have_port, have_container = _machine_of(recorded)
    want_machine, want_user, want_port, want_container = _machine_of(wanted)
    return (
        have_machine == want_machine
        and want_user in (None, have_user)
        and want_port in (None, have_port)
        and want_container in (None, have_container)
    )


def _machine_of(host: str) -> tuple[str, str | None, str | None, str | None]:
    """(machine, user, port, container) of ``[user@]machine[:port][/container]``."""
    where, slash, container = host.partition("/")
    user, at, machine = where.rpartition("@")
    port: str | None = None
    if machine.startswith("[") and "]" in machine:  # [v6::addr]:port
        inside, _, rest = machine[1:].partition("]")
        machine, port = inside, rest[1:] or None
    elif machine.count(":") == 1:
        machine, port = machine.split(":")
    return machine, user if at else None, port, container if slash else None


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass
class Recording:
    """Mutable outcome of one :meth:`HistoryStore.recorded` block."""

    id: int = 0
    status: str = OK
    sha256_before: str | None = None
    sha256_after: str | None = None
    message: str = ""


_default_store: HistoryStore | None = None
_default_lock = threading.Lock()


def default_store() -> HistoryStore:
    """The process-wide store at :func:`default_db_path` (re-created if the env var changed)."""
    global _default_store
    with _default_lock:
        path = default_db_path()
        if _default_store is None or _default_store.path != path:
            _default_store = HistoryStore(path)
        return _default_store


def recorded(
    op: str,
    host: str,
    path: str,
    *,
    sha256_before: str | None = None,
    command: str | None = None,
) -> contextlib.AbstractContextManager[Recording]:
    """Shortcut for ``default_store().recorded(...)``, for the push / rollback commands."""
    return default_store().recorded(op, host, path, sha256_before=sha256_before, command=command)


def _set_up(conn: sqlite3.Connection) -> None:
    """Switch the database to WAL and create the schema; safe to repeat, and racing processes."""
    # WAL lets readers and one writer proceed together across processes; NORMAL sync is
    # durable against a killed process (the case "started" rows exist for). WAL is stored in
    # the file, so only the first run on a new database has to change it.
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")  # one process creates the schema; the others then see it
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _when_not_busy(action: Callable[[], _T], budget_s: float = BUSY_TIMEOUT_S) -> _T:
    """Run ``action``, retrying while another process holds the database.

    The busy timeout does not cover every case: SQLite answers "database is locked" at once,
    without waiting, when two connections both try to turn a new database into WAL (each holds
    the shared lock the other must wait out), and while the last connection to close cleans up
    the WAL files. Those are short; this waits them out within the same budget.
    """
    deadline = time.monotonic() + budget_s
    pause = 0.002
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))  # noqa: S311 -- jitter: racing processes spread out
        pause = min(pause * 2, 0.1)
