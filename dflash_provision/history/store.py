"""The local history store: every push, repair, rollback and audit this controller ran, in SQLite.

Where: ``platformdirs.user_data_dir("dflash-provision")/history.sqlite3`` (on Linux
``~/.local/share/dflash-provision/``); ``$DFLASH_PROVISION_HOME`` replaces the directory (tests,
shared controllers).

One row per host and operation: who (``user@controller``), when (UTC, ISO 8601), the command line,
the operation, host, path, sha256 before and after, status, message and duration. A host is named
one way, a ``HostKey`` (the machine as the user named it, plus the login, port and container when
a target spec gave them), stored in its own columns, so ``history --host`` is one SQL match.

``journal`` is the one entry point for changes (push, rollback, repair). A write is
recorded as ``started`` *before* the remote write begins and updated when it ends, so a write whose
process was killed stays visible as ``started`` (shown as "incomplete"): the host may hold either
file and deserves a ``verify``.

Failures of the store itself (a corrupt or unwritable database, a full disk, a
``DFLASH_PROVISION_HOME`` that is a file) never stop or hide the operation being recorded: the
first one is kept in ``HistoryStore.problem`` as one line that says what is wrong and how to fix
it (the CLI prints it and exits 9), and later writes of that run are skipped. Reading (``history``)
raises it as ``LocalWriteFailed``.

Concurrency: each thread gets its own connection (sqlite3 connections must not be shared across
threads without care); processes coordinate through WAL mode, a busy timeout and a bounded retry
for the moments SQLite reports "database is locked" without waiting (see ``_when_not_busy``), so
two audits started by cron at the same minute both get recorded.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import random
import shlex
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dflash_provision.data_dir import HOME_ENV as HOME_ENV
from dflash_provision.data_dir import data_dir as data_dir
from dflash_provision.errors import LocalWriteFailed
from dflash_provision.history.host_key import HostKey

if TYPE_CHECKING:
    from dflash_provision.history.references import ReferenceKey

_T = TypeVar("_T")

DB_FILENAME = "history.sqlite3"
BUSY_TIMEOUT_S = 30.0

STARTED = "started"  # written before the remote change; stays so if the process dies
OK = "ok"
FAILED = "failed"


# One schema: 0.1.0 is the first release, so no migration is kept from the development builds
# before it. It is numbered 3, as the last of those builds numbered the same tables, whose
# databases keep working; a database at another number (1 or 2: an older build; above 3: a
# newer version) or with an unnumbered ``events`` table is refused, saying how to move it aside.
_SCHEMA_VERSION = 3
# No semicolon inside a comment: _execute_all splits the script on them.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at    TEXT NOT NULL,   -- UTC, ISO 8601 with offset
    finished_at   TEXT,            -- NULL while the operation runs (or if it was interrupted)
    duration_s    REAL,
    who           TEXT NOT NULL,   -- user@controller
    command       TEXT NOT NULL,   -- the command line that did it
    op            TEXT NOT NULL,   -- push, repair, rollback, audit, verify
    host          TEXT NOT NULL,   -- the text shown to users (the key: the last four columns)
    path          TEXT NOT NULL,
    sha256_before TEXT,
    sha256_after  TEXT,
    status        TEXT NOT NULL,   -- started, ok, failed, or an audit status (in_sync, drifted...)
    message       TEXT NOT NULL DEFAULT '',
    pid           INTEGER NOT NULL,
    machine       TEXT,
    login         TEXT,
    port          INTEGER,
    container     TEXT
);
CREATE INDEX IF NOT EXISTS events_host_time ON events (host, id);
CREATE INDEX IF NOT EXISTS events_machine_time ON events (machine, id);
-- Acceptance references: the figures of a passing runtime-check (verify/reference.py), each
-- beside its "runtime-check" row in events. Looked up by host, server port, drafter sha256 and
-- the digest of the smoke prompts, the newest one being the reference.
CREATE TABLE IF NOT EXISTS acceptance_references (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        INTEGER,
    recorded_at     TEXT NOT NULL,
    machine         TEXT NOT NULL,
    login           TEXT,
    port            INTEGER,
    container       TEXT,
    server_port     INTEGER NOT NULL,
    drafter_sha256  TEXT NOT NULL,
    prompts_sha256  TEXT NOT NULL,
    figures         TEXT NOT NULL  -- JSON: rates, lengths, prompts, vLLM version, target
);
CREATE INDEX IF NOT EXISTS references_lookup
    ON acceptance_references (drafter_sha256, prompts_sha256, machine, id);
"""
_KEY_COLUMNS = ("machine", "login", "port", "container")


class OtherSchema(sqlite3.DatabaseError):
    """The history database was written by another version (its schema number says which)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"schema {version}")
        self.version = version


def default_db_path() -> Path:
    return data_dir() / DB_FILENAME


def whoami() -> str:
    """``user@controller`` for the ``who`` column, from the real uid.

    Not from ``LOGNAME``/``USER`` (what getpass.getuser reads first): anyone can set those, and
    the journal must say who really ran the command.
    """
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (containers with arbitrary uids)
        user = str(uid)
    return f"{user}@{socket.gethostname()}"


def check_home() -> None:
    """LocalWriteFailed when the history's directory exists but is not a directory."""
    home = data_dir()
    if home.exists() and not home.is_dir():
        raise LocalWriteFailed(describe_failure(home / DB_FILENAME, NotADirectoryError()))


def describe_failure(path: Path, exc: BaseException) -> str:
    """One line: what is wrong with the history database at ``path``, and how to fix it."""
    home = path.parent
    detail = (str(exc).splitlines() or [type(exc).__name__])[0]
    code = getattr(exc, "errno", None) or getattr(exc, "sqlite_errorcode", None)
    text = detail.lower()
    aside = f"move it aside (mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.broken')})"
    if isinstance(exc, OtherSchema):
        whose = "a newer version" if exc.version > _SCHEMA_VERSION else "a build before 0.1.0"
        old = shlex.quote(str(path) + ".old")
        return (
            f"history database {path} was written by {whose} (schema {exc.version}; this "
            f"version reads {_SCHEMA_VERSION}); move it aside (mv {shlex.quote(str(path))} "
            f"{old}): the next command starts a new one"
        )
    where = f"{HOME_ENV}={home}" if os.environ.get(HOME_ENV) else str(home)
    if isinstance(exc, (NotADirectoryError, FileExistsError)) or (
        home.exists() and not home.is_dir()
    ):
        return f"history directory {where} is not a directory: point {HOME_ENV} at a directory"
    if code in (errno.ENOSPC, sqlite3.SQLITE_FULL) or "disk is full" in text:
        return (
            f"history database {path}: the disk is full ({detail}); free some space, or set "
            f"{HOME_ENV} to a directory on another disk"
        )
    if "not a database" in text or "malformed" in text or code in _CORRUPT:
        return (
            f"history database {path} is corrupt ({detail}); {aside}: the next command starts "
            "a new one"
        )
    if _read_only(home):
        return (
            f"history database {path}: {home} is on a read-only filesystem ({detail}); set "
            f"{HOME_ENV} to a writable directory"
        )
    if isinstance(exc, PermissionError) or "readonly" in text or "unable to open" in text:
        return (
            f"history database {path} cannot be written ({detail}); fix the permissions of "
            f"{home}, or set {HOME_ENV} to a writable directory"
        )
    return f"history database {path}: {detail}; if this persists, {aside}"


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


_CORRUPT = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}


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


_ENTRY_COLUMNS = tuple(f.name for f in fields(HistoryEntry))


@dataclass(frozen=True)
class AuditRecord:
    """One host's audit outcome, for :meth:`HistoryStore.record_audits` (one transaction)."""

    host: HostKey
    path: str
    status: str
    sha256: str | None
    message: str
    duration_s: float


class HistoryStore:
    """SQLite-backed history. Cheap to create; one connection, opened lazily and shared by this
    process's threads, one statement or transaction at a time.

    One connection rather than one per thread: a fleet's 64 workers each opening their own
    would contend for the database's write lock through SQLite's busy handler, which sleeps
    (256 rows from 64 threads: 0.5-0.6 s of wall time and twice the CPU, against 0.07 s with
    the connection shared), and every write row is taken right before a host's write."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_db_path()
        self._connection: sqlite3.Connection | None = None
        self._use_lock = threading.Lock()  # one statement or transaction at a time
        self._init_lock = threading.Lock()
        self._initialised = False
        # The first failure to write (one line with the fix); once set, writes are skipped.
        self.problem: str | None = None

    def _write(self, action: Callable[[sqlite3.Connection], _T]) -> _T | None:
        """Run a write; a failure of the store is kept in ``problem`` instead of raised, so the
        operation being recorded carries on and reports its own outcome."""
        if self.problem is not None:
            return None
        try:
            with self._use_lock:
                return action(self._conn())
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # our SQL is wrong: a bug, not a state of the store
        except (sqlite3.Error, OSError) as exc:
            with self._init_lock:
                if self.problem is None:
                    self.problem = describe_failure(self.path, exc)
            return None

    def transaction(self, action: Callable[[sqlite3.Connection], _T]) -> _T | None:
        """Run ``action`` on the shared connection as a write (retried while another process
        holds the database; a failure of the store is kept in ``problem``, None returned): for
        the tables other modules keep beside ``events`` (remote/file_proofs.py)."""
        return self._write(lambda conn: _when_not_busy(lambda: action(conn)))

    def _read(self, action: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            with self._use_lock:
                return action(self._conn())
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise
        except (sqlite3.Error, OSError) as exc:
            raise LocalWriteFailed(describe_failure(self.path, exc)) from None

    # -- connections -------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        """The shared connection (callers hold ``_use_lock``)."""
        conn = self._connection
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit; multi-row writes use explicit BEGIN/COMMIT.
            # check_same_thread=False: shared by the threads, one at a time (_use_lock).
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._connection = conn
            self._ensure_schema(conn)
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        with self._init_lock:
            if self._initialised:
                return
            _when_not_busy(lambda: _set_up(conn))
            self._initialised = True

    def close(self) -> None:
        """Close the connection (the next use opens it again)."""
        with self._use_lock:
            conn, self._connection = self._connection, None
        if conn is not None:
            conn.close()

    # -- writing -----------------------------------------------------------------------------

    def record_start(
        self,
        op: str,
        host: HostKey,
        path: str,
        *,
        sha256_before: str | None = None,
        command: str | None = None,
        who: str | None = None,
    ) -> int | None:
        """Record that ``op`` is about to change ``host:path``; returns the row id (None when
        the store failed: see ``problem``)."""
        row = (
            utc_now(),
            who or whoami(),
            command or current_command(),
            op,
            str(host),
            path,
            sha256_before,
            STARTED,
            os.getpid(),
            *host.columns(),
        )

        def insert(conn: sqlite3.Connection) -> int | None:
            cursor = _when_not_busy(
                lambda: conn.execute(
                    "INSERT INTO events (started_at, who, command, op, host, path, sha256_before,"
                    " status, pid, machine, login, port, container)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
            )
            return cursor.lastrowid

        return self._write(insert)

    def record_finish(
        self,
        entry_id: int | None,
        *,
        status: str,
        sha256_before: str | None = None,
        sha256_after: str | None = None,
        message: str = "",
        duration_s: float | None = None,
    ) -> None:
        """Close a row opened by :meth:`record_start` (no row: nothing to do). ``None`` hashes
        keep what was stored."""
        if entry_id is None:
            return
        values = (utc_now(), duration_s, status, message, sha256_before, sha256_after, entry_id)
        self._write(
            lambda conn: _when_not_busy(
                lambda: conn.execute(
                    "UPDATE events SET finished_at = ?, duration_s = ?, status = ?, message = ?,"
                    " sha256_before = COALESCE(?, sha256_before),"
                    " sha256_after = COALESCE(?, sha256_after) WHERE id = ?",
                    values,
                )
            )
        )

    def record_discard(self, entry_id: int | None) -> None:
        """Drop a row opened by :meth:`record_start` for a change that did not happen (repair
        found the file already right): the audit row says what the host held."""
        if entry_id is None:
            return
        self._write(
            lambda conn: _when_not_busy(
                lambda: conn.execute("DELETE FROM events WHERE id = ?", (entry_id,))
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
        """Record many finished audit results in one transaction (one fsync for a whole fleet);
        returns how many were recorded (0 when the store failed: see ``problem``)."""
        now = utc_now()
        rows = [
            (
                now,
                now,
                r.duration_s,
                who or whoami(),
                command or current_command(),
                op,
                str(r.host),
                r.path,
                r.sha256,
                r.sha256,
                r.status,
                r.message,
                os.getpid(),
                *r.host.columns(),
            )
            for r in records
        ]

        def insert_all(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO events (started_at, finished_at, duration_s, who, command, op,"
                    " host, path, sha256_before, sha256_after, status, message, pid,"
                    " machine, login, port, container)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # a failed COMMIT may have ended it
                    conn.execute("ROLLBACK")
                raise
            return len(rows)

        return self._write(lambda conn: _when_not_busy(lambda: insert_all(conn))) or 0

    @contextlib.contextmanager
    def recorded(
        self,
        op: str,
        host: HostKey,
        path: str,
        *,
        sha256_before: str | None = None,
        command: str | None = None,
    ) -> Iterator[Recording]:
        """Wrap a remote change: the row says ``started`` before the body runs.

        The body fills in ``sha256_before`` / ``sha256_after`` / ``message`` and may set
        ``status``; a body that raises is recorded as ``failed`` with the exception's message.
        """
        row_id = self.record_start(op, host, path, sha256_before=sha256_before, command=command)
        rec = Recording(id=row_id, sha256_before=sha256_before)
        started = time.monotonic()
        try:
            yield rec
        except BaseException as exc:
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            self.record_finish(
                row_id,
                status=FAILED,
                sha256_before=rec.sha256_before,
                sha256_after=rec.sha256_after,
                message=message,
                duration_s=time.monotonic() - started,
            )
            raise
        if rec.discard:
            self.record_discard(row_id)
            return
        self.record_finish(
            row_id,
            status=rec.status,
            sha256_before=rec.sha256_before,
            sha256_after=rec.sha256_after,
            message=rec.message,
            duration_s=time.monotonic() - started,
        )

    # -- acceptance references (runtime-check) ------------------------------------------------

    def record_reference(
        self, key: ReferenceKey, figures: dict[str, Any], *, message: str, duration_s: float
    ) -> int | None:
        """Record a passing runtime-check: its row in events (op ``runtime-check``, shown by
        ``history``) and its figures as the newest acceptance reference for ``key``."""
        now = utc_now()
        event = (
            now, now, duration_s, whoami(), current_command(), "runtime-check", str(key.host),
            key.path, key.drafter_sha256, key.drafter_sha256, "passed", message, os.getpid(),
            *key.host.columns(),
        )  # fmt: skip

        def insert(conn: sqlite3.Connection) -> int | None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = conn.execute(
                    "INSERT INTO events (started_at, finished_at, duration_s, who, command, op,"
                    " host, path, sha256_before, sha256_after, status, message, pid,"
                    " machine, login, port, container)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    event,
                )
                conn.execute(
                    "INSERT INTO acceptance_references (event_id, recorded_at, machine, login,"
                    " port, container, server_port, drafter_sha256, prompts_sha256, figures)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (cursor.lastrowid, now, *key.host.columns(), key.server_port,
                     key.drafter_sha256, key.prompts_sha256, json.dumps(figures)),
                )  # fmt: skip
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return cursor.lastrowid

        return self._write(lambda conn: _when_not_busy(lambda: insert(conn)))

    def latest_reference(
        self, key: ReferenceKey, *, vllm_version: str | None = None
    ) -> tuple[str, dict[str, Any]] | None:
        """The newest reference for ``key`` (when it was recorded, its figures), else None.
        The host must match exactly: another login, port or container is another host.
        ``vllm_version``: only a reference recorded on that vLLM version (the figures' own
        ``vllm_version``: acceptance moves between releases, verify/reference_version.py)."""
        sql = (
            "SELECT recorded_at, figures FROM acceptance_references WHERE drafter_sha256 = ?"
            " AND prompts_sha256 = ? AND server_port = ? AND machine = ? AND login IS ?"
            " AND port IS ? AND container IS ?"
        )
        params: tuple[Any, ...] = (
            key.drafter_sha256, key.prompts_sha256, key.server_port, *key.host.columns()
        )  # fmt: skip
        if vllm_version is not None:
            sql += " AND json_valid(figures) AND json_extract(figures, '$.vllm_version') = ?"
            params += (vllm_version,)
        sql += " ORDER BY id DESC LIMIT 1"
        row = self._read(lambda conn: _when_not_busy(lambda: conn.execute(sql, params).fetchone()))
        if row is None:
            return None
        try:
            figures = json.loads(row["figures"])
        except ValueError:
            return None
        return (str(row["recorded_at"]), figures) if isinstance(figures, dict) else None

    # -- reading -----------------------------------------------------------------------------

    def query(
        self,
        *,
        host: HostKey | None = None,
        op: str | None = None,
        status: str | None = None,
        limit: int | None = 50,
    ) -> list[HistoryEntry]:
        """Newest first. ``limit=None`` returns everything. LocalWriteFailed when the database
        cannot be read.

        ``host`` matches its machine, and its login, port and container only where it names
        them: ``gpu1`` finds ``gpu1`` (fleet commands, inventory names), ``root@gpu1:2222``
        (push and rollback, which name the login) and ``gpu1/lxc:c1`` (its containers).
        """
        clauses: list[str] = []
        params: list[Any] = []
        wanted: list[tuple[str, object]] = [("op", op), ("status", status)]
        if host is not None:
            wanted += list(zip(_KEY_COLUMNS, host.columns(), strict=True))
        for column, value in wanted:
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM events"  # noqa: S608 - our own names
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = self._read(lambda conn: _when_not_busy(lambda: conn.execute(sql, params).fetchall()))
        return [HistoryEntry(**dict(row)) for row in rows]


@dataclass
class Recording:
    """Mutable outcome of one :func:`journal` block; ``id`` is its row (None: not kept)."""

    id: int | None = None
    status: str = OK
    sha256_before: str | None = None
    sha256_after: str | None = None
    message: str = ""
    #: Set by a body that found nothing to change: the row is dropped, not closed.
    discard: bool = False


_default_store: HistoryStore | None = None
_default_lock = threading.Lock()


def default_store_problem() -> str | None:
    """What went wrong with the process-wide store in this run, if anything (for the CLI)."""
    with _default_lock:
        return _default_store.problem if _default_store is not None else None


def default_store() -> HistoryStore:
    """The process-wide store at :func:`default_db_path` (re-created if the env var changed)."""
    global _default_store
    with _default_lock:
        path = default_db_path()
        if _default_store is None or _default_store.path != path:
            _default_store = HistoryStore(path)
        return _default_store


@contextlib.contextmanager
def journal(
    store: HistoryStore | None,
    op: str,
    host: HostKey,
    path: str,
    *,
    sha256_before: str | None = None,
) -> Iterator[Recording]:
    """Journal one change (push, rollback, repair) of ``host:path``: the row reads "started"
    before the body runs, so a change that is killed half way stays visible; the body fills in
    the outcome. With no ``store`` (a dry run, a fleet run without history) nothing is kept."""
    if store is None:
        yield Recording(sha256_before=sha256_before)
        return
    with store.recorded(op, host, path, sha256_before=sha256_before) as recording:
        yield recording


def _set_up(conn: sqlite3.Connection) -> None:
    """Switch the database to WAL and create the schema; safe to repeat, and racing processes."""
    # WAL lets readers and one writer proceed together across processes; NORMAL sync is
    # durable against a killed process (the case "started" rows exist for). WAL is stored in
    # the file, so only the first run on a new database has to change it.
    # Refused before anything is changed in a database of another version (WAL included).
    _refuse_other_schema(conn)
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")  # one process creates the schema; the others then see it
    try:
        _refuse_other_schema(conn)  # another process may have written it since
        if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
            _execute_all(conn, _SCHEMA)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _execute_all(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _refuse_other_schema(conn: sqlite3.Connection) -> None:
    """OtherSchema unless the database is ours (numbered ``_SCHEMA_VERSION``) or new (unnumbered,
    without an ``events`` table: other tables, e.g. rollouts, may be there already)."""
    # One statement, one snapshot: read apart, another process could create the tables and
    # number them in between (version 0 seen, then its events table).
    version, events = conn.execute(
        "SELECT (SELECT user_version FROM pragma_user_version),"
        " EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events')"
    ).fetchone()
    if version == _SCHEMA_VERSION or (version == 0 and not events):
        return
    raise OtherSchema(int(version))


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
