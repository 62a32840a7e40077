"""`Store.pending_page`: the oldest open items up to a limit, and how many are open (issue 11).

`handrail pending` shows a person a page of a long queue; the page is all it reads. Run against
every store: memory and PostgreSQL take the default (every item, sliced), SQLite a bounded query.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handrail.store import Batch, PendingItem, RunRecord, Store

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        s = Store.memory()
    elif request.param == "sqlite":
        s = Store.open(tmp_path / "runs.db")
    else:
        s = Store.open(request.getfixturevalue("pg_url"))
    yield s
    await s.close()


def _item(i: int, kind: str = "approval", agent: str = "a", tool: str = "x/y") -> PendingItem:
    return PendingItem(id=f"p{i:02d}", kind=kind, run_id="r1", call_record="r1:c", agent=agent,
                       tool=tool, created_at=100.0 + i, payload={"n": i})


async def test_a_page_is_the_oldest_open_items_and_the_count_is_every_open_one(
        store: Store) -> None:
    items = [_item(i, kind="question" if i % 3 == 0 else "approval",
                   agent="b" if i % 2 else "a") for i in range(12)]
    await store.write(Batch(run=RunRecord(id="r1", task="t", policy={}), pending=items))
    await store.decide("p04", {"kind": "approve"}, "op")  # decided: neither listed nor counted
    everything = await store.pending()
    for limit in (1, 5, 11, 50):
        page, total = await store.pending_page(limit)
        assert (page, total) == (everything[:limit], 11), limit
    for filters in ({"kind": "question"}, {"agent": "b"}, {"tool": "x/y", "kind": "approval"},
                    {"tool": "nope"}):
        expected = await store.pending(**filters)
        assert await store.pending_page(2, **filters) == (expected[:2], len(expected)), filters
    assert await store.pending_page(0) == ([], 11)
    assert [p.payload for p in (await store.pending_page(2))[0]] == [{"n": 0}, {"n": 1}]


async def test_an_empty_queue_is_an_empty_page(store: Store) -> None:
    assert await store.pending_page(50) == ([], 0)
    assert await store.pending_page(0) == ([], 0)
