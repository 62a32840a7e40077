"""SQLite specifics: migrations, schema version, WAL, and cross-process compare-and-swap."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from handrail.errors import SchemaTooNew, StoreError
from handrail.store import Batch, PendingItem, RunRecord, Store
from handrail.store._sqlite import MIGRATIONS, WRITER_CACHE_KIB, SQLiteStore

pytestmark = pytest.mark.anyio

DECIDER = Path(__file__).with_name("decider.py")


def test_an_empty_database_is_migrated_to_the_full_schema(tmp_path: Path) -> None:
    Store.open(tmp_path / "runs.db")
    db = sqlite3.connect(tmp_path / "runs.db")
    names = [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY id")]
    assert names == [name for name, _ in MIGRATIONS]
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "messages", "calls", "pending", "_migrations"} <= tables
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    columns = {r[1] for r in db.execute("PRAGMA table_info(calls)")}
    assert {"verdict", "decision", "disposition", "answers", "pending_id"} <= columns


def _schema(db: sqlite3.Connection) -> dict[str, Any]:
    """Every table's columns, keys, rowid-ness and indexes, as the engine sees them."""
    out: dict[str, Any] = {}
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "ORDER BY name")]
    for table in tables:
        indexes = sorted(
            (name if not name.startswith("sqlite_autoindex") else "auto", unique, origin,
             partial, [tuple(c) for c in db.execute(f"PRAGMA index_xinfo({name})")])
            for _, name, unique, origin, partial in db.execute(f"PRAGMA index_list({table})"))
        out[table] = {
            "columns": db.execute(f"PRAGMA table_xinfo({table})").fetchall(),
            "list": db.execute(f"PRAGMA table_list({table})").fetchall()[0][2:],
            "foreign keys": db.execute(f"PRAGMA foreign_key_list({table})").fetchall(),
            "indexes": indexes,
        }
    return out


def test_a_new_file_gets_the_schema_the_migrations_build(tmp_path: Path) -> None:
    # A new, empty file is created with the current schema at once; an existing one is
    # migrated step by step. Both must end with the same tables, columns (types, defaults,
    # NOT NULL, keys), WITHOUT ROWID-ness, foreign keys and indexes, and the same record.
    Store.open(tmp_path / "new.db")
    stepwise = sqlite3.connect(tmp_path / "stepwise.db", isolation_level=None)
    stepwise.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                     "applied_at REAL NOT NULL)")
    MIGRATIONS[0][1](stepwise)  # not empty any more: the rest migrates one by one
    stepwise.execute("INSERT INTO _migrations VALUES (1, ?, 0)", (MIGRATIONS[0][0],))
    stepwise.close()
    Store.open(tmp_path / "stepwise.db")
    new, stepwise = (sqlite3.connect(tmp_path / f"{n}.db") for n in ("new", "stepwise"))
    assert _schema(new) == _schema(stepwise)
    for db in (new, stepwise):
        assert [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY id")] == [
            name for name, _ in MIGRATIONS]
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        db.close()


def test_reopening_does_not_migrate_twice(tmp_path: Path) -> None:
    Store.open(tmp_path / "runs.db")
    Store.open(tmp_path / "runs.db")
    db = sqlite3.connect(tmp_path / "runs.db")
    assert db.execute("SELECT count(*) FROM _migrations").fetchone()[0] == len(MIGRATIONS)


def test_both_connections_keep_a_fold_cycles_log_in_their_page_cache(tmp_path: Path) -> None:
    # The reader folds the log too (before a read, on close): with SQLite's default 2 MiB
    # cache each of the fold's passes read a large log's pages from the WAL again, and its
    # transaction spilled pages to the WAL before its commit (a lookup in the WAL's index a
    # page, dearer as the WAL grows: the per-call cost was not flat in the run's length).
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        for db in (store._db, store._reader):
            assert db.execute("PRAGMA cache_size").fetchone()[0] == -WRITER_CACHE_KIB
    finally:
        anyio.run(store.close)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    Store.open(tmp_path / "runs.db")
    db = sqlite3.connect(tmp_path / "runs.db")
    # What a newer handrail leaves behind: its migration recorded, the version bumped.
    db.execute("INSERT INTO _migrations VALUES (99, '0099_from_the_future', 0)")
    db.execute("PRAGMA user_version=99")
    db.commit()
    with pytest.raises(SchemaTooNew, match="0099_from_the_future"):
        Store.open(tmp_path / "runs.db")


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store.open(path)


def test_unknown_url_schemes_are_refused() -> None:
    from handrail.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown store URL"):
        Store.open("redis://localhost")
    with pytest.raises(ConfigError, match="empty"):
        Store.open("")


ROUNDS = 60


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_processes_released_together_never_both_decide_one_item(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """A check-then-write decide loses this race: both processes read `open`, both write.

    Two long-lived processes decide the same item in each of ROUNDS rounds; a barrier (this
    test, over a socket) releases them together, so their decisions overlap every round. Also
    PostgreSQL: the race is the same, the compare-and-swap a conditional UPDATE there.
    """
    path = (str(tmp_path / "runs.db") if backend == "sqlite"
            else str(request.getfixturevalue("pg_url")))
    store = Store.open(path)

    async def seed() -> None:
        await store.write(Batch(
            run=RunRecord(id="r1", task="t", created_at=time.time()),
            pending=[PendingItem(id=f"p{i}", kind="approval", run_id="r1", call_record="r1:c",
                                 created_at=time.time()) for i in range(ROUNDS)],
        ))
        await store.close()

    anyio.run(seed)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(120)
    port = server.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(DECIDER), str(path), str(port), name,
                               str(ROUNDS)], stdout=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    links: list[socket.socket] = []
    try:
        links = [server.accept()[0] for _ in procs]
        for link in links:
            link.settimeout(120)
        for _ in range(ROUNDS):
            for link in links:
                assert link.recv(1) == b"r"
            for link in links:
                link.sendall(b"g")
        won = {name: json.loads(p.communicate(timeout=120)[0])
               for name, p in zip(("a", "b"), procs, strict=True)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for link in links:
            link.close()
        server.close()
    assert sorted(won["a"] + won["b"]) == list(range(ROUNDS)), won  # exactly one winner each

    async def check() -> None:
        async with Store.open(path) as again:
            assert await again.pending() == []
            for name, rounds in won.items():
                for i in rounds:
                    assert (await again.pending_item(f"p{i}")).decided_by == name

    anyio.run(check)


def test_stored_values_read_back_as_json_wrote_them(tmp_path: Path) -> None:
    # The store encodes with pydantic_core (faster) and falls back to json for what it
    # refuses: a value must read back exactly as a json round trip gives it, lone surrogates
    # (model output decoded from "\ud800"), NaN and Infinity included.
    import math

    from handrail.store import CallRecord

    odd = {"text": "é ü \u2028 \ud800 end", "nan": math.nan, "inf": -math.inf,
           "big": 2**100, "nested": [{"a": (1, 2)}, None, True, 0.1, -0.0]}
    call = CallRecord(id="r1:c1", run_id="r1", call_id="c1", turn=0, index=0,
                      model_name="m", arguments="{}", result=odd, actions=[odd])

    async def main() -> tuple[Any, Any, Any]:
        async with Store.open(tmp_path / "runs.db") as store:
            await store.write(Batch(run=RunRecord(id="r1", task="t", created_at=time.time(),
                                                  events=[odd]),
                                    messages=[("r1", 0, odd)], calls=[call]))
            stored = await store.call("r1:c1")
            return ((await store.messages("r1"))[0], stored.result,
                    (await store.run("r1")).events[0])

    expected = json.loads(json.dumps(odd))
    for got in anyio.run(main):
        assert json.dumps(got) == json.dumps(expected)  # NaN != NaN: compare the texts
