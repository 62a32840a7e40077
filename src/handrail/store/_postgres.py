"""`PostgresStore`: the store for many processes on many machines (`postgresql://...`).

Same contract as SQLite and memory (`handrail.store.contract`); what differs is where the
coordination happens:

- Writes go through a queue committed in groups (group commit, as in the SQLite store): every
  write (a batch, a decision, a claim) that arrives while a group is committing waits for the
  next one; each waiter is released only when the transaction holding its write has committed.
  Groups commit one after another on one pooled connection, so writes apply in the order they
  were issued. Decisions and claims run inside their own savepoint: a compare-and-swap lost
  fails alone. A batch that fails (a constraint) makes its group retry one write per
  transaction, so only the failing write fails.
- `decide` is one conditional `UPDATE ... WHERE state = 'open'`: of any number of processes
  on any number of machines, one changes the row; every other gets `AlreadyDecided`.
- `claim` locks the run's row (`SELECT ... FOR UPDATE`) and checks it against the database's
  clock. `claim_ready` (used by `handrail worker`) takes runs that are ready to continue with
  `FOR UPDATE SKIP LOCKED`, so workers never wait on each other's candidates; the claim of a
  run it held (and read ahead) is a conditional UPDATE sent at the head of the run's next
  write, before its owner fence.
- Leases are measured on the database's clock, because machines' clocks differ: a RUNNING run
  written with `lease_until` is stored as the database's `now()` plus the lease time the
  writer had left by its own clock.
- Reads use other pooled connections, after every write issued before them has committed.
- A decision is announced with `NOTIFY handrail_ready` in its transaction; workers `LISTEN`.

Everything is async (psycopg 3's async connections and pool): nothing waits on the event loop.
A store serves the event loop it was first used on (its pool lives there).

Migrations are ordered and named, recorded in `handrail_migrations`; a database migrated by a
newer handrail (a migration unknown here) is refused with `SchemaTooNew` and never written to.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import functools
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from handrail.errors import (
    AlreadyDecided,
    ConfigError,
    NotFound,
    ResumeRefused,
    SchemaTooNew,
    StoreError,
    UserError,
)
from handrail.store import audit as _audit
from handrail.store._rows import DECISION_COLUMNS, DecisionRows
from handrail.store._rows import call_from_row as _call_from
from handrail.store._rows import loads as _loads
from handrail.store._rows import run_from_row as _run_from
from handrail.store.audit import ZERO
from handrail.store.contract import (
    Batch,
    CallRecord,
    Durability,
    PendingItem,
    QuotaExceeded,
    RunRecord,
    RunStatus,
    Store,
    check_claimable,
    check_run_record,
    counted,
    cutoff,
    expired,
    is_owner_alive,
    logged_event,
    redacted_url,
    status_after_decision,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool


# The chain's encoding this store writes: version 2 (docs/audit.md). Its hashes are computed
# in the database by `handrail_audit` (PostgreSQL's sha256, hex text), which version 2's
# bodies and hashes are made for; version 3 (one hash a fact, raw: SQLite's) would save the
# client nothing here.
_VERSION = 2
run_body = functools.partial(_audit.run_body, version=_VERSION)
status_body = functools.partial(_audit.status_body, version=_VERSION)
call_body = functools.partial(_audit.call_body, version=_VERSION)
pending_body = functools.partial(_audit.pending_body, version=_VERSION)

__all__ = ["MIGRATIONS", "NOTIFY_CHANNEL", "PostgresStore"]

T = TypeVar("T")

NOTIFY_CHANNEL = "handrail_ready"
"""The channel a decision is announced on; workers LISTEN to it.

The payload is empty: "something may be ready, claim". PostgreSQL delivers identical
notifications of one transaction once, so the decisions of one group commit wake each
listening worker once, not once per decision (with a payload per run, fifty decisions woke
every worker fifty times: each wake-up a process switch in the worker and in its server
backend, and a claim statement from every idle worker)."""

_NOTIFY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', '')"

_M0001 = """
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
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    outcome TEXT,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    model_requests BIGINT NOT NULL DEFAULT 0,
    remembered TEXT NOT NULL DEFAULT '[]',
    steps INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    events TEXT NOT NULL DEFAULT '[]',
    agent_ref TEXT
);
CREATE INDEX runs_created ON runs (created_at);
CREATE INDEX runs_status ON runs (status, updated_at);
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
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION
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
    created_at DOUBLE PRECISION NOT NULL,
    state TEXT NOT NULL,
    decision TEXT,
    decided_by TEXT,
    decided_at DOUBLE PRECISION
);
CREATE INDEX pending_open ON pending (state, created_at);
CREATE INDEX pending_run ON pending (run_id, state)
"""

FENCE_SQLSTATE = "HR409"
"""The SQLSTATE `handrail_fence` raises: the run is held by another owner now."""

# The fence every write of a driven run goes through (see `PostgresStore.write`): the run's
# row is locked, and unless the writer's owner still holds it the transaction fails. One
# statement sent in the pipeline (no reply awaited): a lost fence fails the commit.
_M0005_FENCE = f"""
CREATE FUNCTION handrail_fence(fenced_id TEXT, expected TEXT) RETURNS void
LANGUAGE plpgsql AS $fence$
DECLARE
    holder TEXT;
BEGIN
    SELECT owner INTO holder FROM runs WHERE id = fenced_id FOR UPDATE;
    IF FOUND AND holder IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'run % is held by %, not by %', fenced_id,
            coalesce(holder, 'nobody'), expected USING ERRCODE = '{FENCE_SQLSTATE}';
    END IF;
END
$fence$
"""

QUOTA_SQLSTATE = "HR429"
"""The SQLSTATE `handrail_quota` raises: the window is full (nothing of the write is kept)."""

# One statement a claim, sent in the pipeline like the fence (no reply awaited before the
# commit): the window's count with this call, or, when it is full, an error that rolls the
# whole transaction back. Two transactions claiming in one window meet at its row's lock; the
# second, once the first has committed, re-checks `n < lim` on the row as the first left it
# (PostgreSQL re-evaluates an ON CONFLICT UPDATE's WHERE on the newest version): never over.
_M0008_QUOTA = f"""
CREATE FUNCTION handrail_quota(c TEXT, b BIGINT, lim BIGINT, force BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $quota$
DECLARE
    counted BIGINT;
BEGIN
    INSERT INTO quota_counts AS q (counter, bucket, n) VALUES (c, b, 1)
    ON CONFLICT (counter, bucket) DO UPDATE SET n = q.n + 1 WHERE force OR q.n < lim
    RETURNING n INTO counted;
    IF counted IS NULL THEN
        SELECT n INTO counted FROM quota_counts WHERE counter = c AND bucket = b;
        RAISE EXCEPTION 'quota % window % is full: % of %', c, b, counted, lim
            USING ERRCODE = '{QUOTA_SQLSTATE}',
                  DETAIL = json_build_object('counter', c, 'bucket', b, 'count', counted);
    END IF;
    RETURN counted;
END
$quota$
"""

_M0010_AUDIT = (
    'CREATE TABLE audit (seq BIGINT PRIMARY KEY, run_id TEXT COLLATE "C" NOT NULL, '
    "n INTEGER NOT NULL, kind TEXT NOT NULL, ref TEXT NOT NULL, body TEXT, "
    "prev TEXT NOT NULL, hash TEXT NOT NULL, link TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX audit_run ON audit (run_id, n)",
    "CREATE TABLE audit_tip (id INTEGER PRIMARY KEY, seq BIGINT NOT NULL, link TEXT NOT NULL)",
    f"INSERT INTO audit_tip VALUES (1, 0, '{ZERO}')",
    "CREATE TABLE audit_signatures (seq BIGINT NOT NULL, link TEXT NOT NULL, key TEXT NOT NULL, "
    "signature TEXT NOT NULL, signed_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (seq, key))",
)

# Appends facts to their runs' chains and the store's, at the end of the transaction that
# writes them (one statement, sent in the pipeline). The store-wide tip is locked first and
# is the last lock the transaction takes, so writers chain one after another and never
# deadlock on it. A fact with a condition (an owner) is kept only when its run is RUNNING
# under that owner by then (a claim decided in SQL); a `run` fact only for a run with no
# chain yet.
_M0010_APPEND = f"""
CREATE FUNCTION handrail_audit(p_runs TEXT[], p_kinds TEXT[], p_refs TEXT[],
                               p_bodies TEXT[], p_rows BYTEA[], p_conds TEXT[]) RETURNS void
LANGUAGE plpgsql AS $audit$
DECLARE
    s BIGINT; l TEXT; tip_n INTEGER; tip_hash TEXT; h TEXT; at_now DOUBLE PRECISION;
BEGIN
    SELECT seq, link INTO s, l FROM audit_tip WHERE id = 1 FOR UPDATE;
    at_now := extract(epoch from clock_timestamp());
    FOR i IN 1 .. coalesce(array_length(p_runs, 1), 0) LOOP
        IF p_conds[i] IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs WHERE id = p_runs[i]
                AND status = 'running' AND owner = p_conds[i]) THEN
            CONTINUE;
        END IF;
        SELECT n, hash INTO tip_n, tip_hash FROM audit WHERE run_id = p_runs[i]
            ORDER BY n DESC LIMIT 1;
        IF NOT FOUND THEN
            tip_n := -1;
            tip_hash := '{ZERO}';
        END IF;
        CONTINUE WHEN p_kinds[i] = 'run' AND tip_n >= 0;
        -- A call's body is its row in the row encoding (bytes); the others' JSON text.
        IF p_rows[i] IS NOT NULL THEN
            h := encode(sha256(convert_to(tip_hash, 'UTF8') || p_rows[i]), 'hex');
        ELSE
            h := encode(sha256(convert_to(tip_hash || p_bodies[i], 'UTF8')), 'hex');
        END IF;
        s := s + 1;
        l := encode(sha256(convert_to(l || h, 'UTF8')), 'hex');
        -- A call's body is its row, written in this transaction: its hash alone is kept.
        INSERT INTO audit VALUES (s, p_runs[i], tip_n + 1, p_kinds[i], p_refs[i], p_bodies[i],
                                  tip_hash, h, l, at_now);
    END LOOP;
    UPDATE audit_tip SET seq = s, link = l WHERE id = 1;
END
$audit$
"""

_AUDIT_APPEND = ("SELECT handrail_audit(%s::text[], %s::text[], %s::text[], %s::text[], "
                 "%s::bytea[], %s::text[])")

MIGRATIONS: list[tuple[str, str | tuple[str, ...]]] = [
    ("0001_initial", _M0001),
    # Where a call's output stands for the taint check (CallRecord.provenance), as JSON.
    ("0002_call_provenance", "ALTER TABLE calls ADD COLUMN provenance TEXT"),
    # A sub-agent's run names the call that delegated to it and its depth in the tree.
    ("0003_run_tree", "ALTER TABLE runs ADD COLUMN parent_call_id TEXT; "
                      "ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0"),
    # Writes of a driven run are fenced by its owner (a plpgsql body: one statement, unsplit).
    ("0005_owner_fence", (_M0005_FENCE,)),
    # The runs a worker holds, found by their owner (a claim reads ahead the runs it just
    # held): a few rows, however many runs the store has seen.
    ("0006_runs_owner", "CREATE INDEX runs_owner ON runs (owner) WHERE owner IS NOT NULL"),
    # How many calls each quota window started: one row per counter and window, counted in
    # the transaction of each counted call's STARTED mark (`_QUOTA_CLAIM`).
    ("0008_quotas", ("CREATE TABLE quota_counts (counter TEXT NOT NULL, bucket BIGINT NOT "
                     "NULL, n BIGINT NOT NULL, PRIMARY KEY (counter, bucket))", _M0008_QUOTA)),
    # Deadlines with a default, four-eyes approvals and the notification outbox, on the item
    # (each changed by the item's own compare-and-swap); items open at the upgrade are not
    # notified. The indexes hold only open items with a deadline, or owed a notification.
    ("0009_pending_deadlines",
     "ALTER TABLE pending ADD COLUMN deadline DOUBLE PRECISION; "
     "ALTER TABLE pending ADD COLUMN on_expiry TEXT; "
     "ALTER TABLE pending ADD COLUMN escalate_at DOUBLE PRECISION; "
     "ALTER TABLE pending ADD COLUMN approvals_needed INTEGER NOT NULL DEFAULT 1; "
     "ALTER TABLE pending ADD COLUMN approvals TEXT NOT NULL DEFAULT '[]'; "
     "ALTER TABLE pending ADD COLUMN notified INTEGER NOT NULL DEFAULT 0; "
     "ALTER TABLE pending ADD COLUMN notify_after DOUBLE PRECISION NOT NULL DEFAULT 0; "
     "ALTER TABLE pending ADD COLUMN notes TEXT NOT NULL DEFAULT '[]'; "
     "UPDATE pending SET notified = 2; "
     "CREATE INDEX pending_deadline ON pending (deadline) "
     "WHERE state = 'open' AND deadline IS NOT NULL; "
     "CREATE INDEX pending_notify ON pending (notify_after) "
     "WHERE state = 'open' AND notified < 2"),
    # The tamper-evident record (`handrail.store.audit`); the record as it stands is chained
    # once, as found, right after (`_adopt`).
    ("0010_audit_chain", (*_M0010_AUDIT, _M0010_APPEND)),
    # What other processes record about a run (`Store.run_events`: a dispatcher's delivery
    # attempts), appended, never updated: not in the run's row, which its driver rewrites.
    ("0011_run_events",
     "CREATE TABLE run_events (seq BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL, "
     "at DOUBLE PRECISION NOT NULL, event TEXT NOT NULL); "
     "CREATE INDEX run_events_run ON run_events (run_id, seq)"),
]
"""Ordered, named migrations; a database records which ran in `handrail_migrations`.

Each is SQL split on `;`, or a tuple of statements taken whole (a function body).
"""

_QUOTA_CLAIM = "SELECT handrail_quota(%s, %s, %s, %s)"


class _QuotaFull(StoreError):
    """A write's claim found its window full (`QUOTA_SQLSTATE`); `write` names the claim."""

    def __init__(self, message: str, counter: str, bucket: int, count: int) -> None:
        super().__init__(message)
        self.counter, self.bucket, self.count = counter, bucket, count

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this handrail writes."""

_LOCK_KEY = 0x68616E64  # "hand": serialises migrations of concurrent first opens

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _dumps(value: Any) -> str | None:
    if value is None:
        return None
    if not value and type(value) is list:
        return "[]"
    return _ENCODE(value)


_RUN_COLUMNS = (
    "id, task, agent, status, parent_id, policy, manifest_digest, model, workspace, created_at, "
    "updated_at, outcome, input_tokens, output_tokens, model_requests, remembered, steps, owner, "
    "lease_until, events, agent_ref, parent_call_id, depth"
)
_CALL_COLUMNS = (
    "id, run_id, call_id, turn, idx, model_name, tool, arguments, arguments_digest, "
    "performed_arguments, actions, verdict, decision, decided_by, status, result, disposition, "
    "error, answers, pending_id, started_at, ended_at, provenance"
)
_HISTORY_CHUNK = 1000
"""Runs whose calls `call_history` reads in one query."""
_PENDING_COLUMNS = (
    "id, kind, run_id, call_record, agent, tool, payload, created_at, state, decision, "
    "decided_by, decided_at, deadline, on_expiry, escalate_at, approvals_needed, approvals, "
    "notified, notify_after, notes"
)
_NOW_AT = len(_RUN_COLUMNS.split(", "))
"""Where the database's clock sits in a row selected as `_RUN_COLUMNS, _NOW`."""
_NOW = "extract(epoch from clock_timestamp())::double precision"
"""The database's clock, as Unix time (leases are measured on it)."""

_RUN_MUTABLE = ("status", "updated_at", "outcome", "input_tokens", "output_tokens",
                "model_requests", "remembered", "steps", "owner", "lease_until", "events")
# The 22nd parameter: the lease time left by the writer's clock, or NULL to keep lease_until
# as given. A RUNNING run's lease is re-based on the database's clock (see the module doc).
_RUN_UPSERT = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join(['%s'] * 18)}, "
    f"COALESCE({_NOW} + %s, %s), %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _RUN_MUTABLE)
)
_MESSAGE_UPSERT = (
    "INSERT INTO messages (run_id, seq, data) VALUES (%s, %s, %s) "
    "ON CONFLICT (run_id, seq) DO UPDATE SET data = excluded.data"
)
_CALL_UPSERT = (
    f"INSERT INTO calls ({_CALL_COLUMNS}) VALUES ({', '.join(['%s'] * 23)}) "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _CALL_COLUMNS.split(", ")[1:])
)
_PENDING_UPSERT = (
    f"INSERT INTO pending ({_PENDING_COLUMNS}) VALUES ({', '.join(['%s'] * 20)}) "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _PENDING_COLUMNS.split(", ")[1:])
)

_CLAIM_HELD = (
    f"UPDATE runs SET status = 'running', owner = %s, lease_until = {_NOW} + %s, "
    f"updated_at = {_NOW}, outcome = NULL WHERE id = %s AND owner = %s AND "
    "status NOT IN ('completed', 'failed')"
)
"""Claim a run still held by the worker that took it (and not finished since)."""

_HELD_BY = (
    "SELECT r.id FROM runs r WHERE r.owner = %s AND r.status IN ('ready', "
    "'awaiting_approval', 'awaiting_answer', 'awaiting_recovery') AND NOT (r.id = ANY(%s))"
)
"""The runs an owner holds and has not claimed (parameters: owner, ids to leave out).

Found through the owner index (migration 0006): a few rows, never the runs paused or the
history."""

_AWAITING = (RunStatus.AWAITING_APPROVAL.value, RunStatus.AWAITING_ANSWER.value,
             RunStatus.AWAITING_RECOVERY.value)

_PAUSED_ALL_DECIDED = (
    # The paused runs without an open item first (an anti-join), then each of those few
    # probed for a decided item through the index. (OFFSET 0 keeps PostgreSQL to that
    # order; left to itself it hashed every decided item ever recorded, at every claim.)
    "SELECT q.id FROM (SELECT w.id FROM runs w WHERE w.status IN "
    "  ('awaiting_approval', 'awaiting_answer', 'awaiting_recovery') "
    "  AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.run_id = w.id AND p.state = 'open') "
    "  OFFSET 0) q "
    "WHERE EXISTS (SELECT 1 FROM pending p WHERE p.run_id = q.id AND p.state = 'decided' "
    "  OFFSET 0)"
)
"""Ids of the runs paused with everything they wait on decided (items written decided)."""

READY_WHERE = (
    # Nobody holds it: no owner, or an owner whose lease lapsed (on the database's clock)...
    f"(r.owner IS NULL OR r.lease_until < {_NOW}) "
    "AND r.status IN ('ready', 'running', 'awaiting_approval', 'awaiting_answer', "
    "'awaiting_recovery') AND r.id IN ("
    # ...and decided and not yet continued (READY), or RUNNING (its driver is gone)...
    "  SELECT id FROM runs WHERE status IN ('ready', 'running') UNION ALL "
    # ...or paused with everything it waits on decided (a decision, an answer, a recovery).
    f"  {_PAUSED_ALL_DECIDED})"
)
"""Which runs a worker may take: `r` is the runs table."""

PAUSED_READY_WHERE = (
    f"(r.owner IS NULL OR r.lease_until < {_NOW}) AND ("
    "  (r.status IN ('awaiting_approval', 'awaiting_answer', 'awaiting_recovery') "
    "   AND EXISTS (SELECT 1 FROM pending p WHERE p.run_id = r.id AND p.state = 'decided') "
    "   AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.run_id = r.id AND p.state = 'open')) "
    "  OR r.status = 'ready')"
)
"""The ready runs nobody drives (READY_WHERE without RUNNING ones)."""

_TAKE_PAUSED = (
    f"UPDATE runs SET owner = %s, lease_until = {_NOW} + %s WHERE id IN ("
    "SELECT r.id FROM runs r WHERE r.id IN ("
    # READY (decided, not yet continued: what `decide` makes of a run whose last open item
    # it decides): found through the status index, whatever the history holds...
    "  SELECT id FROM runs WHERE status = 'ready' UNION ALL "
    # ...or paused with everything decided (items written decided).
    f"  {_PAUSED_ALL_DECIDED}) "
    # Checked again on the row as locked (a concurrent claim may have changed it).
    "AND r.status IN ('ready', 'awaiting_approval', 'awaiting_answer', 'awaiting_recovery') "
    f"AND (r.owner IS NULL OR r.lease_until < {_NOW}) AND NOT (r.id = ANY(%s)) "
    f"ORDER BY r.updated_at LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {_RUN_COLUMNS}"
)
"""Hold up to N runs of PAUSED_READY_WHERE in one statement (see `_take_paused`).

Written so that its cost follows the runs that may be ready, not the store's history: the
condition as one `OR` made PostgreSQL hash every decided item ever recorded at each claim
(12-29 ms of server time per claim with 20,000 of them and 2,000 runs awaiting a
person)."""


def _run_row(r: RunRecord, policy_json: str | None) -> tuple[Any, ...]:
    rebase = r.status is RunStatus.RUNNING and r.owner is not None and r.lease_until > 0
    left = r.lease_until - time.time() if rebase else None
    return (r.id, r.task, r.agent, r.status.value, r.parent_id, policy_json,
            r.manifest_digest, r.model, r.workspace, r.created_at, r.updated_at,
            _dumps(r.outcome), r.input_tokens, r.output_tokens, r.model_requests,
            _dumps(r.remembered), r.steps, r.owner, left, r.lease_until, _dumps(r.events),
            r.agent_ref, r.parent_call_id, r.depth)


def _call_row(c: CallRecord) -> tuple[Any, ...]:
    # As the table gives them back (DOUBLE PRECISION, INTEGER): the audit chain hashes the
    # row as written, and verify the row as read.
    turn, index, started, ended = int(c.turn), int(c.index), c.started_at, c.ended_at
    started = None if started is None else float(started)
    ended = None if ended is None else float(ended)
    return (c.id, c.run_id, c.call_id, turn, index, c.model_name, c.tool, c.arguments,
            c.arguments_digest, _dumps(c.performed_arguments), _dumps(c.actions),
            _dumps(c.verdict), _dumps(c.decision), c.decided_by, c.status.value,
            _dumps(c.result), c.disposition, c.error, _dumps(c.answers), c.pending_id,
            started, ended, _dumps(c.provenance))


def _pending_row(p: PendingItem) -> tuple[Any, ...]:
    return (p.id, p.kind, p.run_id, p.call_record, p.agent, p.tool, _dumps(p.payload),
            p.created_at, p.state, _dumps(p.decision), p.decided_by, p.decided_at,
            p.deadline, _dumps(p.on_expiry), p.escalate_at, p.approvals_needed,
            _dumps(p.approvals), p.notified, p.notify_after, _dumps(p.notes))


def _pending_from(row: tuple[Any, ...]) -> PendingItem:
    return PendingItem(
        id=row[0], kind=row[1], run_id=row[2], call_record=row[3], agent=row[4], tool=row[5],
        payload=_loads(row[6]), created_at=row[7], state=row[8], decision=_loads(row[9]),
        decided_by=row[10], decided_at=row[11], deadline=row[12], on_expiry=_loads(row[13]),
        escalate_at=row[14], approvals_needed=row[15], approvals=_loads(row[16]),
        notified=row[17], notify_after=row[18], notes=_loads(row[19]),
    )


Fact = tuple[str, str, str, "str | bytes", str | None]
"""A fact to chain: (run id, kind, ref, body, condition: an owner the run must be RUNNING
under when the transaction ends, or None); see `handrail_audit`."""


def _fact_arrays(facts: list[Fact]) -> tuple[list[Any], ...]:
    """`handrail_audit`'s parameters: one array per field (a call's body in its own)."""
    runs, kinds, refs, bodies, conds = (list(column) for column in zip(*facts, strict=True))
    rows = [b if isinstance(b, bytes) else None for b in bodies]
    texts = [None if isinstance(b, bytes) else b for b in bodies]
    return runs, kinds, refs, texts, rows, conds


async def _adopt(conn: psycopg.AsyncConnection[Any]) -> None:
    """Chain the record as it stands (a database migrated to the chain, 0010)."""
    facts: list[Fact] = []
    cur = await conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created_at, id")
    for row in await cur.fetchall():
        facts.append((row[0], "run", row[0], run_body(row), None))
        facts.append((row[0], "status", row[0], status_body(row[0], row[3], row[11]), None))
    cur = await conn.execute(f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY run_id, turn, idx")
    facts += [(r[1], "call", r[0], call_body(r), None) for r in await cur.fetchall()]
    cur = await conn.execute(f"SELECT {_PENDING_COLUMNS} FROM pending ORDER BY created_at, id")
    facts += [(r[2], "pending", r[0], pending_body(r), None) for r in await cur.fetchall()]
    for i in range(0, len(facts), 10_000):
        await conn.execute(_AUDIT_APPEND, _fact_arrays(facts[i:i + 10_000]))


_DUE = "SELECT 1 FROM pending WHERE state = 'open' AND deadline <= %s LIMIT 1"
"""Whether an item is due to expire (the `pending_deadline` index)."""


async def _move_run(conn: Any, run_id: str, facts: list[Fact]) -> None:
    """Move a paused run on once one of its items was decided (see `Store.decide`).

    The run's new status is added to `facts`, for the caller to chain in its transaction.
    """
    cur = await conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %s FOR UPDATE",
                             (run_id,))
    run_row = await cur.fetchone()
    if run_row is None:
        return
    cur = await conn.execute(
        f"SELECT {_PENDING_COLUMNS} FROM pending WHERE run_id = %s AND state = 'open'",
        (run_id,))
    still_open = [_pending_from(r) for r in await cur.fetchall()]
    moved = status_after_decision(_run_from(run_row), still_open)
    if moved is not None:
        outcome = _dumps(moved.outcome)
        await conn.execute("UPDATE runs SET status = %s, outcome = %s, updated_at = %s "
                           "WHERE id = %s", (moved.status.value, outcome,
                                              moved.updated_at, moved.id))
        facts.append((moved.id, "status", moved.id,
                      status_body(moved.id, moved.status.value, outcome), None))


async def _expire_due(conn: Any, now: float, facts: list[Fact]) -> list[PendingItem]:
    """Expire what is due, in the caller's transaction.

    Each expiry (and each run it moves) is added to `facts`, for the caller to chain in the
    same transaction. Exactly once: the items are locked (`FOR UPDATE`), and one a concurrent
    transaction decided meanwhile is re-read by PostgreSQL after that one commits, no longer
    open, and left out.
    """
    cur = await conn.execute(
        f"SELECT {_PENDING_COLUMNS} FROM pending WHERE state = 'open' AND deadline <= %s "
        "ORDER BY id FOR UPDATE", (now,))
    done = []
    for row in await cur.fetchall():
        item = expired(_pending_from(row), now)
        decided = await (await conn.execute(
            "UPDATE pending SET state = 'decided', decision = %s, decided_by = %s, "
            "decided_at = %s, payload = %s, notes = %s WHERE id = %s AND state = 'open' "
            f"RETURNING {_PENDING_COLUMNS}",
            (_dumps(item.decision), item.decided_by, now, _dumps(item.payload),
             _dumps(item.notes), item.id))).fetchone()
        if decided is not None:
            facts.append((item.run_id, "pending", item.id, pending_body(decided), None))
        await _move_run(conn, item.run_id, facts)
        done.append(item)
    if done:
        await conn.execute(_NOTIFY)
    return done


def _import_driver() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ConfigError(
            "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
            "pip install 'handrail[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


def map_psycopg_error(url: str, exc: BaseException) -> BaseException:
    """The handrail exception for a psycopg failure (the one map at this boundary).

    Every psycopg error (connection refused, authentication, a query failing, a pool timeout)
    becomes a `StoreError` naming the store; anything else is returned unchanged.
    """
    driver, psycopg_pool = _import_driver()
    if isinstance(exc, driver.Error) and exc.sqlstate == QUOTA_SQLSTATE:
        detail = json.loads(exc.diag.message_detail or "{}")
        return _QuotaFull(exc.diag.message_primary or str(exc), str(detail.get("counter")),
                          int(detail.get("bucket") or 0), int(detail.get("count") or 0))
    if isinstance(exc, driver.Error) and exc.sqlstate == FENCE_SQLSTATE:
        # The run was taken over (its lease lapsed, another worker holds it now): this
        # writer no longer drives it, and nothing of its write was committed.
        detail = exc.diag.message_primary or str(exc)
        return ResumeRefused(f"{detail}: taken over by another process (a lapsed lease); "
                             "this process no longer drives it and wrote nothing")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return StoreError(f"no connection to the PostgreSQL store {url} in time: {exc}")
    if isinstance(exc, driver.OperationalError):
        return StoreError(f"cannot reach the PostgreSQL store {url}: {exc}")
    if isinstance(exc, driver.Error):
        return StoreError(f"the PostgreSQL store {url} failed: {exc}")
    return exc


_CAS_ERRORS = (AlreadyDecided, NotFound, ResumeRefused)


class _Op:
    """One queued write: a coroutine function of a connection, and who waits for it."""

    __slots__ = ("cas", "deferred", "fn", "future", "waited")

    def __init__(self, fn: Callable[[Any], Awaitable[Any]], future: asyncio.Future[Any],
                 cas: bool, waited: bool, deferred: bool = False) -> None:
        self.fn = fn
        self.future = future
        self.cas = cas
        """A compare-and-swap (decide, claim): runs in a savepoint, may fail alone."""
        self.waited = waited
        """Someone awaits its outcome (False: `write(wait=False)`, reported to the next op)."""
        self.deferred = deferred
        """A conditional write decided wholly in SQL: `fn` sends its statements and returns a
        reader, called once the group has committed (no reply awaited before the commit)."""


RELEASE_PER_ITERATION = 4
"""At most this many waiters of a committed group resume per event-loop iteration (the rest
in the next ones, in commit order): the SQLite store's rule, for the same reason."""

GROUP_LIMIT = 64
"""At most this many writes per committed group."""


class PostgresStore(Store):
    """Runs, calls, messages and pending items in PostgreSQL, shared by many processes.

    Open it with `Store.open("postgresql://user@host/db")` (or `postgres://`); the connection
    string is libpq's (query parameters such as `?host=/run/postgresql` work). The schema is
    created or migrated at first use.

    Args:
        url: The libpq connection URL.
        durability: `"process"` (the default): a commit is acknowledged once the server has
            it (`synchronous_commit = off` for this store's sessions): it survives the death
            of any client process; a crash of the database server itself may lose the last
            fraction of a second of commits (never corrupting anything). `"fsync"`: each
            commit waits for the server's WAL to reach its disk (the server's own
            `synchronous_commit`, normally on); concurrent commits share those flushes.
        max_connections: The pool's size (one writer connection plus readers).
    """

    def __init__(self, url: str, *, durability: Durability = "process",
                 max_connections: int = 8) -> None:
        _import_driver()
        self.url = url
        self.durability = durability
        self._where = redacted_url(url)
        self._max = max(2, max_connections)
        self._pool: AsyncConnectionPool[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._ops: list[_Op] = []
        self._draining = False
        # Committed writes whose waiters have not been settled yet (`_release`), oldest first.
        self._to_release: collections.deque[tuple[_Op, tuple[bool, Any]]] = collections.deque()
        self._releasing = False
        self._drainer: asyncio.Task[None] | None = None
        self._background_error: BaseException | None = None
        self._closed = False
        self._driving: dict[str, str] = {}
        """Run id -> the owner this store's writes of it are fenced by (see `write`)."""
        self._holds: dict[str, str] = {}
        """Run id -> the worker that holds it (`claim_ready`) and must be the one to claim."""
        self._held_rows: dict[str, tuple[Any, ...]] = {}
        """Run id -> its row as `claim_ready` held it: `run()` before the claim reads it."""
        self._snapshots: dict[str, tuple[list[Any], list[Any], list[Any]]] = {}
        """Run id -> its message, call and pending rows, read in the transaction that claimed
        it.

        A run this store drives is written by nobody else (the fence), so until this store
        writes it again, `messages()` and `calls()` read these instead of the database (a
        resume reads both, twice, before its first write), and `pending_item()` its items
        that are no longer open (a decision never changes again; an open item may be
        decided elsewhere at any moment, so it is read from the database)."""
        self._settled_items: dict[str, tuple[Any, ...]] = {}
        """Item id -> the row of a decided item of a snapshot (see `_snapshots`)."""
        self._held_reads: dict[str, tuple[list[Any], list[Any], list[Any]]] = {}
        """Run id -> its message, call and settled item rows, read in the transaction that
        held it (`claim_ready`): the snapshot its claim will serve."""
        self._chained_status: dict[str, tuple[str, str | None]] = {}
        """Running runs' status facts as this store last chained them (`write`)."""
        self._group_facts: list[Fact] = []
        """The facts of the group being committed (`_commit_group`), in order."""
        self._claims: dict[str, tuple[str, str]] = {}
        """Run id -> (owner, held_by): a claim of a held run not sent yet (see `claim`)."""

    # ------------------------------------------------------------ opening

    async def _ensure_open(self) -> AsyncConnectionPool[Any]:
        if self._closed:
            raise StoreError(f"the PostgreSQL store {self._where} is closed")
        loop = asyncio.get_running_loop()
        if self._pool is not None:
            if loop is not self._loop:
                raise StoreError(
                    f"the PostgreSQL store {self._where} serves the event loop it was first "
                    "used on; open one store per event loop (per anyio.run)"
                )
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open_pool()
                self._loop = loop
        return self._pool

    async def _open_pool(self) -> AsyncConnectionPool[Any]:
        driver, psycopg_pool = _import_driver()
        try:
            # Check and migrate the schema on one connection before any pooled one exists:
            # a newer schema is refused before anything is written.
            async with await driver.AsyncConnection.connect(self.url, autocommit=True) as conn:
                await self._migrate(conn)
            pool: AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
                self.url, min_size=1, max_size=self._max, open=False,
                kwargs={"autocommit": True}, name="handrail", configure=self._configure,
            )
            await pool.open(wait=True, timeout=30)
        except (SchemaTooNew, StoreError):
            raise
        except Exception as exc:
            raise map_psycopg_error(self._where, exc) from exc
        return pool

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # durability="process": a commit is acknowledged once the server has it (its WAL in
        # the server's memory), before the WAL reaches the disk: it survives the death of this
        # process, like the SQLite store's "process" level. "fsync": the commit waits for the
        # server's WAL flush (the server's own setting; normally on).
        if self.durability == "process":
            await conn.execute("SET synchronous_commit = off")

    async def _migrate(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            # Concurrent first opens (four workers starting together) migrate one at a time.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            exists = (await (await conn.execute(
                "SELECT to_regclass('handrail_migrations') IS NOT NULL")).fetchone() or (False,))[0]
            done: set[str] = set()
            if exists:
                rows = await (await conn.execute("SELECT name FROM handrail_migrations")).fetchall()
                done = {r[0] for r in rows}
            newer = done - {name for name, _ in MIGRATIONS}
            if newer:
                raise SchemaTooNew(
                    f"the PostgreSQL store {self._where} was migrated by a newer handrail "
                    f"(schema version {len(done)}, migrations {sorted(newer)} unknown here; "
                    f"this handrail knows version {SCHEMA_VERSION}); upgrade handrail to use it. "
                    "Nothing was written."
                )
            if len(done) == len(MIGRATIONS):
                return  # current: opening writes nothing
            if not exists:
                await conn.execute(
                    "CREATE TABLE handrail_migrations (id INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL UNIQUE, applied_at DOUBLE PRECISION NOT NULL)"
                )
            for number, (name, sql) in enumerate(MIGRATIONS, start=1):
                if name in done:
                    continue
                statements = sql.split(";") if isinstance(sql, str) else sql
                for statement in statements:
                    if statement.strip():
                        await conn.execute(statement.encode())
                if name == "0010_audit_chain":
                    await _adopt(conn)
                await conn.execute(
                    "INSERT INTO handrail_migrations VALUES (%s, %s, %s)",
                    (number, name, time.time()),
                )

    async def schema_version(self) -> int:
        """How many migrations the database has run (this handrail writes `SCHEMA_VERSION`)."""
        row = await self._read_one("SELECT count(*) FROM handrail_migrations", ())
        return int(row[0]) if row else 0

    # ------------------------------------------------------------ the writer

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the PostgreSQL store {self._where} is closed")
        error = self._background_error
        if error is not None:
            # A failed write(wait=False) surfaces at the next operation, never silently.
            self._background_error = None
            raise StoreError(f"an earlier write to {self._where} failed: {error}") from error

    async def _enqueue(self, fn: Callable[[Any], Awaitable[Any]], *, cas: bool = False,
                       wait: bool = True, deferred: bool = False) -> Any:
        self._check_open()
        await self._ensure_open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        # Mark every outcome retrieved: a waiter cancelled while its write commits must not
        # leave "exception never retrieved" behind.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._ops.append(_Op(fn, future, cas, wait, deferred))
        if not self._draining:
            self._draining = True
            self._drainer = loop.create_task(self._drain())
        if not wait:
            return None
        # The write commits whether or not this waiter stays (it is in the queue already).
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        """Commit queued writes group by group until the queue is empty."""
        try:
            while self._ops:
                ops, self._ops = self._ops[:GROUP_LIMIT], self._ops[GROUP_LIMIT:]
                await self._commit(ops)
        finally:
            self._draining = False

    async def _commit(self, ops: list[_Op]) -> None:
        pool = self._pool
        assert pool is not None
        try:
            outcomes = await self._commit_group(pool, ops)
        except Exception as exc:  # the group failed: retry each write alone
            if len(ops) == 1:
                self._settle(ops[0], False, map_psycopg_error(self._where, exc))
                return
            for op in ops:
                try:
                    (outcome,) = await self._commit_group(pool, [op])
                except Exception as one:
                    outcome = (False, map_psycopg_error(self._where, one))
                self._settle(op, *outcome)
            return
        # Paced, as the SQLite store's releases: each waiter resumed does its run's next turn
        # in the loop iteration that resumes it, and anything else on the loop waits for the
        # whole iteration. A few per iteration (`_release`), while this drainer goes on to
        # commit the next group (issue 24).
        self._to_release.extend(zip(ops, outcomes, strict=True))
        if not self._releasing:
            self._releasing = True
            self._release()

    def _release(self) -> None:
        """Settle the next few committed writes' waiters; again in the next loop iteration."""
        pending = self._to_release
        released = 0
        while pending and released < RELEASE_PER_ITERATION:
            op, (ok, value) = pending.popleft()
            if op.waited and not op.future.done():
                released += 1
            self._settle(op, ok, value)
        if pending:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._releasing = False

    async def _commit_group(self, pool: AsyncConnectionPool[Any], ops: list[_Op]
                            ) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        # Pipeline mode: the group's statements go out without waiting for each reply (one
        # round trip per group, not per statement); a compare-and-swap reads its own reply.
        # A deferred op (a conditional UPDATE ... RETURNING) is read after the commit: its
        # condition is the database's, nothing to undo when it matched no row.
        facts: list[Fact] = []
        self._group_facts = facts
        async with pool.connection() as conn:
            try:
                return await self._commit_on(conn, ops, outcomes, facts)
            except _import_driver()[0].Error:
                # A statement failed in the pipeline (a full quota window, a lost fence):
                # psycopg's prepared statements may no longer be the server's (a statement
                # it prepared in the aborted pipeline was never run: `prepared statement
                # "_pg3_33" does not exist` at this connection's next write). This
                # connection is not used again; the pool opens another.
                await conn.close()
                raise

    async def _commit_on(self, conn: Any, ops: list[_Op], outcomes: list[tuple[bool, Any]],
                         facts: list[Fact]) -> list[tuple[bool, Any]]:
        if all(not op.cas or op.deferred for op in ops):
            # Nothing to read before the commit: no BEGIN, no COMMIT. Everything up to
            # the pipeline's Sync is one implicit transaction, committed at the Sync and
            # rolled back whole if any statement fails (the protocol's rule): half the
            # client CPU and wall time of an explicit transaction for a runner's write.
            async with conn.pipeline():
                for op in ops:
                    outcomes.append((True, await op.fn(conn)))
                if facts:
                    # Never a prepared statement: a pipeline aborted by a lost fence
                    # before this one's Parse left psycopg believing it prepared, and
                    # the next group failed on "prepared statement does not exist".
                    await conn.execute(_AUDIT_APPEND, _fact_arrays(facts), prepare=False)
        else:
            async with conn.pipeline(), conn.transaction():
                for op in ops:
                    if not op.cas or op.deferred:
                        outcomes.append((True, await op.fn(conn)))
                        continue
                    try:
                        async with conn.transaction():  # a savepoint: a lost CAS fails alone
                            outcomes.append((True, await op.fn(conn)))
                    except _CAS_ERRORS as exc:
                        outcomes.append((False, exc))
                if facts:
                    await conn.execute(_AUDIT_APPEND, _fact_arrays(facts), prepare=False)
        for i, op in enumerate(ops):
            if op.deferred:
                try:
                    outcomes[i] = (True, await outcomes[i][1]())
                except _CAS_ERRORS as exc:
                    outcomes[i] = (False, exc)
        return outcomes

    def _settle(self, op: _Op, ok: bool, value: Any) -> None:
        if op.future.done():
            return
        if ok:
            op.future.set_result(value)
        else:
            if not op.future.get_loop().is_closed() and isinstance(value, BaseException):
                op.future.set_exception(value)
            if not op.waited and not isinstance(value, ResumeRefused):
                # Nobody waits for this write: its failure is raised by the next operation.
                # Not a lost fence (a heartbeat of a run taken over): that run's driver
                # meets it at its next write, and other runs' operations are not its concern.
                self._background_error = value

    async def _barrier(self) -> None:
        """Wait until every write issued before this call has committed."""
        if self._ops:
            last = self._ops[-1].future
        elif self._draining and self._drainer is not None:
            await asyncio.shield(self._drainer)
            return
        else:
            return
        try:
            await asyncio.shield(last)
        except Exception:  # its waiter (or the next operation) reports it
            pass

    # ------------------------------------------------------------ reads

    async def _read(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        self._check_open()
        pool = await self._ensure_open()
        if self._claims:
            await self._send_claims()
        await self._barrier()
        self._check_open()  # a write queued before this read failed: say so, not read past it
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params)
                rows: list[tuple[Any, ...]] = await cur.fetchall()
                return rows
        except Exception as exc:
            raise map_psycopg_error(self._where, exc) from exc

    async def _read_one(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        rows = await self._read(sql, params)
        return rows[0] if rows else None

    # ------------------------------------------------------------ the contract

    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        if batch.run is not None:
            check_run_record(batch.run)
        # Rows are built now: the caller may change its records as soon as this returns.
        run_row = None if batch.run is None else _run_row(batch.run, _dumps(batch.run.policy))
        messages = [(r, s, _ENCODE(m)) for r, s, m in batch.messages]
        calls = [_call_row(c) for c in batch.calls]
        pending = [_pending_row(p) for p in batch.pending]
        # Fenced: a run this store drives (it claimed it, or wrote it RUNNING under an owner)
        # is written only while that owner still holds it. Another machine takes a run over
        # once its lease lapses (a stalled process, a starved heartbeat); the stalled writer
        # must then change nothing — above all not mark a call STARTED and run its tool
        # after the new driver found the call not started and ran it. The fence locks the
        # row and fails the transaction otherwise (`ResumeRefused`).
        driving = self._driving
        fences = []
        claims: list[tuple[str, str, str]] = []
        if driving or self._snapshots or self._held_rows:
            touched = {c.run_id for c in batch.calls} | {p.run_id for p in batch.pending} | {
                r for r, _, _ in batch.messages}
            if batch.run is not None:
                touched.add(batch.run.id)
            fences = [(run_id, driving[run_id]) for run_id in touched if run_id in driving]
            for run_id in touched:  # read from the database again, after this write
                self._forget(run_id)
                self._held_rows.pop(run_id, None)
                self._held_reads.pop(run_id, None)
                claim = self._claims.pop(run_id, None)
                if claim is not None:
                    claims.append((run_id, *claim))
        lease = self.lease_seconds
        # What this write adds to the audit chain, appended at the end of its group's
        # transaction (`handrail_audit`): a claim sent with it (kept if it took), the run's
        # start (when this store has not chained it), its call records and pending items,
        # then its status when it is not the one this store chained last.
        facts: list[Fact] = [(run_id, "status", run_id, status_body(run_id, "running", None),
                              owner) for run_id, owner, _ in claims]
        run = batch.run
        chained = self._chained_status
        if run is not None and run.id not in chained:
            facts.append((run.id, "run", run.id, run_body((
                run.id, run.task, run.agent, None, run.parent_id, run_row[5],  # type: ignore[index]
                run.manifest_digest, run.model, run.workspace, run.created_at, *(None,) * 10,
                run.agent_ref, run.parent_call_id, run.depth)), None))
        facts += [(c[1], "call", c[0], call_body(c), None) for c in calls]
        facts += [(p[2], "pending", p[0], pending_body(p), None) for p in pending]
        if run is not None:
            # (The pair, not its body: the body is built only when the status changed.)
            status = (run.status._value_, run_row[11])  # type: ignore[index]
            if chained.get(run.id) != status:
                facts.append((run.id, "status", run.id, status_body(run.id, *status), None))
                if wait and run.status is RunStatus.RUNNING:
                    chained[run.id] = status
                else:
                    chained.pop(run.id, None)

        # Sorted: two writers' claims on the same windows lock their rows in one order.
        quotas = sorted(batch.claims, key=lambda c: (c.counter, c.window))

        counted: list[Any] = []

        async def apply(conn: psycopg.AsyncConnection[Any]) -> Any:
            counted.clear()  # applied again alone when its group failed
            self._group_facts += facts
            cur = conn.cursor()
            for run_id, owner, held_by in claims:  # before its fence (`claim`)
                await cur.execute(_CLAIM_HELD, (owner, lease, run_id, held_by))
            for fence in fences:
                await cur.execute("SELECT handrail_fence(%s, %s)", fence)
            for quota in quotas:
                # Sent, not read: a full window fails the transaction (`handrail_quota`);
                # the counts are read once it has committed (`deferred`).
                one = conn.cursor()
                await one.execute(_QUOTA_CLAIM, (quota.counter, quota.window, quota.limit,
                                                 quota.force))
                counted.append(one)
            if run_row is not None:
                await cur.execute(_RUN_UPSERT, run_row)
            if messages:
                await cur.executemany(_MESSAGE_UPSERT, messages)
            if calls:
                await cur.executemany(_CALL_UPSERT, calls)
            if pending:
                await cur.executemany(_PENDING_UPSERT, pending)
            if not quotas:
                return None

            async def read() -> None:
                for quota, one in zip(quotas, counted, strict=True):
                    row = await one.fetchone()
                    quota.count = int(row[0])

            return read

        try:
            if quotas:
                try:
                    await self._enqueue(apply, cas=True, deferred=True)
                except _QuotaFull as full:
                    # Nothing of it was written, a run's claim riding on it included: the
                    # next write carries that again.
                    for run_id, owner, held_by in claims:
                        self._claims.setdefault(run_id, (owner, held_by))
                    refused = next((q for q in quotas if (q.counter, q.window)
                                    == (full.counter, full.bucket)), quotas[0])
                    raise QuotaExceeded(refused, full.count) from None
            else:
                await self._enqueue(apply, wait=wait)
        except BaseException:
            if run is not None:
                chained.pop(run.id, None)  # its status may not be chained
            raise
        if run is not None:
            # Committed (or queued, with wait=False; a write after it is fenced the same).
            if run.status is RunStatus.RUNNING and run.owner:
                driving[run.id] = run.owner
            else:
                driving.pop(run.id, None)

    async def flush(self) -> None:
        if self._pool is not None:
            await self._barrier()
        self._check_open()

    async def run(self, run_id: str) -> RunRecord:
        held = self._held_rows.get(run_id)
        if held is not None:
            self._check_open()
            return _run_from(held)
        row = await self._read_one(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = %s", (run_id,))
        if row is None:
            raise NotFound(f"no run {run_id!r} in {self._where}")
        return _run_from(row)

    async def runs(self, *, limit: int = 50, status: RunStatus | None = None) -> list[RunRecord]:
        if status is None:
            rows = await self._read(
                f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created_at DESC LIMIT %s", (limit,))
        else:
            rows = await self._read(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = %s ORDER BY created_at DESC "
                "LIMIT %s", (status.value, limit))
        return [_run_from(r) for r in rows]

    async def call_history(self, *, since: float = 0.0, decisions_only: bool = False,
                           ) -> AsyncIterator[tuple[RunRecord, list[CallRecord]]]:
        # One READ ONLY, REPEATABLE READ transaction: the server refuses any write in it, and
        # every chunk of calls is read from the snapshot the runs were listed in.
        columns = ", ".join(DECISION_COLUMNS) if decisions_only else _CALL_COLUMNS
        decode: Callable[[tuple[Any, ...]], CallRecord] = (
            DecisionRows() if decisions_only else _call_from)
        self._check_open()
        pool = await self._ensure_open()
        if self._claims:
            await self._send_claims()
        await self._barrier()
        self._check_open()
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur = await conn.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE created_at >= %s "
                    "ORDER BY created_at, id", (since,))
                runs = [_run_from(r) for r in await cur.fetchall()]
                for start in range(0, len(runs), _HISTORY_CHUNK):
                    chunk = runs[start:start + _HISTORY_CHUNK]
                    cur = await conn.execute(
                        f"SELECT {columns} FROM calls WHERE run_id = ANY(%s) "
                        "ORDER BY run_id, turn, idx", ([r.id for r in chunk],))
                    calls: dict[str, list[CallRecord]] = {}
                    for row in await cur.fetchall():
                        calls.setdefault(row[1], []).append(decode(row))
                    for run in chunk:
                        yield run, calls.get(run.id, [])
        except (StoreError, NotFound):
            raise
        except Exception as exc:
            raise map_psycopg_error(self._where, exc) from exc

    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        snapshot = self._snapshots.get(run_id)
        if snapshot is not None:
            self._check_open()
            return [json.loads(r[0]) for r in snapshot[0]]
        rows = await self._read("SELECT data FROM messages WHERE run_id = %s ORDER BY seq",
                                (run_id,))
        return [json.loads(r[0]) for r in rows]

    async def calls(self, run_id: str) -> list[CallRecord]:
        snapshot = self._snapshots.get(run_id)
        if snapshot is not None:
            self._check_open()
            return [_call_from(r) for r in snapshot[1]]
        rows = await self._read(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = %s ORDER BY turn, idx", (run_id,))
        return [_call_from(r) for r in rows]

    async def call(self, record_id: str) -> CallRecord:
        row = await self._read_one(f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = %s",
                                   (record_id,))
        if row is None:
            raise NotFound(f"no call {record_id!r} in {self._where}")
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
                where.append(f"{column} = %s")
                params.append(value)
        bound = cutoff(older_than)
        if bound is not None:
            where.append("created_at <= %s")
            params.append(bound)
        await self._expire_if_due()
        rows = await self._read(
            f"SELECT {_PENDING_COLUMNS} FROM pending WHERE {' AND '.join(where)} "
            "ORDER BY created_at, id", params)
        return [_pending_from(r) for r in rows]

    async def _expire_if_due(self) -> None:
        """Expire what is due (this touch enforces it); one indexed read when nothing is."""
        if await self._read_one(_DUE, (self.clock(),)) is not None:
            await self.expire_due()

    async def expire_due(self) -> list[PendingItem]:
        clock = self.clock

        async def expire(conn: psycopg.AsyncConnection[Any]) -> list[PendingItem]:
            return await self._chained(conn, lambda c, facts: _expire_due(c, clock(), facts))

        done: list[PendingItem] = await self._enqueue(expire, cas=True)
        for item in done:
            self._held_rows.pop(item.run_id, None)  # its status moved
            self._held_reads.pop(item.run_id, None)
        return done

    async def take_notifications(self, *, hold: float, limit: int = 50,
                                 ) -> list[PendingItem]:
        now = self.clock()

        async def take(conn: psycopg.AsyncConnection[Any]) -> list[PendingItem]:
            # SKIP LOCKED: an item another sender is taking right now is theirs.
            cur = await conn.execute(
                "UPDATE pending SET notify_after = %s WHERE id IN (SELECT id FROM pending "
                "WHERE state = 'open' AND notified < 2 AND notify_after <= %s AND "
                "(notified = 0 OR escalate_at <= %s) ORDER BY created_at LIMIT %s "
                f"FOR UPDATE SKIP LOCKED) RETURNING {_PENDING_COLUMNS}",
                (now + hold, now, now, max(limit, 0)))
            return sorted((_pending_from(r) for r in await cur.fetchall()),
                          key=lambda p: p.created_at)

        taken: list[PendingItem] = await self._enqueue(take, cas=True)
        return taken

    async def record_notification(self, item_id: str, note: dict[str, Any], *,
                                  notified: int | None = None,
                                  retry_at: float | None = None) -> None:
        note_json, where = _dumps([note]), self._where
        event_json = _dumps(logged_event(item_id, note))
        at = float(note.get("at") or self.clock())

        async def record(conn: psycopg.AsyncConnection[Any]) -> Exception | None:
            # One statement: the item's note and its run's event, in one transaction.
            cur = await conn.execute(
                "WITH item AS (UPDATE pending SET notes = (notes::jsonb || %s::jsonb)::text, "
                "notified = greatest(notified, coalesce(%s, notified)), "
                "notify_after = coalesce(%s, notify_after) WHERE id = %s RETURNING run_id) "
                "INSERT INTO run_events (run_id, at, event) SELECT run_id, %s, %s FROM item "
                "RETURNING seq",
                (note_json, notified, retry_at, item_id, at, event_json))
            if await cur.fetchone() is None:
                return NotFound(f"no pending item {item_id!r} in {where}")
            return None

        failed = await self._enqueue(record, cas=True)
        if isinstance(failed, Exception):
            raise failed

    async def quota_count(self, counter: str, window: int) -> int:
        row = await self._read_one("SELECT n FROM quota_counts WHERE counter = %s AND "
                                   "bucket = %s", (counter, window))
        return 0 if row is None else int(row[0])

    async def _logged_events(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self._read("SELECT event FROM run_events WHERE run_id = %s ORDER BY seq",
                                (run_id,))
        return [_loads(r[0]) for r in rows]

    async def pending_item(self, item_id: str) -> PendingItem:
        settled = self._settled_items.get(item_id)
        if settled is not None:
            self._check_open()
            return _pending_from(settled)
        await self._expire_if_due()
        row = await self._read_one(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = %s",
                                   (item_id,))
        if row is None:
            raise NotFound(f"no pending item {item_id!r} in {self._where}")
        return _pending_from(row)

    async def _chained(self, conn: psycopg.AsyncConnection[Any],
                       change: Callable[[Any, list[Fact]], Awaitable[T]]) -> T:
        """Run `change` in the write's transaction; chain the facts it adds to its list.

        For the writes that are not batches (a decision, an expiry, a claim): the facts go
        to the group's `handrail_audit` whatever `change` returns (a refusal returned after
        an expiry keeps the expiry, and so its facts); a raise rolls both back, and adds none.
        """
        facts: list[Fact] = []
        result = await change(conn, facts)
        self._group_facts += facts
        for run_id in {fact[0] for fact in facts}:
            self._chained_status.pop(run_id, None)
        return result

    async def decide(self, item_id: str, decision: dict[str, Any], decided_by: str, *,
                     payload: dict[str, Any] | None = None) -> PendingItem:
        where, clock = self._where, self.clock

        async def decide_in(conn: psycopg.AsyncConnection[Any], facts: list[Fact]
                            ) -> PendingItem | Exception:
            now = clock()
            # What is due expires first, in this transaction: a decision after the deadline
            # is refused ("already decided by expiry"). A refusal is returned, not raised: a
            # raise rolls back the transaction, the expiry with it.
            if await (await conn.execute(_DUE, (now,))).fetchone() is not None:
                await _expire_due(conn, now, facts)
            # The item's row lock makes a concurrent decision wait, then read what this one
            # wrote: counted once, in order (four-eyes approvals included).
            cur = await conn.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = %s FOR UPDATE", (item_id,))
            row = await cur.fetchone()
            if row is None:
                return NotFound(f"no pending item {item_id!r} in {where}")
            item = _pending_from(row)
            try:
                after = counted(item, decision, decided_by, now, payload)
            except (AlreadyDecided, UserError) as exc:
                return exc
            if after is None:
                return item
            decided = await (await conn.execute(
                "UPDATE pending SET state = %s, decision = %s, decided_by = %s, "
                "decided_at = %s, payload = %s, approvals = %s WHERE id = %s "
                f"RETURNING {_PENDING_COLUMNS}",
                (after.state, _dumps(after.decision), after.decided_by, after.decided_at,
                 _dumps(after.payload), _dumps(after.approvals), item_id))).fetchone()
            # Chained: each approval (a four-eyes item's first one changes who decided so
            # far), the decision, and the run's move.
            if decided is not None:
                facts.append((item.run_id, "pending", item.id, pending_body(decided), None))
            if after.state != "open":
                # In the same transaction a paused run moves on: READY when nothing else of
                # it is open, else the status of its oldest open item (the Store contract).
                await _move_run(conn, item.run_id, facts)
                await conn.execute(_NOTIFY)
            return after

        async def cas(conn: psycopg.AsyncConnection[Any]) -> PendingItem | Exception:
            return await self._chained(conn, decide_in)

        result = await self._enqueue(cas, cas=True)
        if isinstance(result, Exception):
            raise result
        assert isinstance(result, PendingItem)
        self._held_rows.pop(result.run_id, None)  # its status may have moved
        self._held_reads.pop(result.run_id, None)
        return result

    async def claim(self, run_id: str, owner: str) -> RunRecord:
        lease = self.lease_seconds
        where = self._where
        held_by = self._holds.pop(run_id, None)
        held_row = self._held_rows.pop(run_id, None)
        reads = self._held_reads.pop(run_id, None)
        # Whatever was read ahead for an earlier claim is not this one's: another process
        # may have driven the run since.
        self._forget(run_id)
        self._claims.pop(run_id, None)
        if held_by is not None and held_row is not None and reads is not None:
            return self._claim_with_next_write(run_id, owner, held_by, held_row, reads)
        if held_by is not None:
            return await self._claim_held(run_id, owner, held_by)

        clock = self.clock

        async def claim_in(conn: psycopg.AsyncConnection[Any], facts: list[Fact]) -> RunRecord:
            # A run resumed after its item's deadline continues with the default.
            if await (await conn.execute(_DUE, (clock(),))).fetchone() is not None:
                await _expire_due(conn, clock(), facts)
            cur = await conn.execute(
                f"SELECT {_RUN_COLUMNS}, {_NOW} FROM runs WHERE id = %s FOR UPDATE", (run_id,))
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"no run {run_id!r} in {where}")
            check_claimable(_run_from(row), row[_NOW_AT])
            cur = await conn.execute(
                f"UPDATE runs SET status = 'running', owner = %s, lease_until = {_NOW} + %s, "
                f"updated_at = {_NOW}, outcome = NULL WHERE id = %s RETURNING {_RUN_COLUMNS}",
                (owner, lease, run_id),
            )
            updated = await cur.fetchone()
            assert updated is not None
            facts.append((run_id, "status", run_id, status_body(run_id, "running", None), None))
            return _run_from(updated)

        async def cas(conn: psycopg.AsyncConnection[Any]) -> RunRecord:
            return await self._chained(conn, claim_in)

        result: RunRecord = await self._enqueue(cas, cas=True)
        self._driving[run_id] = owner
        return result

    def _claim_with_next_write(self, run_id: str, owner: str, held_by: str,
                               held_row: tuple[Any, ...],
                               reads: tuple[list[Any], list[Any], list[Any]]) -> RunRecord:
        """Claim a run this store's worker holds and read ahead, in the run's next write.

        Nothing is sent now (a round trip saved per resume): the claim is the conditional
        UPDATE of `_claim_held` (still held by `held_by`, not finished), sent at the head of
        the run's next write, before that write's owner fence. Until then nothing can
        happen to the world on this claim's word: a resume performs an action only after a
        write (the call's STARTED mark) has committed. If the hold lapsed and another worker
        took the run, the UPDATE changes nothing, the fence finds the other owner, and that
        write (all of it) fails with `ResumeRefused`; this store then writes nothing of the
        run. Reads of the database send the claims waiting first (`_send_claims`).
        """
        self._claims[run_id] = (owner, held_by)
        self._chained_status.pop(run_id, None)
        self._driving[run_id] = owner
        self._snapshots[run_id] = reads
        for item in reads[2]:
            self._settled_items[item[0]] = item
        now = time.time()
        return dataclasses.replace(_run_from(held_row), status=RunStatus.RUNNING, owner=owner,
                                   lease_until=now + self.lease_seconds, updated_at=now,
                                   outcome=None)

    async def _send_claims(self) -> None:
        """Send the claims waiting for their run's next write (a read must see them)."""
        claims, self._claims = list(self._claims.items()), {}
        lease = self.lease_seconds

        async def send(conn: psycopg.AsyncConnection[Any]) -> None:
            cur = conn.cursor()
            for run_id, (owner, held_by) in claims:
                await cur.execute(_CLAIM_HELD, (owner, lease, run_id, held_by))
                self._group_facts.append((run_id, "status", run_id,
                                          status_body(run_id, "running", None), owner))

        await self._enqueue(send)

    async def _claim_held(self, run_id: str, owner: str, held_by: str) -> RunRecord:
        """Claim a run this store's worker holds: one conditional UPDATE, read after commit.

        Held (`claim_ready`), the run is claimable exactly when `held_by` still holds it and
        it is not finished: a condition the database decides alone, so the claim waits for
        no reply before its commit. A hold that lapsed and was taken by another worker (who
        may have driven the run on already) is not claimed: `ResumeRefused`. The run's
        messages, calls and settled items are read in the same transaction, for the resume
        that follows (`_snapshots`).
        """
        lease = self.lease_seconds

        async def send(conn: psycopg.AsyncConnection[Any]
                       ) -> Callable[[], Awaitable[tuple[Any, list[Any], list[Any], list[Any]]]]:
            run_cur, message_cur, call_cur, pending_cur = (
                conn.cursor(), conn.cursor(), conn.cursor(), conn.cursor())
            await run_cur.execute(f"{_CLAIM_HELD} RETURNING {_RUN_COLUMNS}",
                                  (owner, lease, run_id, held_by))
            self._group_facts.append((run_id, "status", run_id,
                                      status_body(run_id, "running", None), owner))
            await message_cur.execute(
                "SELECT data FROM messages WHERE run_id = %s ORDER BY seq", (run_id,))
            await call_cur.execute(
                f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = %s ORDER BY turn, idx",
                (run_id,))
            await pending_cur.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending WHERE run_id = %s AND state <> 'open'",
                (run_id,))

            async def read() -> tuple[Any, list[Any], list[Any], list[Any]]:
                row = await run_cur.fetchone()
                if row is None:
                    raise ResumeRefused(
                        f"run {run_id} was finished, or taken by another worker, after "
                        f"{held_by} held it (its hold lapsed)")
                return (row, await message_cur.fetchall(), await call_cur.fetchall(),
                        await pending_cur.fetchall())

            return read

        row, message_rows, call_rows, item_rows = await self._enqueue(send, cas=True,
                                                                      deferred=True)
        self._chained_status.pop(run_id, None)
        self._driving[run_id] = owner
        if len(self._snapshots) >= 4096:  # runs left without a write (a lost worker's)
            self._forget(next(iter(self._snapshots)))
        self._snapshots[run_id] = (message_rows, call_rows, item_rows)
        for item in item_rows:
            self._settled_items[item[0]] = item
        return _run_from(row)

    def _forget(self, run_id: str) -> None:
        """Drop a run's snapshot: its next reads go to the database."""
        snapshot = self._snapshots.pop(run_id, None)
        if snapshot is not None:
            for item in snapshot[2]:
                self._settled_items.pop(item[0], None)

    # ------------------------------------------------------------ for workers

    async def claim_ready(self, owner: str, limit: int = 1,
                          exclude: frozenset[str] = frozenset(), *,
                          orphans: bool = True) -> list[RunRecord]:
        """Hold up to `limit` runs that are ready to continue, for `owner` to resume.

        Ready: nobody holds it (no owner, or a lease lapsed on the database's clock, or an
        owner that was a process of this machine and is gone) and it is either paused with
        every pending item it waits on decided, or RUNNING (its driver died). Candidates are
        locked with `FOR UPDATE SKIP LOCKED`, so concurrent workers take disjoint runs without
        waiting on each other. A held run keeps its status; it gets `owner` and a fresh lease,
        which keeps every other worker off it until `owner` resumes it (`claim`, then the
        runner's heartbeat renews the lease) or releases it (`release`).

        With `orphans=False` only runs nobody drives are looked at (paused with everything
        decided, or READY), in one statement whose reply is read after its commit, sent with
        the reads of the held runs' messages, calls and decided items: their `claim` then
        sends nothing of its own (it rides on the run's next write, see
        `_claim_with_next_write`). RUNNING runs whose driver is gone (a dead process of this
        machine, a lapsed lease elsewhere) are looked for with `orphans=True` (a worker does
        so once per poll interval).
        """
        lease = self.lease_seconds
        if not orphans:
            taken = await self._enqueue(
                lambda conn: self._take_paused(conn, owner, limit, exclude),
                cas=True, deferred=True) or []
            for row in taken:
                self._holds[row[0]] = owner
                self._held_rows[row[0]] = row
            return [_run_from(row) for row in taken]
        # Runs held by a process of this machine that is gone (a SIGKILLed worker): known dead
        # now, no need to wait for the lease.
        local = await self._read(
            "SELECT id, owner FROM runs WHERE owner LIKE %s AND status NOT IN "
            "('completed', 'failed')",
            (socket.gethostname().replace("%", r"\%").replace("_", r"\_") + ":%",))
        # Never this process's own: a run this process drives is not an orphan, even in the
        # moment between `claim` and its runner registering in ACTIVE_OWNERS (taking it then
        # would resume it twice, here).
        me = f":{os.getpid()}:"
        dead = [run_id for run_id, holder in local
                if me not in holder and not is_owner_alive(holder)]

        async def take(conn: psycopg.AsyncConnection[Any]) -> list[RunRecord]:
            cur = await conn.execute(
                f"SELECT {_RUN_COLUMNS}, {_NOW} FROM runs r WHERE ({READY_WHERE} "
                "OR (r.id = ANY(%s) AND r.status NOT IN ('completed', 'failed'))) "
                "AND NOT (r.id = ANY(%s)) ORDER BY r.updated_at LIMIT %s "
                "FOR UPDATE SKIP LOCKED",
                (dead, list(exclude), limit * 2 + 8),
            )
            taken: list[str] = []
            for row in await cur.fetchall():
                run = _run_from(row)
                if run.status is RunStatus.RUNNING and run.owner is not None:
                    try:
                        check_claimable(run, row[_NOW_AT])
                    except ResumeRefused:
                        continue
                elif run.owner is not None and run.lease_until >= row[_NOW_AT] and \
                        is_owner_alive(run.owner):
                    continue
                taken.append(run.id)
                if len(taken) == limit:
                    break
            if not taken:
                return []
            cur = await conn.execute(
                f"UPDATE runs SET owner = %s, lease_until = {_NOW} + %s "
                f"WHERE id = ANY(%s) RETURNING {_RUN_COLUMNS}",
                (owner, lease, taken),
            )
            return [_run_from(r) for r in await cur.fetchall()]

        result = await self._enqueue(take, cas=True) or []
        for run in result:
            self._holds[run.id] = owner
        return result

    async def _take_paused(self, conn: psycopg.AsyncConnection[Any], owner: str, limit: int,
                           exclude: frozenset[str]) -> Callable[[], Awaitable[list[Any]]]:
        """Hold runs paused with everything decided, or READY: one UPDATE, read after commit.

        Nobody drives such a run, so whether it may be taken is the database's to decide
        alone (no owner, or a lapsed lease): the claim waits for no reply before its commit.
        """
        cur, message_cur, call_cur, pending_cur = (
            conn.cursor(), conn.cursor(), conn.cursor(), conn.cursor())
        await cur.execute(_TAKE_PAUSED, (owner, self.lease_seconds, list(exclude), limit))
        # In the same transaction, what the resume of each run held will read first: the
        # runs this owner holds and is not resuming yet are the ones just held (rows of
        # another are dropped below).
        held = _HELD_BY
        await message_cur.execute(
            f"SELECT run_id, data FROM messages WHERE run_id IN ({held}) ORDER BY run_id, seq",
            (owner, list(exclude)))
        await call_cur.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id IN ({held}) "
            "ORDER BY run_id, turn, idx", (owner, list(exclude)))
        await pending_cur.execute(
            f"SELECT {_PENDING_COLUMNS} FROM pending WHERE run_id IN ({held}) AND "
            "state <> 'open'", (owner, list(exclude)))

        async def read() -> list[Any]:
            rows: list[Any] = await cur.fetchall()
            reads: dict[str, tuple[list[Any], list[Any], list[Any]]] = {
                row[0]: ([], [], []) for row in rows}
            for run_id, data in await message_cur.fetchall():
                if run_id in reads:
                    reads[run_id][0].append((data,))
            for call_row in await call_cur.fetchall():
                if call_row[1] in reads:
                    reads[call_row[1]][1].append(call_row)
            for item_row in await pending_cur.fetchall():
                if item_row[2] in reads:
                    reads[item_row[2]][2].append(item_row)
            if len(self._held_reads) >= 4096:  # held and never claimed (a lost resume's)
                self._held_reads.pop(next(iter(self._held_reads)))
            self._held_reads.update(reads)
            return rows

        return read

    async def ready_count(self) -> int:
        """How many runs are ready to continue now (see `claim_ready`)."""
        row = await self._read_one(f"SELECT count(*) FROM runs r WHERE {READY_WHERE}", ())
        return int(row[0]) if row else 0

    async def release(self, run_id: str, owner: str) -> bool:
        """Give a held run back (no owner, no lease) if `owner` still holds it."""
        if self._holds.get(run_id) == owner:
            del self._holds[run_id]
        self._held_rows.pop(run_id, None)
        self._held_reads.pop(run_id, None)
        self._forget(run_id)
        claim = self._claims.get(run_id)
        if claim is not None and claim[1] == owner:  # never sent: the hold is owner's still
            del self._claims[run_id]
            self._driving.pop(run_id, None)

        async def give(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(
                "UPDATE runs SET lease_until = 0, owner = NULL WHERE id = %s AND owner = %s "
                "RETURNING id", (run_id, owner))
            if await cur.fetchone() is None:
                return False
            await conn.execute(_NOTIFY)
            return True

        return bool(await self._enqueue(give, cas=True))

    async def listen(self) -> psycopg.AsyncConnection[Any]:
        """A dedicated connection LISTENing on `NOTIFY_CHANNEL` (the caller closes it)."""
        driver, _ = _import_driver()
        await self._ensure_open()
        try:
            conn: psycopg.AsyncConnection[Any] = await driver.AsyncConnection.connect(
                self.url, autocommit=True)
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except Exception as exc:
            raise map_psycopg_error(self._where, exc) from exc
        return conn

    async def close(self) -> None:
        """Commit what is queued, then close the pool."""
        if self._closed:
            return
        try:
            if self._pool is not None:
                if self._claims:
                    await self._send_claims()
                await self._barrier()
        finally:
            self._closed = True
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()
        error = self._background_error
        if error is not None:
            self._background_error = None
            raise StoreError(f"an earlier write to {self._where} failed: {error}") from error


class _AuditReader:
    """The audit chain and the record of a PostgreSQL store, for `handrail.store.audit`.

    One connection (psycopg's synchronous API: the CLI has no event loop to share), one
    `REPEATABLE READ, READ ONLY` transaction: one snapshot, nothing written. Writable (to
    record a signature), the transaction locks the store-wide tip first, so the head it
    signs stays the head until it commits. Large reads stream through server-side cursors.
    """

    def __init__(self, url: str, *, writable: bool = False) -> None:
        driver, _ = _import_driver()
        self._where = redacted_url(url)
        self._cursors = 0
        try:
            self.db = driver.connect(url, autocommit=False)
        except Exception as exc:
            raise map_psycopg_error(self._where, exc) from exc
        try:
            if writable:
                self.db.execute("SELECT 1 FROM audit_tip WHERE id = 1 FOR UPDATE")
            else:
                self.db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                self.db.execute("SELECT 1 FROM audit_tip")
        except Exception as exc:
            self.db.close()
            error = map_psycopg_error(self._where, exc)
            if isinstance(error, StoreError) and "audit_tip" in str(exc):
                raise StoreError(f"the PostgreSQL store {self._where} has no audit chain "
                                 "yet: open it once with this handrail (`handrail runs`) to "
                                 "migrate it, then read it") from exc
            raise error from exc

    def close(self) -> None:
        """End the transaction (committing what `add_signature` wrote) and close."""
        try:
            self.db.commit()
        finally:
            self.db.close()

    def _stream(self, sql: str, params: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        self._cursors += 1
        with self.db.cursor(name=f"handrail_audit_{self._cursors}") as cur:
            cur.itersize = 5000
            cur.execute(sql, params)
            yield from cur

    def source(self, run_id: str | None = None) -> _audit.Source:
        """What `handrail.store.audit.verify` reads (one run's rows, with `run_id`)."""
        where, params = ("", ()) if run_id is None else (" WHERE run_id = %s", (run_id,))
        by_id = "" if run_id is None else " WHERE id = %s"
        c = ' COLLATE "C"'

        def links() -> Iterator[tuple[Any, ...]]:
            if run_id is None:
                yield from self._stream("SELECT seq, hash, link FROM audit ORDER BY seq")

        one = _audit.Source(
            facts=lambda: self._stream(
                "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit"
                f"{where} ORDER BY run_id, n, seq", params),
            links=links,
            runs=lambda: self._stream(f"SELECT {_RUN_COLUMNS} FROM runs{by_id} "
                                      f"ORDER BY id{c}", params),
            calls=lambda: self._stream(f"SELECT {_CALL_COLUMNS} FROM calls{where} "
                                       f"ORDER BY run_id{c}", params),
            pending=lambda: self._stream(f"SELECT {_PENDING_COLUMNS} FROM pending{where} "
                                         f"ORDER BY run_id{c}", params),
            signatures=lambda: self.signatures(),
            previous_link=self.previous_link)
        if run_id is not None:
            return one
        return dataclasses.replace(
            one,
            ordered_facts=lambda: self._stream(
                "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit "
                "ORDER BY seq"),
            all_runs=lambda: self._stream(f"SELECT {_RUN_COLUMNS} FROM runs"),
            all_calls=lambda: self._stream(f"SELECT {_CALL_COLUMNS} FROM calls"),
            all_pending=lambda: self._stream(f"SELECT {_PENDING_COLUMNS} FROM pending"),
            fact=lambda seq: self.db.execute(
                "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit "
                "WHERE seq = %s", (seq,)).fetchone(),
            for_run=self.source)

    def previous_link(self, seq: int) -> str | None:
        """The link of fact `seq - 1` (`ZERO` before the first), or None if it is gone."""
        if seq == 1:
            return ZERO
        row = self.db.execute("SELECT link FROM audit WHERE seq = %s", (seq - 1,)).fetchone()
        return None if row is None else str(row[0])

    def run_hash(self, run_id: str, n: int) -> str | None:
        """The hash (hex) of the fact at place `n` of a run's chain, or None."""
        row = self.db.execute("SELECT hash FROM audit WHERE run_id = %s AND n = %s",
                              (run_id, n)).fetchone()
        return None if row is None else str(row[0])

    def head(self) -> tuple[int, str] | None:
        """The store's head: its last fact's (seq, link)."""
        row = self.db.execute("SELECT seq, link FROM audit ORDER BY seq DESC LIMIT 1"
                              ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def first_since(self, since: float) -> int | None:
        """The first fact written at or after `since` (Unix time)."""
        row = self.db.execute("SELECT min(seq) FROM audit WHERE at >= %s", (since,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def facts_from(self, seq: int) -> Iterator[tuple[Any, ...]]:
        """Every fact from `seq` on, in order, with its `at`."""
        yield from self._stream(
            "SELECT seq, run_id, n, kind, ref, body, prev, hash, link, at FROM audit "
            "WHERE seq >= %s ORDER BY seq", (seq,))

    def call_row(self, record_id: str) -> Sequence[Any] | None:
        """A call's row as it stands."""
        row: Sequence[Any] | None = self.db.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = %s", (record_id,)).fetchone()
        return row

    def signatures(self) -> list[tuple[Any, ...]]:
        """Every signature, in head order."""
        rows: list[tuple[Any, ...]] = self.db.execute(
            "SELECT seq, link, key, signature, signed_at FROM audit_signatures "
            "ORDER BY seq, key").fetchall()
        return rows

    def add_signature(self, seq: int, link: str, key: str, signature: str) -> None:
        """Record a head's signature (a writable reader, in its transaction)."""
        self.db.execute("INSERT INTO audit_signatures VALUES (%s, %s, %s, %s, %s) "
                        "ON CONFLICT (seq, key) DO UPDATE SET signature = excluded.signature, "
                        "link = excluded.link, signed_at = excluded.signed_at",
                        (seq, link, key, signature, time.time()))
