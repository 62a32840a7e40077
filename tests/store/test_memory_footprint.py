"""The memory store holds no object the garbage collector tracks per stored call or message.

Issue 24: at 1,000 concurrent runs on one loop every full collector pass walked every object the
process holds, 0.5 µs each; the memory store kept a record object and a tuple per stored call
(a sixth of what a pass walked), so its loop lag was several times SQLite's with the same loop
code. A stored call and a stored message are now one byte string each (not tracked); what the
store holds per run (its record, its lists of ids and messages) does not grow with the calls.
"""

from __future__ import annotations

import gc

import pytest

import handrail as hr
from handrail.store import Batch, CallRecord, CallStatus, RunRecord

pytestmark = pytest.mark.anyio

RUNS = 3


def _call(run_id: str, n: int) -> CallRecord:
    # Every container field filled, as the gate fills them: each is a tracked object on the
    # writer's side.
    return CallRecord(
        id=f"{run_id}:call_{n}", run_id=run_id, call_id=f"call_{n}", turn=n, index=0,
        model_name="add", tool="local/add", arguments='{"a": 1}', arguments_digest="sha256:x",
        performed_arguments={"a": [n]}, actions=[{"act": "call", "target": "local/add"}],
        verdict={"effect": "allow", "rule": ["default"]}, decision=None,
        status=CallStatus.FINISHED,
        result={"content": [{"kind": "text", "text": str(n)}], "structured": n,
                "is_error": False, "metadata": {}},
        answers=[], started_at=1.0, ended_at=2.0,
        provenance={"output": "untrusted", "trusted": []})


async def _write_calls(store: hr.Store, first: int, count: int) -> None:
    for n in range(first, first + count):
        for r in range(RUNS):
            run_id = f"run-{r}"
            message = {"kind": "tool_result", "call_id": f"call_{n}",
                       "result": {"content": [{"kind": "text", "text": str(n)}]}}
            await store.write(Batch(run=RunRecord(id=run_id, task="t", steps=n),
                                    calls=[_call(run_id, n)],
                                    messages=[(run_id, n, message)]))


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_stored_calls_and_messages_add_no_tracked_objects() -> None:
    store = hr.Store.memory()
    await _write_calls(store, 0, 20)
    before = _tracked()
    await _write_calls(store, 20, 100)
    grown = _tracked() - before
    # 300 calls and 300 messages more: two tracked objects a call (a record and a tuple)
    # grew this by 600. A margin for what the event loop allocates meanwhile.
    assert grown < 60, f"{grown} tracked objects more after 300 stored calls"
    # And what is stored is all there, in order, as written.
    stored = await store.calls("run-1")
    assert [c.turn for c in stored] == list(range(120))
    assert stored[57] == _call("run-1", 57)
    messages = await store.messages("run-2")
    assert len(messages) == 120 and messages[7]["call_id"] == "call_7"


async def test_a_writes_messages_and_calls_read_back_each_as_written() -> None:
    # Issue 38: a write's messages and call records are packed together, in one blob; each
    # still reads back as itself (its own place in the blob), and what a read returns shares
    # nothing with another read, even where the writer shared an object between them.
    store = hr.Store.memory()
    shared = {"content": [{"kind": "text", "text": "3"}], "structured": 3, "is_error": False,
              "metadata": {}}
    first, second = _call("r", 0), _call("r", 1)
    second.status = CallStatus.STARTED
    first.result = shared
    messages = [("r", 0, {"kind": "assistant", "parts": [{"kind": "text", "text": "a"}]}),
                ("r", 1, {"kind": "tool_result", "call_id": "call_0", "result": shared})]
    await store.write(Batch(run=RunRecord(id="r", task="t"), calls=[first, second],
                            messages=messages))
    assert await store.messages("r") == [m for _, _, m in messages]
    assert await store.calls("r") == [first, second]
    assert await store.call("r:call_1") == second
    read = await store.call("r:call_0")
    assert read.result is not None
    read.result["content"].clear()
    assert (await store.messages("r"))[1]["result"] == shared
    assert (await store.call("r:call_0")).result == shared
    # A later write of one of them replaces that one alone.
    await store.write(Batch(messages=[("r", 1, {"kind": "tool_result", "call_id": "x"})]))
    assert [m["kind"] for m in await store.messages("r")] == ["assistant", "tool_result"]
    assert (await store.messages("r"))[1]["call_id"] == "x"
    assert await store.calls("r") == [first, second]


async def test_a_write_with_one_item_marshal_refuses_keeps_every_item() -> None:
    # One value marshal refuses (a subclass of a builtin type) makes the write pack item by
    # item: the others still packed, every one read back as written.
    class Text(str):
        pass

    store = hr.Store.memory()
    record = _call("r", 0)
    messages = [("r", 0, {"kind": "user", "text": "plain"}),
                ("r", 1, {"kind": "user", "text": Text("odd")})]
    await store.write(Batch(run=RunRecord(id="r", task="t"), calls=[record],
                            messages=messages))
    assert await store.messages("r") == [m for _, _, m in messages]
    assert await store.calls("r") == [record]
