"""The store contract, run against every store: memory, a real SQLite file, a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from handrail.errors import AlreadyDecided, NotFound, ResumeRefused
from handrail.store import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    RunRecord,
    RunStatus,
    Store,
)

pytestmark = pytest.mark.anyio


def _run(run_id: str = "r1", **kw: object) -> RunRecord:
    base = {"id": run_id, "task": "do it", "agent": "a", "created_at": time.time(),
            "policy": {"layers": []}}
    base.update(kw)
    return RunRecord(**base)  # type: ignore[arg-type]


def _call(run_id: str, call_id: str, turn: int = 0, index: int = 0, **kw: object) -> CallRecord:
    return CallRecord(id=f"{run_id}:{call_id}", run_id=run_id, call_id=call_id, turn=turn,
                      index=index, model_name="x", **kw)  # type: ignore[arg-type]


def _item(item_id: str, run_id: str = "r1", kind: str = "approval", **kw: object) -> PendingItem:
    base: dict[str, object] = {"id": item_id, "kind": kind, "run_id": run_id,
                               "call_record": f"{run_id}:c", "created_at": time.time()}
    base.update(kw)
    return PendingItem(**base)  # type: ignore[arg-type]


async def test_run_round_trip_keeps_every_field(store: Store) -> None:
    run = _run(status=RunStatus.AWAITING_APPROVAL, parent_id="p", manifest_digest="sha256:ab",
               model="m", workspace="/w", updated_at=2.0,
               outcome={"kind": "awaiting_approval", "request_id": "p1"},
               input_tokens=3, output_tokens=4, model_requests=5,
               remembered=[{"act": "write", "pattern": "*.md", "effect": "allow"}], steps=6,
               owner="h:1:x", lease_until=9.0, events=[{"kind": "resumed"}], agent_ref="m:o")
    await store.write(Batch(run=run))
    assert await store.run("r1") == run



async def test_call_round_trip_keeps_every_field(store: Store) -> None:
    # Every field set away from its default, each to a value of its own: a store (the memory
    # store's generated packer, issue 11) that drops or swaps one reads back unequal.
    call = _call("r1", "c1", turn=2, index=3, tool="t/x", arguments='{"a": 1}',
                 arguments_digest="sha256:cd", performed_arguments={"a": 1},
                 actions=[{"act": "read", "target": "f"}], verdict={"effect": "ask"},
                 decision={"kind": "approve"}, decided_by="ops", status=CallStatus.FINISHED,
                 result={"content": [], "is_error": False}, disposition="landed",
                 error="e", answers=[{"kind": "submit", "value": "v"}], pending_id="p1",
                 started_at=7.0, ended_at=8.0,
                 provenance={"output": "untrusted", "trusted": []})
    defaults = CallRecord(id="i", run_id="r", call_id="c", turn=0, index=0, model_name="x")
    assert [f.name for f in dataclasses.fields(CallRecord)
            if getattr(call, f.name) == getattr(defaults, f.name)] == ["model_name"]
    await store.write(Batch(run=_run(), calls=[call]))
    assert await store.call("r1:c1") == call
    assert await store.calls("r1") == [call]

async def test_unknown_ids_raise_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="nope"):
        await store.run("nope")
    with pytest.raises(NotFound):
        await store.call("nope")
    with pytest.raises(NotFound):
        await store.pending_item("nope")
    with pytest.raises(NotFound):
        await store.decide("nope", {}, "me")


async def test_messages_keep_order_and_rewriting_a_seq_does_not_duplicate(store: Store) -> None:
    await store.write(Batch(run=_run(), messages=[("r1", 0, {"k": 0}), ("r1", 1, {"k": 1})]))
    await store.write(Batch(messages=[("r1", 2, {"k": 2}), ("r1", 1, {"k": 1})]))
    assert await store.messages("r1") == [{"k": 0}, {"k": 1}, {"k": 2}]
    assert await store.messages("other") == []


async def test_calls_are_ordered_by_turn_then_index_and_upserted(store: Store) -> None:
    await store.write(Batch(run=_run(), calls=[_call("r1", "b", 1, 0), _call("r1", "a", 0, 1),
                                                _call("r1", "c", 0, 0)]))
    done = _call("r1", "a", 0, 1, status=CallStatus.FINISHED, result={"content": []},
                 answers=[{"kind": "submit", "value": "x"}], pending_id="q1",
                 verdict={"effect": "allow"}, actions=[{"act": "read", "target": "a"}])
    await store.write(Batch(calls=[done]))
    assert [c.call_id for c in await store.calls("r1")] == ["c", "a", "b"]
    assert await store.call("r1:a") == done


async def test_pending_filters_and_open_only(store: Store) -> None:
    await store.write(Batch(run=_run(), pending=[
        _item("p1", agent="a", tool="x/y", created_at=time.time() - 100),
        _item("p2", kind="question", agent="b", tool="x/z"),
        _item("p3", agent="a", tool="x/z"),
    ]))
    assert [p.id for p in await store.pending()] == ["p1", "p2", "p3"]
    assert [p.id for p in await store.pending(kind="approval")] == ["p1", "p3"]
    assert [p.id for p in await store.pending(agent="b")] == ["p2"]
    assert [p.id for p in await store.pending(tool="x/z")] == ["p2", "p3"]
    assert [p.id for p in await store.pending(older_than=50)] == ["p1"]
    await store.decide("p1", {"kind": "approve"}, "me")
    assert [p.id for p in await store.pending(kind="approval")] == ["p3"]


async def test_decide_is_compare_and_swap(store: Store) -> None:
    await store.write(Batch(run=_run(), pending=[_item("p1")]))
    item = await store.decide("p1", {"kind": "deny", "reason": "no"}, "alice")
    assert (item.state, item.decided_by, item.decision) == ("decided", "alice",
                                                             {"kind": "deny", "reason": "no"})
    with pytest.raises(AlreadyDecided, match="alice"):
        await store.decide("p1", {"kind": "approve"}, "bob")
    assert (await store.pending_item("p1")).decision == {"kind": "deny", "reason": "no"}


async def test_claim_refuses_finished_and_live_runs(store: Store) -> None:
    await store.write(Batch(run=_run("done", status=RunStatus.COMPLETED,
                                     outcome={"kind": "completed", "output": "ok"})))
    with pytest.raises(ResumeRefused, match="completed"):
        await store.claim("done", "me")
    from handrail.store._base import ACTIVE_OWNERS, new_owner

    owner = new_owner()
    live = _run("live", owner=owner, lease_until=time.time() + 60)
    await store.write(Batch(run=live))
    ACTIVE_OWNERS.add(owner)  # a runner of this process is driving it
    try:
        with pytest.raises(ResumeRefused, match="driven by"):
            await store.claim("live", "me")
    finally:
        ACTIVE_OWNERS.discard(owner)
    # The same owner whose runner is gone (it raised): claimable at once, lease or not.
    assert (await store.claim("live", "me")).owner == "me"


async def test_claim_takes_a_run_whose_owner_died_or_whose_lease_ran_out(store: Store) -> None:
    # A pid that is certainly dead: a process that has exited.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],  # noqa: ASYNC221
                          capture_output=True, text=True, check=True).stdout.strip()
    import socket

    await store.write(Batch(run=_run("crashed", owner=f"{socket.gethostname()}:{dead}:x",
                                     lease_until=time.time() + 60)))
    claimed = await store.claim("crashed", "me")
    assert (claimed.owner, claimed.status) == ("me", RunStatus.RUNNING)
    await store.write(Batch(run=_run("stale", owner="elsewhere:1:x", lease_until=time.time() - 1)))
    assert (await store.claim("stale", "me2")).owner == "me2"


async def test_paused_runs_are_claimable(store: Store) -> None:
    await store.write(Batch(run=_run(status=RunStatus.AWAITING_APPROVAL,
                                     outcome={"kind": "awaiting_approval", "request_id": "p"})))
    run = await store.claim("r1", "me")
    assert run.status is RunStatus.RUNNING and run.lease_until > time.time()
    assert dataclasses.replace(await store.run("r1")) == run


async def test_what_is_stored_does_not_change_with_the_writers_objects(store: Store) -> None:
    # A store keeps what was written at the moment of the write: the records and messages a
    # caller goes on changing in place (the gate does) must not change what was stored, and
    # what a reader changes must not reach the next reader. The memory store keeps them
    # packed (issue 11) and held shared dicts before.
    await store.write(Batch(run=_run()))
    record = _call("r1", "c1", result={"content": [{"kind": "text", "text": "a"}],
                                       "structured": {"n": [1, 2]}, "is_error": False,
                                       "metadata": {}},
                   actions=[{"act": "call", "target": "x"}], verdict={"effect": "allow"},
                   performed_arguments={"a": 1})
    message = {"kind": "user", "parts": [{"kind": "text", "text": "hi"}]}
    await store.write(Batch(calls=[record], messages=[("r1", 0, message)]))
    assert record.result is not None and record.verdict is not None
    record.result["structured"]["n"].append(3)
    record.actions.append({"act": "read", "target": "f"})
    record.verdict["effect"] = "deny"
    message["parts"].append({"kind": "text", "text": "more"})
    stored = await store.call("r1:c1")
    assert stored.result is not None and stored.result["structured"] == {"n": [1, 2]}
    assert stored.actions == [{"act": "call", "target": "x"}]
    assert stored.verdict == {"effect": "allow"}
    assert stored.performed_arguments == {"a": 1}
    assert (await store.messages("r1"))[0]["parts"] == [{"kind": "text", "text": "hi"}]
    stored.result["structured"]["n"].clear()
    (await store.messages("r1"))[0]["parts"].clear()
    again = await store.call("r1:c1")
    assert again.result is not None and again.result["structured"] == {"n": [1, 2]}
    assert (await store.messages("r1"))[0]["parts"] == [{"kind": "text", "text": "hi"}]


async def test_a_value_of_a_builtin_subclass_is_stored_and_read_back(store: Store) -> None:
    # What the memory store cannot pack (marshal takes exact builtin types only) it keeps as
    # a copy of the record: it still reads back equal.
    class Name(str):
        pass

    await store.write(Batch(run=_run()))
    record = _call("r1", "c1", performed_arguments={"name": Name("ada")},
                   result={"content": [], "structured": Name("ada"), "is_error": False,
                           "metadata": {}})
    await store.write(Batch(calls=[record], messages=[("r1", 0, {"kind": "user",
                                                                 "text": Name("hi")})]))
    stored = await store.call("r1:c1")
    assert stored.performed_arguments == {"name": "ada"}
    assert stored.result is not None and stored.result["structured"] == "ada"
    assert (await store.messages("r1"))[0]["text"] == "hi"
