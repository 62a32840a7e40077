"""Deadlines with a default and four-eyes approvals, in every store (memory, SQLite, PostgreSQL).

The deadline is enforced by whatever touches the store next (`pending`, `pending_item`,
`decide`, `claim`, a dispatcher's round), exactly once, recorded as decided by "expiry"; an
item that needs two approvers stays open until two distinct people approved.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from notify_helpers import Clock

from handrail.errors import AlreadyDecided, UserError
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store

pytestmark = pytest.mark.anyio

DENY_30M = {"kind": "deny", "reason": "expired after 30m"}


def _paused(run_id: str = "r1", item_id: str = "p1") -> RunRecord:
    return RunRecord(id=run_id, task="t", agent="a", created_at=time.time(),
                     policy={"layers": []}, status=RunStatus.AWAITING_APPROVAL,
                     outcome={"kind": "awaiting_approval", "request_id": item_id})


def _item(item_id: str, now: float, run_id: str = "r1", **kw: Any) -> PendingItem:
    return PendingItem(id=item_id, kind="approval", run_id=run_id,
                       call_record=f"{run_id}:c", created_at=now,
                       payload={"act": "write", "target": "a.txt"}, **kw)


async def test_an_item_keeps_its_deadline_default_approvals_and_notes(store: Store,
                                                                       clock: Clock) -> None:
    item = _item("p1", clock.now, deadline=clock.now + 1800, on_expiry=DENY_30M,
                 escalate_at=clock.now + 600, approvals_needed=2,
                 approvals=[{"by": "alice", "at": 1.0}], notified=1, notify_after=5.0,
                 notes=[{"kind": "notified", "at": 2.0}])
    defaults = _item("x", 0.0)
    changed = [f.name for f in dataclasses.fields(PendingItem)
               if getattr(item, f.name) != getattr(defaults, f.name)]
    assert {"deadline", "on_expiry", "escalate_at", "approvals_needed", "approvals",
            "notified", "notify_after", "notes"} <= set(changed)
    await store.write(Batch(run=_paused(), pending=[item]))
    assert await store.pending_item("p1") == item


async def test_an_item_past_its_deadline_is_decided_once_by_expiry(store: Store,
                                                                    clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[
        _item("p1", clock.now, deadline=clock.now + 1800, on_expiry=DENY_30M)]))
    clock.advance(1799)
    assert [p.id for p in await store.pending()] == ["p1"]
    clock.advance(1)
    assert await store.pending() == []  # the listing itself enforced it
    item = await store.pending_item("p1")
    assert (item.state, item.decided_by, item.decision) == ("decided", "expiry", DENY_30M)
    assert item.decided_at == clock.now
    assert [n["kind"] for n in item.notes] == ["expired"]
    assert (await store.run("r1")).status is RunStatus.READY  # a resume applies the deny
    # Every later touch leaves it as it is: expired once.
    clock.advance(3600)
    assert await store.expire_due() == []
    assert [n["kind"] for n in (await store.pending_item("p1")).notes] == ["expired"]


async def test_a_decision_after_the_deadline_is_refused_and_one_before_it_stands(
        store: Store, clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[
        _item("late", clock.now, deadline=clock.now + 60, on_expiry=DENY_30M),
        _item("early", clock.now, deadline=clock.now + 60, on_expiry=DENY_30M)]))
    await store.decide("early", {"kind": "approve"}, "alice")
    clock.advance(61)
    with pytest.raises(AlreadyDecided, match="expiry"):
        await store.decide("late", {"kind": "approve"}, "bob")
    late, early = await store.pending_item("late"), await store.pending_item("early")
    assert (late.decided_by, late.decision) == ("expiry", DENY_30M)
    assert (early.decided_by, early.decision, early.notes) == ("alice", {"kind": "approve"}, [])


async def test_a_resume_after_the_deadline_finds_the_default(store: Store, clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[
        _item("p1", clock.now, deadline=clock.now + 60, on_expiry=DENY_30M)]))
    clock.advance(60)
    run = await store.claim("r1", "h:1:x")  # nothing else touched the store since
    assert run.status is RunStatus.RUNNING
    assert (await store.pending_item("p1")).decided_by == "expiry"


async def test_a_denied_write_that_expires_keeps_no_bytes(store: Store, clock: Clock) -> None:
    payload = {"act": "write", "target": "a.txt", "content": "c2VjcmV0",
               "arguments": {"path": "a.txt", "content": "secret"},
               "actions": [{"act": "write", "target": "a.txt", "content": "c2VjcmV0"}]}
    await store.write(Batch(run=_paused(), pending=[dataclasses.replace(
        _item("p1", clock.now, deadline=clock.now + 1, on_expiry=DENY_30M), payload=payload)]))
    clock.advance(2)
    kept = (await store.pending_item("p1")).payload
    assert kept["content"] is None and "secret" not in repr(kept)
    assert kept["content_bytes"] == 6


async def test_concurrent_touches_expire_each_item_exactly_once(backend: str,
                                                                clock: Clock) -> None:
    if backend == "memory://":
        pytest.skip("one process's dicts: nothing concurrent to race")
    first, second = Store.open(backend), Store.open(backend)
    try:
        for s in (first, second):
            s.clock = clock
        items = [_item(f"p{i}", clock.now, run_id=f"r{i}", deadline=clock.now + 10,
                       on_expiry=DENY_30M) for i in range(20)]
        for i, item in enumerate(items):
            await first.write(Batch(run=_paused(f"r{i}", item.id), pending=[item]))
        clock.advance(11)
        expired: list[PendingItem] = []

        async def touch(s: Store, how: int) -> None:
            if how == 0:
                expired.extend(await s.expire_due())
            elif how == 1:
                await s.pending()
            else:
                await s.pending_item("p3")

        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(touch, (first, second)[n % 2], n % 3)
        for item in items:
            done = await second.pending_item(item.id)
            assert done.decided_by == "expiry"
            assert [n["kind"] for n in done.notes] == ["expired"], done.id
        assert len(expired) <= 20 and len({p.id for p in expired}) == len(expired)
    finally:
        await first.close()
        await second.close()


_CHILD = """
import sys, anyio, json
from handrail.store import Store
async def main():
    store = Store.open(sys.argv[1])
    try:
        done = await store.expire_due()
        await store.pending()
        print(json.dumps([p.id for p in done]))
    finally:
        await store.close()
anyio.run(main)
"""


async def test_two_processes_touching_the_store_expire_each_item_exactly_once(
        backend: str) -> None:
    if backend == "memory://":
        pytest.skip("a memory store lives in one process")
    now = time.time()
    store = Store.open(backend)
    try:
        for i in range(30):
            await store.write(Batch(run=_paused(f"r{i}", f"p{i}"), pending=[
                _item(f"p{i}", now, run_id=f"r{i}", deadline=now - 1, on_expiry=DENY_30M)]))
        await store.flush()
    finally:
        await store.close()
    outputs: list[str] = []

    async def child() -> None:
        done = await anyio.run_process([sys.executable, "-c", _CHILD, backend])
        outputs.append(done.stdout.decode())

    async with anyio.create_task_group() as tg:  # both at once
        tg.start_soon(child)
        tg.start_soon(child)
    ids = [i for out in outputs for i in json.loads(out)]
    assert sorted(ids) == sorted(f"p{i}" for i in range(30))  # each by one process, once
    store = Store.open(backend)
    try:
        for i in range(30):
            item = await store.pending_item(f"p{i}")
            assert [n["kind"] for n in item.notes] == ["expired"]
    finally:
        await store.close()


async def test_four_eyes_needs_two_distinct_people(store: Store, clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[_item("p1", clock.now,
                                                          approvals_needed=2)]))
    one = await store.decide("p1", {"kind": "approve"}, "alice")
    assert one.state == "open" and [a["by"] for a in one.approvals] == ["alice"]
    assert (await store.run("r1")).status is RunStatus.AWAITING_APPROVAL
    # The same person again, however spelled, counts once.
    for again in ("alice", "Alice ", "ＡＬＩＣＥ"):
        assert (await store.decide("p1", {"kind": "approve"}, again)).state == "open"
    assert len((await store.pending_item("p1")).approvals) == 1
    clock.advance(5)
    two = await store.decide("p1", {"kind": "approve"}, "bob")
    assert (two.state, two.decided_by) == ("decided", "alice, bob")
    assert two.decision == {"kind": "approve", "approvals": ["alice", "bob"]}
    assert [a["by"] for a in (await store.pending_item("p1")).approvals] == ["alice", "bob"]
    assert (await store.run("r1")).status is RunStatus.READY
    with pytest.raises(AlreadyDecided):
        await store.decide("p1", {"kind": "approve"}, "carol")


async def test_any_deny_ends_a_four_eyes_item(store: Store, clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[_item("p1", clock.now,
                                                          approvals_needed=3)]))
    await store.decide("p1", {"kind": "approve"}, "alice")
    denied = await store.decide("p1", {"kind": "deny", "reason": "no"}, "bob")
    assert (denied.state, denied.decided_by, denied.decision["kind"]) == (
        "decided", "bob", "deny")


async def test_a_four_eyes_approval_cannot_edit_or_remember(store: Store, clock: Clock) -> None:
    await store.write(Batch(run=_paused(), pending=[_item("p1", clock.now,
                                                          approvals_needed=2)]))
    with pytest.raises(UserError, match="as it is"):
        await store.decide("p1", {"kind": "approve", "modified": {"path": "b"}}, "alice")
    with pytest.raises(UserError, match="as it is"):
        await store.decide("p1", {"kind": "approve", "remember": ["*.txt"]}, "alice")
    assert (await store.pending_item("p1")).approvals == []


async def test_two_approvers_at_once_on_two_connections_are_both_counted(
        backend: str, clock: Clock) -> None:
    if backend == "memory://":
        pytest.skip("one process's dicts: nothing concurrent to race")
    first, second = Store.open(backend), Store.open(backend)
    try:
        await first.write(Batch(run=_paused(), pending=[_item("p1", clock.now,
                                                              approvals_needed=2)]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.decide, "p1", {"kind": "approve"}, "alice")
            tg.start_soon(second.decide, "p1", {"kind": "approve"}, "bob")
        item = await first.pending_item("p1")
        assert item.state == "decided"
        assert sorted(a["by"] for a in item.approvals) == ["alice", "bob"]
    finally:
        await first.close()
        await second.close()


async def test_a_store_upgraded_to_deadlines_does_not_notify_what_was_already_open(
        tmp_path: Path) -> None:
    """Migration 0009 on a file made before it: items open then are kept as they were, with
    no deadline, and are not owed a notification (an upgrade is not a flood of messages)."""
    import sqlite3

    from handrail.store._sqlite import MIGRATIONS

    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                "applied_at REAL NOT NULL)")
    before = [name for name, _ in MIGRATIONS].index("0009_pending_deadlines")
    for number, (name, migrate) in enumerate(MIGRATIONS[:before], start=1):
        migrate(old)
        old.execute("INSERT INTO _migrations VALUES (?, ?, 0)", (number, name))
    old.execute(f"PRAGMA user_version={before}")
    old.execute("INSERT INTO runs (id, task, status, created_at, updated_at) "
                "VALUES ('r1', 't', 'awaiting_approval', 0, 0)")
    old.execute("INSERT INTO pending (id, kind, run_id, call_record, payload, created_at, "
                "state) VALUES ('p1', 'approval', 'r1', 'r1:c', '{}', 1, 'open')")
    old.close()
    store = Store.open(path)
    try:
        item = await store.pending_item("p1")
        assert (item.deadline, item.approvals_needed, item.approvals, item.notes) == (
            None, 1, [], [])
        assert item.notified == 2
        assert await store.take_notifications(hold=60) == []
        await store.write(Batch(pending=[_item("p2", time.time())]))
        assert [p.id for p in await store.take_notifications(hold=60)] == ["p2"]
    finally:
        await store.close()
