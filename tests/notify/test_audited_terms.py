"""Deadlines and four-eyes in the tamper-evident record (issues 41 and 42 together).

An expiry and a decision by the last of two approvers change a pending item and move its run:
each is chained in the transaction that makes it (docs/audit.md), so `audit verify` of a store
that only expired and decided finds nothing, and an edit of what expiry or the second
approver decided is named.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import pytest
from notify_helpers import Clock

from handrail.cli import main
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store

pytestmark = pytest.mark.anyio

DENY = {"kind": "deny", "reason": "expired after 1m"}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    return str(request.getfixturevalue("pg_url"))


def _paused(run_id: str, item_id: str) -> RunRecord:
    return RunRecord(id=run_id, task="t", agent="a", created_at=time.time(),
                     policy={"layers": []}, status=RunStatus.AWAITING_APPROVAL,
                     outcome={"kind": "awaiting_approval", "request_id": item_id})


def _item(item_id: str, run_id: str, now: float, **kw: Any) -> PendingItem:
    return PendingItem(id=item_id, kind="approval", run_id=run_id, call_record=f"{run_id}:c",
                       created_at=now, payload={"act": "write", "target": "a.txt"}, **kw)


def _breaks(url: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    code = main(["audit", "verify", "--store", url, "--json"])
    breaks: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["breaks"]
    assert code == (1 if breaks else 0)
    return breaks


def _sql(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    db = sqlite3.connect(url)
    try:
        rows = db.execute(sql, params).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


async def test_an_expiry_and_a_second_approval_are_chained_and_an_edit_is_named(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    store = Store.open(url)
    store.clock = clock
    try:
        await store.write(Batch(run=_paused("r1", "p1"), pending=[
            _item("p1", "r1", clock.now, deadline=clock.now + 60, on_expiry=DENY)]))
        await store.write(Batch(run=_paused("r2", "p2"), pending=[
            _item("p2", "r2", clock.now, approvals_needed=2)]))
        await store.decide("p2", {"kind": "approve"}, "alice")  # 1 of 2: still open
        await store.decide("p2", {"kind": "approve"}, "bob")  # 2 of 2: decided
        clock.advance(61)
        assert [i.id for i in await store.expire_due()] == ["p1"]
        assert (await store.run("r1")).status is RunStatus.READY
    finally:
        await store.close()
    assert _breaks(url, capsys) == []
    decided = dict(_sql(url, "SELECT id, decided_by FROM pending ORDER BY id"))
    assert decided == {"p1": "expiry", "p2": "alice, bob"}
    for item_id in ("p1", "p2"):  # what expiry decided, what the two people decided
        _sql(url, "UPDATE pending SET decided_by = 'mallory' WHERE id = ?", item_id)
        breaks = _breaks(url, capsys)
        assert any(b["what"] == "edited" and b["where"] == f"pending item {item_id}"
                   for b in breaks), breaks
        _sql(url, "UPDATE pending SET decided_by = ? WHERE id = ?", decided[item_id], item_id)
    assert _breaks(url, capsys) == []
