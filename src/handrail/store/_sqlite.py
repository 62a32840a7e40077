"""`SQLiteStore`: the embedded default. One file, WAL, ordered migrations, group commit.

Writes: every write (a batch, a decision, a claim) becomes an operation in a queue. The
queue is committed as one transaction (a group): operations that arrive while a group is
being committed wait for the next one, and each waiter is released only when the transaction
holding its write has committed. Operations apply in the order they were issued. A group of
writes of distinct runs is written merged (`_apply_writes`: one statement per kind of row for
the whole group); when that cannot be taken as it is, or the group holds other operations,
each runs in turn, and after a failure each inside its own SAVEPOINT, so one that fails (a
compare-and-swap lost: `AlreadyDecided`, `ResumeRefused`) is rolled back alone and the rest
of its group commits. When the COMMIT itself fails, every operation of the group fails with
a `StoreError` and nothing of it stays.

Where a group commits (see "No call that can wait on the event loop" in
docs/architecture.md): with `durability="process"` (WAL, `synchronous=NORMAL`) a commit is a
few writes into the OS page cache, 10-50 µs, so it runs on the event loop itself, after the
writers of this loop iteration have queued their operations (`call_soon`), with
`busy_timeout=0`: it never waits for a lock. When another connection holds the write lock
(another process deciding, a CLI), BEGIN fails at once with SQLITE_BUSY and the group goes to
the store's thread, which waits for the lock with a busy timeout; the loop carries on. With
`durability="fsync"` (`synchronous=FULL`) every commit waits for the disk, so groups always
commit on the thread, and concurrent runs share each fsync.

`BEGIN IMMEDIATE` serialises writers across processes, which is what makes `decide` and
`claim` compare-and-swap.

Releasing: a group's waiters resume at most `RELEASE_PER_ITERATION` per loop iteration (each
does a turn of work in that iteration; released at once, 100 runs' would hold the loop for
one long iteration), and what they write meanwhile joins the next group, committed once they
all have resumed. A write on an idle store (a lone run's turn) needs no waiter: its group's
commit is scheduled before the writer yields, so in the next iteration the commit runs and
the writer finds its outcome (one iteration a write instead of two); and when nothing else
on the loop could run in that iteration (no callback ready, no timer due) and the store
yielded less than `_pace.HOLD_SECONDS` ago, the write commits at once, without a yield.

Reads run on the store's thread on a second connection (a read's size is not bounded: a run
with 10,000 calls), after every write issued before them has committed.

Progress: a running run's turn that changes only its progress (steps, tokens, requests,
lease, `updated_at`) writes it to `run_progress` beside its ~1 KB row rather than into it;
readers take it over the row (`_RUN_SELECT`), a write that rewrites the row deletes it, and
the fold moves it into `runs`.

The log: a write appends its messages and call records to the `log` table (one b-tree, written
at its right edge) instead of updating `messages` and `calls` (three or four pages: a WAL
commit's cost grows with the pages it writes). Every `CHECKPOINT_EVERY` writes the writer
folds the log into those tables in a transaction of its own on the thread (`_fold_unchecked`);
a read of messages or calls folds first, and `close` folds what is left, so the tables are
complete for every reader (another process, plain SQL).

Checkpoints: the writer never checkpoints on commit (`wal_autocheckpoint=0`); after each fold
the thread runs a PASSIVE checkpoint on its own connection, off the hot path, without making
a writer wait (a PASSIVE checkpoint takes no write lock); then the writer checkpoints what
the writers added meanwhile (`_restart_wal`), so the next commit starts the WAL over and the
WAL stays bounded under steady load (`SQLiteStore._checkpoint`). Opening reads
`user_version` (no write when the schema is current; a new, empty file is created without
fsyncs under "process" durability, with the current schema in one pass); closing does not
wait for the last checkpoint (the WAL stays beside the file, complete; the next open uses it).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import marshal
import os
import queue
import re
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio.to_thread

from handrail.errors import (
    AlreadyDecided,
    NotFound,
    ResumeRefused,
    SchemaTooNew,
    StoreError,
    UserError,
)
from handrail.store import audit as _audit
from handrail.store._pace import nothing_else_to_run
from handrail.store._rows import DECISION_COLUMNS, DECISION_INDEXES, DecisionRows
from handrail.store._rows import call_from_row as _call_from
from handrail.store._rows import loads as _loads
from handrail.store._rows import run_from_row as _run_from
from handrail.store.audit import (
    ZERO,
    ZERO_HASH,
    _hex,
    call_body,
    pending_body,
    run_body,
    status_body,
)
from handrail.store.contract import (
    Batch,
    CallRecord,
    Durability,
    PendingItem,
    QuotaClaim,
    QuotaExceeded,
    RunRecord,
    RunStatus,
    Store,
    check_claimable,
    check_run_record,
    continues_conversation,
    counted,
    cutoff,
    expired,
    logged_event,
    status_after_decision,
)

__all__ = ["MIGRATIONS", "SQLiteStore"]

_MARSHAL = marshal.dumps
"""`call_body`'s encoder (CPython's marshal, format 2: the row encoding), inlined in `write`."""

T = TypeVar("T")


def _script(db: sqlite3.Connection, script: str) -> None:
    # Not executescript(): it commits first, and migrations run inside our transaction.
    statement = ""
    for piece in script.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):  # (a trigger's body holds `;` too)
            if statement.strip(" \n;"):
                db.execute(statement)
            statement = ""
    if statement.strip(" \n;"):
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


def _m0002_clustered_calls_and_messages(db: sqlite3.Connection) -> None:
    # Calls and messages become WITHOUT ROWID tables clustered on their keys: a write touches
    # one b-tree page per table instead of the row's page plus its primary-key index's (a WAL
    # commit's cost grows with the pages it writes: 6 -> 3-4 per turn write). `runs_status`
    # serves `handrail runs --status` on a large store.
    _script(
        db,
        """
        CREATE TABLE calls_new (
            id TEXT NOT NULL PRIMARY KEY,
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
        ) WITHOUT ROWID;
        INSERT INTO calls_new SELECT id, run_id, call_id, turn, idx, model_name, tool, arguments,
            arguments_digest, performed_arguments, actions, verdict, decision, decided_by,
            status, result, disposition, error, answers, pending_id, started_at, ended_at
            FROM calls;
        DROP TABLE calls;
        ALTER TABLE calls_new RENAME TO calls;
        CREATE INDEX calls_run ON calls (run_id, turn, idx);
        CREATE TABLE messages_new (
            run_id TEXT NOT NULL REFERENCES runs (id),
            seq INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        ) WITHOUT ROWID;
        INSERT INTO messages_new SELECT run_id, seq, data FROM messages;
        DROP TABLE messages;
        ALTER TABLE messages_new RENAME TO messages;
        CREATE INDEX runs_status ON runs (status, created_at);
        """
    )


def _m0003_log(db: sqlite3.Connection) -> None:
    # The hot path appends messages and call records here (one b-tree, written at its right
    # edge: a commit writes one or two pages of it) instead of updating `messages` and `calls`
    # (three to four pages). The log is folded into those tables off the hot path, and before
    # any read of them, so every reader (and plain SQL) sees the tables complete.
    # kind 0: a message (c0 = seq, c1 = data); kind 1: a call record (c0..c21 = its columns;
    # c22, the provenance, from migration 0004).
    columns = ", ".join(f"c{i}" for i in range(22))
    _script(
        db,
        f"""
        CREATE TABLE log (
            id INTEGER PRIMARY KEY,
            kind INTEGER NOT NULL,
            run_id TEXT NOT NULL REFERENCES runs (id),
            {columns}
        )
        """,
    )
def _m0004_call_provenance(db: sqlite3.Connection) -> None:
    # Where a call's output stands for the taint check (CallRecord.provenance), as JSON; the
    # log carries it too (c22) until the fold moves it into `calls`.
    db.execute("ALTER TABLE calls ADD COLUMN provenance TEXT")
    db.execute("ALTER TABLE log ADD COLUMN c22")


def _m0005_run_tree(db: sqlite3.Connection) -> None:
    # A sub-agent's run names the call that delegated to it and its depth in the tree
    # (docs/subagents.md).
    db.execute("ALTER TABLE runs ADD COLUMN parent_call_id TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0")


def _m0006_rowid_calls_and_messages(db: sqlite3.Connection) -> None:
    # Since 0003 only the fold writes `calls` and `messages`, thousands of rows at a time.
    # Clustered (WITHOUT ROWID) on their keys, a call record (~700 bytes, 5 to a page) went in
    # among its run's rows: a page split, cells copied, for most rows (13 µs a call record,
    # 2.4 a message). As rowid tables each row is appended at the table's right edge and only
    # its key goes in among the others, in the key's index (issue 24: a fold of 60,000 log
    # rows 408 -> 188 ms; writers wait for the fold, so this is throughput).
    _script(
        db,
        """
        CREATE TABLE calls_new (
            id TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (id),
            call_id TEXT NOT NULL, turn INTEGER NOT NULL, idx INTEGER NOT NULL,
            model_name TEXT NOT NULL, tool TEXT, arguments TEXT NOT NULL, arguments_digest TEXT,
            performed_arguments TEXT, actions TEXT NOT NULL, verdict TEXT, decision TEXT,
            decided_by TEXT, status TEXT NOT NULL, result TEXT, disposition TEXT, error TEXT,
            answers TEXT NOT NULL, pending_id TEXT, started_at REAL, ended_at REAL,
            provenance TEXT
        );
        INSERT INTO calls_new SELECT * FROM calls ORDER BY id;
        DROP TABLE calls;
        ALTER TABLE calls_new RENAME TO calls;
        CREATE INDEX calls_run ON calls (run_id, turn, idx);
        CREATE TABLE messages_new (
            run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL, data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        INSERT INTO messages_new SELECT run_id, seq, data FROM messages ORDER BY run_id, seq;
        DROP TABLE messages;
        ALTER TABLE messages_new RENAME TO messages;
        """
    )


def _m0007_run_progress(db: sqlite3.Connection) -> None:
    # A running run's turn changes only its progress (these six columns); its `runs` row,
    # ~1 KB with the policy's text, four to a page, was rewritten every turn: with 100 runs
    # a group's commit wrote ~23 pages of `runs` to the WAL, more than its log rows (issue
    # 24). The turn's progress goes here instead, 100 runs in two pages; readers take it
    # over the row (`_RUN_SELECT`), and the fold moves it into `runs`.
    db.execute(_RUN_PROGRESS_TABLE)


_QUOTA_TABLE = """
    CREATE TABLE quota_counts (
        counter TEXT NOT NULL, bucket INTEGER NOT NULL, n INTEGER NOT NULL,
        PRIMARY KEY (counter, bucket)
    ) WITHOUT ROWID
"""
"""How many calls each quota window started (migration 0008): one row per counter and window,
incremented in the transaction of each counted call's STARTED mark (`_QUOTA_CLAIM`)."""


def _m0008_quotas(db: sqlite3.Connection) -> None:
    db.execute(_QUOTA_TABLE)


_QUOTA_CLAIM = (
    "INSERT INTO quota_counts (counter, bucket, n) VALUES (?1, ?2, 1) ON CONFLICT (counter, "
    "bucket) DO UPDATE SET n = n + 1 WHERE n < ?3 RETURNING n")
"""One statement a claim: the window's count with this call, or no row when it is full."""
_QUOTA_FORCE = (
    "INSERT INTO quota_counts (counter, bucket, n) VALUES (?1, ?2, 1) ON CONFLICT (counter, "
    "bucket) DO UPDATE SET n = n + 1 RETURNING n")
_QUOTA_READ = "SELECT n FROM quota_counts WHERE counter = ? AND bucket = ?"


def claim_quotas(db: sqlite3.Connection, claims: Sequence[QuotaClaim]) -> None:
    """Count `claims` in the open transaction; raise `QuotaExceeded` at the first full window.

    The caller's transaction holds SQLite's write lock (BEGIN IMMEDIATE): no other writer
    counts between the statement and the commit.
    """
    for claim in claims:
        row = db.execute(_QUOTA_FORCE if claim.force else _QUOTA_CLAIM,
                         (claim.counter, claim.window) if claim.force else
                         (claim.counter, claim.window, claim.limit)).fetchone()
        if row is None:
            full = db.execute(_QUOTA_READ, (claim.counter, claim.window)).fetchone()
            raise QuotaExceeded(claim, int(full[0]) if full else claim.limit)
        claim.count = int(row[0])


_AUDIT_TABLE = """
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, n INTEGER NOT NULL, kind TEXT NOT NULL,
        ref TEXT NOT NULL, body TEXT, prev TEXT, hash BLOB NOT NULL, link BLOB NOT NULL,
        at REAL NOT NULL
    )
"""
"""One row a fact (`handrail.store.audit`). Version 3 (migration 0013): `hash` and `link`
their 32 raw bytes, `prev` NULL (it is the run's previous fact's hash); version 2: the three
as hex text. `hash` and `link` are declared BLOB, which has no affinity: each keeps the type
it was written with, which is its fact's version."""
_AUDIT_INDEX = "CREATE INDEX IF NOT EXISTS audit_run ON audit (run_id, n)"
"""A run's facts in order (a resumed run's tip, `verify --run`): made by the first fold that
moves facts into `audit` (`_fold_rows`), not with a new file's schema, whose `audit` is
empty until then (one b-tree fewer for every new store to make and every open to parse)."""
_SIGNATURES_TABLE = """
    CREATE TABLE IF NOT EXISTS audit_signatures (
        seq INTEGER NOT NULL, link TEXT NOT NULL, key TEXT NOT NULL, signature TEXT NOT NULL,
        signed_at REAL NOT NULL, PRIMARY KEY (seq, key)
    )
"""
"""Signatures of heads (`handrail audit verify --sign`), made by the first signature: not
with a new file's schema (two more b-trees every new store made, and parsed again at every
open, for a table most stores never use; issue 42)."""
_AUDIT_TABLES = _AUDIT_TABLE + ";" + _AUDIT_INDEX + ";" + _SIGNATURES_TABLE
"""The tamper-evident record (migration 0010, `handrail.store.audit`): one row per fact,
chained by run (`prev`, `hash`) and store-wide (`link`); signatures of heads beside it."""


def _m0010_audit_chain(db: sqlite3.Connection) -> None:
    # The chain starts with the record as it stands: every run, call and item there is is
    # chained once, as found (docs/audit.md: what a migrated store's chain proves).
    _script(db, _AUDIT_TABLES)
    _fold_rows(db)
    _adopt(db)


_PENDING_DEADLINES = """
    CREATE INDEX pending_deadline ON pending (deadline) WHERE state = 'open'
        AND deadline IS NOT NULL;
    CREATE INDEX pending_notify ON pending (notify_after) WHERE state = 'open' AND notified < 2
"""
"""The two indexes the touches of migration 0009 read: what is due to expire, and what is owed
a notification (both a few rows, however many items the store has decided)."""


def _m0009_pending_deadlines(db: sqlite3.Connection) -> None:
    # Deadlines with a default, four-eyes approvals, and the notification outbox (what was
    # sent to whom): columns of the item, so each is changed by the item's own
    # compare-and-swap. Items already open are not notified when a store is upgraded.
    _script(db, """
        ALTER TABLE pending ADD COLUMN deadline REAL;
        ALTER TABLE pending ADD COLUMN on_expiry TEXT;
        ALTER TABLE pending ADD COLUMN escalate_at REAL;
        ALTER TABLE pending ADD COLUMN approvals_needed INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE pending ADD COLUMN approvals TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE pending ADD COLUMN notified INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE pending ADD COLUMN notify_after REAL NOT NULL DEFAULT 0;
        ALTER TABLE pending ADD COLUMN notes TEXT NOT NULL DEFAULT '[]';
        UPDATE pending SET notified = 2
    """ + ";" + _PENDING_DEADLINES)


_RUN_EVENTS_TABLE = """
    CREATE TABLE run_events (
        seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, at REAL NOT NULL, event TEXT NOT NULL
    );
    CREATE INDEX run_events_run ON run_events (run_id)
"""
"""What other processes record about a run (migration 0011; `Store.run_events`), appended,
never updated: a dispatcher's delivery attempts. Not in the run's row, which its driver
rewrites whole (an event written there by another process would be lost to that write)."""


def _m0011_run_events(db: sqlite3.Connection) -> None:
    _script(db, _RUN_EVENTS_TABLE)


_LOG_WIDTH = 28
"""The log's value columns, c0..c27 (migrations 0003, 0004, 0012, 0013)."""

_LOG_TABLE = """
    CREATE TABLE log (
        id INTEGER PRIMARY KEY, kind INTEGER NOT NULL, run_id TEXT NOT NULL REFERENCES runs (id),
        """ + ", ".join(f"c{i}" for i in range(_LOG_WIDTH)) + """
    )
"""


def _m0012_facts_in_log_rows(db: sqlite3.Connection) -> None:
    # A call's fact is written in its record's log row (c23..c28: seq, n, prev, hash, link,
    # at) instead of a row of its own, and a fact of another kind keeps its seq and the rest
    # there too (issue 42: a row a fact, and its copy at the fold, were a third of what the
    # chain cost a write). The log as the previous schema wrote it is folded first.
    _fold_rows(db)
    _script(db, ";".join(f"ALTER TABLE log ADD COLUMN c{i}" for i in range(23, 29)))


def _m0013_raw_hashes(db: sqlite3.Connection) -> None:
    # Version 3 of the chain's encoding (docs/audit.md): a fact's hash and link as their
    # raw bytes, and no `prev` kept (it is the run's previous fact's hash; issue 42: the
    # hex text of three hashes, hashed again as text, and the value the log row bound for
    # `prev`, were a quarter of what the chain cost a durable call). The log, as 0012 left
    # it, is folded, then made again with five fact columns (c23..c27: seq, n, hash, link,
    # at); `audit` is made again with `prev` allowed NULL; version 2 facts stay as written,
    # and are checked as version 2.
    _fold_rows(db)
    _script(db, "DROP TABLE log;" + _LOG_TABLE + ";" + _AUDIT_TABLE.replace(
        "CREATE TABLE audit (", "CREATE TABLE audit_v3 (") + """;
        INSERT INTO audit_v3 SELECT seq, run_id, n, kind, ref, body, prev, hash, link, at
            FROM audit ORDER BY seq;
        DROP TABLE audit;
        ALTER TABLE audit_v3 RENAME TO audit""")
    # The index is made by the first fold with facts now (`_AUDIT_INDEX`), signatures' table
    # by the first signature (`_SIGNATURES_TABLE`).
    if db.execute("SELECT 1 FROM audit LIMIT 1").fetchone() is not None:
        db.execute(_AUDIT_INDEX)
    db.execute(_SIGNATURES_TABLE)  # (a store whose migration 0010 ran here: none yet)
    if db.execute("SELECT count(*) FROM audit_signatures").fetchone()[0] == 0:
        db.execute("DROP TABLE audit_signatures")


MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = [
    ("0001_initial", _m0001_initial),
    ("0002_clustered_calls_and_messages", _m0002_clustered_calls_and_messages),
    ("0003_log", _m0003_log),
    ("0004_call_provenance", _m0004_call_provenance),
    ("0005_run_tree", _m0005_run_tree),
    ("0006_rowid_calls_and_messages", _m0006_rowid_calls_and_messages),
    ("0007_run_progress", _m0007_run_progress),
    ("0008_quotas", _m0008_quotas),
    ("0009_pending_deadlines", _m0009_pending_deadlines),
    ("0010_audit_chain", _m0010_audit_chain),
    ("0011_run_events", _m0011_run_events),
    ("0012_facts_in_log_rows", _m0012_facts_in_log_rows),
    ("0013_raw_hashes", _m0013_raw_hashes),
]
"""Ordered, named migrations; a database records which ran in `_migrations`. A new migration
changes `_CURRENT_SCHEMA` too (a new file is created from it; a test compares the two)."""


_RUN_PROGRESS_TABLE = """
    CREATE TABLE run_progress (
        id TEXT NOT NULL PRIMARY KEY, p_updated_at REAL NOT NULL,
        p_input_tokens INTEGER NOT NULL, p_output_tokens INTEGER NOT NULL,
        p_model_requests INTEGER NOT NULL, p_steps INTEGER NOT NULL, p_lease_until REAL NOT NULL
    ) WITHOUT ROWID
"""
"""A running run's progress since its row was last written (migration 0007): its newer
`updated_at`, token counts, model requests, steps and lease (each turn renews it). No foreign
key: a row is only written where its run's row is (`_PROGRESS_INSERT`)."""


_CURRENT_SCHEMA = """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, task TEXT NOT NULL, agent TEXT, status TEXT NOT NULL,
        parent_id TEXT, policy TEXT, manifest_digest TEXT, model TEXT, workspace TEXT,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, outcome TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
        model_requests INTEGER NOT NULL DEFAULT 0, remembered TEXT NOT NULL DEFAULT '[]',
        steps INTEGER NOT NULL DEFAULT 0, owner TEXT, lease_until REAL NOT NULL DEFAULT 0,
        events TEXT NOT NULL DEFAULT '[]', agent_ref TEXT, parent_call_id TEXT,
        depth INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_created ON runs (created_at);
    CREATE INDEX runs_status ON runs (status, created_at);
    CREATE TABLE pending (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, run_id TEXT NOT NULL REFERENCES runs (id),
        call_record TEXT NOT NULL, agent TEXT, tool TEXT, payload TEXT NOT NULL,
        created_at REAL NOT NULL, state TEXT NOT NULL, decision TEXT, decided_by TEXT,
        decided_at REAL, deadline REAL, on_expiry TEXT, escalate_at REAL,
        approvals_needed INTEGER NOT NULL DEFAULT 1, approvals TEXT NOT NULL DEFAULT '[]',
        notified INTEGER NOT NULL DEFAULT 0, notify_after REAL NOT NULL DEFAULT 0,
        notes TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX pending_open ON pending (state, created_at);
    """ + _PENDING_DEADLINES + """;
    CREATE TABLE calls (
        id TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (id),
        call_id TEXT NOT NULL, turn INTEGER NOT NULL, idx INTEGER NOT NULL,
        model_name TEXT NOT NULL, tool TEXT, arguments TEXT NOT NULL, arguments_digest TEXT,
        performed_arguments TEXT, actions TEXT NOT NULL, verdict TEXT, decision TEXT,
        decided_by TEXT, status TEXT NOT NULL, result TEXT, disposition TEXT, error TEXT,
        answers TEXT NOT NULL, pending_id TEXT, started_at REAL, ended_at REAL, provenance TEXT
    );
    CREATE INDEX calls_run ON calls (run_id, turn, idx);
    CREATE TABLE messages (
        run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """ + _LOG_TABLE + """;
    """ + _RUN_PROGRESS_TABLE + """;
    """ + _QUOTA_TABLE + """;
    """ + _AUDIT_TABLE + """;
    """ + _RUN_EVENTS_TABLE + """
"""
"""The schema every migration in `MIGRATIONS` leads to, created at once in a new, empty file.

Running the migrations one by one on a new file (tables created, copied, renamed, altered:
~40 statements, each re-reading the schema) cost ~2.2 ms of CPU per new store, a fixed cost
of every run that opens its own file. `test_a_new_file_gets_the_schema_the_migrations_build`
compares the two column by column, index by index; a new migration changes both."""


_JSON_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""One shared encoder: `json.dumps` with options builds a new encoder per call."""


def _first_encode(value: Any) -> str:
    """Load the fast encoder, then encode `value` with it (the first write only).

    Not at import: the CLI's reading commands never write, and never load pydantic_core.
    """
    global _ENCODE
    from pydantic_core import PydanticSerializationError, to_json

    def encode(value: Any) -> str:
        # pydantic_core's encoder is 3-5x faster than json's for a record's small dicts and
        # writes the same JSON for JSON values (NaN and Infinity as json writes them). What
        # it refuses (a lone surrogate, an object it does not know) goes to json, which
        # writes it or raises as it always did.
        try:
            return to_json(value, inf_nan_mode="constants").decode()
        except PydanticSerializationError:
            return _JSON_ENCODE(value)

    _ENCODE = encode
    return encode(value)


_ENCODE: Callable[[Any], str] = _first_encode
"""Compact JSON of a value to store."""


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
_EVENTS = _RUN_COLUMNS.split(", ").index("events")
_RUN_SELECT = ", ".join(
    "max(updated_at, coalesce(p_updated_at, updated_at))" if c == "updated_at" else
    f"coalesce(p_{c}, {c})" if c in ("input_tokens", "output_tokens", "model_requests", "steps",
                                     "lease_until")
    else c for c in _RUN_COLUMNS.split(", ")) + " FROM runs LEFT JOIN run_progress USING (id)"
"""A run's columns as readers see them: its row, with its progress since (`run_progress`)
over it. Used as `SELECT {_RUN_SELECT} WHERE ...`."""
_PLAIN_TEXT = re.compile(r"[ !#-\[\]-~]+")
"""Text every JSON encoder writes as it is: printable ASCII but the quote and the backslash."""
_CALL_COLUMNS = (
    "id, run_id, call_id, turn, idx, model_name, tool, arguments, arguments_digest, "
    "performed_arguments, actions, verdict, decision, decided_by, status, result, disposition, "
    "error, answers, pending_id, started_at, ended_at, provenance"
)
_PENDING_COLUMNS = (
    "id, kind, run_id, call_record, agent, tool, payload, created_at, state, decision, "
    "decided_by, decided_at, deadline, on_expiry, escalate_at, approvals_needed, approvals, "
    "notified, notify_after, notes"
)


# What a run may change after it is created; the rest (task, policy, ...) is written once.
_RUN_MUTABLE = ("status", "updated_at", "outcome", "input_tokens", "output_tokens",
                "model_requests", "remembered", "steps", "owner", "lease_until", "events")
# A run's row is updated in place on every turn; the full upsert (which builds the whole row,
# policy text included, before it finds the conflict) only when the row is not there yet.
# Every UPDATE takes the same parameters: the mutable columns but the status and the outcome
# (?1..?9), the id (?10), the status (?11), and the outcome (?12) unless it is None: then the
# statement says NULL (sqlite3 binds a None through a failing adapter lookup, ~3,000
# instructions; a running run's outcome is None on every turn).
_RUN_HOT = ("updated_at", "input_tokens", "output_tokens", "model_requests", "remembered",
            "steps", "owner", "lease_until", "events")
_RUN_SET = ", ".join(f"{c} = ?{i}" for i, c in enumerate(_RUN_HOT, start=1))
# A run's status rarely changes from one write to the next (a running run's turns). An UPDATE
# naming the status re-files the row in the `runs_status` index even when the value is the
# same, and the index's page is one more page each commit writes to the WAL (3 instead of 2
# for a lone run's turn); the first leaves the status as it is, and matches no row when it
# differs (the write then runs the second). Either way the row ends as the record says.
_RUN_UPDATES = {
    (same_status, has_outcome): (
        f"UPDATE runs SET {_RUN_SET}, outcome = {'?12' if has_outcome else 'NULL'}"
        + (" WHERE id = ?10 AND status = ?11" if same_status else
           ", status = ?11 WHERE id = ?10"))
    for same_status in (True, False) for has_outcome in (True, False)
}
_RUN_UPSERT = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({','.join('?' * 23)}) ON CONFLICT(id) DO "
    "UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _RUN_MUTABLE)
)


_LOG_ROWS_PER_INSERT = 100
"""Log rows per INSERT statement (25 parameters a call row: far below SQLite's limit)."""

_LOG_INSERTS: dict[tuple[Any, ...], str] = {}
"""The INSERT of each shape of a write's log rows (`_log_insert`), built once."""


def _log_values(shape: int | tuple[bool, ...]) -> str:
    """The VALUES of one log row of the given shape.

    A message is (kind, run_id, c0 = seq, c1 = data; the rest NULL), a call record (kind,
    run_id, c0..c22 = its columns, c23..c28 = its fact's: seq, n, prev, hash, link, at), a
    fact of another kind (kind 2, run_id, c0 = its kind, c1 = ref, c2 = body, c3..c22 NULL,
    c23..c28).
    `shape` is the row's length when it holds no None, else which of its values are None
    (written as NULL, not bound).
    """
    marks = ["?"] * shape if isinstance(shape, int) else ["NULL" if n else "?" for n in shape]
    return f"({','.join(marks + ['NULL'] * (2 + _LOG_WIDTH - len(marks)))})"


def _log_insert(rows: Sequence[tuple[Any, ...]]) -> tuple[str, tuple[Any, ...]]:
    """One INSERT for a write's log rows (one statement instead of one per row), and its values.

    A None is written as NULL in the statement's text rather than bound: sqlite3 binds a None
    through its adapter lookup, which fails an attribute lookup on a type and formats the
    AttributeError for nothing (~3,000 instructions, a microsecond, a value; a call record
    holds 5-8 of them, every turn). The shapes of real turns are few: each INSERT is built
    and prepared once.
    """
    shape = tuple([len(row) if None not in row else tuple([v is None for v in row])
                   for row in rows])
    sql = _LOG_INSERTS.get(shape)
    if sql is None:
        if len(_LOG_INSERTS) > 256:
            _LOG_INSERTS.clear()  # bounded: the shapes of real turns are few
        sql = _LOG_INSERTS[shape] = (
            f"INSERT INTO log (kind, run_id, {', '.join(f'c{i}' for i in range(_LOG_WIDTH))}) "
            f"VALUES {','.join(_log_values(row) for row in shape)}")
    return sql, tuple([v for row in rows for v in row if v is not None])


_FOLD = (
    # In log order: a later record of the same message or call replaces an earlier one.
    "INSERT OR REPLACE INTO messages (run_id, seq, data) "
    "SELECT run_id, c0, c1 FROM log WHERE kind = 0 AND id <= :upto ORDER BY id",
    f"INSERT INTO calls ({_CALL_COLUMNS}) "
    f"SELECT {', '.join(f'c{i}' for i in range(23))} FROM log WHERE kind = 1 AND id <= :upto "
    "ORDER BY id ON CONFLICT(id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _CALL_COLUMNS.split(", ")[1:]),
    # The audit chain's facts into their table, in the order they were chained: a call's
    # in its record's row (kind 1), the others in rows of their own (kind 2).
    "INSERT INTO audit SELECT c23, run_id, c24, CASE kind WHEN 1 THEN 'call' ELSE c0 END, "
    "CASE kind WHEN 1 THEN c0 ELSE c1 END, CASE kind WHEN 1 THEN NULL ELSE c2 END, NULL, c25, "
    "c26, c27 FROM log WHERE c23 IS NOT NULL AND id <= :upto ORDER BY id",
    # Every row: `upto` is the log's last, read in this transaction, which holds the write
    # lock. On a connection without foreign-key checks (the fold's own, below) SQLite then
    # frees the table's pages at once instead of deleting it row by row.
    "DELETE FROM log",
)
_FOLD_PROGRESS = (
    # Runs' progress into their rows (row values and a subquery, not UPDATE ... FROM: SQLite
    # before 3.33 has none; a fold meets a few hundred runs at most).
    "UPDATE runs SET (updated_at, input_tokens, output_tokens, model_requests, steps, "
    "lease_until) = (SELECT max(runs.updated_at, p_updated_at), p_input_tokens, "
    "p_output_tokens, p_model_requests, p_steps, p_lease_until FROM run_progress "
    "WHERE run_progress.id = runs.id) "
    "WHERE id IN (SELECT id FROM run_progress)",
    "DELETE FROM run_progress",
)


_FOLD_0012 = (*_FOLD[:2], (
    "INSERT INTO audit SELECT c23, run_id, c24, CASE kind WHEN 1 THEN 'call' ELSE c0 END, "
    "CASE kind WHEN 1 THEN c0 ELSE c1 END, CASE kind WHEN 1 THEN NULL ELSE c2 END, c25, c26, "
    "c27, c28 FROM log WHERE c23 IS NOT NULL AND id <= :upto ORDER BY id"), _FOLD[3])
"""`_FOLD` of a log as migration 0012 left it: a fact's six columns c23..c28 (seq, n, prev,
hash, link, at; version 2). Migration 0013 folds a log written so before it makes it again."""
_FOLD_BEFORE_0012 = (*_FOLD[:2], (
    "INSERT INTO audit SELECT c0, run_id, c1, c2, c3, c4, c5, c6, c7, c8 FROM log "
    "WHERE kind = 2 AND id <= :upto ORDER BY id"), _FOLD[3])
"""`_FOLD` of a log as it was before migration 0012: every fact in a row of its own (kind 2:
c0 seq, c1 n, c2 kind, c3 ref, c4 body, c5 prev, c6 hash, c7 link, c8 at). Migration 0012
folds a log written so before it adds the fact's columns, and 0010 folds with it too."""


def _fold_statements(db: sqlite3.Connection) -> tuple[str, ...]:
    """`_FOLD` for the log's layout (an older one is what a migration folds)."""
    (columns,) = db.execute("SELECT count(*) FROM pragma_table_info('log')").fetchone()
    width = columns - 3  # (id, kind, run_id)
    return _FOLD if width == _LOG_WIDTH else _FOLD_0012 if width == 29 else _FOLD_BEFORE_0012


def _fold_rows(db: sqlite3.Connection) -> None:
    """Move the log into `messages`, `calls` and `audit`, runs' progress into their rows.

    Inside the caller's transaction.
    """
    (upto,) = db.execute("SELECT max(id) FROM log").fetchone()
    if upto is not None:
        for statement in _fold_statements(db):
            db.execute(statement, {"upto": upto})
        db.execute(_AUDIT_INDEX)  # (the first fold's facts make it)
    for statement in _FOLD_PROGRESS:
        db.execute(statement)


_AUDIT_LAST = "SELECT seq, link FROM audit ORDER BY seq DESC LIMIT 1"
_AUDIT_TIP = "SELECT n, hash FROM audit WHERE run_id = ? ORDER BY n DESC LIMIT 1"
_AUDIT_INSERT = "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# A fact waiting in the log: its columns c23 seq, c24 n, c25 hash, c26 link, c27 at
# (`_chain`; raw bytes), in its call record's row or in a row of its own (kind 2: c0 kind,
# c1 ref, c2 body). The fold moves them into `audit` (`_FOLD`); the log's rows are in the
# order the facts were chained.
_LOG_FACTS_NEWEST = ("SELECT c23, c26, run_id, c24, c25 FROM log WHERE c23 IS NOT NULL "
                     "ORDER BY id DESC")
_LOG_FACT_NEWEST = "SELECT c23, c26 FROM log WHERE c23 IS NOT NULL ORDER BY id DESC LIMIT 1"
_LOG_TIP = ("SELECT c24, c25 FROM log WHERE c23 IS NOT NULL AND run_id = ? "
            "ORDER BY id DESC LIMIT 1")
_LOG_FACTS = (
    "(SELECT c23 AS seq, run_id, c24 AS n, CASE kind WHEN 1 THEN 'call' ELSE c0 END AS kind, "
    "CASE kind WHEN 1 THEN c0 ELSE c1 END AS ref, CASE kind WHEN 1 THEN NULL ELSE c2 END AS "
    "body, NULL AS prev, c25 AS hash, c26 AS link, c27 AS at, id FROM log "
    "WHERE c23 IS NOT NULL)")
"""The facts waiting in the log as rows of `audit` (and the log's `id`), for readers."""
_AUDIT_SINCE = "SELECT seq, link, run_id, n, hash FROM audit WHERE seq > ? ORDER BY seq"
_raw = _audit._raw
"""A hash or link as its raw bytes (a version 2 fact keeps hex text)."""

Fact = tuple[str, str, str, "str | bytes", "tuple[Any, ...] | None"]
"""A fact to chain: (run id, kind, ref, body, the call record's log row or None); see
`handrail.store.audit`. A call's fact goes in its record's log row (`_chain`)."""

_NO_CALL = (None,) * 20
"""c3..c22 of a fact's row of its own (kind 2)."""


@functools.cache
def _sqlite_functions() -> tuple[Any, Any, Any] | None:
    """The `ctypes` module and SQLite's `sqlite3_file_control` and `sqlite3_db_filename`.

    Looked up once a process: opening the library and finding its functions cost ~50 µs,
    a fixed cost of every store a process opens (issue 42: a run with a store of its own).
    """
    try:
        import _sqlite3
        import ctypes

        library = ctypes.CDLL(_sqlite3.__file__)
        control = library.sqlite3_file_control
        filename = library.sqlite3_db_filename
    except (ImportError, OSError, AttributeError):
        return None
    filename.restype = ctypes.c_char_p
    return ctypes, control, filename


def _data_version(db: sqlite3.Connection) -> Callable[[], int] | None:
    """A reader of `db`'s data version (SQLITE_FCNTL_DATA_VERSION), or None where there is none.

    The counter SQLite keeps for a connection's main database: each commit of a write
    transaction of the connection adds one to it (`sqlite3PagerCommitPhaseTwo`), and the
    start of its next transaction adds one more when any other connection committed
    meanwhile (SQLite compares the WAL's header then). So a writer that reads it after
    BEGIN IMMEDIATE, commits, and reads it after its next BEGIN IMMEDIATE knows, when it
    grew by exactly one, that nobody else wrote in between (`_Tips.begin`): one call,
    ~5,000 instructions, against ~18,000 for the statement that looked at the store's newest
    fact (`PRAGMA data_version` is a statement too).

    Python's sqlite3 offers no `sqlite3_file_control`: it is called through ctypes on the
    connection's handle, the first field of CPython's connection object. The handle is
    checked before any use (SQLite must name the connection's main file); on any other
    interpreter, build or library, or when the check fails, there is no reader and the
    writer reads the newest fact each time, as before.
    """
    if sys.implementation.name != "cpython" or not isinstance(db, sqlite3.Connection):
        return None  # (a stand-in for a connection, as tests use, has no handle to read)
    functions = _sqlite_functions()
    if functions is None:
        return None
    ctypes, control, filename = functions
    # The object's header (`object.__basicsize__`: larger in a trace-refs build), then
    # `sqlite3 *db` (Modules/_sqlite/connection.h, unchanged since the module's start).
    address = ctypes.c_void_p.from_address(id(db) + object.__basicsize__).value
    main = next((row[2] for row in db.execute("PRAGMA database_list") if row[1] == "main"),
                None)
    handle, schema = ctypes.c_void_p(address), ctypes.c_char_p(b"main")
    if not address or not main or filename(handle, schema) != os.fsencode(main):
        return None
    # Arguments built once, as ctypes objects (no argtypes to convert through: the call
    # is a third cheaper).
    value = ctypes.c_uint32()
    out, op = ctypes.byref(value), ctypes.c_int(35)  # SQLITE_FCNTL_DATA_VERSION (3.26)
    if control(handle, schema, op, out) != 0:
        return None

    def read() -> int:
        # -1 (never a version) when the call fails: the caller then reads the newest fact.
        return value.value if control(handle, schema, op, out) == 0 else -1

    return read


class _Tips:
    """The chain's tips as this store's writer last saw them: a cache, checked every time.

    `last` is the store's newest fact (seq, link), `runs` each run's newest (n, hash). The
    cache is right when no other connection wrote since this writer's last commit, and no
    write of its own that chained was rolled back since: `_apply_group` tells it where its
    transactions begin, roll back and commit (`begin`, `rolled_back`, `committed`), and the
    connection's data version says whether anyone else committed in between
    (`_data_version`). Then a write chains on the cache and reads nothing. Otherwise (another
    process chained, a rollback, or no data version) the transaction's first chaining reads
    the store's newest fact (the log's last row, one step of a b-tree); when it is not `last`,
    the facts written since by anyone are read (from the end of the log backwards: as many
    rows as there are new facts) and the tips caught up, and when `last` itself is gone (a
    rolled-back write of ours) the cache starts over. So a chained write reads no index and
    writes no page but the log's (issue 42: with the facts in a table of their own, with an
    index for the tips, a turn's commit wrote twice the pages). A check folded into the
    write's INSERT (a WHERE on it, or a trigger) cost more than the read: SQLite then copies
    the rows into a temporary table first, or runs the trigger's program for every row.
    """

    __slots__ = ("_begun", "_cursor", "_db", "_version", "_versions", "last", "runs", "sure",
                 "valid")

    def __init__(self, versions: Callable[[sqlite3.Connection], Callable[[], int] | None]
                 | None = None) -> None:
        self.last: tuple[int, bytes] | None = None
        self.runs: dict[str, tuple[int, bytes]] = {}
        self._db: sqlite3.Connection | None = None
        self._cursor: sqlite3.Cursor | None = None
        self._versions = versions
        """Makes the reader of a connection's data version (`_data_version`), at its first
        transaction: ctypes is imported then, not when a store opens."""
        self._version: Callable[[], int] | None = None
        self.valid: int | None = None
        """The writer's data version after the last commit that left the cache right."""
        self._begun: int | None = None
        """The data version at the start of the transaction."""
        self.sure = False
        """Whether the cache is right at this point of the writer's transaction."""

    def begin(self, db: sqlite3.Connection) -> None:
        """A transaction of the writer began (it holds the write lock)."""
        version = self._version
        if version is None and self._versions is not None:
            version = self._version = self._versions(db)
            self._versions = None
        # Taken: a transaction that does not commit (`committed`) leaves none behind.
        valid, self.valid = self.valid, None
        begun = self._begun = version() if version is not None else None
        self.sure = valid is not None and begun == valid

    def rolled_back(self) -> None:
        """The writer rolled back (to a savepoint, or the whole transaction)."""
        self.sure = False

    def committed(self) -> None:
        """The writer's transaction committed (which added one to its data version)."""
        begun = self._begun
        self.valid = (begun + 1) & 0xFFFFFFFF if self.sure and begun is not None and (
            begun >= 0) else None
        self.sure = False

    def cursor(self, db: sqlite3.Connection) -> sqlite3.Cursor:
        """One cursor of `db`, reused.

        Every `execute` of a connection makes a cursor, which the connection tracks by a
        weak reference until its next sweep: a tracked object a statement, on the per-call
        path.
        """
        cursor = self._cursor
        if cursor is None or self._db is not db:
            cursor = self._cursor = db.cursor()
            self._db = db
        return cursor

    def catch_up(self, db: sqlite3.Connection) -> tuple[int, bytes]:
        """Bring the tips up to the store's newest fact; return it."""
        last, runs = self.last, self.runs
        if self.sure and last is not None:
            return last  # nobody else wrote since this writer's last commit
        found = self._catch_up(db, last, runs)
        self.sure = True  # (set back by `begin` and `rolled_back`)
        return found

    def _catch_up(self, db: sqlite3.Connection, last: tuple[int, bytes] | None,
                  runs: dict[str, tuple[int, bytes]]) -> tuple[int, bytes]:
        # The reused cursor runs only statements it reads to their end (one left part-read
        # keeps a read transaction open on the writer: others' checkpoints then fail busy).
        newest = self.cursor(db).execute(_LOG_FACT_NEWEST).fetchone()
        if newest is not None and (newest[0], newest[1]) == last:
            return last
        newer: list[tuple[Any, ...]] = []
        found: tuple[int, bytes] | None = None
        if newest is None:  # (no fact in the log: nothing to scan there)
            return self._scan(db, (), last, runs, newer, found)
        scan = db.execute(_LOG_FACTS_NEWEST)
        try:
            return self._scan(db, scan, last, runs, newer, found)
        finally:
            scan.close()

    def _scan(self, db: sqlite3.Connection, scan: Any, last: tuple[int, bytes] | None,
                  runs: dict[str, tuple[int, bytes]], newer: list[tuple[Any, ...]],
                  found: tuple[int, bytes] | None) -> tuple[int, bytes]:
        for row in scan:
            if found is None:
                found = (row[0], row[1])
                if found == last:
                    return found
            if last is not None and row[0] <= last[0]:
                if (row[0], row[1]) != last:
                    break  # not the chain we saw: start over (below)
                for r in reversed(newer):
                    runs[r[2]] = (r[3], r[4])
                self.last = found
                return found
            if last is None or len(newer) > 10_000:
                break
            newer.append(row)
        if found is None or last is not None:
            # The log holds none of the facts since `last` (folded): read the table.
            top = db.execute(_AUDIT_LAST).fetchone()
            if found is None:
                found = (0, ZERO_HASH) if top is None else (top[0], _raw(top[1]))
                if found == last:
                    return found
            if last is not None and top is not None and top[0] >= last[0]:
                seen = db.execute("SELECT link FROM audit WHERE seq = ?", (last[0],)).fetchone()
                if seen is not None and _raw(seen[0]) == last[1]:
                    for r in db.execute(_AUDIT_SINCE, (last[0],)):
                        runs[r[2]] = (r[3], _raw(r[4]))
                    for r in reversed(newer):
                        runs[r[2]] = (r[3], r[4])
                    self.last = found
                    return found
        runs.clear()
        self.last = found
        return found

    def tip(self, db: sqlite3.Connection, run_id: str) -> tuple[int, bytes]:
        """A run's newest fact (n, hash), or (-1, ZERO_HASH) for a run with no chain."""
        tip = self.runs.get(run_id)
        if tip is not None:
            return tip
        db = self.cursor(db)  # type: ignore[assignment]
        if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            tip = (-1, ZERO_HASH)  # a new run (this is called before its row is written)
        else:
            # A run this store has not chained since it opened (resumed from another
            # process): once per run, the log from its end, then the table's index.
            found = db.execute(_LOG_TIP, (run_id,)).fetchone() or db.execute(
                _AUDIT_TIP, (run_id,)).fetchone()
            tip = (-1, ZERO_HASH) if found is None else (found[0], _raw(found[1]))
        if len(self.runs) >= 10_000:
            self.runs.clear()  # bounded: a miss costs a lookup, never a wrong hash
        self.runs[run_id] = tip
        return tip


def _chain(db: sqlite3.Connection, facts: Sequence[Fact], tips: _Tips, *,
           insert: bool = True) -> list[tuple[Any, ...]]:
    """Append `facts` to their runs' chains and to the store's, in the caller's transaction.

    Called before the write's own rows (a new run is one without a row). The tips are
    read inside the transaction that holds the write lock (`_Tips.catch_up`), so writers in
    other processes chain after each other; a rolled-back write takes its facts with it.
    A `run` fact (a run's start) is kept only when its run has no chain yet: a run resumed
    by another process was started elsewhere. A fact's hash and link are version 3's
    (`audit.fact_hash`, `audit.fact_link`): raw bytes in, raw bytes out (bound as a
    `bytearray`: sqlite3 binds one as it is, where `bytes` goes through its adapter lookup
    first). The facts go to the log, on the page
    the write's other rows are on: a call's in its record's row (its columns c23..c27;
    issue 42: a row of its own, and its copy at the fold, were a third of what the chain
    cost a write), the others in rows of their own (kind 2); the fold moves them into
    `audit`. Returns the log rows, in the order of `facts`: the call records' rows with
    their facts, and the other facts' rows. With `insert=False` they are for the caller to
    insert after its run's row (the log's foreign key), through `_insert_log`.
    """
    seq, link = tips.catch_up(db)
    rows: list[tuple[Any, ...]] = []
    at = time.time()
    sha256 = hashlib.sha256
    runs = tips.runs
    for run_id, kind, ref, body, row in facts:
        n, prev = runs.get(run_id) or tips.tip(db, run_id)
        if kind == "run" and n >= 0:
            continue
        seq += 1
        n += 1
        if row is not None:
            # A call's body is its row, in this write (`STORED_BODY`): its hash alone is kept.
            digest = sha256(prev + body).digest()  # type: ignore[operator]
            link = sha256(link + digest).digest()
            rows.append((*row, seq, n, bytearray(digest), bytearray(link), at))
        else:
            digest = sha256(prev + body.encode()).digest()  # type: ignore[union-attr]
            link = sha256(link + digest).digest()
            rows.append((2, run_id, kind, ref, body, *_NO_CALL, seq, n, bytearray(digest),
                         bytearray(link), at))
        runs[run_id] = (n, digest)
    if rows:
        tips.last = (seq, link)
        if insert:
            _insert_log(db, (), rows)
    return rows


def _insert_log(db: sqlite3.Connection | sqlite3.Cursor, own: Sequence[tuple[Any, ...]],
                chained: Sequence[tuple[Any, ...]]) -> None:
    """Insert a write's log rows, the facts `_chain` made last: one INSERT a hundred rows."""
    rows = [*own, *chained] if own else chained
    for i in range(0, len(rows), _LOG_ROWS_PER_INSERT):
        db.execute(*_log_insert(rows[i:i + _LOG_ROWS_PER_INSERT]))


def _adopt(db: sqlite3.Connection) -> None:
    """Chain the record as it stands (a store migrated to the chain, migration 0010).

    Into the new, empty `audit` table directly (the log is folded, and has the layout of
    the schema being migrated, not this one's), in the current version's encoding.
    """
    facts: list[tuple[str, str, str, str | bytes]] = []
    for row in db.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created_at, id"):
        facts.append((row[0], "run", row[0], run_body(row)))
        facts.append((row[0], "status", row[0], status_body(row[0], row[3], row[11])))
    for row in db.execute(f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY run_id, turn, idx"):
        facts.append((row[1], "call", row[0], call_body(row)))
    for row in db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending ORDER BY created_at, id"):
        facts.append((row[2], "pending", row[0], pending_body(row)))
    seq, link, at = 0, ZERO_HASH, time.time()
    tips: dict[str, tuple[int, bytes]] = {}
    rows = []
    for run_id, kind, ref, body in facts:
        n, prev = tips.get(run_id, (-1, ZERO_HASH))
        seq += 1
        digest = _audit.fact_hash(prev, body)
        link = _audit.fact_link(link, digest)
        rows.append((seq, run_id, n + 1, kind, ref, None if isinstance(body, bytes) else body,
                     None, digest, link, at))
        tips[run_id] = (n + 1, digest)
    db.executemany(_AUDIT_INSERT, rows)
    _fold_rows(db)


def _fold_unchecked(db: sqlite3.Connection) -> None:
    """Fold the log on the writer's connection with its foreign-key checks off.

    Each log row was checked against `runs` when it was written (and no run is ever
    deleted); checking each again as it moves cost a lookup a row, and with the checks on
    SQLite deletes the folded log row by row rather than freeing its pages at once (issue
    24: a fold was ~12 µs a write, and every writer waits for it). The reader's connection,
    which folds before a read and on close, never turns them on.
    """
    db.execute("PRAGMA foreign_keys=OFF")  # outside a transaction: there, it is a no-op
    try:
        _fold_committed(db)
    finally:
        db.execute("PRAGMA foreign_keys=ON")


def _restart_wal(db: sqlite3.Connection) -> None:
    """Checkpoint what the WAL holds beyond the last checkpoint, on the writer's connection.

    Run by the writer between two groups (no write commits meanwhile): once every frame is
    copied, SQLite starts the WAL over at the next commit (`SQLiteStore._checkpoint`).
    Best effort: it never fails the writes queued behind it (another process checkpointing
    makes it busy; the next cycle catches up).
    """
    try:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except sqlite3.Error:
        pass


def _fold_committed(db: sqlite3.Connection) -> None:
    """`_fold_rows` in a transaction of its own (waits for the lock)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        _fold_rows(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


_HISTORY_CHUNK = 400
"""Runs whose calls `call_history` reads in one query (SQLite binds 999 parameters at most
before 3.32)."""


def _history_calls(db: sqlite3.Connection, ids: Sequence[str],
                   decisions: DecisionRows | None) -> dict[str, list[CallRecord]]:
    """The calls of runs `ids` by run, in order (`decisions`: only those columns).

    The table's rows, with the log's not folded yet over them (a later log row of a call
    replaces an earlier one, as `_fold_rows` does).
    """
    marks = ",".join("?" * len(ids))
    decode: Callable[[tuple[Any, ...]], CallRecord]
    if decisions is not None:
        columns, log_columns = ", ".join(DECISION_COLUMNS), ", ".join(
            f"c{i}" for i in DECISION_INDEXES)
        decode = decisions
    else:
        columns, log_columns = _CALL_COLUMNS, ", ".join(f"c{i}" for i in range(23))
        decode = _call_from
    rows: dict[str, tuple[Any, ...]] = {}
    for row in db.execute(f"SELECT {columns} FROM calls WHERE run_id IN ({marks})", ids):
        rows[row[0]] = row
    log = db.execute(f"SELECT {log_columns} FROM log "
                     f"WHERE kind = 1 AND run_id IN ({marks}) ORDER BY id", ids).fetchall()
    for row in log:
        rows[row[0]] = row
    out: dict[str, list[CallRecord]] = {}
    for row in sorted(rows.values(), key=lambda r: (r[3], r[4])):
        out.setdefault(row[1], []).append(decode(row))
    return out


async def read_history(path: str, *, since: float = 0.0, decisions_only: bool = False,
                       busy_timeout: float = 10.0,
                       ) -> AsyncIterator[tuple[RunRecord, list[CallRecord]]]:
    """`Store.call_history` of the SQLite file at `path`, without opening a store on it.

    One connection opened read-only (`mode=ro`, `query_only`), one read transaction from the
    first run to the last call: it never writes the file, and never checkpoints it when it
    closes (a read-write connection closing last folds a WAL into the file). The log's call
    rows not folded yet are laid over the table's, as the fold would. `handrail policy
    what-if` reads a store this way.

    Raises:
        StoreError: the file cannot be read, or its schema is not this handrail's.
    """
    def mapped(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except sqlite3.Error as exc:
            raise _mapped(path, exc) from exc

    def connect() -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(str(Path(path).expanduser().resolve()))
        db = sqlite3.connect(uri + "?mode=ro", uri=True, isolation_level=None,
                             check_same_thread=False, timeout=busy_timeout)
        try:
            db.execute("PRAGMA query_only=1")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != len(MIGRATIONS):
                raise StoreError(
                    f"{path} has schema version {version}, this handrail reads version "
                    f"{len(MIGRATIONS)}: " + ("upgrade handrail to read it" if version > len(
                        MIGRATIONS) else "open it once with this handrail (`handrail runs`) "
                        "to migrate it, then read it"))
            db.execute("BEGIN")
        except BaseException:
            db.close()
            raise
        return db

    db = await anyio.to_thread.run_sync(lambda: mapped(connect))
    decisions = DecisionRows() if decisions_only else None
    try:
        runs = await anyio.to_thread.run_sync(lambda: mapped(lambda: [
            _run_from(r) for r in db.execute(
                f"SELECT {_RUN_SELECT} WHERE created_at >= ? ORDER BY created_at, id",
                (since,))]))
        for start in range(0, len(runs), _HISTORY_CHUNK):
            chunk = runs[start:start + _HISTORY_CHUNK]
            ids = [r.id for r in chunk]
            calls = await anyio.to_thread.run_sync(
                lambda ids=ids: mapped(  # type: ignore[misc]
                    lambda: _history_calls(db, ids, decisions)))
            for run in chunk:
                yield run, calls.get(run.id, [])
    finally:
        await anyio.to_thread.run_sync(db.close)


def _fold(db: sqlite3.Connection) -> None:
    """Fold what there is to fold (the reader's, before a read and on close)."""
    if db.execute("SELECT 1 FROM log UNION ALL SELECT 1 FROM run_progress LIMIT 1"
                  ).fetchone() is None:
        return  # nothing to fold: a read, no write
    _fold_committed(db)


_PENDING_REPLACE = (
    f"INSERT OR REPLACE INTO pending ({_PENDING_COLUMNS}) VALUES ({','.join('?' * 20)})"
)


def _run_row(r: RunRecord, policy_json: str | None = None) -> tuple[Any, ...]:
    policy = policy_json if policy_json is not None else _dumps(r.policy)
    return (r.id, r.task, r.agent, r.status.value, r.parent_id, policy,
            r.manifest_digest, r.model, r.workspace, r.created_at, r.updated_at,
            _dumps(r.outcome), r.input_tokens, r.output_tokens, r.model_requests,
            _dumps(r.remembered), r.steps, r.owner, r.lease_until, _dumps(r.events), r.agent_ref,
            r.parent_call_id, r.depth)


def _call_row(c: CallRecord) -> tuple[Any, ...]:
    """A call record's log row: kind 1, its run, then its columns (c0..c22).

    Built once per call record a turn writes: `_dumps` inlined (a call less per field) and
    the status's `_value_` read directly (`Enum.value` is a Python-level property).
    """
    enc = _ENCODE
    actions, answers = c.actions, c.answers
    turn, index, started, ended = c.turn, c.index, c.started_at, c.ended_at
    if not (type(turn) is int and type(index) is int
            and (type(started) is float or started is None)
            and (type(ended) is float or ended is None)):
        # As the table gives them back (REAL, INTEGER): the audit chain hashes the row as
        # written, and verify the row as read.
        turn, index = int(turn), int(index)
        started = None if started is None else float(started)
        ended = None if ended is None else float(ended)
    return (1, c.run_id, c.id, c.run_id, c.call_id, turn, index, c.model_name, c.tool,
            c.arguments, c.arguments_digest,
            None if c.performed_arguments is None else enc(c.performed_arguments),
            None if actions is None else "[]" if not actions and type(actions) is list
            else enc(actions),
            None if c.verdict is None else enc(c.verdict),
            None if c.decision is None else enc(c.decision), c.decided_by, c.status._value_,
            None if c.result is None else enc(c.result), c.disposition, c.error,
            None if answers is None else "[]" if not answers and type(answers) is list
            else enc(answers), c.pending_id,
            started, ended, None if c.provenance is None else enc(c.provenance))


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


_DUE = ("SELECT 1 FROM pending INDEXED BY pending_deadline WHERE state = 'open' "
        "AND deadline <= ? LIMIT 1")
"""Whether an item is due to expire: microseconds in the `pending_deadline` index. Named: with
no statistics, SQLite's planner prefers `pending_open` (state = ?) and reads every open item."""


def _move_run(db: sqlite3.Connection, run_id: str, facts: list[Fact]) -> None:
    """Move a paused run on once one of its items was decided (see `Store.decide`).

    The run's new status is added to `facts`, for the caller to chain in its transaction.
    """
    run_row = db.execute(f"SELECT {_RUN_SELECT} WHERE id = ?", (run_id,)).fetchone()
    if run_row is None:
        return
    still_open = [_pending_from(r) for r in db.execute(
        f"SELECT {_PENDING_COLUMNS} FROM pending WHERE run_id = ? AND state = 'open'",
        (run_id,)).fetchall()]
    moved = status_after_decision(_run_from(run_row), still_open)
    if moved is not None:
        outcome = _dumps(moved.outcome)
        db.execute("UPDATE runs SET status = ?, outcome = ?, updated_at = ? WHERE id = ?",
                   (moved.status.value, outcome, moved.updated_at, moved.id))
        facts.append((moved.id, "status", moved.id,
                      status_body(moved.id, moved.status.value, outcome), None))


def _expire_due(db: sqlite3.Connection, now: float, facts: list[Fact]) -> list[PendingItem]:
    """Expire what is due, inside the caller's write transaction (so exactly once).

    Each expiry (the item as decided by "expiry") and each run it moves are added to
    `facts`, for the caller to chain in the same transaction.
    """
    if db.execute(_DUE, (now,)).fetchone() is None:
        return []
    done = []
    for row in db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending INDEXED BY "
                          "pending_deadline WHERE state = 'open' "
                          "AND deadline <= ?", (now,)).fetchall():
        item = expired(_pending_from(row), now)
        db.execute("UPDATE pending SET state = 'decided', decision = ?, decided_by = ?, "
                   "decided_at = ?, payload = ?, notes = ? WHERE id = ? AND state = 'open'",
                   (_dumps(item.decision), item.decided_by, now, _dumps(item.payload),
                    _dumps(item.notes), item.id))
        decided = db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                             (item.id,)).fetchone()
        facts.append((item.run_id, "pending", item.id, pending_body(decided), None))
        _move_run(db, item.run_id, facts)
        done.append(item)
    return done


CHECKPOINT_EVERY = 16_384
"""Operations committed between two folds of the log (each followed by a PASSIVE checkpoint).
Every writer waits for a fold (it holds the write lock): ~200-250 ms for this many writes of
a turn each (three log rows), once the tables hold a few hundred thousand rows. Counted in
operations, not commits: groups of many writes would make each fold, and its wait, as many
times longer. The WAL grows by ~1 KB a write between two."""


WRITER_CACHE_KIB = 65_536
"""The writer connection's page cache, in KiB (SQLite's default is 2,048), filled only as
pages are used. Between two folds the log grows by ~1 KB a write, and the fold reads it
back twice (once per table) and then deletes it page by page: with the default, each of
those passes read every log page from the WAL again (issue 24: a fold of 24,000 log rows
84 -> 59 ms). The reader's connection, which folds before a read and on close, has as much."""

LOOP_GROUP_LIMIT = 64
"""At most this many operations per group committed on the event loop; the rest go in the
next group. Bounds the loop's time in one commit to about a millisecond (~15 µs a write,
merged: `_apply_writes`). Issue 24, 100 runs on one store: 16 → 64 made a write's share of
the commit 18 → 15 µs (a page of `runs` or of the log is written once for more writes); past
64 it hardly moves."""

RELEASE_PER_ITERATION = 4
"""At most this many waiters of committed writes resume per event-loop iteration; the rest
resume in the next ones, in commit order. Each waiter resumed does its run's next turn
(~0.2-0.3 ms of CPU) in that iteration, and a timer or any other task on the loop waits for
the whole iteration: the number released, not the commit (tens of µs), sets the loop's lag.
Issue 24, 100 runs on one store: releasing a whole group of 16 at once made the median
iteration ~4 ms of CPU; 4 at a time, ~1 ms, with the same throughput."""

_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11 has no error codes
        return "locked" in str(exc) or "busy" in str(exc)
    return (code & 0xFF) in _BUSY


class _Op:
    """One queued operation: a function of the writer connection and who waits for it.

    A write's `fn` is a `_Write` (one object over flat tuples of its rows) rather than a
    closure: a closure is a function object plus a cell per variable, all tracked by the
    garbage collector, and with many runs every run's pending write is held across a few
    loop iterations: long enough to survive a young collection and be walked by the older
    ones (issue 24: 1,000 runs, the middle generation reached 40,000 objects).
    """

    __slots__ = ("direct", "fn", "future", "maintenance", "outcome")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any],
                 future: asyncio.Future[Any] | concurrent.futures.Future[Any] | None,
                 maintenance: bool = False, direct: bool = False) -> None:
        self.fn = fn
        self.future = future
        self.maintenance = maintenance
        """Store upkeep (the fold): its group commits on the thread; its failure is nobody's."""
        self.direct = direct
        """Its writer yielded for one iteration (`SQLiteStore._write_direct`) and then reads
        `outcome`, or, when that is not there yet, sets `future` and waits for it."""
        self.outcome: tuple[bool, Any] | None = None
        """A direct operation's outcome, once its group committed: (ok, value or error)."""


class _Write:
    """One `write`'s rows, built on the caller's side, applied in a group's transaction.

    Called alone (`op.fn(db)`) it writes its rows as they are; a group of several is applied
    by `_apply_writes`, which gives the group's rows one statement per table instead of two
    statements per write. The rows are flat tuples of strings and numbers (which the
    collector stops tracking): a queued write holds no list, closure or record of the
    caller's but `run`, read only when its row went missing (below).
    """

    __slots__ = ("facts", "pending", "progress", "rows", "run", "run_id", "run_row",
                 "run_update", "tips", "update_sql")

    def __init__(self, run: RunRecord | None, run_update: tuple[Any, ...] | None,
                 update_sql: str, run_row: tuple[Any, ...] | None, rows: tuple[Any, ...],
                 pending: tuple[tuple[Any, ...], ...],
                 progress: tuple[Any, ...] | None = None, facts: tuple[Fact, ...] = (),
                 tips: _Tips | None = None) -> None:
        self.run = run
        self.run_id = None if run is None else run.id
        self.run_update = run_update
        self.update_sql = update_sql
        """The UPDATE this write expects to match its row (`_RUN_UPDATES`)."""
        self.run_row = run_row
        """The whole row, for the first write of a run in this process (an upsert)."""
        self.rows = rows
        """Its messages' log rows (`_log_insert`), in order; its call records' rows are in
        `facts`, and go in the log with their facts' columns (`_chain`)."""
        self.pending = pending
        self.progress = progress
        """A running run's turn that changed only its progress: `_PROGRESS_INSERT`'s
        parameters. The run's row stays as it is when it is as this process left it."""
        self.facts = facts
        """What this write records in the audit chain (`_chain`), in order."""
        self.tips = tips
        """The store's chain tips (`_Tips`), when it has facts."""

    def __call__(self, db: sqlite3.Connection) -> None:
        """Write the rows alone, in the group's transaction."""
        chained = _chain(db, self.facts, self.tips,  # type: ignore[arg-type]
                         insert=False) if self.facts else None
        # Through the writer's reused cursor, as `_apply_group`'s BEGIN and COMMIT.
        tips = self.tips
        cursor: sqlite3.Connection | sqlite3.Cursor = db if tips is None else tips.cursor(db)
        run, run_update = self.run, self.run_update
        if run is not None and run_update is not None and (
                self.progress is None
                or cursor.execute(_PROGRESS_INSERT, self.progress).rowcount != 1):
            if self.run_row is not None:
                # The first write of the run in this process (new, or resumed from another):
                # the whole row, or its mutable columns when it is there already.
                cursor.execute(_RUN_UPSERT, self.run_row)
            elif cursor.execute(_RUN_UPDATES[True, len(run_update) == 12], run_update
                                ).rowcount != 1 and \
                    cursor.execute(_RUN_UPDATES[False, len(run_update) == 12],
                                   run_update).rowcount != 1:
                # (Exceptionally) a run whose first write was rolled back: the record as it
                # is now, which is this write's or newer.
                cursor.execute(_RUN_UPSERT, _run_row(run))
            # The row holds the run's progress now: none over it (an older one would hide it).
            cursor.execute(_PROGRESS_DELETE, (run.id,))
        if chained:
            # In the same INSERT (after the run's row: its key).
            _insert_log(cursor, self.rows, chained)
        else:
            rows = self.rows
            for i in range(0, len(rows), _LOG_ROWS_PER_INSERT):
                cursor.execute(*_log_insert(rows[i:i + _LOG_ROWS_PER_INSERT]))
        if self.pending:
            cursor.executemany(_PENDING_REPLACE, self.pending)


class _ClaimingWrite(_Write):
    """A write that counts quota claims first, in its transaction (`claim_quotas`)."""

    __slots__ = ("claims",)

    claims: tuple[QuotaClaim, ...]

    def __call__(self, db: sqlite3.Connection) -> None:
        claim_quotas(db, self.claims)
        super().__call__(db)


_PROGRESS_COLUMNS = ("id, p_updated_at, p_input_tokens, p_output_tokens, p_model_requests, "
                     "p_steps, p_lease_until")
_PROGRESS_WHERE = (
    "EXISTS (SELECT 1 FROM runs WHERE runs.id = {0}1 AND status = 'running' AND outcome IS "
    "NULL AND owner IS {0}8 AND remembered = {0}9 AND events = {0}10)")
_PROGRESS_INSERT = (
    f"INSERT OR REPLACE INTO run_progress ({_PROGRESS_COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?5, ?6, "
    "?7 WHERE " + _PROGRESS_WHERE.format("?"))
"""A turn's progress, written only where the run's row is as this process last wrote it
(running, no outcome, its owner, remembered rules and events): else (another process changed
the row) it matches nothing, and the write rewrites the row as its record says. Parameters:
the id, the six progress values (the last the lease), then owner, remembered, events."""
_PROGRESS_DELETE = "DELETE FROM run_progress WHERE id = ?"
_UNWRITTEN = object()
"""`SQLiteStore._runs_written`'s answer for a run it has not written."""

_MERGED_PROGRESS: dict[int, str] = {}


def _merged_progress(n: int) -> str:
    """`_PROGRESS_INSERT` for `n` runs at once."""
    sql = _MERGED_PROGRESS.get(n)
    if sql is None:
        row = f"({','.join('?' * 10)})"
        sql = _MERGED_PROGRESS[n] = (
            f"INSERT OR REPLACE INTO run_progress ({_PROGRESS_COLUMNS}) SELECT v.column1, "
            "v.column2, v.column3, v.column4, v.column5, v.column6, v.column7 FROM (VALUES "
            f"{','.join([row] * n)}) AS v WHERE " + _PROGRESS_WHERE.format("v.column"))
    return sql


class _Mismatch(Exception):
    """A group's merged UPDATE matched fewer rows than it had writes (`_apply_writes`)."""


def _apply_writes(db: sqlite3.Connection, writes: list[_Write]) -> None:
    """Several writes of distinct runs, merged: one statement per kind of row for them all.

    The merged form of calling each write in turn (issue 24: with 100 runs on one store, a
    turn's two statements, the run's UPDATE and its log INSERT, were the largest part of what
    the SQLite store adds to the memory store's cost). The log rows keep their order (one
    INSERT, written in the writes' order, as each write's own INSERT would); runs' rows
    are independent of each other, one per run. Raises `_Mismatch` when an UPDATE did not
    find its row as the write expected (the caller then writes each alone, which knows
    what to do).
    """
    updates: dict[str, list[tuple[Any, ...]]] = {}
    upserts: list[tuple[Any, ...]] = []
    progress: list[tuple[Any, ...]] = []
    cleared: list[tuple[str]] = []
    rows: list[tuple[Any, ...]] = []
    pending: list[tuple[Any, ...]] = []
    facts: list[Fact] = []
    for w in writes:
        if w.progress is not None:
            progress.append(w.progress)
        elif w.run_update is not None:
            cleared.append((w.run_update[9],))
            if w.run_row is not None:
                upserts.append(w.run_row)
            else:
                same = updates.get(w.update_sql)
                if same is None:
                    updates[w.update_sql] = [w.run_update]
                else:
                    same.append(w.run_update)
        rows += w.rows
        if w.pending:
            pending += w.pending
        if w.facts:
            facts += w.facts
    chained = _chain(db, facts, writes[0].tips,  # type: ignore[arg-type]
                     insert=False) if facts else None
    if progress and _merged(db, _PROGRESS_INSERT, _merged_progress, progress) != len(progress):
        raise _Mismatch
    if cleared:
        db.executemany(_PROGRESS_DELETE, cleared)
    if upserts:
        db.executemany(_RUN_UPSERT, upserts)
    for sql, params in updates.items():
        matched = (_merged(db, sql, functools.partial(_merged_update, sql), params)
                   if _UPDATE_FROM else db.executemany(sql, params).rowcount)
        if matched != len(params):
            raise _Mismatch
    if chained:
        # In the same INSERT (after the runs' rows: their keys).
        _insert_log(db, rows, chained)
    else:
        for i in range(0, len(rows), _LOG_ROWS_PER_INSERT):
            db.execute(*_log_insert(rows[i:i + _LOG_ROWS_PER_INSERT]))
    if pending:
        db.executemany(_PENDING_REPLACE, pending)


MERGED_ROWS = 64
"""Rows one merged statement takes at most (`_merged`): a group on the store's thread holds
every write queued, and SQLite before 3.32 binds at most 999 parameters a statement."""


def _merged(db: sqlite3.Connection, one: str, many: Callable[[int], str],
            rows: list[tuple[Any, ...]]) -> int:
    """How many rows `one` (for a row) or `many(n)` (for n rows at once) changed.

    `MERGED_ROWS` rows at most a statement.
    """
    changed = 0
    for i in range(0, len(rows), MERGED_ROWS):
        chunk = rows[i:i + MERGED_ROWS]
        changed += (db.execute(one, chunk[0]) if len(chunk) == 1 else
                    db.execute(many(len(chunk)), tuple([v for r in chunk for v in r]))).rowcount
    return changed


_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)
"""Whether SQLite has UPDATE ... FROM (3.33, 2020): a group's runs in one statement."""

_MERGED_UPDATES: dict[tuple[str, int], str] = {}


def _merged_update(sql: str, n: int) -> str:
    """`sql` (one of `_RUN_UPDATES`) for `n` runs at once: UPDATE ... FROM (VALUES ...)."""
    key = (sql, n)
    merged = _MERGED_UPDATES.get(key)
    if merged is None:
        width = 12 if "?12" in sql else 11
        sets = ", ".join(f"{c} = v.column{i}" for i, c in enumerate(_RUN_HOT, start=1))
        outcome = "v.column12" if width == 12 else "NULL"
        same = "AND status = ?11" in sql
        row = f"({','.join('?' * width)})"
        merged = _MERGED_UPDATES[key] = (
            f"UPDATE runs SET {sets}, outcome = {outcome}"
            + ("" if same else ", status = v.column11")
            + f" FROM (VALUES {','.join([row] * n)}) AS v WHERE runs.id = v.column10"
            + (" AND runs.status = v.column11" if same else ""))
    return merged


def _mergeable(ops: list[_Op]) -> bool:
    """Whether every operation is a write and no two write the same run (`_apply_writes`)."""
    seen: set[str | None] = set()
    for op in ops:
        fn = op.fn
        if type(fn) is not _Write:
            return False
        run_id = fn.run_id
        if run_id is not None:
            if run_id in seen:
                # Two writes of one run (a write(wait=False) and the next): in order, alone.
                return False
            seen.add(run_id)
    return True


def _apply_group(db: sqlite3.Connection, ops: list[_Op], tips: _Tips) -> list[tuple[bool, Any]]:
    """Run `ops` in one transaction; commit; return each one's outcome.

    An operation that fails is rolled back alone and the others commit. Optimistically a
    group of writes of distinct runs is first written merged (`_apply_writes`: one statement
    per kind of row for the whole group), then, when that fails or is not possible, each
    operation in turn without savepoints (two statements per operation saved); the first
    failure rolls the whole transaction back and the group is run again with a savepoint
    around each operation. Operations are functions of the database's state, so running one
    again after a rollback is the same as running it once.

    `tips` (the writer's chain tips) is told where the transaction begins, rolls back and
    commits: its cache is known right only across transactions that kept all they chained.

    Raises what BEGIN or COMMIT raised (the whole group failed; nothing of it is kept).
    """
    # BEGIN and COMMIT through the writer's reused cursor: `db.execute` makes a cursor a
    # statement, which the connection tracks by a weak reference until its next sweep
    # (~3,000 instructions each, issue 38).
    cursor = tips.cursor(db)
    cursor.execute("BEGIN IMMEDIATE")
    tips.begin(db)
    outcomes: list[tuple[bool, Any]] = []
    try:
        failed = False
        if len(ops) > 1:
            # Rolling back to here keeps the write lock (a ROLLBACK would give it up).
            db.execute("SAVEPOINT optimistic")
            if _mergeable(ops):
                try:
                    _apply_writes(db, [op.fn for op in ops])  # type: ignore[misc]
                except Exception:
                    # A run's row not as its write expected, or a write that fails: each
                    # alone, from the start (below), finds out which and why.
                    db.execute("ROLLBACK TO optimistic")
                    tips.rolled_back()
                else:
                    cursor.execute("COMMIT")
                    tips.committed()
                    return [(True, None)] * len(ops)
        for op in ops:
            try:
                outcomes.append((True, op.fn(db)))
            except Exception as exc:
                if len(ops) == 1:
                    # Alone in its transaction: its failure is the transaction's.
                    db.execute("ROLLBACK")
                    return [(False, exc)]
                failed = True
                break
        if failed:
            db.execute("ROLLBACK TO optimistic")
            tips.rolled_back()
            outcomes = []
            for op in ops:
                db.execute("SAVEPOINT op")
                try:
                    out = op.fn(db)
                except Exception as exc:
                    db.execute("ROLLBACK TO op")
                    db.execute("RELEASE op")
                    tips.rolled_back()
                    outcomes.append((False, exc))
                else:
                    db.execute("RELEASE op")
                    outcomes.append((True, out))
        cursor.execute("COMMIT")
        tips.committed()
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return outcomes


def _mapped(path: str, exc: BaseException) -> BaseException:
    """The exception a caller sees for `exc` (sqlite3's are mapped to `StoreError`)."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"SQLite store {path}: {exc}")
        error.__cause__ = exc
        return error
    return exc


class _Worker:
    """The store's thread: reads, checkpoints, and the groups that must wait (lock, fsync)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.queue: queue.SimpleQueue[tuple[Callable[[], Any],
                                            concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue())
        self.thread = threading.Thread(target=self._serve, name=f"handrail-sqlite:{path}",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who re-raises it
                future.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
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


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None



def _create_private(path: Path) -> None:
    """Create the store's folder (0700) and file (0600) when they do not exist yet.

    The store holds pending writes' bytes and tool output; SQLite creates `-wal` and `-shm`
    with the database file's mode, so a private file keeps all three private. An existing
    file or folder keeps its mode (an operator may have chosen to share it with a group).
    """
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return  # another process made it meanwhile
        except OSError:
            return  # SQLite's own open then says what is wrong
        os.close(fd)

class SQLiteStore(Store):
    """A store in one SQLite file (created and migrated on open).

    Args:
        path: The file (created with its folder if missing), or `:memory:`.
        durability: `"process"` (WAL, `synchronous=NORMAL`): an acknowledged write survives
            the death of the process. `"fsync"` (`synchronous=FULL`): it also survives a
            power loss; each commit waits for the disk, on the store's thread.
        busy_timeout: How long a commit on the store's thread waits for another
            connection's write lock before failing.
    """

    def __init__(self, path: str | Path, *, durability: Durability = "process",
                 busy_timeout: float = 10.0) -> None:
        self.path = str(path)
        self.durability = durability
        self._busy_ms = int(busy_timeout * 1000)
        memory = self.path == ":memory:"
        if not memory:
            _create_private(Path(self.path).expanduser())
        self._tips = _Tips(None if memory else _data_version)
        """The audit chain's tips as the writer last saw them (`_chain`)."""
        try:
            db = self._db = self._connect()
            synchronous = "PRAGMA synchronous=" + ("FULL" if durability == "fsync" else "NORMAL")
            db.execute(synchronous)
            self._open_schema()
            db.execute("PRAGMA foreign_keys=ON")
            db.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute("PRAGMA busy_timeout=0")
            # Reads get their own connection (on the store's thread) so they never wait
            # behind, or hold up, the writer; an in-memory database has only one.
            self._reader = db if memory else self._connect()
            # The reader writes too: it folds the log (before a read of messages or calls, and
            # on close). Left at SQLite's default (FULL), each fold waited for an fsync of the
            # WAL and its folder, milliseconds that `close` made every run wait.
            self._reader.execute(synchronous)
            # ... and it folds a whole cycle's log: the writer's page cache (below), or each
            # of the fold's passes reads the log from the WAL again and its transaction
            # spills pages there before the commit (issue 38: 59 -> 46 k instructions a
            # write at the close's fold, and the cost no longer grows with the WAL).
            self._reader.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store at {self.path}: {exc}") from exc
        # Groups commit on the loop only when a commit is a bounded page-cache write and the
        # connection is not shared with the reader (":memory:").
        self._commit_on_loop = durability == "process" and not memory
        self._worker = _Worker(self.path)
        self._ops: list[_Op] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._on_thread = False
        self._written = 0
        """Operations committed since the last fold."""
        self._checkpointing = False
        self._background_error: BaseException | None = None
        self._chained_status: dict[str, tuple[str, str | None]] = {}
        """Running runs' status facts as this store last chained them (`write`)."""
        self._runs_written: dict[str, tuple[Any, ...] | None] = {}
        """Runs this store has written and that are running, with what their row holds
        besides their progress (owner, remembered rules, events) as last written."""
        # Committed writes whose waiters have not resumed yet (`_release`), oldest first.
        self._to_release: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = (
            collections.deque())
        self._releasing = False
        self._flush_waiting = False
        self._closed = False
        self._wrote = False
        """Whether this store queued a write: only then does `close` fold the log (a store
        that only read, like `handrail policy what-if`, leaves the file as it found it)."""

    def _connect(self) -> sqlite3.Connection:
        # Opening may meet a lock held for a moment (another connection's last close
        # checkpointing, a recovery): it waits like any open. The writer drops to
        # busy_timeout=0 once open, before it commits anything on the loop.
        return sqlite3.connect(self.path, timeout=self._busy_ms / 1000, isolation_level=None,
                               check_same_thread=False)

    def _open_schema(self) -> None:
        """Check the schema by reading `user_version`; migrate (a write) only when behind."""
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == len(MIGRATIONS):
            return
        if version > len(MIGRATIONS):
            self._migrate()  # names the unknown migrations
            raise SchemaTooNew(
                f"{self.path} has schema version {version}, newer than this handrail's "
                f"{len(MIGRATIONS)}; upgrade handrail to open it"
            )
        fresh = version == 0 and self.durability == "process" and db.execute(
            "SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        if fresh:
            # A new, empty file: its creation (the switch to WAL, the schema) waits for no
            # disk. Five fsyncs otherwise, 30-450 ms on a busy VM, for a file that holds
            # nothing yet; "process" durability never promised to survive a power loss,
            # and a process crash loses nothing the OS has been handed. An existing database
            # migrates with its own setting (a power loss then costs at most the migration).
            db.execute("PRAGMA synchronous=OFF")
        try:
            db.execute("PRAGMA journal_mode=WAL")
            self._migrate()
        finally:
            if fresh:
                db.execute("PRAGMA synchronous=NORMAL")

    def _migrate(self) -> None:
        db = self._db
        created = False
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
            if not done and db.execute("SELECT count(*) FROM sqlite_master WHERE name != "
                                       "'_migrations'").fetchone()[0] == 0:
                # A new, empty file: the schema the migrations lead to, at once, and every
                # migration recorded as done.
                _script(db, _CURRENT_SCHEMA)
                now = time.time()
                db.executemany("INSERT INTO _migrations VALUES (?, ?, ?)",
                               [(number, name, now)
                                for number, (name, _) in enumerate(MIGRATIONS, start=1)])
                # Its chain is empty, and known so in this transaction: the first write
                # chains on that, reading nothing, unless another connection commits first
                # (its data version then says so: `_Tips`).
                created = True
                self._tips.begin(db)
                self._tips.last, self._tips.sure = (0, ZERO_HASH), True
            else:
                for number, (name, migrate) in enumerate(MIGRATIONS, start=1):
                    if name not in done:
                        migrate(db)
                        db.execute("INSERT INTO _migrations VALUES (?, ?, ?)",
                                   (number, name, time.time()))
            if db.execute("PRAGMA user_version").fetchone()[0] < len(MIGRATIONS):
                db.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._tips.rolled_back()
            raise
        if created:
            self._tips.committed()

    # ------------------------------------------------------------ the writer

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the SQLite store {self.path} is closed")
        error = self._background_error
        if error is not None:
            # A failed write(wait=False) surfaces at the next operation, never silently.
            self._background_error = None
            raise StoreError(f"an earlier write to {self.path} failed: {error}") from error

    def _enqueue(self, fn: Callable[[sqlite3.Connection], T], *, wait: bool = True
                 ) -> asyncio.Future[T] | concurrent.futures.Future[T] | None:
        """Queue one write operation; returns what to await for its outcome."""
        self._check_open()
        self._wrote = True
        loop = _running_loop()
        if loop is None:
            # Not asyncio (trio): every group commits on the thread, one operation each.
            future: concurrent.futures.Future[T] = concurrent.futures.Future()
            op = _Op(fn, future)
            self._worker.submit(lambda: self._commit_on_worker(op))
            return future if wait else None
        if loop is not self._loop:
            self._rebind(loop)
        waiter: asyncio.Future[T] | None = loop.create_future() if wait else None
        self._ops.append(_Op(fn, waiter))
        if not self._scheduled and not self._on_thread and not self._flush_waiting:
            self._scheduled = True
            loop.call_soon(self._flush)
        return waiter

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve a new event loop (a store reused across `anyio.run` calls)."""
        if self._ops or self._on_thread or self._checkpointing:
            # The old loop stopped with writes queued, a group on the thread or upkeep under
            # way: finish them here, before this loop's first operation (exceptional, so
            # blocking is accepted). The worker is FIFO: once this no-op ran, what the old
            # loop left on it is over (a group's commit, a checkpoint), though its hand-back
            # to the old loop may never run: that loop is gone or stopped.
            self._worker.submit(lambda: None).result()
            self._on_thread = False
            ops, self._ops = self._ops, []
            for op in ops:
                op.future = None  # its waiter's loop is gone; a failure surfaces next
                op.direct = False
            if ops:
                self._commit_blocking(ops)
            self._checkpointing = False  # else no fold would ever come due again
        # Waiters of the old loop that were never resumed: their tasks are gone with it.
        self._to_release.clear()
        self._releasing = self._flush_waiting = False
        self._loop = loop
        self._scheduled = False

    def _flush(self) -> None:
        """Commit the queued operations as one group (an event-loop callback)."""
        self._scheduled = False
        if self._on_thread or not self._ops:
            return
        if self._releasing and self._commit_on_loop:
            # The last group's waiters are still resuming, a few per iteration: what they
            # write meanwhile joins one group, committed once they all have (`_release`).
            # Groups stay large (cheap per write) while each iteration stays short.
            self._flush_waiting = True
            return
        if self._commit_on_loop and not self._ops[0].maintenance:
            ops = self._ops[:LOOP_GROUP_LIMIT]
            # (The first is no upkeep: a lone write needs no look.)
            if len(ops) > 1 and any(op.maintenance for op in ops):
                # Upkeep takes milliseconds: it goes to the thread with the writes behind it.
                ops = ops[:next(i for i, op in enumerate(ops) if op.maintenance)]
            del self._ops[:len(ops)]
            try:
                outcomes = _apply_group(self._db, ops, self._tips)
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    self._fail(ops, exc)
                    self._after_group(len(ops))
                    return
                # Another connection holds the write lock: wait for it on the thread.
                self._ops[:0] = ops
            else:
                self._finish(ops, outcomes)
                self._after_group(len(ops))
                return
        ops, self._ops = self._ops, []
        self._on_thread = True
        loop = self._loop
        assert loop is not None

        def commit() -> None:
            try:
                outcomes: list[tuple[bool, Any]] | BaseException = self._group_on_thread(ops)
            except BaseException as exc:
                outcomes = exc
            try:
                loop.call_soon_threadsafe(self._thread_done, ops, outcomes)
            except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                self._on_thread = False

        self._worker.submit(commit)

    def _group_on_thread(self, ops: list[_Op]) -> list[tuple[bool, Any]]:
        """Commit a group on the store's thread, waiting for the lock if need be."""
        db = self._db
        db.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        try:
            first = ops[0].fn
            if first is _restart_wal or first is _fold_rows:
                # Upkeep in a transaction of its own (a checkpoint cannot run in one; the
                # fold turns the foreign-key checks off, which only works outside one),
                # before the writes queued behind it. Its failure is nobody's: they go on.
                try:
                    _restart_wal(db) if first is _restart_wal else _fold_unchecked(db)
                    done: tuple[bool, Any] = (True, None)
                except sqlite3.Error as exc:
                    done = (False, exc)
                return [done, *(_apply_group(db, ops[1:], self._tips) if len(ops) > 1 else ())]
            return _apply_group(db, ops, self._tips)
        finally:
            db.execute("PRAGMA busy_timeout=0")

    def _thread_done(self, ops: list[_Op], outcomes: list[tuple[bool, Any]] | BaseException
                     ) -> None:
        self._on_thread = False
        if isinstance(outcomes, BaseException):
            self._fail(ops, outcomes)
        else:
            self._finish(ops, outcomes)
        if ops[0].fn is _restart_wal:
            self._checkpointing = False  # the WAL starts over at the next commit
        elif any(op.maintenance for op in ops):
            # The log is folded: copy the WAL into the file, off the loop. A PASSIVE
            # checkpoint never takes the write lock, so no writer waits for it.
            self._worker.submit(self._checkpoint)
        self._after_group(len(ops))

    def _after_group(self, written: int) -> None:
        self._written += written
        if self._written >= CHECKPOINT_EVERY and not self._checkpointing:
            self._written = 0
            # Upkeep joins the queue like a write: the writer folds the log on its own
            # connection, so nobody contends for the lock (a second connection folding would
            # make the loop's commits fail over to the thread and sleep in SQLite's busy
            # handler).
            self._checkpointing = True
            self._ops.append(_Op(_fold_rows, None, maintenance=True))
        if self._ops and not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _checkpoint(self) -> None:
        """Copy the WAL into the file beside the writers, then start it over.

        On the store's thread; then the writer copies what the writers added meanwhile
        (`_restart_wal`), and the next commit starts the WAL over. A PASSIVE checkpoint
        copies the frames there were when it began; the writers append more meanwhile, and
        SQLite starts the WAL over only once a checkpoint has copied every frame. Under
        steady load that never happened: the WAL grew by the size of every fold cycle
        (issue 24: 75, 147, 224 MB after three), and each commit's write extended a file
        instead of overwriting it (twice the cost of the system call).
        """
        loop = self._loop
        try:
            self._reader.execute("PRAGMA wal_checkpoint(PASSIVE)")
            if loop is not None and not self._closed:
                loop.call_soon_threadsafe(self._catch_up)
                return
        except (sqlite3.Error, RuntimeError):
            pass  # best effort (RuntimeError: the loop closed): the next one catches up
        self._checkpointing = False

    def _catch_up(self) -> None:
        """Queue the checkpoint of what the writers added during the last one (`_checkpoint`).

        It runs as the writer's next operation, on the store's thread: no write commits
        while it copies, and what it copies is only what came during the first checkpoint
        (milliseconds), so it finds every frame copied and the next commit starts the WAL
        over.
        """
        if self._closed or self._loop is None:
            self._checkpointing = False
            return
        self._ops.insert(0, _Op(_restart_wal, None, maintenance=True))
        if not self._scheduled and not self._on_thread and not self._flush_waiting:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _finish(self, ops: list[_Op], outcomes: list[tuple[bool, Any]]) -> None:
        """The group committed: hand each operation's outcome to its waiter."""
        direct = 0
        for op, (ok, value) in zip(ops, outcomes, strict=True):
            future = op.future
            if future is None:
                if op.direct:
                    # Its writer resumes by itself (in this iteration or the next) and reads
                    # this: one of the writers this group resumes now.
                    op.outcome = (ok, value)
                    direct += 1
                elif not ok and not op.maintenance:
                    self._background_error = _mapped(self.path, value)
            elif future.done():
                continue  # its waiter was cancelled; the write itself stands
            elif isinstance(future, asyncio.Future):
                self._to_release.append((future, ok, value))
            elif ok:
                future.set_result(value)
            else:
                future.set_exception(_mapped(self.path, value))
        pending = self._to_release
        if pending and not self._releasing:
            if len(pending) + direct <= RELEASE_PER_ITERATION:
                # The common case (one run, or a few): resume them now, nothing to pace.
                while pending:
                    future, ok, value = pending.popleft()
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(_mapped(self.path, value))
            else:
                self._releasing = True
                self._release(RELEASE_PER_ITERATION - direct)

    def _release(self, budget: int = RELEASE_PER_ITERATION) -> None:
        """Resume the next waiters of committed writes (at most one call per loop iteration).

        After resuming some it calls itself again in the next iteration, even with none left
        now: a group committing later in this iteration must not resume more this iteration.
        """
        pending = self._to_release
        if not pending or self._loop is None:
            self._releasing = False
            if self._flush_waiting:
                self._flush_waiting = False
                self._flush()
            return
        for _ in range(min(budget, len(pending))):
            future, ok, value = pending.popleft()
            if future.done():
                continue  # its waiter was cancelled; the write itself stands
            if ok:
                future.set_result(value)
            else:
                future.set_exception(_mapped(self.path, value))
        self._loop.call_soon(self._release)

    def _commit_on_worker(self, op: _Op) -> None:
        """Commit one operation on the worker (no asyncio loop), with the same upkeep."""
        self._commit_blocking([op])
        self._written += 1
        if self._written >= CHECKPOINT_EVERY:
            self._written = 0
            try:
                _fold(self._db)
                self._reader.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass  # best effort: the next one (or a read, or close) catches up

    def _commit_blocking(self, ops: list[_Op]) -> None:
        """Commit a group here and now, waiting for the lock (off the loop, or exceptional)."""
        try:
            outcomes = self._group_on_thread(ops)
        except BaseException as exc:
            self._fail(ops, exc)
        else:
            self._finish(ops, outcomes)

    def _fail(self, ops: list[_Op], exc: BaseException) -> None:
        """The group's transaction failed: each of its operations fails, none is kept."""
        error = StoreError(
            f"SQLite store {self.path}: the transaction holding this write failed and was "
            f"rolled back ({exc}); nothing of it was stored"
        )
        error.__cause__ = exc
        for op in ops:
            if op.maintenance:
                self._checkpointing = False
            elif op.future is None:
                if op.direct:
                    op.outcome = (False, error)
                else:
                    self._background_error = error
            elif not op.future.done():
                op.future.set_exception(error)

    async def _submit_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        waiter = self._enqueue(fn)
        assert waiter is not None
        if isinstance(waiter, concurrent.futures.Future):
            return await _wait(waiter)
        return await waiter

    async def _barrier(self) -> None:
        """Wait until every write issued so far has committed (reads see them)."""
        if self._ops or self._on_thread or self._scheduled:
            await self._submit_write(lambda db: None)
        else:
            self._check_open()

    async def _read(self, fn: Callable[[sqlite3.Connection], T], *, fold: bool = False) -> T:
        await self._barrier()
        reader = self._reader

        def read(db: sqlite3.Connection) -> T:
            if fold:
                _fold(db)
            return fn(db)

        return await _wait(self._worker.submit(lambda: self._mapped_call(read, reader)))

    def _mapped_call(self, fn: Callable[[sqlite3.Connection], T], db: sqlite3.Connection) -> T:
        try:
            return fn(db)
        except sqlite3.Error as exc:
            raise _mapped(self.path, exc) from exc

    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        # Rows are built here, on the caller's side: the caller may change its records as
        # soon as this returns (at once, with wait=False).
        run = batch.run
        run_row: tuple[Any, ...] | None = None
        run_update: tuple[Any, ...] | None = None
        progress: tuple[Any, ...] | None = None
        update_sql = ""
        if run is not None:
            check_run_record(run)
            outcome = run.outcome
            remembered, events = _dumps(run.remembered), _dumps(run.events)
            run_update = (
                (run.updated_at, run.input_tokens, run.output_tokens, run.model_requests,
                 remembered, run.steps, run.owner, run.lease_until, events, run.id,
                 run.status._value_)
                if outcome is None else
                (run.updated_at, run.input_tokens, run.output_tokens, run.model_requests,
                 remembered, run.steps, run.owner, run.lease_until, events, run.id,
                 run.status._value_, _ENCODE(outcome)))
            # What a running run's row holds besides its progress, as this process wrote it.
            held = ((run.owner, remembered, events)
                    if run.status is RunStatus.RUNNING and outcome is None else None)
            last = self._runs_written.get(run.id, _UNWRITTEN)
            if last is _UNWRITTEN:
                # The whole row (policy text included) only for a run this store has not
                # written yet; every later write of it is the UPDATE of what may change.
                run_row = _run_row(run)
            elif held is not None and last == held:
                # A turn: only its progress changed. Written beside the row, not into it
                # (`run_progress`, migration 0007), where the row is still as written here.
                progress = (run.id, run.updated_at, run.input_tokens, run.output_tokens,
                            run.model_requests, run.steps, run.lease_until, *held)
            else:
                # Its last write here had it running (else it would have been forgotten,
                # below): a running run keeps its status (the UPDATE that leaves it alone),
                # any other status is a change. A row found otherwise (another process's
                # doing) makes the merged UPDATE match less, and the write alone sorts it out.
                update_sql = _RUN_UPDATES[run.status is RunStatus.RUNNING, outcome is not None]
            if run.status is RunStatus.RUNNING:
                self._runs_written[run.id] = held
            else:
                # The run leaves this process's hands (ended, paused, handed back): forget it,
                # or a long-lived server holds an id for every run it ever served. A later
                # write of it builds its whole row once more, which its UPDATE makes unneeded.
                self._runs_written.pop(run.id, None)
        enc = _ENCODE
        log = [(0, r, s, enc(m)) for r, s, m in batch.messages]
        # The facts this write adds to the audit chain (`_chain`): the run's start (its
        # first write here), each call record and pending item as written, then the run's
        # status when it is not the one this store chained last.
        facts: list[Fact] = []
        if run_row is not None:
            facts.append((run_row[0], "run", run_row[0], run_body(run_row), None))
        if batch.calls:
            # A call record's log row goes with its fact (`_chain` adds the fact's columns);
            # its body is `call_body` of its columns, inlined (a call less a record).
            rows = list(map(_call_row, batch.calls))
            try:
                facts += [(c[1], "call", c[2], _MARSHAL((3, "call", c[2:]), 2), c)
                          for c in rows]
            except ValueError:  # (what `call_body` sorts out: a subclass of str or int)
                facts += [(c[1], "call", c[2], call_body(c[2:]), c) for c in rows]
        # Built now, as flat tuples of strings and numbers (which the collector stops
        # tracking): the write holds no list, closure or record of the caller's while queued.
        pending = tuple([_pending_row(p) for p in batch.pending]) if batch.pending else ()
        if pending:
            facts += [(p[2], "pending", p[0], pending_body(p), None) for p in pending]
        if run is not None:
            # (The pair, not its body: the body is built only when the status changed.)
            status = (run.status._value_,
                      run_update[11] if run.outcome is not None else None)  # type: ignore[index]
            if self._chained_status.get(run.id) != status:
                facts.append((run.id, "status", run.id, status_body(run.id, *status), None))
                if wait and run.status is RunStatus.RUNNING:
                    self._chained_status[run.id] = status
                else:
                    # Not kept: a run that leaves this process's hands (bounded), and a
                    # write nobody waits for (its failure would leave a status unchained).
                    self._chained_status.pop(run.id, None)
        if batch.claims:
            # Counted in the write's own transaction, never merged with another's (a full
            # window fails this write alone: `_apply_group`). Sorted: two writers' claims
            # on the same windows are taken in one order.
            claiming = _ClaimingWrite(run, run_update, update_sql, run_row, tuple(log),
                                      pending, progress, tuple(facts), self._tips)
            claiming.claims = tuple(sorted(batch.claims, key=lambda c: (c.counter, c.window)))
            fn: _Write = claiming
            wait = True
        else:
            fn = _Write(run, run_update, update_sql, run_row, tuple(log), pending, progress,
                        tuple(facts), self._tips)
        try:
            if wait and self._idle():
                await self._write_direct(fn)
                return
            waiter = self._enqueue(fn, wait=wait)
            if waiter is None:
                return
            if isinstance(waiter, concurrent.futures.Future):
                await _wait(waiter)
            else:
                await waiter
        except BaseException:
            if run is not None:
                self._chained_status.pop(run.id, None)  # its status may not be chained
                # Nor its row written: the next write builds it whole, with the run's start
                # fact when it has no chain yet (else the row comes back with no fact).
                self._runs_written.pop(run.id, None)
            raise

    def _idle(self) -> bool:
        """Whether a write now would be alone at the head of the next group, on the loop."""
        return (self._commit_on_loop and not self._ops and not self._scheduled
                and not self._on_thread and not self._releasing and not self._flush_waiting
                and self._loop is not None and self._loop is _running_loop())

    async def _write_direct(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        """Queue a write on an idle store, yield once (or not at all), and find it committed.

        The group's commit (`_flush`) is scheduled before this writer's own resumption, so in
        the next iteration it runs first and the writer finds its outcome on the operation:
        one loop iteration a write, as the memory store's yield, instead of two (a commit,
        then a waiter's wake-up). An iteration is ~40,000 instructions (issue 24: a lone
        run's turn was ~30% dearer on SQLite for its store's machinery alone). When nothing
        else could run in that iteration, the commit runs here instead (below). When the
        group did not commit (it went to the thread: another connection holds the lock),
        the writer waits for it as any other does.
        """
        self._check_open()
        loop = self._loop
        assert loop is not None
        op = _Op(fn, None, direct=True)
        self._ops.append(op)
        if nothing_else_to_run(loop, self._resumed_at):
            # Nothing else on the loop could run (no callback ready, no timer due, no
            # cancellation on its way: anyio delivers one through a ready callback), and this
            # loop yielded less than HOLD_SECONDS ago: the iteration a yield would end has
            # nothing else in it. Commit here and now (the memory store's pacer's rule).
            self._flush()
        else:
            self._scheduled = True
            loop.call_soon(self._flush)
            await asyncio.sleep(0)
            self._resumed_at = loop.time()
        outcome = op.outcome
        if outcome is None:
            waiter: asyncio.Future[Any] = loop.create_future()
            op.future = waiter
            await waiter
            return
        ok, value = outcome
        if not ok:
            raise _mapped(self.path, value)

    _resumed_at = float("-inf")
    """When a direct write last resumed from its yield (`loop.time()`)."""

    async def flush(self) -> None:
        await self._barrier()
        self._check_open()

    async def run(self, run_id: str) -> RunRecord:
        row = await self._read(
            lambda db: db.execute(f"SELECT {_RUN_SELECT} WHERE id = ?",
                                  (run_id,)).fetchone()
        )
        if row is None:
            raise NotFound(f"no run {run_id!r} in {self.path}")
        return _run_from(row)

    async def runs(self, *, limit: int = 50, status: RunStatus | None = None) -> list[RunRecord]:
        def query(db: sqlite3.Connection) -> list[Any]:
            if status is None:
                return db.execute(f"SELECT {_RUN_SELECT} ORDER BY created_at DESC "
                                  "LIMIT ?", (limit,)).fetchall()
            return db.execute(f"SELECT {_RUN_SELECT} WHERE status = ? ORDER BY "
                              "created_at DESC LIMIT ?", (status.value, limit)).fetchall()

        return [_run_from(r) for r in await self._read(query)]

    async def continuations(self, conversation: str, *, since: float = 0.0,
                            limit: int = 1000) -> list[RunRecord]:
        # Only rows whose events text holds a `continues` event (and, for an id both JSON
        # encoders write as it is, the id) are read; each is then checked on its parsed events,
        # on the store's thread, up to `limit`. Only those matching are decoded in full.
        where = ["created_at >= ?", "instr(events, '\"continues\"') > 0"]
        params: list[Any] = [since]
        if _PLAIN_TEXT.fullmatch(conversation):
            where.append("instr(events, ?) > 0")
            params.append(f'"{conversation}"')
        sql = (f"SELECT {_RUN_SELECT} WHERE {' AND '.join(where)} "
               "ORDER BY created_at, id")

        def query(db: sqlite3.Connection) -> list[Any]:
            rows: list[Any] = []
            for row in db.execute(sql, params):
                if len(rows) >= limit:
                    break
                if continues_conversation(json.loads(row[_EVENTS]), conversation):
                    rows.append(row)
            return rows

        return [_run_from(r) for r in await self._read(query)]

    async def run_ids(self, prefix: str, *, limit: int = 1000) -> list[str]:
        # From the prefix on, along the primary key's index: ids only, no row is decoded.
        rows = await self._read(lambda db: db.execute(
            "SELECT id FROM runs WHERE id >= ? AND substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
            (prefix, len(prefix), prefix, max(limit, 0))).fetchall())
        return [str(r[0]) for r in rows]

    async def call_history(self, *, since: float = 0.0, decisions_only: bool = False,
                           ) -> AsyncIterator[tuple[RunRecord, list[CallRecord]]]:
        # On a connection of its own, opened read-only: never the reader's, which folds the
        # log before it reads calls (a write). See `read_history`.
        if self.path == ":memory:":
            async for pair in super().call_history(since=since):
                yield pair
            return
        await self._barrier()
        async for pair in read_history(self.path, since=since, decisions_only=decisions_only,
                                       busy_timeout=self._busy_ms / 1000):
            yield pair

    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self._read(
            lambda db: db.execute("SELECT data FROM messages WHERE run_id = ? ORDER BY seq",
                                  (run_id,)).fetchall(), fold=True
        )
        return [json.loads(r[0]) for r in rows]

    async def calls(self, run_id: str) -> list[CallRecord]:
        rows = await self._read(
            lambda db: db.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? "
                                  "ORDER BY turn, idx", (run_id,)).fetchall(), fold=True
        )
        return [_call_from(r) for r in rows]

    async def call(self, record_id: str) -> CallRecord:
        row = await self._read(
            lambda db: db.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = ?",
                                  (record_id,)).fetchone(), fold=True
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
        rows = await self._read_pending(lambda db: db.execute(sql, params).fetchall())
        return [_pending_from(r) for r in rows]

    async def _read_pending(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn`'s read, once every item due to expire has been (this touch enforces it)."""
        now = self.clock()
        due: Any = _DUE

        def read(db: sqlite3.Connection) -> Any:
            if db.execute(_DUE, (now,)).fetchone() is not None:
                return due
            return fn(db)

        result = await self._read(read)
        if result is due:
            await self.expire_due()
            result = await self._read(fn)
        return cast(T, result)

    async def expire_due(self) -> list[PendingItem]:
        clock = self.clock
        return await self._submit_write(lambda db: self._chained(db, lambda facts: _expire_due(
            db, clock(), facts)))

    async def take_notifications(self, *, hold: float, limit: int = 50,
                                 ) -> list[PendingItem]:
        now = self.clock()

        def take(db: sqlite3.Connection) -> list[PendingItem]:
            rows = db.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending INDEXED BY pending_notify "
                "WHERE state = 'open' AND notified < 2 "
                "AND notify_after <= ? AND (notified = 0 OR escalate_at <= ?) "
                "ORDER BY created_at LIMIT ?", (now, now, max(limit, 0))).fetchall()
            db.executemany("UPDATE pending SET notify_after = ? WHERE id = ?",
                           [(now + hold, r[0]) for r in rows])
            return [dataclasses.replace(_pending_from(r), notify_after=now + hold)
                    for r in rows]

        return await self._submit_write(take)

    async def record_notification(self, item_id: str, note: dict[str, Any], *,
                                  notified: int | None = None,
                                  retry_at: float | None = None) -> None:
        note_json, event_json = _dumps(note), _dumps(logged_event(item_id, note))
        at = float(note.get("at") or self.clock())

        def record(db: sqlite3.Connection) -> None:
            changed = db.execute(
                "UPDATE pending SET notes = json_insert(notes, '$[#]', json(?)), "
                "notified = max(notified, coalesce(?, notified)), "
                "notify_after = coalesce(?, notify_after) WHERE id = ?",
                (note_json, notified, retry_at, item_id)).rowcount
            if changed != 1:
                raise NotFound(f"no pending item {item_id!r} in {self.path}")
            db.execute("INSERT INTO run_events (run_id, at, event) SELECT run_id, ?, ? "
                       "FROM pending WHERE id = ?", (at, event_json, item_id))

        await self._submit_write(record)

    async def quota_count(self, counter: str, window: int) -> int:
        row = await self._read(lambda db: db.execute(_QUOTA_READ, (counter, window)).fetchone())
        return 0 if row is None else int(row[0])

    async def _logged_events(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self._read(lambda db: db.execute(
            "SELECT event FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall())
        return [_loads(r[0]) for r in rows]

    async def pending_page(self, limit: int, *, kind: str | None = None,
                           agent: str | None = None, tool: str | None = None,
                           ) -> tuple[list[PendingItem], int]:
        where, params = ["state = 'open'"], []
        for column, value in (("kind", kind), ("agent", agent), ("tool", tool)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        clause = " AND ".join(where)
        # One statement, so one snapshot: the count and the page agree. An empty page of a
        # positive limit means none is open.
        sql = (f"SELECT {_PENDING_COLUMNS}, (SELECT count(*) FROM pending WHERE {clause}) "
               f"FROM pending WHERE {clause} ORDER BY created_at LIMIT ?")
        rows = await self._read_pending(
            lambda db: db.execute(sql, [*params, *params, max(limit, 1)]).fetchall())
        total = int(rows[0][-1]) if rows else 0
        return [_pending_from(r[:-1]) for r in rows[:max(limit, 0)]], total

    async def pending_item(self, item_id: str) -> PendingItem:
        row = await self._read_pending(
            lambda db: db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                                  (item_id,)).fetchone()
        )
        if row is None:
            raise NotFound(f"no pending item {item_id!r} in {self.path}")
        return _pending_from(row)

    def _chained(self, db: sqlite3.Connection, change: Callable[[list[Fact]], T]) -> T:
        """Run `change` in the write transaction and chain the facts it adds to its list.

        For the writes that are not batches (a decision, an expiry, a claim): the facts are
        chained whatever `change` returns (a refusal returned after an expiry keeps the
        expiry, and so its facts); a raise rolls both back.
        """
        facts: list[Fact] = []
        result = change(facts)
        if facts:
            _chain(db, facts, self._tips)
            for run_id in {fact[0] for fact in facts}:
                self._chained_status.pop(run_id, None)
        return result

    async def decide(self, item_id: str, decision: dict[str, Any], decided_by: str, *,
                     payload: dict[str, Any] | None = None) -> PendingItem:
        clock = self.clock

        def cas(db: sqlite3.Connection, facts: list[Fact]) -> PendingItem | Exception:
            now = clock()
            # What is due expires first, in this transaction: a decision after the deadline
            # is refused ("already decided by expiry"), and the expiry is kept (a failure
            # returned, not raised: raised, it would roll the expiry back with it).
            _expire_due(db, now, facts)
            row = db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                             (item_id,)).fetchone()
            if row is None:
                return NotFound(f"no pending item {item_id!r} in {self.path}")
            item = _pending_from(row)
            try:
                after = counted(item, decision, decided_by, now, payload)
            except (AlreadyDecided, UserError) as exc:
                return exc
            if after is None:
                return item
            db.execute(
                "UPDATE pending SET state = ?, decision = ?, decided_by = ?, decided_at = ?, "
                "payload = ?, approvals = ? WHERE id = ? AND state = 'open'",
                (after.state, _dumps(after.decision), after.decided_by, after.decided_at,
                 _dumps(after.payload), _dumps(after.approvals), item_id))
            # Chained: each approval (a four-eyes item's first one changes who decided so
            # far), the decision, and the run's move.
            row = db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending WHERE id = ?",
                             (item_id,)).fetchone()
            facts.append((item.run_id, "pending", item.id, pending_body(row), None))
            if after.state != "open":
                _move_run(db, item.run_id, facts)
            return after

        result = await self._submit_write(lambda db: self._chained(db, lambda facts: cas(
            db, facts)))
        if isinstance(result, Exception):
            raise result
        return result

    async def claim(self, run_id: str, owner: str) -> RunRecord:
        lease = self.lease_seconds

        clock = self.clock

        def cas(db: sqlite3.Connection, facts: list[Fact]) -> RunRecord | Exception:
            # A run resumed after its item's deadline continues with the default (kept even
            # when the claim is refused: returned, not raised, see `decide`).
            _expire_due(db, clock(), facts)
            row = db.execute(f"SELECT {_RUN_SELECT} WHERE id = ?",
                             (run_id,)).fetchone()
            if row is None:
                return NotFound(f"no run {run_id!r} in {self.path}")
            run = _run_from(row)
            now = time.time()
            try:
                check_claimable(run, now)
            except ResumeRefused as exc:
                return exc
            run = dataclasses.replace(run, status=RunStatus.RUNNING, owner=owner, outcome=None,
                                      lease_until=now + lease, updated_at=now)
            db.execute("UPDATE runs SET status = ?, owner = ?, lease_until = ?, updated_at = ?, "
                       "outcome = NULL WHERE id = ?",
                       (run.status.value, owner, run.lease_until, now, run_id))
            facts.append((run_id, "status", run_id, status_body(run_id, "running", None),
                          None))
            return run

        result = await self._submit_write(lambda db: self._chained(db, lambda facts: cas(
            db, facts)))
        if isinstance(result, Exception):
            raise result
        return result

    async def close(self) -> None:
        """Commit what is queued, then release the connections without a final checkpoint.

        Every committed write is in the WAL already; checkpointing it into the main file on
        close costs two fsyncs (milliseconds) and buys nothing the next open needs.
        """
        if self._closed:
            return
        try:
            await self.flush()
            # Fold the log now (milliseconds at most: what came since the last fold), so the
            # tables are complete for plain SQL readers after this process is gone. A store
            # that wrote nothing leaves that to the writer (or the next read of calls).
            if self._wrote:
                reader = self._reader
                await _wait(self._worker.submit(lambda: self._mapped_call(_fold, reader)))
        finally:
            self._closed = True
            reader, db = self._reader, self._db

            def release() -> None:
                reader.close()
                if db is not reader:
                    db.close()

            self._worker.submit(release)
            self._worker.stop()


class _AuditReader:
    """The audit chain and the record of a SQLite file, for `handrail.store.audit`.

    One connection opened read-only (`mode=ro`, `query_only`) and one read transaction: one
    snapshot, and nothing written (as `read_history`). Calls are the table's rows with the
    log's not folded yet laid over them, as the fold would.
    """

    def __init__(self, path: str, *, writable: bool = False, busy_timeout: float = 10.0
                 ) -> None:
        self.path = path
        uri = "file:" + urllib.parse.quote(str(Path(path).expanduser().resolve()))
        try:
            db = sqlite3.connect(uri + ("?mode=rw" if writable else "?mode=ro"), uri=True,
                                 isolation_level=None, check_same_thread=False,
                                 timeout=busy_timeout)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store {path}: {exc}") from exc
        self.db = db
        try:
            if not writable:
                db.execute("PRAGMA query_only=1")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != len(MIGRATIONS):
                raise StoreError(
                    f"{path} has schema version {version}, this handrail reads version "
                    f"{len(MIGRATIONS)}: " + ("upgrade handrail to read it" if version > len(
                        MIGRATIONS) else "open it once with this handrail (`handrail runs`) "
                        "to migrate it (which starts its audit chain), then read it"))
            db.execute("BEGIN IMMEDIATE" if writable else "BEGIN")
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"cannot read the SQLite store {path}: {exc}") from exc
        except BaseException:
            db.close()
            raise

    def close(self) -> None:
        """End the transaction (committing what `sign` wrote) and close."""
        try:
            if self.db.in_transaction:
                self.db.execute("COMMIT")
        finally:
            self.db.close()

    def _where(self, run_id: str | None, column: str = "run_id") -> tuple[str, tuple[Any, ...]]:
        return ("", ()) if run_id is None else (f" WHERE {column} = ?", (run_id,))

    def source(self, run_id: str | None = None) -> _audit.Source:
        """What `handrail.store.audit.verify` reads (one run's rows, with `run_id`)."""
        db = self.db
        where, params = self._where(run_id)
        run_where, run_params = self._where(run_id, "id")

        def facts() -> Iterator[_audit.Fact]:
            log: dict[str, list[Any]] = {}
            for row in db.execute(
                    "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM "
                    f"{_LOG_FACTS}{where} ORDER BY id", params):
                log.setdefault(row[1], []).append(row)
            later = sorted(log)
            for rid, rows in _audit._grouped(db.execute(
                    "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit"
                    f"{where} ORDER BY run_id, n, seq", params), 1):
                while later and later[0] < rid:
                    yield from log.pop(later.pop(0))
                yield from rows
                if later and later[0] == rid:
                    yield from log.pop(later.pop(0))
            for rid in later:
                yield from log.pop(rid)

        def links() -> Iterator[tuple[int, str, str]]:
            if run_id is None:
                yield from db.execute("SELECT seq, hash, link FROM audit ORDER BY seq")
                yield from db.execute(f"SELECT seq, hash, link FROM {_LOG_FACTS} ORDER BY id")

        def calls() -> Iterator[Sequence[Any]]:
            log: dict[str, dict[str, tuple[Any, ...]]] = {}
            for row in db.execute(f"SELECT {', '.join(f'c{i}' for i in range(23))} FROM log "
                                  f"WHERE kind = 1{where.replace('WHERE', 'AND')} "
                                  "ORDER BY id", params):
                log.setdefault(row[1], {})[row[0]] = row
            later = sorted(log)
            for rid, rows in _audit._grouped(db.execute(
                    f"SELECT {_CALL_COLUMNS} FROM calls{where} ORDER BY run_id", params), 1):
                while later and later[0] < rid:
                    yield from log.pop(later.pop(0)).values()
                over = log.pop(rid, None)
                if later and later[0] == rid:
                    later.pop(0)
                if over:
                    rows = [over.pop(r[0], r) for r in rows] + list(over.values())
                yield from rows
            for rid in later:
                yield from log.pop(rid).values()

        one = _audit.Source(
            facts=facts, links=links,
            runs=lambda: db.execute(f"SELECT {_RUN_COLUMNS} FROM runs{run_where} ORDER BY id",
                                    run_params),
            calls=calls,
            pending=lambda: db.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending{where} ORDER BY run_id", params),
            signatures=self.signatures,
            previous_link=self.previous_link)
        if run_id is not None:
            return one
        return dataclasses.replace(
            one,
            ordered_facts=self._ordered_facts,
            all_runs=lambda: db.execute(f"SELECT {_RUN_COLUMNS} FROM runs"),
            all_calls=self._all_calls,
            all_pending=lambda: db.execute(f"SELECT {_PENDING_COLUMNS} FROM pending"),
            fact=self._fact,
            for_run=self.source)

    def _ordered_facts(self) -> Iterator[_audit.Fact]:
        yield from self.db.execute(
            "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit ORDER BY seq")
        yield from self.db.execute(
            f"SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM {_LOG_FACTS} "
            "ORDER BY id")

    def _all_calls(self) -> Iterator[Sequence[Any]]:
        # The table in its own order (sequential reads), the log's newer rows laid over it.
        log: dict[str, tuple[Any, ...]] = {}
        for row in self.db.execute(f"SELECT {', '.join(f'c{i}' for i in range(23))} FROM log "
                                   "WHERE kind = 1 ORDER BY id"):
            log[row[0]] = row
        for row in self.db.execute(f"SELECT {_CALL_COLUMNS} FROM calls"):
            yield log.pop(row[0], row) if log else row
        yield from log.values()

    def _fact(self, seq: int) -> _audit.Fact | None:
        row: _audit.Fact | None = self.db.execute(
            "SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM audit WHERE seq = ?",
            (seq,)).fetchone() or self.db.execute(
            f"SELECT seq, run_id, n, kind, ref, body, prev, hash, link FROM {_LOG_FACTS} "
            "WHERE seq = ?", (seq,)).fetchone()
        return row

    def previous_link(self, seq: int) -> str | None:
        """The link of fact `seq - 1` (`ZERO` before the first), or None if it is gone."""
        if seq == 1:
            return ZERO
        row = self.db.execute("SELECT link FROM audit WHERE seq = ?", (seq - 1,)).fetchone(
            ) or self.db.execute(f"SELECT link FROM {_LOG_FACTS} WHERE seq = ?",
                                 (seq - 1,)).fetchone()
        return None if row is None else _hex(row[0])

    def run_hash(self, run_id: str, n: int) -> str | None:
        """The hash (hex) of the fact at place `n` of a run's chain, or None."""
        row = self.db.execute(f"SELECT hash FROM {_LOG_FACTS} WHERE run_id = ? AND n = ?",
                              (run_id, n)).fetchone() or self.db.execute(
            "SELECT hash FROM audit WHERE run_id = ? AND n = ?", (run_id, n)).fetchone()
        return None if row is None else _hex(row[0])

    def head(self) -> tuple[int, str] | None:
        """The store's head: its last fact's (seq, link)."""
        row = self.db.execute(_LOG_FACT_NEWEST).fetchone() or self.db.execute(
            _AUDIT_LAST).fetchone()
        return None if row is None else (int(row[0]), _hex(row[1]))

    def first_since(self, since: float) -> int | None:
        """The first fact written at or after `since` (Unix time)."""
        row = self.db.execute(
            "SELECT min(s) FROM (SELECT min(seq) AS s FROM audit WHERE at >= ? UNION ALL "
            f"SELECT min(seq) FROM {_LOG_FACTS} WHERE at >= ?)", (since, since)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def facts_from(self, seq: int) -> Iterator[tuple[Any, ...]]:
        """Every fact from `seq` on, in order, with its `at`."""
        yield from self.db.execute(
            "SELECT seq, run_id, n, kind, ref, body, prev, hash, link, at FROM audit "
            "WHERE seq >= ? ORDER BY seq", (seq,))
        yield from self.db.execute(
            f"SELECT seq, run_id, n, kind, ref, body, prev, hash, link, at FROM {_LOG_FACTS} "
            "WHERE seq >= ? ORDER BY id", (seq,))

    def call_row(self, record_id: str) -> Sequence[Any] | None:
        """A call's row as it stands (the log's newer state first)."""
        row: Sequence[Any] | None = self.db.execute(
            f"SELECT {', '.join(f'c{i}' for i in range(23))} FROM log WHERE kind = 1 AND "
            "c0 = ? ORDER BY id DESC LIMIT 1", (record_id,)).fetchone() or self.db.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = ?", (record_id,)).fetchone()
        return row

    def signatures(self) -> list[tuple[Any, ...]]:
        """Every signature, in head order (none before the first: no table yet)."""
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                           "'audit_signatures'").fetchone() is None:
            return []
        return self.db.execute("SELECT seq, link, key, signature, signed_at FROM "
                               "audit_signatures ORDER BY seq, key").fetchall()

    def add_signature(self, seq: int, link: str, key: str, signature: str) -> None:
        """Record a head's signature (a writable reader, in its transaction)."""
        self.db.execute(_SIGNATURES_TABLE)
        self.db.execute("INSERT OR REPLACE INTO audit_signatures VALUES (?, ?, ?, ?, ?)",
                        (seq, link, key, signature, time.time()))
