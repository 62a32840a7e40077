"""SQLite specifics: migrations, schema version, WAL, and cross-process compare-and-swap."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from handrail.errors import SchemaTooNew, StoreError
from handrail.store import Batch, PendingItem, RunRecord, Store
from handrail.store._sqlite import MIGRATIONS

pytestmark = pytest.mark.anyio


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


def test_reopening_does_not_migrate_twice(tmp_path: Path) -> None:
    Store.open(tmp_path / "runs.db")
    Store.open(tmp_path / "runs.db")
    db = sqlite3.connect(tmp_path / "runs.db")
    assert db.execute("SELECT count(*) FROM _migrations").fetchone()[0] == len(MIGRATIONS)


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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_two_processes_deciding_at_once_yield_one_decision(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    # Also PostgreSQL: the race is the same, the compare-and-swap a conditional UPDATE there.
    path = (str(tmp_path / "runs.db") if backend == "sqlite"
            else str(request.getfixturevalue("pg_url")))
    async with Store.open(path) as store:
        await store.write(Batch(
            run=RunRecord(id="r1", task="t", created_at=time.time()),
            pending=[PendingItem(id=f"p{i}", kind="approval", run_id="r1", call_record="r1:c",
                                 created_at=time.time()) for i in range(20)],
        ))
    script = textwrap.dedent(f"""
        import anyio, sys
        from handrail.errors import AlreadyDecided
        from handrail.store import Store
        async def main():
            wins = 0
            async with Store.open({path!r}) as store:
                for i in range(20):
                    try:
                        await store.decide(f"p{{i}}", {{"kind": "approve"}}, sys.argv[1])
                        wins += 1
                    except AlreadyDecided:
                        pass
            print(wins)
        anyio.run(main)
    """)
    # Two real processes race on purpose.
    procs = [subprocess.Popen([sys.executable, "-c", script, name],  # noqa: ASYNC220
                              stdout=subprocess.PIPE, text=True) for name in ("a", "b")]
    wins = [int(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(wins) == 20
    async with Store.open(path) as store:
        assert await store.pending() == []
