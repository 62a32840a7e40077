"""Provenance is kept with each call record, in every store; an older SQLite file migrates."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from handrail.store import Batch, CallRecord, CallStatus, RunRecord, Store
from handrail.store._sqlite import MIGRATIONS

pytestmark = pytest.mark.anyio

PROVENANCE = {"output": "untrusted", "trusted": [{"value": "bob@example.org", "by": "ctx.trust"}]}


def _records() -> tuple[RunRecord, CallRecord]:
    now = time.time()
    run = RunRecord(id="r1", task="t", created_at=now, updated_at=now)
    call = CallRecord(id="r1:c1", run_id="r1", call_id="c1", turn=0, index=0, model_name="x",
                      status=CallStatus.FINISHED, result={"content": []},
                      provenance=dict(PROVENANCE))
    return run, call


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
async def test_a_calls_provenance_round_trips(kind: str, tmp_path: Path,
                                              request: pytest.FixtureRequest) -> None:
    store = (Store.memory() if kind == "memory" else Store.open(tmp_path / "runs.db")
             if kind == "sqlite" else Store.open(request.getfixturevalue("pg_url")))
    run, call = _records()
    await store.write(Batch(run=run, calls=[call]))
    call.provenance = None  # a later change by the caller never reaches what was committed
    assert (await store.call("r1:c1")).provenance == PROVENANCE
    assert (await store.calls("r1"))[0].provenance == PROVENANCE
    await store.close()


async def test_a_database_from_before_provenance_migrates(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "applied_at REAL NOT NULL)")
    name, first = MIGRATIONS[0]
    first(db)
    db.execute("INSERT INTO _migrations VALUES (1, ?, 0)", (name,))
    db.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
               "VALUES ('r0', 't', 'completed', 0, 0)")
    db.execute("INSERT INTO calls (id, run_id, call_id, turn, idx, model_name, arguments, "
               "actions, status, answers) VALUES ('r0:c', 'r0', 'c', 0, 0, 'x', '{}', '[]', "
               "'finished', '[]')")
    db.close()
    store = Store.open(path)
    assert (await store.call("r0:c")).provenance is None  # read as untrusted output
    run, call = _records()
    await store.write(Batch(run=run, calls=[call]))
    assert (await store.call("r1:c1")).provenance == PROVENANCE
    await store.close()
