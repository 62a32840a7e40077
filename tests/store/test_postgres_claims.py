"""What `claim_ready` holds on PostgreSQL: at most `limit` runs, never one another transaction
has locked (skipped, not waited for), never one in `exclude` — by both of its paths (the
paused-runs statement of `orphans=False`, and the one that also looks for orphans)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
import pytest

from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store

pytestmark = pytest.mark.anyio

PATHS = [pytest.param(True, id="with-orphans"), pytest.param(False, id="paused-only")]


def _paused(run_id: str) -> RunRecord:
    return RunRecord(id=run_id, task="t", created_at=time.time(),
                     status=RunStatus.AWAITING_APPROVAL,
                     outcome={"kind": "awaiting_approval", "request_id": f"{run_id}-p"})


def _decided(item_id: str, run_id: str) -> PendingItem:
    return PendingItem(id=item_id, kind="approval", run_id=run_id, call_record=f"{run_id}:c",
                       created_at=time.time(), state="decided",
                       decision={"kind": "approve"})


async def _five_ready(store: Any) -> list[str]:
    ids = [f"r{i}" for i in range(5)]
    for run_id in ids[:3]:  # paused with everything decided
        await store.write(Batch(run=_paused(run_id), pending=[_decided(f"{run_id}-p", run_id)]))
    for run_id in ids[3:]:  # READY (decided, not yet continued)
        await store.write(Batch(run=RunRecord(id=run_id, task="t", created_at=time.time(),
                                              status=RunStatus.READY)))
    assert await store.ready_count() == 5
    return ids


@pytest.mark.parametrize("orphans", PATHS)
async def test_a_claim_holds_at_most_its_limit(pg_url: str, orphans: bool) -> None:
    async with Store.open(pg_url) as store:
        ids = await _five_ready(store)
        (one,) = await store.claim_ready("w1", limit=1, orphans=orphans)
        assert one.owner == "w1"
        assert await store.ready_count() == 4  # the four others are not held by anyone
        two = await store.claim_ready("w2", limit=2, orphans=orphans)
        assert len(two) == 2 and {r.owner for r in two} == {"w2"}
        rest = await store.claim_ready("w3", limit=10, orphans=orphans)
        assert sorted([one.id, *(r.id for r in two), *(r.id for r in rest)]) == ids
        assert {(await store.run(i)).owner for i in ids} == {"w1", "w2", "w3"}


@pytest.mark.parametrize("orphans", PATHS)
async def test_a_claim_skips_a_run_another_transaction_has_locked(
        pg_url: str, orphans: bool) -> None:
    async with Store.open(pg_url) as store:
        ids = await _five_ready(store)
        # Another worker's claim, mid-transaction, holding the row lock of r0.
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT id FROM runs WHERE id = 'r0' FOR UPDATE")
            # A deadline, not a measure: a claim that waits on the lock never returns while
            # the lock is held (the transaction above stays open until after the claim).
            with anyio.fail_after(60):
                taken = await store.claim_ready("w", limit=10, orphans=orphans)
            assert sorted(r.id for r in taken) == ids[1:]
            other.rollback()
        assert [r.id for r in await store.claim_ready("w2", limit=10, orphans=orphans)] == ["r0"]


@pytest.mark.parametrize("orphans", PATHS)
async def test_a_claim_never_holds_an_excluded_run(pg_url: str, orphans: bool) -> None:
    async with Store.open(pg_url) as store:
        ids = await _five_ready(store)
        taken = await store.claim_ready("w", limit=10, exclude=frozenset({"r1", "r4"}),
                                        orphans=orphans)
        assert sorted(r.id for r in taken) == ["r0", "r2", "r3"]
        assert (await store.run("r1")).owner is None and (await store.run("r4")).owner is None
        assert sorted(ids) == ids
