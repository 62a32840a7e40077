"""`handrail pending` is one of the touches that enforce a deadline, and shows "1 of 2"."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from handrail.cli import main
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store


def _seed(db: Path) -> None:
    now = time.time()

    async def go() -> None:
        async with Store.open(db) as store:
            for run_id, item in (
                    ("r1", PendingItem(id="four", kind="approval", run_id="r1",
                                       call_record="r1:c", tool="x/pay", created_at=now,
                                       payload={"act": "call", "target": "x/pay"},
                                       approvals_needed=2,
                                       approvals=[{"by": "alice", "at": now}],
                                       deadline=now + 1800,
                                       on_expiry={"kind": "deny", "reason": "expired"})),
                    ("r2", PendingItem(id="late", kind="approval", run_id="r2",
                                       call_record="r2:c", tool="x/pay", created_at=now - 60,
                                       payload={"act": "call", "target": "x/pay"},
                                       deadline=now - 1,
                                       on_expiry={"kind": "deny", "reason": "expired"}))):
                await store.write(Batch(run=RunRecord(
                    id=run_id, task="t", policy={"layers": []}, created_at=now,
                    status=RunStatus.AWAITING_APPROVAL,
                    outcome={"kind": "awaiting_approval", "request_id": item.id}),
                    pending=[item]))

    anyio.run(go)


def test_pending_expires_what_is_due_and_shows_approvals_and_the_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    _seed(db)
    assert main(["pending", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("four approval") and "late" not in out  # expired by this look
    assert "approvals: 1 of 2 (by alice; another person must approve)" in out
    assert "deadline: deny by default at" in out
    assert "run r2 is ready (decided, not yet continued)" in out  # it waits for a resume

    async def read() -> PendingItem:
        async with Store.open(db) as store:
            return await store.pending_item("late")

    late = anyio.run(read)
    assert (late.state, late.decided_by) == ("decided", "expiry")
    assert main(["pending", "--store", str(db), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["id"], listed["approvals_needed"], listed["approvals"]) == (
        "four", 2, ["alice"])


def test_approve_counts_a_four_eyes_approval_and_says_it_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    _seed(db)
    assert main(["approve", "four", "--store", str(db), "--as", "Alice", "--no-resume"]) == 0
    out = capsys.readouterr().out
    assert "approval 1 of 2 counted (by alice)" in out and "another person" in out
    assert main(["approve", "four", "--store", str(db), "--as", "bob", "--no-resume"]) == 0
    assert "recorded (by bob); run r1 is ready" in capsys.readouterr().out

    async def read() -> PendingItem:
        async with Store.open(db) as store:
            return await store.pending_item("four")

    assert anyio.run(read).decided_by == "alice, bob"
