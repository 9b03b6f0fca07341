"""The local history store: recording, querying, interrupted writes, concurrency."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_provision.errors import ExitCode, LocalWriteFailed
from dflash_provision.history import store as history
from dflash_provision.history.host_key import HostKey
from dflash_provision.history.store import AuditRecord, HistoryStore
from dflash_provision.rollout.store import RolloutStore
from tests.fixtures.cli import run_cli_in_process


@pytest.fixture
def store(tmp_path: Path) -> HistoryStore:
    return HistoryStore(tmp_path / "history.sqlite3")


def test_home_env_moves_the_database(tmp_path, monkeypatch):
    monkeypatch.setenv(history.HOME_ENV, str(tmp_path / "home"))
    assert history.default_db_path() == tmp_path / "home" / "history.sqlite3"
    with history.journal(history.default_store(), "push", HostKey("h01"), "/m/config.json"):
        pass
    assert (tmp_path / "home" / "history.sqlite3").exists()
    (entry,) = history.default_store().query()
    assert (entry.op, entry.host, entry.status) == ("push", "h01", "ok")


def test_recorded_write_stores_who_when_hashes_and_duration(store):
    with store.recorded("push", HostKey("h01"), "/m/config.json", sha256_before="aa" * 32) as rec:
        rec.sha256_after = "bb" * 32
        rec.message = "replaced"
    (entry,) = store.query()
    assert entry.status == "ok"
    assert entry.sha256_before == "aa" * 32 and entry.sha256_after == "bb" * 32
    assert entry.who == history.whoami() and "@" in entry.who
    assert entry.started_at.endswith("+00:00") and entry.finished_at is not None
    assert entry.duration_s is not None and entry.duration_s >= 0
    assert not entry.incomplete


def test_a_failing_write_is_recorded_as_failed_with_the_message(store):
    from dflash_provision.errors import RemoteStepFailed

    with (
        pytest.raises(RemoteStepFailed),
        store.recorded("repair", HostKey("h02"), "/m/config.json"),
    ):
        raise RemoteStepFailed("rename failed: Read-only file system", step="rename")
    (entry,) = store.query()
    assert entry.status == "failed"
    assert entry.message == "rename failed: Read-only file system"


def test_a_write_killed_midway_stays_visible_as_incomplete(tmp_path):
    db = tmp_path / "history.sqlite3"
    # A real process records "started", then dies without running any cleanup (SIGKILL-like).
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from dflash_provision.history.host_key import HostKey\n"
        "from dflash_provision.history.store import HistoryStore\n"
        f"store = HistoryStore(Path({str(db)!r}))\n"
        "cm = store.recorded('push', HostKey('h03'), '/m/config.json', sha256_before='cc'*32)\n"
        "cm.__enter__()\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert proc.returncode == -9
    (entry,) = HistoryStore(db).query(host=HostKey("h03"))
    assert entry.status == "started"
    assert entry.incomplete
    assert entry.finished_at is None
    assert entry.sha256_before == "cc" * 32
    assert entry.to_dict()["incomplete"] is True


def test_query_filters_by_host_and_limits_newest_first(store):
    for i in range(5):
        rid = store.record_start("push", HostKey(f"h{i % 2}"), "/m/config.json")
        store.record_finish(rid, status="ok", message=str(i))
    entries = store.query(host=HostKey("h0"), limit=2)
    assert [e.message for e in entries] == ["4", "2"]
    assert len(store.query(limit=None)) == 5


def test_host_filter_finds_a_machine_however_each_command_named_it(store):
    # push and rollback name the login (root@gpu1), fleet commands the inventory name (gpu1).
    for host in ("root@gpu1", "root@gpu1:2222", "gpu1/lxc:c1", "gpu1", "alice@gpu1", "gpu10"):
        key = HostKey.parse(host)
        store.record_finish(store.record_start("push", key, "/m/config.json"), status="ok")

    def query(host: str) -> list[str]:
        return [e.host for e in store.query(host=HostKey.parse(host))]

    assert set(query("gpu1")) == {
        "root@gpu1",
        "root@gpu1:2222",
        "gpu1/lxc:c1",
        "gpu1",
        "alice@gpu1",
    }
    assert set(query("root@gpu1")) == {"root@gpu1", "root@gpu1:2222"}
    assert query("gpu1/lxc:c1") == ["gpu1/lxc:c1"]
    assert query("gpu1:2222") == ["root@gpu1:2222"]


# What the development builds before 0.1.0 wrote: schema 1 kept the host as text only.
_BUILD_1 = """CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL,
finished_at TEXT, duration_s REAL, who TEXT NOT NULL, command TEXT NOT NULL, op TEXT NOT NULL,
host TEXT NOT NULL, path TEXT NOT NULL, sha256_before TEXT, sha256_after TEXT,
status TEXT NOT NULL, message TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL);"""


@pytest.mark.parametrize(
    ("setup", "whose"),
    [
        (_BUILD_1 + "PRAGMA user_version = 1;", "a build before 0.1.0 (schema 1;"),
        (_BUILD_1 + "PRAGMA user_version = 2;", "a build before 0.1.0 (schema 2;"),
        (_BUILD_1, "a build before 0.1.0 (schema 0;"),
        ("PRAGMA user_version = 4;", "a newer version (schema 4;"),
    ],
)
def test_a_history_of_another_version_is_refused_with_how_to_move_it_aside(
    tmp_path: Path, setup: str, whose: str
) -> None:
    db = tmp_path / "history.sqlite3"
    old = sqlite3.connect(db)
    old.executescript(setup)
    old.close()
    before = db.read_bytes()
    with pytest.raises(LocalWriteFailed) as caught:
        HistoryStore(db).query()
    assert str(caught.value) == (
        f"history database {db} was written by {whose} this version reads 3); move it aside "
        f"(mv {db} {db}.old): the next command starts a new one"
    )
    assert db.read_bytes() == before  # left as it was: nothing migrated, no WAL switched on
    # The CLI: one line, exit 9 (the controller's own files); after the mv, a new history.
    done = run_cli_in_process("history", env={"DFLASH_PROVISION_HOME": str(tmp_path)})
    assert done.returncode == ExitCode.LOCAL_WRITE
    assert done.stderr == f"error: {caught.value}\n"
    db.rename(tmp_path / "history.sqlite3.old")
    assert (
        run_cli_in_process("history", env={"DFLASH_PROVISION_HOME": str(tmp_path)}).returncode == 0
    )


def test_a_database_that_holds_only_rollouts_gets_the_history_beside_them(tmp_path: Path) -> None:
    # The rollout store keeps its table in the same file and may create it first.
    db = tmp_path / "history.sqlite3"
    RolloutStore(db).all()
    store = HistoryStore(db)
    store.record_finish(store.record_start("push", HostKey("gpu2"), "/m"), status="ok")
    assert [e.host for e in store.query()] == ["gpu2"]


def test_host_filter_takes_sql_wildcards_literally(store):
    for host in ("h_1", "hx1", "[fe80::1]:22"):
        key = HostKey.parse(host)
        store.record_finish(store.record_start("push", key, "/m/config.json"), status="ok")
    assert [e.host for e in store.query(host=HostKey.parse("h_1"))] == ["h_1"]
    assert [e.host for e in store.query(host=HostKey.parse("fe80::1"))] == ["[fe80::1]:22"]


def test_audit_records_are_written_in_one_batch(store):
    records = [
        AuditRecord(
            HostKey(f"h{i:02d}"), "/m/config.json", "drifted" if i % 3 else "in_sync", "ab", "", 0.1
        )
        for i in range(30)
    ]
    assert store.record_audits(records) == 30
    assert len(store.query(op="audit", status="in_sync", limit=None)) == 10


def test_concurrent_threads_and_processes_all_land(store):
    def worker(n: int) -> None:
        for j in range(20):
            with store.recorded("repair", HostKey(f"t{n}"), f"/m/{j}"):
                pass

    child = (
        "from pathlib import Path\n"
        "from dflash_provision.history.host_key import HostKey\n"
        "from dflash_provision.history.store import HistoryStore\n"
        f"s = HistoryStore(Path({str(store.path)!r}))\n"
        "for j in range(40):\n"
        "    s.record_finish(s.record_start('audit', HostKey('proc'), str(j)), status='ok')\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(2)]
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        assert p.wait(timeout=60) == 0
    entries = store.query(limit=None)
    assert len(entries) == 8 * 20 + 2 * 40
    assert all(e.status == "ok" for e in entries)


_FIRST_USE = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "from dflash_provision.history.host_key import HostKey\n"
    "from dflash_provision.history.store import HistoryStore\n"
    "store = HistoryStore(Path(sys.argv[1]))\n"
    "Path(sys.argv[2] + '.' + str(os.getpid())).touch()\n"
    "while not os.path.exists(sys.argv[2]):\n"
    "    time.sleep(0.0005)\n"
    "store.record_finish(store.record_start('audit', HostKey('cron'), 'x'), status='ok')\n"
)


def test_processes_opening_a_new_database_at_the_same_moment_all_record(tmp_path):
    # Cron starting several commands in the same second on a controller with no history yet:
    # each first connection turns the new file into WAL, which SQLite refuses at once (no busy
    # wait) to all but one. Released together, 8 processes collided in about a third of rounds.
    processes, rounds = 8, 4
    for round_no in range(rounds):
        db, go = tmp_path / f"h{round_no}.sqlite3", tmp_path / f"go{round_no}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _FIRST_USE, str(db), str(go)], stderr=subprocess.PIPE
            )
            for _ in range(processes)
        ]
        while len(list(tmp_path.glob(f"go{round_no}.*"))) < processes:
            assert all(p.poll() is None for p in procs), "a child died before the start line"
            time.sleep(0.005)
        go.touch()
        errors = [p.communicate(timeout=60)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0] * processes, errors
        assert len(HistoryStore(db).query(limit=None)) == processes


def test_busy_retry_waits_out_a_lock_and_gives_up_after_its_budget():
    calls: list[int] = []

    def locked_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert history._when_not_busy(locked_twice) == "done"
    assert len(calls) == 3

    def always_locked() -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        history._when_not_busy(always_locked, budget_s=0.05)

    def broken() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("no such table: events")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        history._when_not_busy(broken)
    assert len(calls) == 1  # only "busy" is worth waiting for


def test_history_cli_shows_json_and_filters(tmp_path):
    store = HistoryStore(tmp_path / history.DB_FILENAME)
    store.record_finish(store.record_start("push", HostKey("h01"), "/m/config.json"), status="ok")
    store.record_start("repair", HostKey("h02"), "/m/config.json")  # never finished
    out = run_cli_in_process("history", "--json", "--host", "h02", home=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["host"], r["status"], r["incomplete"]) for r in rows] == [("h02", "started", True)]
    # A wide terminal: piped, the table takes COLUMNS (80 where none is set, as under xdist,
    # which cuts "started (incomplete)" short).
    table = run_cli_in_process("history", "--last", "5", home=tmp_path, env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "incomplete" in table.stdout and "h01" in table.stdout


def test_history_json_has_the_layout_of_every_json_document(tmp_path: Path) -> None:
    """history --json is a list, not an object, yet printed like every other --json document:
    text as UTF-8 (an arrow, an accent), not ``\\u`` escapes, two-space indents."""
    store = HistoryStore(tmp_path / history.DB_FILENAME)
    entry = store.record_start("push", HostKey("h01"), "/m/config.json")
    store.record_finish(entry, status="failed", message="déjà vu: 0.31 → 0.12")
    out = run_cli_in_process("history", "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "déjà vu: 0.31 → 0.12" in out.stdout
    assert out.stdout.startswith('[\n  {\n    "')
    assert out.stdout == json.dumps(json.loads(out.stdout), indent=2, ensure_ascii=False) + "\n"


def _narrow_history(home: Path) -> list[tuple[str, str, str, str, str]]:
    """Records as a fleet leaves them: long host keys, a long failure message, an incomplete
    write; (op, host, status, message, sha256 after) of each, newest first."""
    store = HistoryStore(home / history.DB_FILENAME)
    written = [
        ("push", HostKey("gpu-node-017.dc2.example.com", "root", 2222), "written", "", "a" * 64),
        ("audit", HostKey("gpu-node-018", container="lxc:vllm-1"), "drifted",
         "2 field(s) differ from z-lab/Qwen3.6-27B-DFlash@0c6a2b7: layer_types, sliding_window",
         "b" * 64),
        ("repair", HostKey("h03"), "failed",
         "connection to h03 (10.20.30.40 port 22) refused; the old file was left untouched", ""),
    ]  # fmt: skip
    for op, key, status, message, after in written:
        entry = store.record_start(op, key, "/root/models/Qwen3.6-27B-DFlash/config.json")
        store.record_finish(entry, status=status, message=message, sha256_after=after or None)
    store.record_start("rollback", HostKey("gpu-node-019.dc2.example.com"), "/m/config.json")
    rows = [(op, str(key), status, message, after) for op, key, status, message, after in written]
    rows.append(("rollback", "gpu-node-019.dc2.example.com", "started (incomplete)", "", ""))
    return rows[::-1]


@pytest.mark.parametrize("columns", [80, 72])
def test_history_at_80_columns_keeps_every_cell_whole(tmp_path: Path, columns: int) -> None:
    """As `git log --oneline` or journalctl at 80 columns: no line wider than the terminal, no
    cell cut (the table cut them to 'hos', 'statu', '06:44:2' and dropped the message); what
    does not fit goes by priority (login, hash length, year, hashes) and the message (at 72
    columns these hosts too) goes under its row, indented."""
    rows = _narrow_history(tmp_path)
    done = run_cli_in_process("history", home=tmp_path, env={"COLUMNS": str(columns)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), "\n".join(lines)
    header, *body = lines
    assert header.split()[:3] == ["when", "(UTC)", "op"] and "status" in header.split()
    # One record per unindented line; its continuation lines are indented.
    records: list[list[str]] = []
    for line in body:
        if line.startswith(" "):
            records[-1].append(line.strip())
        else:
            records.append([line])
    assert len(records) == len(rows)
    for (op, host, status, message, _), (row, *more) in zip(rows, records, strict=True):
        _date, clock, *cells = row.split()
        assert len(clock) == 8 and clock.count(":") == 2, row  # HH:MM:SS, whole
        shown = " ".join([*cells, *more])  # every cell whole, the message's words in order
        for whole in (op, host, message):
            assert whole in shown, (whole, shown)
        assert status in shown or (status == "started (incomplete)" and "incomplete" in cells)


def test_history_wide_keeps_the_one_line_table(tmp_path: Path) -> None:
    rows = _narrow_history(tmp_path)
    done = run_cli_in_process("history", home=tmp_path, env={"COLUMNS": "250"})
    header, *body = done.stdout.splitlines()
    assert header.split()[:4] == ["when", "(UTC)", "who", "op"] and header.endswith("message")
    assert len(body) == len(rows)  # one line each: the message in its column
    for (op, host, status, message, after), line in zip(rows, body, strict=True):
        assert f"  {op}  " in line and f"  {host}  " in line and status in line
        assert line.endswith(message or after[:12] or "→ -")
