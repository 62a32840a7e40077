"""`SQLiteStore`: the embedded default. One file, WAL, a busy timeout, ordered migrations.

Every statement runs on one dedicated thread that owns the connection (never on the event
loop), taking work from a FIFO queue: operations apply in the order they were issued, and a
read sees every write issued before it. `BEGIN IMMEDIATE` serialises writers across
processes, which is what makes `decide` and `claim` compare-and-swap.

Why a dedicated thread rather than a thread pool: on our VMs a pool hop costs 200 µs or more,
a dedicated thread about half that, and `write(..., wait=False)` (used for a turn's results,
which must be durable before the next side effect, not before the next model request) costs
no hop at all on the caller's side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from handrail.errors import AlreadyDecided, NotFound, SchemaTooNew, StoreError
from handrail.store._base import Store, check_claimable, cutoff
from handrail.store._records import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    RunRecord,
    RunStatus,
)

__all__ = ["MIGRATIONS", "SQLiteStore"]

T = TypeVar("T")


def _script(db: sqlite3.Connection, script: str) -> None:
    # Not executescript(): it commits first, and migrations run inside our transaction.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _m0001_initial(db: sqlite3.Connection) -> None:
    _script(
        db,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            task TEXT NOT NULL,
            agent TEXT,
            status TEXT NOT NULL,
            parent_id TEXT,
            policy TEXT,
            manifest_digest TEXT,
            model TEXT,
            workspace TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            outcome TEXT,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            model_requests INTEGER NOT NULL DEFAULT 0,
            remembered TEXT NOT NULL DEFAULT '[]',
            steps INTEGER NOT NULL DEFAULT 0,
            owner TEXT,
            lease_until REAL NOT NULL DEFAULT 0,
            events TEXT NOT NULL DEFAULT '[]',
            agent_ref TEXT
        );
        CREATE INDEX runs_created ON runs (created_at);
        CREATE TABLE messages (
            run_id TEXT NOT NULL REFERENCES runs (id),
            seq INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE calls (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (id),
            call_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            model_name TEXT NOT NULL,
            tool TEXT,
            arguments TEXT NOT NULL,
            arguments_digest TEXT,
            performed_arguments TEXT,
            actions TEXT NOT NULL,
            verdict TEXT,
            decision TEXT,
            decided_by TEXT,
            status TEXT NOT NULL,
            result TEXT,
            disposition TEXT,
            error TEXT,
            answers TEXT NOT NULL,
            pending_id TEXT,
            started_at REAL,
            ended_at REAL
        );
        CREATE INDEX calls_run ON calls (run_id, turn, idx);
        CREATE TABLE pending (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            run_id TEXT NOT NULL REFERENCES runs (id),
            call_record TEXT NOT NULL,
            agent TEXT,
            tool TEXT,
            payload TEXT NOT NULL,
            created_at REAL NOT NULL,
            state TEXT NOT NULL,
            decision TEXT,
            decided_by TEXT,
            decided_at REAL
        );
        CREATE INDEX pending_open ON pending (state, created_at);
        """
    )


def _m0002_call_provenance(db: sqlite3.Connection) -> None:
    # Where a call's output stands for the taint check (CallRecord.provenance), as JSON.
    db.execute("ALTER TABLE calls ADD COLUMN provenance TEXT")


MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = [
    ("0001_initial", _m0001_initial),
    ("0002_call_provenance", _m0002_call_provenance),
]
"""Ordered, named migrations; a database records which ran in `_migrations`."""


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_RUN_COLUMNS = (
    "id, task, agent, status, parent_id, policy, manifest_digest, model, workspace, created_at, "
    "updated_at, outcome, input_tokens, output_tokens, model_requests, remembered, steps, owner, "
    "lease_until, events, agent_ref"
)
_CALL_COLUMNS = (
    "id, run_id, call_id, turn, idx, model_name, tool, arguments, arguments_digest, "
    "performed_arguments, actions, verdict, decision, decided_by, status, result, disposition, "
    "error, answers, pending_id, started_at, ended_at, provenance"
)
_PENDING_COLUMNS = (
    "id, kind, run_id, call_record, agent, tool, payload, created_at, state, decision, "
    "decided_by, decided_at"
)


# What a run may change after it is created; the rest (task, policy, ...) is written once.
_RUN_MUTABLE = ("status", "updated_at", "outcome", "input_tokens", "output_tokens",
                "model_requests", "remembered", "steps", "owner", "lease_until", "events")
_RUN_UPSERT = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({','.join('?' * 21)}) ON CONFLICT(id) DO "
    "UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _RUN_MUTABLE)
)


def _run_row(r: RunRecord, policy_json: str | None = None) -> tuple[Any, ...]:
    policy = policy_json if policy_json is not None else _dumps(r.policy)
    return (r.id, r.task, r.agent, r.status.value, r.parent_id, policy,
            r.manifest_digest, r.model, r.workspace, r.created_at, r.updated_at,
            _dumps(r.outcome), r.input_tokens, r.output_tokens, r.model_requests,
            _dumps(r.remembered), r.steps, r.owner, r.lease_until, _dumps(r.events), r.agent_ref)


def _run_from(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(
        id=row[0], task=row[1], agent=row[2], status=RunStatus(row[3]), parent_id=row[4],
        policy=_loads(row[5]), manifest_digest=row[6], model=row[7], workspace=row[8],
        created_at=row[9], updated_at=row[10], outcome=_loads(row[11]), input_tokens=row[12],
        output_tokens=row[13], model_requests=row[14], remembered=_loads(row[15]),
        steps=row[16], owner=row[17], lease_until=row[18], events=_loads(row[19]),
        agent_ref=row[20],
    )


def _call_row(c: CallRecord) -> tuple[Any, ...]:
    return (c.id, c.run_id, c.call_id, c.turn, c.index, c.model_name, c.tool, c.arguments,
            c.arguments_digest, _dumps(c.performed_arguments), _dumps(c.actions),
            _dumps(c.verdict), _dumps(c.decision), c.decided_by, c.status.value,
            _dumps(c.result), c.disposition, c.error, _dumps(c.answers), c.pending_id,
            c.started_at, c.ended_at, _dumps(c.provenance))


def _call_from(row: tuple[Any, ...]) -> CallRecord:
    return CallRecord(
        id=row[0], run_id=row[1], call_id=row[2], turn=row[3], index=row[4], model_name=row[5],
        tool=row[6], arguments=row[7], arguments_digest=row[8],
        performed_arguments=_loads(row[9]), actions=_loads(row[10]), verdict=_loads(row[11]),
        decision=_loads(row[12]), decided_by=row[13], status=CallStatus(row[14]),
        result=_loads(row[15]), disposition=row[16], error=row[17], answers=_loads(row[18]),
        pending_id=row[19], started_at=row[20], ended_at=row[21], provenance=_loads(row[22]),
    )


def _pending_row(p: PendingItem) -> tuple[Any, ...]:
    return (p.id, p.kind, p.run_id, p.call_record, p.agent, p.tool, _dumps(p.payload),
            p.created_at, p.state, _dumps(p.decision), p.decided_by, p.decided_at)


def _pending_from(row: tuple[Any, ...]) -> PendingItem:
    return PendingItem(
        id=row[0], kind=row[1], run_id=row[2], call_record=row[3], agent=row[4], tool=row[5],
        payload=_loads(row[6]), created_at=row[7], state=row[8], decision=_loads(row[9]),
        decided_by=row[10], decided_at=row[11],
    )


class _Worker:
    """The thread that owns the connection and runs queued operations in order."""

    def __init__(self, db: sqlite3.Connection, path: str) -> None:
        self.db = db
        self.path = path
        self.queue: queue.SimpleQueue[tuple[Callable[[sqlite3.Connection], Any],
                                            concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue())
        self.thread = threading.Thread(target=self._serve, name=f"handrail-sqlite:{path}",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                self.db.close()
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(self.db))
            except sqlite3.Error as exc:
                error = StoreError(f"SQLite store {self.path}: {exc}")
                error.__cause__ = exc
                future.set_exception(error)
            except BaseException as exc:  # handed to the caller, who re-raises it
                future.set_exception(exc)

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.queue.put((fn, future))
        return future

    def stop(self) -> None:
        self.queue.put(None)


async def _wait(future: concurrent.futures.Future[T]) -> T:
    """Await a worker's result without blocking the event loop, on any anyio backend."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): park a pool thread on the result instead
        return await anyio.to_thread.run_sync(future.result)
    return await asyncio.wrap_future(future)


class SQLiteStore(Store):
    """A store in one SQLite file (created and migrated on open)."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 10.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store at {self.path}: {exc}") from exc
        self._worker = _Worker(self._db, self.path)
        self._inflight: list[concurrent.futures.Future[Any]] = []
        self._policy_json: dict[str, tuple[Any, str | None]] = {}
        self._closed = False

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "CREATE TABLE IF NOT EXISTS _migrations "
                "(id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {row[1] for row in db.execute("SELECT id, name FROM _migrations")}
            known = {name for name, _ in MIGRATIONS}
            newer = done - known
            if newer:
                raise SchemaTooNew(
                    f"{self.path} was migrated by a newer handrail (migrations "
                    f"{sorted(newer)} are unknown here); upgrade handrail to open it"
                )
            for number, (name, migrate) in enumerate(MIGRATIONS, start=1):
                if name not in done:
                    migrate(db)
                    db.execute("INSERT INTO _migrations VALUES (?, ?, ?)",
                               (number, name, time.time()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> concurrent.futures.Future[T]:
        if self._closed:
            raise StoreError(f"the SQLite store {self.path} is closed")
        self._raise_background_failure()
        return self._worker.submit(fn)

    def _raise_background_failure(self) -> None:
        """Surface a failed `write(wait=False)` at the next operation, never silently."""
        while self._inflight and self._inflight[0].done():
            future = self._inflight.pop(0)
            error = future.exception()
            if error is not None:
                raise StoreError(
                    f"an earlier write to {self.path} failed: {error}"
                ) from error

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await _wait(self._submit(fn))

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def transaction(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out

        return await self._run(transaction)

    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        # Rows are built here, on the caller's side: the caller may change its records as
        # soon as this returns (at once, with wait=False).
        run_row = None
        if batch.run is not None:
            # A run's policy does not change: serialise it once per run, not once per turn.
            cached = self._policy_json.get(batch.run.id)
            if cached is None or cached[0] is not batch.run.policy:
                cached = (batch.run.policy, _dumps(batch.run.policy))
                self._policy_json[batch.run.id] = cached
            run_row = _run_row(batch.run, cached[1])
        messages = [(r, s, json.dumps(m, separators=(",", ":"))) for r, s, m in batch.messages]
        calls = [_call_row(c) for c in batch.calls]
        pending = [_pending_row(p) for p in batch.pending]

        def apply(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                if run_row is not None:
                    db.execute(_RUN_UPSERT, run_row)
                if messages:
                    db.executemany("INSERT OR REPLACE INTO messages (run_id, seq, data) "
                                   "VALUES (?, ?, ?)", messages)
                if calls:
                    db.executemany(f"INSERT OR REPLACE INTO calls ({_CALL_COLUMNS}) VALUES "
                                   f"({','.join('?' * 23)})", calls)
                if pending:
                    db.executemany(f"INSERT OR REPLACE INTO pending ({_PENDING_COLUMNS}) "
                                   f"VALUES ({','.join('?' * 12)})", pending)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        future = self._submit(apply)
        if wait:
            await _wait(future)
        else:
            self._inflight.append(future)

    async def flush(self) -> None:
        await self._run(lambda db: None)
        self._raise_background_failure()

    async def run(self, run_id: str) -> RunRecord:
        row = await self._run(
            lambda db: db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?",
                                  (run_id,)).fetchone()
        )
        if row is None:
            raise NotFound(f"no run {run_id!r} in {self.path}")
        return _run_from(row)

    async def runs(self, *, limit: int = 50, status: RunStatus | None = None) -> list[RunRecord]:
        def query(db: sqlite3.Connection) -> list[Any]:
            if status is None:
                return db.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created_at DESC "
                                  "LIMIT ?", (limit,)).fetchall()
            return db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = ? ORDER BY "
                              "created_at DESC LIMIT ?", (status.value, limit)).fetchall()

        return [_run_from(r) for r in await self._run(query)]

    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self._run(
            lambda db: db.execute("SELECT data FROM messages WHERE run_id = ? ORDER BY seq",
                                  (run_id,)).fetchall()
        )
        return [json.loads(r[0]) for r in rows]

    async def calls(self, run_id: str) -> list[CallRecord]:
        rows = await self._run(
            lambda db: db.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? "
                                  "ORDER BY turn, idx", (run_id,)).fetchall()
        )
        return [_call_from(r) for r in rows]

    async def call(self, record_id: str) -> CallRecord:
        row = await self._run(
            lambda db: db.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = ?",
                                  (record_id,)).fetchone()
        )
        if row is None:
            raise NotFound(f"no call {record_id!r} in {self.path}")
        return _call_from(row)

    async def pending(
        self,
        kind: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        older_than: float | dt.timedelta | None = None,
    ) -> list[PendingItem]:
        where: list[str] = ["state = 'open'"]
        params: list[Any] = []
        for column, value in (("kind", kind), ("agent", agent), ("tool", tool)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        bound = cutoff(older_than)
        if bound is not None:
            where.append("created_at <= ?")
            params.append(bound)
        sql = (f"SELECT {_PENDING_COLUMNS} FROM pending WHERE {' AND '.join(where)} "
               "ORDER BY created_at")
        rows = await self._run(lambda db: db.execute(sql, params).fetchall())
        return [_pending_from(r) for r in rows]

    async def pending_item(self, item_id: str) -> PendingItem:
        row = await self._run(
            lambda db: db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                                  (item_id,)).fetchone()
        )
        if row is None:
            raise NotFound(f"no pending item {item_id!r} in {self.path}")
        return _pending_from(row)

    async def decide(self, item_id: str, decision: dict[str, Any], decided_by: str, *,
                     payload: dict[str, Any] | None = None) -> PendingItem:
        def cas(db: sqlite3.Connection) -> PendingItem:
            now = time.time()
            changed = db.execute(
                "UPDATE pending SET state = 'decided', decision = ?, decided_by = ?, "
                "decided_at = ?, payload = COALESCE(?, payload) WHERE id = ? AND state = 'open'",
                (_dumps(decision), decided_by, now, _dumps(payload), item_id),
            ).rowcount
            row = db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                             (item_id,)).fetchone()
            if row is None:
                raise NotFound(f"no pending item {item_id!r} in {self.path}")
            item = _pending_from(row)
            if changed != 1:
                raise AlreadyDecided(
                    f"{item.kind} {item_id} was already decided by {item.decided_by}"
                )
            return item

        return await self._tx(cas)

    async def claim(self, run_id: str, owner: str) -> RunRecord:
        def cas(db: sqlite3.Connection) -> RunRecord:
            row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?",
                             (run_id,)).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id!r} in {self.path}")
            run = _run_from(row)
            now = time.time()
            check_claimable(run, now)
            run = dataclasses.replace(run, status=RunStatus.RUNNING, owner=owner,
                                      lease_until=now + self.lease_seconds, updated_at=now)
            db.execute("UPDATE runs SET status = ?, owner = ?, lease_until = ?, updated_at = ? "
                       "WHERE id = ?", (run.status.value, owner, run.lease_until, now, run_id))
            return run

        return await self._tx(cas)

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            self._worker.stop()
            await anyio.to_thread.run_sync(self._worker.thread.join)
