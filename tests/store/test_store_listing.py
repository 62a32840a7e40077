"""What the CLI's listings ask of a store (issue 11), against every store.

`Store.pending_page`: `handrail pending` shows a person a page of a long queue, and the page is
all it reads (memory and PostgreSQL take the default: every item, sliced; SQLite reads the
page). `Store.run_ids`: `handrail show 3f9a` names a run by the start of its id; SQLite and
memory look at every run by its id, not at the newest 10,000 runs decoded.
`Store.continuations`: `handrail show` lists a run's conversation; SQLite and memory read the
runs that continue it, not the newest 1,000 runs decoded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from handrail.store import Batch, PendingItem, RunRecord, Store

pytestmark = pytest.mark.anyio


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


async def test_run_ids_are_those_that_start_with_the_prefix_in_id_order(store: Store) -> None:
    ids = ["abcd", "abcd1", "abcd2", "abce", "abc", "xabcd", "abcdé", "ABCD"]
    for i, run_id in enumerate(ids):
        await store.write(Batch(run=RunRecord(id=run_id, task="t", policy={},
                                              created_at=float(i))))
    assert await store.run_ids("abcd") == ["abcd", "abcd1", "abcd2", "abcdé"]
    assert await store.run_ids("abcd", limit=2) == ["abcd", "abcd1"]
    assert await store.run_ids("abcdé") == ["abcdé"]
    assert await store.run_ids("abcz") == []
    assert await store.run_ids("%") == [] and await store.run_ids("_bcd") == []


async def test_run_ids_look_past_the_newest_runs(tmp_path: Path) -> None:
    # The default looked among the newest 10,000 runs: the SQLite store finds an older one.
    async with Store.open(tmp_path / "runs.db") as store:
        await store.write(Batch(run=RunRecord(id="old-run", task="t", policy={},
                                              created_at=0.0)))
        for start in range(0, 10_050, 1000):
            for i in range(start, min(start + 1000, 10_050)):
                await store.write(Batch(run=RunRecord(id=f"new-{i:05d}", task="t", policy={},
                                                      created_at=1.0 + i)), wait=False)
            await store.flush()
        assert await store.run_ids("old-") == ["old-run"]


def _continuing(run_id: str, conversation: str, previous: str, at: float) -> RunRecord:
    return RunRecord(id=run_id, task="t", policy={}, created_at=at, events=[
        {"kind": "verify", "check": "x"},
        {"kind": "continues", "run": previous, "conversation": conversation, "at": at}])


@pytest.mark.parametrize("root", ["c1", 'ç "c1\\ é'])
async def test_continuations_are_a_conversations_later_runs_oldest_first(
        store: Store, root: str) -> None:
    runs = [RunRecord(id=root, task="t", policy={}, created_at=1.0),
            _continuing("c3", root, "c2", 3.0), _continuing("c2", root, root, 2.0),
            _continuing("c4", root, "c3", 3.0),
            # Another conversation; a run naming the root elsewhere in its events; a run
            # whose first `continues` event names another conversation.
            _continuing("d2", "d1", "d1", 2.5),
            RunRecord(id="e1", task="t", policy={}, created_at=2.7, events=[
                {"kind": "note", "conversation": root, "text": f'"{root}" "continues"'}]),
            RunRecord(id="f2", task="t", policy={}, created_at=2.8, events=[
                {"kind": "continues", "run": "f1", "conversation": "f1", "at": 0},
                {"kind": "continues", "run": root, "conversation": root, "at": 0}])]
    for run in runs:
        await store.write(Batch(run=run))
    assert [r.id for r in await store.continuations(root)] == ["c2", "c3", "c4"]
    assert [r.id for r in await store.continuations(root, since=3.0)] == ["c3", "c4"]
    assert [r.id for r in await store.continuations(root, limit=2)] == ["c2", "c3"]
    assert await store.continuations(root, limit=0) == []
    assert [r.id for r in await store.continuations("d1")] == ["d2"]
    assert await store.continuations("nope") == []
    (c2,) = [r for r in await store.continuations(root) if r.id == "c2"]
    assert c2 == runs[2]  # the whole record


async def test_continuations_look_past_the_newest_runs(tmp_path: Path) -> None:
    # The default looked among the newest 1,000 runs: the SQLite store finds an older one.
    async with Store.open(tmp_path / "runs.db") as store:
        await store.write(Batch(run=RunRecord(id="c1", task="t", policy={}, created_at=0.0)))
        await store.write(Batch(run=_continuing("c2", "c1", "c1", 1.0)))
        for i in range(1100):
            await store.write(Batch(run=RunRecord(id=f"new-{i:05d}", task="t", policy={},
                                                  created_at=2.0 + i)), wait=False)
        await store.flush()
        assert [r.id for r in await store.continuations("c1")] == ["c2"]
