"""SQLite group commit: concurrent writes share transactions, each waiter is released only once
its transaction has committed, a failure stays with the writes it concerns, and nothing that
can wait (another process's lock) blocks the event loop."""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from loop_ticks import counting_iterations, resumed_per_iteration

from handrail.errors import AlreadyDecided, ConfigError, ResumeRefused, StoreError
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store
from handrail.store._sqlite import MIGRATIONS, SQLiteStore
from handrail.store.contract import register_backend

pytestmark = pytest.mark.anyio


def _run(run_id: str, **kw: Any) -> RunRecord:
    return RunRecord(id=run_id, task="t", created_at=time.time(), **kw)


def _wal_frames(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])
    finally:
        db.close()


async def _concurrently(*fns: Any) -> list[BaseException | Any]:
    """Start every coroutine function in the same loop iteration; their outcomes, in order."""
    out: list[BaseException | Any] = [None] * len(fns)

    async def one(i: int) -> None:
        try:
            out[i] = await fns[i]()
        except Exception as exc:
            out[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(fns)):
            tg.start_soon(one, i)
    return out


async def test_concurrent_writes_share_commits(tmp_path: Path) -> None:
    alone, shared = tmp_path / "alone.db", tmp_path / "shared.db"
    async with Store.open(alone) as store:
        for i in range(60):
            await store.write(Batch(run=_run(f"r{i}")))
        # One commit per write writes its pages each time.
        one_by_one = _wal_frames(alone)
    async with Store.open(shared) as store:
        writes = [lambda i=i: store.write(Batch(run=_run(f"r{i}"))) for i in range(60)]
        assert await _concurrently(*writes) == [None] * 60
        # Shared commits write each page once per group.
        together = _wal_frames(shared)
        assert len(await store.runs(limit=100)) == 60
    assert one_by_one >= 60
    assert together < one_by_one / 4


async def test_a_cas_loser_in_a_group_fails_alone(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "runs.db") as store:
        await store.write(Batch(run=_run("r0"), pending=[
            PendingItem(id="p1", kind="approval", run_id="r0", call_record="r0:c",
                        created_at=time.time())]))
        await store.write(Batch(run=_run("r1", owner="elsewhere:1:x", lease_until=0.0)))
        decides = [lambda i=i: store.decide("p1", {"kind": "approve"}, f"d{i}")
                   for i in range(8)]
        claims = [lambda i=i: store.claim("r1", f"elsewhere:2:{i}") for i in range(4)]
        writes = [lambda i=i: store.write(Batch(run=_run(f"w{i}"))) for i in range(8)]
        out = await _concurrently(*decides, *claims, *writes)
        decided, claimed, written = out[:8], out[8:12], out[12:]
        winners = [d for d in decided if not isinstance(d, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(d, AlreadyDecided) for d in decided if d is not winners[0])
        assert sum(not isinstance(c, BaseException) for c in claimed) == 1
        assert all(isinstance(c, ResumeRefused) for c in claimed
                   if isinstance(c, BaseException))
        assert written == [None] * 8
        assert (await store.pending_item("p1")).decided_by == winners[0].decided_by
        assert len(await store.runs(limit=100)) == 10


async def test_a_failing_write_in_a_group_fails_alone(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "runs.db") as store:
        bad = Batch(run=_run("orphan-parent"), messages=[("no-such-run", 0, {"k": 1})])
        writes = [lambda i=i: store.write(Batch(run=_run(f"w{i}"))) for i in range(5)]
        out = await _concurrently(*writes[:2], lambda: store.write(bad), *writes[2:])
        assert out[:2] + out[3:] == [None] * 5
        assert isinstance(out[2], StoreError) and "FOREIGN KEY" in str(out[2])
        ids = {r.id for r in await store.runs(limit=100)}
        # Nothing of the failed write stays, not even its run row.
        assert ids == {f"w{i}" for i in range(5)}



async def test_a_run_whose_first_write_failed_is_stored_whole_by_the_next(tmp_path: Path
                                                                          ) -> None:
    # After its first write a run is only UPDATEd (its policy text and task are not built
    # again); a first write that was rolled back must not leave it UPDATEing nothing.
    async with Store.open(tmp_path / "runs.db") as store:
        bad = Batch(run=_run("r1", policy={"layers": []}),
                    messages=[("no-such-run", 0, {"k": 1})])
        with pytest.raises(StoreError, match="FOREIGN KEY"):
            await store.write(bad)
        await store.write(Batch(run=_run("r1", policy={"layers": []}, steps=2)))
        run = await store.run("r1")
        assert (run.task, run.policy, run.steps) == ("t", {"layers": []}, 2)


class _CommitFails:
    """A connection whose COMMIT fails, as on a full disk."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def cursor(self) -> Any:
        return self  # (the writer runs BEGIN and COMMIT through a reused cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_failed_commit_fails_every_write_of_its_group(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        real = store._db
        store._db = _CommitFails(real)  # type: ignore[assignment]
        writes = [lambda i=i: store.write(Batch(run=_run(f"w{i}"))) for i in range(6)]
        out = await _concurrently(*writes)
        assert all(isinstance(e, StoreError) and "rolled back" in str(e)
                   and "disk I/O error" in str(e) for e in out), out
        store._db = real
        assert await store.runs() == []
        await store.write(Batch(run=_run("after")))
        assert [r.id for r in await store.runs()] == ["after"]


async def test_another_connections_lock_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    async with Store.open(path) as store:
        assert isinstance(store, SQLiteStore)
        # The loop's connection never waits for a lock (SQLite's busy handler sleeps in C,
        # where the loop would stall for the whole busy timeout): a commit there fails at
        # once and goes to the store's thread, which waits.
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        await store.write(Batch(run=_run("r0")))
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process deciding, say
        done = anyio.Event()

        async def write() -> None:
            await store.write(Batch(run=_run("r1")))
            await store.write(Batch(run=_run("r2")))
            done.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
                for _ in range(50):
                    await anyio.lowlevel.checkpoint()
                # The loop ran on (these steps, the COMMIT below) while the write waits for
                # the lock on the store's thread.
                assert store._on_thread
                assert not done.is_set()
                other.execute("COMMIT")
                await done.wait()
        other.close()
        assert {r.id for r in await store.runs()} == {"r0", "r1", "r2"}
        # The thread's wait did not stay on the connection the loop commits on.
        assert not store._on_thread
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 0


async def test_a_new_file_is_created_without_waiting_for_the_disk_then_commits_normal(
        tmp_path: Path) -> None:
    # A new, empty file is created (WAL switch, schema) with synchronous=OFF: nothing in it
    # yet to lose. Every commit after that runs with the durability asked for.
    for durability, expected in (("process", 1), ("fsync", 2)):
        path = tmp_path / f"{durability}.db"
        store = Store.open(path, durability=durability)
        assert isinstance(store, SQLiteStore)
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == expected
        # The reader's connection folds the log: its commits are the store's durability too.
        assert store._reader.execute("PRAGMA synchronous").fetchone()[0] == expected
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        await store.write(Batch(run=_run("r1")))
        await store.close()
        again = Store.open(path, durability=durability)
        assert isinstance(again, SQLiteStore)
        assert again._db.execute("PRAGMA synchronous").fetchone()[0] == expected
        assert again._reader.execute("PRAGMA synchronous").fetchone()[0] == expected
        assert [r.id for r in await again.runs()] == ["r1"]
        await again.close()


async def test_opening_a_current_store_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    Store.open(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock is taken: an open that wrote would wait
    # With no busy timeout, an open that tried to write (a migration, a pragma that writes)
    # fails at once with "database is locked" instead of waiting for the lock.
    store = SQLiteStore(path, busy_timeout=0)
    other.execute("ROLLBACK")
    other.close()
    await store.close()


async def test_a_store_reopens_at_once_after_close(tmp_path: Path) -> None:
    # Closing does not wait for the last connection's checkpoint; an open that meets it
    # waits for the lock like any open, it does not fail.
    path = tmp_path / "runs.db"
    for i in range(5):
        store = Store.open(path)
        await store.write(Batch(run=_run(f"r{i}")))
        await store.close()
    async with Store.open(path) as store:
        assert len(await store.runs()) == 5


async def test_reads_see_writes_queued_without_waiting(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "runs.db") as store:
        await store.write(Batch(run=_run("r0")), wait=False)
        assert (await store.run("r0")).id == "r0"


async def test_fsync_durability_commits_with_synchronous_full(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "runs.db", durability="fsync") as store:
        assert isinstance(store, SQLiteStore)
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        writes = [lambda i=i: store.write(Batch(run=_run(f"w{i}"))) for i in range(20)]
        assert await _concurrently(*writes) == [None] * 20
        assert len(await store.runs()) == 20
    with pytest.raises(ConfigError, match="durability"):
        Store.open(tmp_path / "runs.db", durability="sometimes")  # type: ignore[arg-type]


def test_a_0001_database_is_migrated_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "applied_at REAL NOT NULL)")
    MIGRATIONS[0][1](db)
    db.execute("INSERT INTO _migrations VALUES (1, ?, 0)", (MIGRATIONS[0][0],))
    db.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
               "VALUES ('r1', 't', 'completed', 1, 1)")
    db.execute("INSERT INTO messages VALUES ('r1', 0, '{\"k\": 0}')")
    db.execute("INSERT INTO calls (id, run_id, call_id, turn, idx, model_name, arguments, "
               "actions, status, answers) VALUES ('r1:c', 'r1', 'c', 0, 0, 'x', '{}', '[]', "
               "'finished', '[]')")
    db.close()

    async def check() -> None:
        async with Store.open(path) as store:
            assert (await store.run("r1")).task == "t"
            assert await store.messages("r1") == [{"k": 0}]
            assert [c.id for c in await store.calls("r1")] == ["r1:c"]

    anyio.run(check)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    sql = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    # Clustered by 0002, rowid tables again since 0006 (the fold's bulk inserts).
    assert "WITHOUT ROWID" not in sql["calls"] and "WITHOUT ROWID" not in sql["messages"]
    assert "log" in sql
    db.close()


def test_a_0005_database_keeps_its_rows_and_its_unfolded_log_through_0006(tmp_path: Path
                                                                         ) -> None:
    """0006 rebuilds `calls` and `messages` as rowid tables: every row comes along, and what
    the log still holds (written before the upgrade, not folded yet) folds into them after."""
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "applied_at REAL NOT NULL)")
    for i, (name, migrate) in enumerate(MIGRATIONS[:5], start=1):
        migrate(db)
        db.execute("INSERT INTO _migrations VALUES (?, ?, 0)", (i, name))
    db.execute("PRAGMA user_version = 5")
    assert "WITHOUT ROWID" in db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'calls'").fetchone()[0]
    db.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
               "VALUES ('r1', 't', 'running', 1, 1)")
    for seq in range(3):
        db.execute("INSERT INTO messages VALUES ('r1', ?, ?)", (seq, f'{{"k": {seq}}}'))
    call = ("INSERT INTO {} ({}) VALUES ({})")
    db.execute(call.format("calls", "id, run_id, call_id, turn, idx, model_name, arguments, "
                           "actions, status, answers, provenance",
                           "'r1:a', 'r1', 'a', 0, 0, 'x', '{}', '[]', 'finished', '[]', "
                           "'{\"output\": \"trusted\"}'"))
    # Unfolded: a message and a second call record, and a newer record of the first.
    db.execute("INSERT INTO log (kind, run_id, c0, c1) VALUES (0, 'r1', 3, '{\"k\": 3}')")
    for record_id, call_id, status in (("r1:b", "b", "started"), ("r1:a", "a", "in_doubt")):
        db.execute(
            "INSERT INTO log (kind, run_id, c0, c1, c2, c3, c4, c5, c6, c7, c10, c14, c18) "
            "VALUES (1, 'r1', ?, 'r1', ?, 1, 0, 'x', 't/x', '{}', '[]', ?, '[]')",
            (record_id, call_id, status))
    db.close()

    async def check() -> None:
        async with Store.open(path) as store:
            assert await store.messages("r1") == [{"k": 0}, {"k": 1}, {"k": 2}, {"k": 3}]
            calls = {c.id: c for c in await store.calls("r1")}
            assert sorted(calls) == ["r1:a", "r1:b"]
            assert calls["r1:a"].status.value == "in_doubt"
            assert calls["r1:b"].tool == "t/x"

    anyio.run(check)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 6
    sql = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    assert "WITHOUT ROWID" not in sql["calls"] and "WITHOUT ROWID" not in sql["messages"]
    assert db.execute("SELECT count(*) FROM log").fetchone() == (0,)
    db.close()


async def test_the_log_is_folded_into_the_tables_for_every_reader(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = Store.open(path)
    await store.write(Batch(run=_run("r1"), messages=[("r1", 0, {"k": 0})]))
    from handrail.store import CallRecord

    first = CallRecord(id="r1:c", run_id="r1", call_id="c", turn=0, index=0, model_name="x")
    await store.write(Batch(calls=[first], messages=[("r1", 1, {"k": 1})]))
    second = CallRecord(id="r1:c", run_id="r1", call_id="c", turn=0, index=0, model_name="x",
                        error="later")
    await store.write(Batch(calls=[second], messages=[("r1", 1, {"k": "1b"})]))
    # Another process's reader (plain SQL) sees nothing yet: the writes are in the log.
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM calls").fetchone()[0] == 0
    # A reader through the store folds the log first; the later record wins.
    other = Store.open(path)
    assert [c.error for c in await other.calls("r1")] == ["later"]
    assert await other.messages("r1") == [{"k": 0}, {"k": "1b"}]
    await other.close()
    await store.write(Batch(messages=[("r1", 2, {"k": 2})]))
    await store.close()
    # Closing folds what is left: the tables are complete for plain SQL.
    assert db.execute("SELECT count(*) FROM log").fetchone()[0] == 0
    assert db.execute("SELECT error FROM calls").fetchall() == [("later",)]
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 3
    db.close()


def test_backends_come_from_the_registry() -> None:
    made: list[tuple[str, str]] = []

    def factory(url: str, durability: Any) -> Store:
        made.append((url, durability))
        return Store.memory()

    register_backend("testing", factory)
    assert Store.open("testing://x", durability="fsync") is not None
    assert made == [("testing://x", "fsync")]
    with pytest.raises(ConfigError, match="unknown store URL"):
        Store.open("nosuch://x")


def test_the_contract_imports_no_backend() -> None:
    code = ("import sys, handrail.store.contract; "
            "print(sorted(m for m in sys.modules if m.startswith('handrail.store._') "
            "and m not in ('handrail.store._base', 'handrail.store._records')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_a_store_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "runs.db")

    async def first() -> None:
        await store.write(Batch(run=_run("r1")))
        await store.write(Batch(run=_run("r2")), wait=False)

    async def second() -> None:
        assert {r.id for r in await store.runs()} == {"r1", "r2"}
        await store.write(Batch(run=_run("r3")))
        await store.close()

    anyio.run(first)
    anyio.run(second)
    db = sqlite3.connect(tmp_path / "runs.db")
    assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    db.close()


def test_a_fold_cycle_cut_short_by_the_loops_end_does_not_stop_the_next_loops_folds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold's checkpoint hands back to the loop that asked for it; when that loop is gone
    (its `anyio.run` ended meanwhile) the hand-back never comes, and the store, which does
    not fold while a cycle is under way, must not wait for it on the next loop."""
    from handrail.store import _sqlite

    folds = _counting(monkeypatch, "_fold_rows")
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 30)
    store = Store.open(tmp_path / "runs.db")
    assert isinstance(store, SQLiteStore)

    async def first() -> None:
        await store.write(Batch(run=_run("r0")))
        store._checkpointing = True  # a cycle under way, its hand-back lost with this loop

    async def second() -> None:
        await _fold_once(store, 40, "s")
        await store.close()

    anyio.run(first)
    anyio.run(second)
    assert folds, "the second loop never folded"


async def test_a_group_resumes_its_writers_a_few_per_loop_iteration(tmp_path: Path) -> None:
    """Issue 24: 100 runs sharing a commit must not all do their next turn in one iteration.

    Every waiter resumed by a commit runs its run's next step in the same loop iteration, and
    anything else on the loop (a timer, a web request) waits for the whole iteration. Released
    all at once, a group of 16 made each iteration ~4 ms of CPU at 100 runs; the store resumes
    at most `RELEASE_PER_ITERATION` per iteration, the rest in the next ones.
    """
    from handrail.store._sqlite import RELEASE_PER_ITERATION

    async with Store.open(tmp_path / "runs.db") as store:
        async def write(i: int, mark: Callable[[], None]) -> None:
            await store.write(Batch(run=_run(f"r{i}")))
            mark()

        per_iteration = await resumed_per_iteration(
            [functools.partial(write, i) for i in range(40)])
        assert len(await store.runs(limit=100)) == 40
    assert sum(per_iteration) == 40
    assert max(per_iteration) <= RELEASE_PER_ITERATION, per_iteration


async def test_a_queued_write_holds_few_objects_the_collector_walks(tmp_path: Path) -> None:
    """Issue 24: with many runs, every run's write waits a few loop iterations for its group.

    Long enough to survive a young collection: whatever a queued write holds is walked by the
    older passes, whose length is the loop's worst lag. A write used to hold a closure (a
    function and a cell per variable) and lists of rows: 10 tracked objects; its rows are
    now flat tuples of strings and numbers, which the collector stops tracking (3-4).
    """
    import gc

    async with Store.open(tmp_path / "runs.db") as store:
        runs = [_run(f"r{i}") for i in range(101)]
        await store.write(Batch(run=runs[0], messages=[("r0", 0, {"k": [0]})]))
        gc.collect()
        before = len(gc.get_objects())
        for run in runs[1:]:
            # wait=False: queued, not committed, until this task yields.
            await store.write(Batch(run=run, messages=[(run.id, 0, {"k": [1, 2]})]),
                              wait=False)
        gc.collect()
        gc.collect()  # a tuple is untracked once a pass finds only untracked items in it
        held = len(gc.get_objects()) - before
        # Its operation, a partial and the partial's arguments (which name the run's record).
        assert held <= 5 * 100, f"{held / 100:.1f} tracked objects per queued write"
        await store.flush()
        assert len(await store.messages("r100")) == 1


async def test_the_store_forgets_a_run_once_it_leaves_the_process(tmp_path: Path) -> None:
    # A long-lived server (handrail serve, worker) writes many runs through one store: what
    # the store keeps per run to write it cheaply goes when the run ends or pauses.
    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        for i in range(20):
            run = _run(f"r{i}", status=RunStatus.RUNNING)
            await store.write(Batch(run=run))
            await store.write(Batch(run=run))
            run.status = RunStatus.READY  # handed back (an end or a pause alike)
            await store.write(Batch(run=run))
        assert store._runs_written == {}
        # Written again (resumed): stored whole, as the UPDATE it is.
        run = _run("r3", status=RunStatus.RUNNING)
        run.steps = 7
        await store.write(Batch(run=run))
        assert (await store.run("r3")).steps == 7
        assert len(await store.runs(limit=100)) == 20


async def test_a_running_runs_next_write_commits_two_pages(tmp_path: Path) -> None:
    """A turn's write commits the run's row page and the log's page, nothing more.

    An UPDATE naming the run's status re-files the row in the `runs_status` index even when
    the status stays the same: one more page in every commit's WAL write (3 instead of 2 for
    a lone run's turn). A change of status is still stored, whichever way it goes.
    """
    path = tmp_path / "runs.db"
    async with Store.open(path) as store:
        run = _run("r1", status=RunStatus.RUNNING)
        await store.write(Batch(run=run, messages=[("r1", 0, {"k": 0})]))
        frames = []
        for i in range(1, 4):
            _wal_frames(path)  # all copied into the file: the next commit restarts the WAL
            run.steps = i
            await store.write(Batch(run=run, messages=[("r1", i, {"k": i})]))
            frames.append(_wal_frames(path))
        assert min(frames) == 2, frames
        for status in (RunStatus.READY, RunStatus.RUNNING, RunStatus.READY):
            run.status, run.steps = status, run.steps + 1
            await store.write(Batch(run=run))
            stored = await store.run("r1")
            assert (stored.status, stored.steps) == (status, run.steps)
        # A running run pauses (an outcome), resumes (none), pauses again.
        for request in ("p1", "p2"):
            for _ in range(2):
                run.status, run.outcome = RunStatus.RUNNING, None
                run.steps += 1
                await store.write(Batch(run=run))
            assert (await store.run("r1")).outcome is None
            # The row says more than the record (changed outside, say): the next write of
            # the record leaves the row as the record says, whatever it held.
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("UPDATE runs SET outcome = '{}' WHERE id = 'r1'")
            other.close()
            await store.write(Batch(run=run))
            assert (await store.run("r1")).outcome is None
            run.status = RunStatus.AWAITING_APPROVAL
            run.outcome = {"kind": "awaiting_approval", "request_id": request}
            run.steps += 1
            await store.write(Batch(run=run))
            stored = await store.run("r1")
            assert (stored.status, stored.outcome, stored.steps) == (
                run.status, run.outcome, run.steps)
        run.status, run.outcome = RunStatus.RUNNING, None
        for steps in (20, 21):  # written again after it left the process: its whole row
            run.steps = steps
            await store.write(Batch(run=run))
            stored = await store.run("r1")
            assert (stored.status, stored.steps, stored.task, stored.outcome) == (
                RunStatus.RUNNING, steps, "t", None)


async def test_none_in_any_field_of_a_call_record_reads_back_in_its_place(tmp_path: Path
                                                                          ) -> None:
    """A call record's None values are written as NULL in the INSERT's text, not bound.

    One INSERT per shape of a write's rows (which of their values are None): each record,
    with a different field None, must read back with every value in its own column, in one
    write beside messages, and in writes of their own.
    """
    from handrail.store import CallRecord, CallStatus

    full = CallRecord(id="r1:c", run_id="r1", call_id="c", turn=1, index=2, model_name="m",
                      tool="t/x", arguments='{"a": 1}', arguments_digest="sha256:cd",
                      performed_arguments={"a": 1}, actions=[{"act": "read"}],
                      verdict={"effect": "ask"}, decision={"kind": "approve"},
                      decided_by="ops", status=CallStatus.FINISHED, result={"is_error": False},
                      disposition="landed", error="e", answers=[{"v": 1}], pending_id="p1",
                      started_at=7.0, ended_at=8.0, provenance={"output": "trusted"})
    nullable = [f.name for f in dataclasses.fields(CallRecord)
                if f.default is None and getattr(full, f.name) is not None]
    assert len(nullable) >= 10, nullable
    records = [dataclasses.replace(full, id=f"r1:{name}", call_id=name, **{name: None})
               for name in nullable]
    records.append(dataclasses.replace(full, id="r1:none", call_id="none",
                                       **dict.fromkeys(nullable)))
    records.append(dataclasses.replace(full, id="r1:empty", call_id="empty", actions=[],
                                       answers=[], result={}))
    async with Store.open(tmp_path / "runs.db") as store:
        await store.write(Batch(run=_run("r1"), calls=records[:5],
                                messages=[("r1", 0, {"k": None}), ("r1", 1, {"k": 1})]))
        for record in records[5:]:
            await store.write(Batch(calls=[record], messages=[("r1", 2, {"k": 2})]))
        assert {r.id: r for r in await store.calls("r1")} == {r.id: r for r in records}
        assert await store.messages("r1") == [{"k": None}, {"k": 1}, {"k": 2}]


async def test_a_lone_write_takes_one_loop_iteration(tmp_path: Path) -> None:
    """A write on an idle store yields once and finds itself committed, as a memory store's.

    Its group's commit is scheduled before the writer's resumption, so both happen in the
    next iteration: one iteration a write instead of two (a commit, then a wake-up), each
    ~40,000 instructions of a lone run's turn. Its failure still reaches its writer.
    """
    async with Store.open(tmp_path / "runs.db") as store:
        run = _run("r1")
        await store.write(Batch(run=run))
        async with counting_iterations() as ticks:
            start = ticks.count
            for i in range(20):
                run.steps = i
                await store.write(Batch(run=run, messages=[("r1", i, {"k": i})]))
            spent = ticks.count - start
        assert spent <= 22, spent
        assert (await store.run("r1")).steps == 19
        assert len(await store.messages("r1")) == 20
        with pytest.raises(StoreError, match="FOREIGN KEY"):
            await store.write(Batch(messages=[("no-such-run", 0, {"k": 1})]))
        await store.write(Batch(run=run, messages=[("r1", 20, {"k": 20})]))
        assert len(await store.messages("r1")) == 21
        # Its commit fails: the writer hears of it.
        assert isinstance(store, SQLiteStore)
        real = store._db
        store._db = _CommitFails(real)  # type: ignore[assignment]
        with pytest.raises(StoreError, match="rolled back"):
            await store.write(Batch(run=run, messages=[("r1", 21, {"k": 21})]))
        store._db = real
        # Another connection holds the lock: its group goes to the thread, and the writer
        # returns only once that has committed.
        other = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        done = anyio.Event()

        async def write() -> None:
            await store.write(Batch(run=run, messages=[("r1", 22, {"k": 22})]))
            done.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
                for _ in range(50):
                    await anyio.lowlevel.checkpoint()
                assert not done.is_set()
                other.execute("COMMIT")
                await done.wait()
        other.close()
        assert len(await store.messages("r1")) == 22


class _CountsGroups:
    """A connection that records how many runs each transaction inserts."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.groups: list[int] = []

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "BEGIN IMMEDIATE":
            self.groups.append(0)
        elif sql.startswith("INSERT INTO runs"):
            self.groups[-1] += 1
        return self.db.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> Any:
        rows = list(rows)
        if sql.startswith("INSERT INTO runs"):
            self.groups[-1] += len(rows)  # a group's new runs, merged (`_apply_writes`)
        return self.db.executemany(sql, rows)

    def cursor(self) -> Any:
        return self  # (the writer runs BEGIN and COMMIT through a reused cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_group_on_the_loop_holds_at_most_loop_group_limit_writes(tmp_path: Path
                                                                         ) -> None:
    """A commit on the event loop is bounded: the writes beyond the limit go in later groups."""
    from handrail.store._sqlite import LOOP_GROUP_LIMIT

    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        await store.write(Batch(run=_run("first")))
        counting = _CountsGroups(store._db)
        store._db = counting  # type: ignore[assignment]
        writes = [lambda i=i: store.write(Batch(run=_run(f"r{i}")))
                  for i in range(3 * LOOP_GROUP_LIMIT)]
        assert await _concurrently(*writes) == [None] * len(writes)
        store._db = counting.db
        assert len(await store.runs(limit=1000)) == 3 * LOOP_GROUP_LIMIT + 1
    assert sum(counting.groups) == 3 * LOOP_GROUP_LIMIT
    assert max(counting.groups) == LOOP_GROUP_LIMIT, counting.groups


class _CountsCursors:
    """A connection that records the statements run on it and the cursors made of it."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.statements: list[str] = []
        self.cursors = 0

    def execute(self, sql: str, *args: Any) -> Any:
        self.statements.append(sql)
        return self.db.execute(sql, *args)

    def cursor(self) -> Any:
        self.cursors += 1
        return self.db.cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_a_write_begins_and_commits_through_one_reused_cursor(tmp_path: Path) -> None:
    """A write's statements go through the writer's cursor, made once (issue 38).

    `Connection.execute` makes a cursor a statement, tracked by a weak reference until the
    connection's next sweep: a few thousand instructions a statement, two every write.
    """
    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        run = _run("r1")
        await store.write(Batch(run=run))
        counting = _CountsCursors(store._db)
        store._db = counting  # type: ignore[assignment]
        for i in range(3):
            run.steps = i + 1
            await store.write(Batch(run=run, messages=[("r1", i, {"k": i})]))
        store._db = counting.db
        # (Nor a turn's own statements: its progress and its log rows.)
        assert not [sql for sql in counting.statements
                    if sql.startswith(("BEGIN", "COMMIT", "INSERT"))], counting.statements
        assert counting.cursors == 1
        assert (await store.run("r1")).steps == 3
        assert len(await store.messages("r1")) == 3


async def test_a_lone_write_on_an_idle_loop_commits_without_yielding(tmp_path: Path) -> None:
    """Nothing else on the loop could run: the write commits at once, without a yield.

    With no callback ready, no timer due, and a yield less than `YIELD_HOLD_SECONDS` ago, the
    iteration a yield would end has nothing else in it (the memory store's pacer follows the
    same rule). Past the hold, or with something else ready, the write yields as before.
    """
    import asyncio

    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        run = _run("r1")
        await store.write(Batch(run=run))
        loop = asyncio.get_running_loop()
        scheduled = 0
        original = loop.call_soon

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal scheduled
            scheduled += 1
            return original(*args, **kwargs)

        async def writes(first: int, hold: bool,
                         timer: Callable[[int], None] | None = None) -> int:
            nonlocal scheduled
            scheduled = 0
            loop.call_soon = counting  # type: ignore[method-assign]
            try:
                for i in range(first, first + 10):
                    # Just yielded (within the hold), or long ago.
                    store._resumed_at = loop.time() if hold else float("-inf")
                    if timer is not None:
                        loop.call_at(loop.time() - 1, timer, i)
                    run.steps = i
                    await store.write(Batch(run=run, messages=[("r1", i, {"k": i})]))
            finally:
                del loop.call_soon
            return scheduled

        # (The first may find the test's own callbacks still ready.)
        assert await writes(0, hold=True) <= 2
        assert await writes(10, hold=False) >= 20  # its commit, then its resumption
        stored = await store.run("r1")
        assert stored.steps == 19
        assert len(await store.messages("r1")) == 20
        # A timer due: the write yields to it.
        fired: list[int] = []
        assert await writes(30, hold=True, timer=fired.append) >= 20
        await anyio.lowlevel.checkpoint()
        assert fired == list(range(30, 40))
        # Another task ready: each write yields to it, hold or not.
        async with counting_iterations() as ticks:
            before = ticks.count
            for i in range(40, 50):
                store._resumed_at = loop.time()
                await store.write(Batch(messages=[("r1", i, {"k": i})]))
            assert ticks.count - before >= 10


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Wrap `handrail.store._sqlite.<name>` (a function of the connection) to count its calls."""
    from handrail.store import _sqlite

    calls: list[int] = []
    original = getattr(_sqlite, name)

    def counted(db: sqlite3.Connection) -> None:
        original(db)
        calls.append(1)

    monkeypatch.setattr(_sqlite, name, counted)
    return calls


def _spy_merged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of each group written merged (`_apply_writes`) that went through:
    one that raised was written again a write at a time, and is not counted."""
    from handrail.store import _sqlite

    sizes: list[int] = []
    original = _sqlite._apply_writes

    def spy(db: sqlite3.Connection, writes: list[Any]) -> None:
        original(db, writes)
        sizes.append(len(writes))

    monkeypatch.setattr(_sqlite, "_apply_writes", spy)
    return sizes


async def _contents(store: Store, run_ids: list[str]) -> dict[str, Any]:
    """Everything the store holds of these runs, as a reader sees it."""
    return {run_id: (await store.run(run_id), await store.messages(run_id),
                     sorted(await store.calls(run_id), key=lambda c: c.id))
            for run_id in run_ids} | {"pending": await store.pending()}


@pytest.mark.parametrize(("update_from", "merged_rows"), [(True, 64), (True, 5), (False, 64)],
                         ids=["update-from", "update-from-in-chunks-of-5", "executemany"])
async def test_a_merged_group_stores_what_each_write_alone_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, update_from: bool,
        merged_rows: int) -> None:
    """Writes of distinct runs committed together share one statement per kind of row.

    New runs (their whole row), running runs' turns, a pause with its outcome and pending
    item, call records with None fields, several messages: written merged in one group, the
    store holds exactly what it holds when each is written alone. Runs' rows are updated by
    UPDATE ... FROM (VALUES ...) (or, on SQLite before 3.33, executemany), their progress by
    one INSERT, each for up to MERGED_ROWS runs.
    """
    from handrail.store import CallRecord, CallStatus, _sqlite

    if update_from and not _sqlite._UPDATE_FROM:
        pytest.skip(f"SQLite {sqlite3.sqlite_version} has no UPDATE ... FROM")
    monkeypatch.setattr(_sqlite, "_UPDATE_FROM", update_from)
    # A merged statement takes MERGED_ROWS rows at most (a group on the store's thread holds
    # every write queued): with 5, twelve writes go in statements of 5, 5 and 2.
    monkeypatch.setattr(_sqlite, "MERGED_ROWS", merged_rows)

    def batches(round_: int) -> list[Batch]:
        out = []
        for i in range(12):
            run = RunRecord(id=f"r{i}", task="t", status=RunStatus.RUNNING,
                            created_at=1.0 + i)
            # Every column the UPDATE sets holds its own value: a mix-up shows. Round 1 is a
            # turn (only progress changes: beside the rows), round 2 rewrites every row (new
            # remembered rules and events), some with a pause.
            run.steps = round_
            run.updated_at = 100.0 + round_
            run.input_tokens, run.output_tokens = 10 * i + round_, 20 * i + round_
            run.model_requests = 30 + round_
            run.remembered = [{"pattern": f"p{i}.{int(round_ >= 2)}"}]
            run.events = [{"event": f"e{i}.{int(round_ >= 2)}"}]
            run.owner, run.lease_until = f"host:{i}", 1000.0 + i + round_
            calls = [CallRecord(id=f"r{i}:c{round_}", run_id=f"r{i}", call_id=f"c{round_}",
                                turn=round_, index=0, model_name="m", tool="t/x",
                                arguments='{"a": 1}',
                                status=CallStatus.FINISHED, result={"n": i},
                                verdict=None if i % 2 else {"effect": "allow"},
                                started_at=1.0, ended_at=None if i % 3 else 2.0)]
            pending = []
            if round_ == 2 and i % 4 == 0:  # some pause, waiting for a person
                run.status = RunStatus.AWAITING_APPROVAL
                run.outcome = {"kind": "awaiting_approval", "request_id": f"p{i}"}
                pending = [PendingItem(id=f"p{i}", kind="approval", run_id=f"r{i}",
                                       call_record=f"r{i}:c2", created_at=3.0)]
            out.append(Batch(run=run, calls=calls, pending=pending, messages=[
                (f"r{i}", 2 * round_, {"turn": round_, "i": i}),
                (f"r{i}", 2 * round_ + 1, {"result": i, "none": None})]))
        return out

    rounds = [batches(r) for r in range(3)]
    ids = [f"r{i}" for i in range(12)]
    async with Store.open(tmp_path / "alone.db") as store:
        for batch_list in rounds:
            for batch in batch_list:
                await store.write(batch)
        alone = await _contents(store, ids)
    merged = _spy_merged(monkeypatch)
    async with Store.open(tmp_path / "merged.db") as store:
        for batch_list in [batches(r) for r in range(3)]:
            out = await _concurrently(*[functools.partial(store.write, b) for b in batch_list])
            assert out == [None] * 12
        together = await _contents(store, ids)
    assert merged == [12, 12, 12]
    assert together == alone
    assert together["r0"][0].status is RunStatus.AWAITING_APPROVAL
    assert [p.id for p in together["pending"]] == ["p0", "p4", "p8"]


@pytest.mark.parametrize("turn", ["progress", "rewrite"])
async def test_a_row_changed_by_another_process_is_written_as_the_record_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn: str) -> None:
    """A merged write that finds a run's row not as this process left it is not taken.

    Another process paused r3 meanwhile: the group's statement (the runs' progress beside
    their rows, or their rows rewritten when more than progress changed) matches one row
    fewer than it has writes, and the group is written again one write at a time (each of
    which knows what to do with a row that differs): every run ends as its record says.
    """
    path = tmp_path / "runs.db"
    merged = _spy_merged(monkeypatch)
    async with Store.open(path) as store:
        runs = [_run(f"r{i}", status=RunStatus.RUNNING) for i in range(6)]
        await _concurrently(*[functools.partial(store.write, Batch(run=r)) for r in runs])
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("UPDATE runs SET status = 'awaiting_approval', steps = 99 "
                      "WHERE id = 'r3'")
        other.close()
        for r in runs:
            r.steps = 5
            if turn == "rewrite":
                r.remembered = [{"pattern": "new"}]
        out = await _concurrently(*[functools.partial(store.write, Batch(run=r))
                                    for r in runs])
        assert out == [None] * 6
        assert merged == [6]  # the second group matched five rows of six: written alone
        for r in runs:
            stored = await store.run(r.id)
            assert (stored.status, stored.steps, stored.remembered) == (
                RunStatus.RUNNING, 5, r.remembered), r.id


async def test_two_writes_of_one_run_in_a_group_are_written_in_their_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's write(wait=False) and its next write can meet in one group: never merged.

    Merged, the second write's whole row (the run came back after a pause) would go in
    before the first's UPDATE and be overwritten by it.
    """
    merged = _spy_merged(monkeypatch)
    async with Store.open(tmp_path / "runs.db") as store:
        run = _run("r1", status=RunStatus.RUNNING)
        await store.write(Batch(run=run))
        others = [_run(f"o{i}") for i in range(3)]

        async def pause_then_resume() -> None:
            run.status, run.steps = RunStatus.READY, 1
            await store.write(Batch(run=run, messages=[("r1", 0, {"v": "first"})]),
                              wait=False)
            run.status, run.steps = RunStatus.RUNNING, 2
            await store.write(Batch(run=run, messages=[("r1", 0, {"v": "second"})]))

        out = await _concurrently(
            *[functools.partial(store.write, Batch(run=o)) for o in others],
            pause_then_resume)
        assert out == [None] * 4
        stored = await store.run("r1")
        assert (stored.status, stored.steps) == (RunStatus.RUNNING, 2)
        assert await store.messages("r1") == [{"v": "second"}]
        assert 4 not in merged and 5 not in merged, merged


async def test_the_log_is_folded_every_checkpoint_every_writes_however_they_are_grouped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold comes after so many writes, not so many commits: with groups of tens of
    writes a count of commits would let the log, and the fold every writer waits for, grow
    as many times larger."""
    from handrail.store import _sqlite

    folds: list[int] = []
    fold_rows = _sqlite._fold_rows

    def counted(db: sqlite3.Connection) -> None:
        folds.append(db.execute("SELECT count(*) FROM log WHERE kind = 0").fetchone()[0])
        fold_rows(db)

    monkeypatch.setattr(_sqlite, "_fold_rows", counted)
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 50)
    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        for round_ in range(3):
            writes = [functools.partial(store.write, Batch(
                run=_run(f"r{round_}-{i}"), messages=[(f"r{round_}-{i}", 0, {"i": i})]))
                for i in range(40)]
            assert await _concurrently(*writes) == [None] * 40
            await store.flush()
            with anyio.fail_after(10):
                while store._checkpointing:  # noqa: ASYNC110 - the fold and its checkpoints
                    await anyio.sleep(0.01)  # run on the store's thread: nothing to wait on
        # 120 writes (and a flush after each 40) in a few groups of up to 40: one fold,
        # of the 80 messages written by then.
        assert folds == [80]


async def test_the_wal_starts_over_after_each_fold_under_steady_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint after a fold runs beside the writers, which append meanwhile; the
    writer then copies what they added, and the next commit starts the WAL over. Without
    that last step SQLite never found every frame copied while writes went on, and the WAL
    grew by a fold cycle's size every cycle (issue 24: 75, 147, 224 MB after three)."""
    from handrail.store import _sqlite

    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 200)
    path = tmp_path / "runs.db"
    restarts = _counting(monkeypatch, "_restart_wal")
    sizes: list[int] = []
    async with Store.open(path) as store:
        assert isinstance(store, SQLiteStore)

        async def writer(k: int) -> None:
            # Until five cycles have ended in a restart. How many writes a cycle spans
            # depends on how fast the checkpoint thread runs beside them (a fast machine
            # wrote 3,000 in four cycles; a loaded one fewer): a count of cycles, not of
            # writes, is what the WAL's bound is about. The cap only ends a broken run.
            run = _run(f"r{k}", status=RunStatus.RUNNING)
            for i in range(1_500):
                if len(restarts) >= 5:
                    return
                run.steps = i
                await store.write(Batch(run=run, messages=[(f"r{k}", i, {"text": "x" * 400})]))
                if k == 0 and i % 10 == 0:
                    sizes.append((path.parent / "runs.db-wal").stat().st_size)

        async with anyio.create_task_group() as tg:
            for k in range(20):
                tg.start_soon(writer, k)
    # A fold every 200 writes: the WAL holds one cycle at most, not all of them.
    assert len(restarts) >= 5, f"{len(restarts)} restarts in 30,000 writes"
    first_cycle = max(sizes[:3])
    assert max(sizes) < 4 * max(first_cycle, 1), sizes


async def _fold_once(store: SQLiteStore, writes: int, prefix: str) -> None:
    """Write `writes` runs concurrently (a fold comes due), then wait for the upkeep."""
    out = await _concurrently(*[functools.partial(store.write, Batch(
        run=_run(f"{prefix}{i}"), messages=[(f"{prefix}{i}", 0, {"i": i})]))
        for i in range(writes)])
    assert out == [None] * writes
    await store.flush()
    with anyio.fail_after(10):
        while store._checkpointing:  # noqa: ASYNC110 - the fold and its checkpoints
            await anyio.sleep(0.01)  # run on the store's thread: nothing to wait on


async def test_the_writer_checks_foreign_keys_again_after_its_fold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer folds with its foreign-key checks off (each log row was checked when it
    was written): they are on again for the next write, which still may not name a run
    that is not there."""
    from handrail.store import _sqlite

    folds: list[int] = []
    fold_rows = _sqlite._fold_rows

    def counted(db: sqlite3.Connection) -> None:
        assert db.execute("PRAGMA foreign_keys").fetchone() == (0,)
        fold_rows(db)
        folds.append(1)

    monkeypatch.setattr(_sqlite, "_fold_rows", counted)
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 30)
    async with Store.open(tmp_path / "runs.db") as store:
        assert isinstance(store, SQLiteStore)
        await _fold_once(store, 40, "r")
        assert folds == [1]
        with pytest.raises(StoreError, match="FOREIGN KEY"):
            await store.write(Batch(messages=[("no-such-run", 0, {"k": 1})]))
        assert len(await store.messages("r3")) == 1


async def test_a_failed_fold_fails_no_write_and_the_next_one_folds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold is the writer's upkeep, in a transaction of its own: when it fails (a full
    disk, say), the writes queued behind it in its group still commit, and the next fold
    moves the log."""
    from handrail.store import _sqlite

    calls: list[str] = []
    fold_rows = _sqlite._fold_rows

    def fails_once(db: sqlite3.Connection) -> None:
        if not calls:
            calls.append("failed")
            raise sqlite3.OperationalError("disk I/O error")
        fold_rows(db)
        calls.append("folded")

    behind: list[int] = []
    on_thread = SQLiteStore._group_on_thread

    def spy(self: SQLiteStore, ops: list[Any]) -> list[tuple[bool, Any]]:
        if ops[0].fn is fails_once:
            behind.append(len(ops) - 1)
        return on_thread(self, ops)

    monkeypatch.setattr(_sqlite, "_fold_rows", fails_once)
    monkeypatch.setattr(_sqlite, "CHECKPOINT_EVERY", 150)
    monkeypatch.setattr(SQLiteStore, "_group_on_thread", spy)
    path = tmp_path / "runs.db"
    async with Store.open(path) as store:

        async def writer(k: int) -> None:
            run = _run(f"r{k}", status=RunStatus.RUNNING)
            for i in range(4):
                await store.write(Batch(run=run, messages=[(f"r{k}", i, {"i": i})]))

        async with anyio.create_task_group() as tg:
            for k in range(100):
                tg.start_soon(writer, k)
        assert calls[:1] == ["failed"], calls
        assert behind[0] > 0, behind  # writes went in the failed fold's group
        assert isinstance(store, SQLiteStore)
        await _fold_once(store, 160, "later")  # the next fold comes due, and folds
        assert calls[:2] == ["failed", "folded"], calls
        assert len(await store.runs(limit=1000)) == 260
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (560,)
    finally:
        db.close()


def _row(path: Path, run_id: str) -> tuple[Any, ...]:
    """The run's row as plain SQL reads it: steps, tokens, lease, status."""
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT steps, input_tokens, lease_until, status FROM runs WHERE id = ?",
                         (run_id,)).fetchone()
        assert row is not None
        return tuple(row)
    finally:
        db.close()


async def test_a_turns_progress_is_written_beside_the_run_row_and_read_over_it(
        tmp_path: Path) -> None:
    """A running run's turn changes only its progress (steps, tokens, requests, lease,
    updated_at): written to `run_progress`, not into its ~1 KB row (issue 24: the rows of
    100 runs were most of what a group's commit wrote). Every read through a store sees it
    at once; plain SQL sees it in `runs` once the log is folded (on close at the latest)."""
    path = tmp_path / "runs.db"
    async with Store.open(path) as store:
        run = _run("r1", status=RunStatus.RUNNING, owner="host:1:a", policy={"layers": []})
        await store.write(Batch(run=run))
        for step in range(1, 4):
            run.steps, run.input_tokens, run.lease_until = step, 10 * step, 1000.0 + step
            run.updated_at = 50.0 + step
            await store.write(Batch(run=run, messages=[("r1", step, {"s": step})]))
        stored = await store.run("r1")
        assert (stored.steps, stored.input_tokens, stored.lease_until, stored.updated_at) == (
            3, 30, 1003.0, 53.0)
        assert [r.steps for r in await store.runs()] == [3]
        assert _row(path, "r1")[:3] == (0, 0, 0.0)  # the row as first written
        # A change of status is written into the row, with the progress of the moment; no
        # older progress hides it.
        run.status, run.steps = RunStatus.AWAITING_APPROVAL, 4
        run.outcome = {"kind": "awaiting_approval", "request_id": "p1"}
        await store.write(Batch(run=run))
        stored = await store.run("r1")
        assert (stored.status, stored.steps, stored.input_tokens) == (
            RunStatus.AWAITING_APPROVAL, 4, 30)
        # Running again (a resume): progress beside the row once more.
        run.status, run.outcome = RunStatus.RUNNING, None
        await store.write(Batch(run=run))
        run.steps = 9
        await store.write(Batch(run=run))
        assert (await store.run("r1")).steps == 9
    assert _row(path, "r1") == (9, 30, 1003.0, "running")  # folded on close
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT count(*) FROM run_progress").fetchone() == (0,)
    finally:
        db.close()


async def test_another_process_sees_a_runs_progress_and_takes_it_over_whole(
        tmp_path: Path) -> None:
    """Another store on the file reads the progress over the row (a claim's lease check
    included), and once it writes the run, its record is the row and the older progress
    is gone."""
    path = tmp_path / "runs.db"
    async with Store.open(path) as first, Store.open(path) as second:
        run = _run("r1", status=RunStatus.RUNNING, owner="host:1:a")
        await first.write(Batch(run=run))
        run.steps, run.lease_until = 5, 2000.0
        await first.write(Batch(run=run))
        seen = await second.run("r1")
        assert (seen.steps, seen.lease_until) == (5, 2000.0)
        taken = dataclasses.replace(seen, owner="host:2:b", steps=6, lease_until=3000.0)
        await second.write(Batch(run=taken))  # its first write of the run: the whole row
        for store in (first, second):
            stored = await store.run("r1")
            assert (stored.owner, stored.steps, stored.lease_until) == ("host:2:b", 6, 3000.0)
