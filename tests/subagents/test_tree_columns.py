"""A run's place in a tree is kept in columns of its own (`parent_call_id`, `depth`): SQLite
migration 0005 and PostgreSQL migration 0003 add them, old runs read back as roots, and every
store round-trips them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from handrail.store import RunRecord, RunStatus, Store
from handrail.store._sqlite import MIGRATIONS
from handrail.store.contract import Batch

pytestmark = pytest.mark.anyio


def _tree_runs() -> list[RunRecord]:
    return [RunRecord(id="root", task="t", status=RunStatus.READY, created_at=1,
                      updated_at=1),
            RunRecord(id="kid", task="t", status=RunStatus.READY, created_at=2,
                      updated_at=2, parent_id="root", parent_call_id="call_0_0", depth=1)]


async def _round_trip(store: Store) -> None:
    for run in _tree_runs():
        await store.write(Batch(run=run))
    kid = await store.run("kid")
    assert (kid.parent_id, kid.parent_call_id, kid.depth) == ("root", "call_0_0", 1)
    root = await store.run("root")
    assert (root.parent_id, root.parent_call_id, root.depth) == (None, None, 0)
    listed = {r.id: r for r in await store.runs()}
    assert listed["kid"].depth == 1 and listed["kid"].parent_call_id == "call_0_0"


async def test_memory_and_sqlite_keep_a_runs_place_in_its_tree(tmp_path: Path) -> None:
    await _round_trip(Store.memory())
    async with Store.open(tmp_path / "runs.db") as store:
        await _round_trip(store)


async def test_postgres_keeps_a_runs_place_in_its_tree(pg_url: str) -> None:
    async with Store.open(pg_url) as store:
        await _round_trip(store)


def test_a_0004_sqlite_database_gains_the_columns_and_its_runs_are_roots(tmp_path: Path
                                                                        ) -> None:
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "applied_at REAL NOT NULL)")
    before = [m for m in MIGRATIONS if m[0] < "0005"]
    assert MIGRATIONS[len(before)][0] == "0005_run_tree"  # and the later ones after it
    for number, (name, migrate) in enumerate(before, start=1):
        migrate(db)
        db.execute("INSERT INTO _migrations VALUES (?, ?, 0)", (number, name))
    db.execute(f"PRAGMA user_version = {len(before)}")
    db.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
               "VALUES ('old', 't', 'completed', 1, 1)")
    db.close()

    async def check() -> None:
        async with Store.open(path) as store:
            old = await store.run("old")
            assert (old.parent_call_id, old.depth) == (None, 0)

    anyio.run(check)
    db = sqlite3.connect(path)
    columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    assert {"parent_id", "parent_call_id", "depth"} <= columns
    assert ("0005_run_tree",) in db.execute("SELECT name FROM _migrations").fetchall()
    db.close()
