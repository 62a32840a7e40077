"""Beyond its conversation, a live run keeps at most one GC-tracked object per call.

Issue 24: at 1,000 concurrent runs on one loop, each full collector pass walks every object
the process holds (0.5 µs each; a pass was 100-350 ms, the loop's worst lag). A live run must
keep its conversation (the messages the model is sent again each turn), but nothing more per
call: the gate's queue of outputs waiting for the taint index kept four containers per call
(an entry, the result dict, its content list, a list of vouched values), the memory store two
(a record and a tuple). The store's are a byte string now, which the collector does not
track; the queue keeps at most its entry.
"""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import Sequence
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, Turn, call, calls, reply
from handrail.store import Batch, CallStatus

pytestmark = pytest.mark.anyio

CALLS = 60
FIRST, LAST = 10, 50
"""The turns at which the process's tracked objects are counted."""


@hr.tool(mutates=False)
async def add(a: int) -> dict[str, Any]:
    """Add one (a structured result: a dict, as many tools return)."""
    return {"sum": a + 1, "parts": [a, 1]}


_SHARED = (type, types.ModuleType, types.FunctionType)
"""Where a walk stops: classes, modules and functions (a function's globals lead to its
module, and from there to everything the process imported), the same at every count."""


def _tracked_in(*roots: Any) -> int:
    """Tracked objects reachable from `roots`, not through classes, modules or functions."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED) or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return len(seen)


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_a_live_run_keeps_at_most_one_tracked_object_a_call_beyond_its_conversation(
        store_kind: str, tmp_path: Any) -> None:
    counts: dict[int, tuple[int, int]] = {}

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            if n in (FIRST, LAST):
                gc.collect()
                # What the run can reach (its store, its agent, the task it runs in, and
                # through that task's frames its runner, gate and queues), not the whole
                # process: under load another test's thread still at work, or objects it
                # left for the collector, counted with gc.get_objects(), made this flaky.
                counts[n] = (_tracked_in(store, agent, asyncio.current_task()),
                             _tracked_in(list(messages)))
            return call("add", {"a": n}) if n < CALLS else reply("done")

        return make

    store = (hr.Store.memory() if store_kind == "memory"
             else hr.Store.open(str(tmp_path / "runs.db")))
    # No lease renewal between the counts, however slow the machine (its write would be
    # counted in flight): the heartbeat comes every lease_seconds / 3.
    store.lease_seconds = 3600.0
    agent = hr.Agent(Scripted([turn(i) for i in range(CALLS + 1)]), [add],
                     policy=hr.Policy.default(), max_steps=CALLS + 5)
    result = await agent.run("add things", store=store)
    await store.close()
    assert result.output == "done"
    process = counts[LAST][0] - counts[FIRST][0]  # what the run keeps, its conversation included
    conversation = counts[LAST][1] - counts[FIRST][1]
    calls = LAST - FIRST
    # The conversation grows by a few objects a call (the messages and their parts).
    assert conversation >= 4 * calls
    # Everything else the process gained over 40 calls: at most one object a call (a
    # queue entry for the taint index, when it holds the result object the history keeps
    # anyway), with a margin for the run's bounded bookkeeping (the same turns each time).
    # The gate's queue of result dicts made it grow by 4 a call, the memory store's copies
    # of the records by 2.
    assert process - conversation < calls + calls // 2, (process, conversation)


# A turn of one call takes the gate's fast path, whose first batch is its final one; a turn
# of two takes the general stages, where the first batch (committed, or merged) is another.
TURNS = {
    "one call": [call("add", {"a": 1}), call("add", {"a": 2}), reply("done")],
    "two calls": [calls([("add", {"a": 1}), ("add", {"a": 2})]),
                  calls([("add", {"a": 3}), ("add", {"a": 4})]), reply("done")],
}


@pytest.mark.parametrize("turns", list(TURNS))
async def test_a_turn_holds_one_batch_while_its_final_write_waits(turns: str) -> None:
    # The final write of a turn waits its turn behind every other run's (the store's
    # pacer): what a run holds across it is held x1,000 at 1,000 runs, and walked by each
    # young collector pass. The turn's first batch (committed, or merged into the final
    # one) is not held there.
    store = hr.Store.memory()
    write = store.write
    held: list[int] = []

    async def counting_write(batch: Batch, *, wait: bool = True) -> None:
        if batch.calls and all(c.status is CallStatus.FINISHED for c in batch.calls):
            gc.collect()
            held.append(sum(type(o) is Batch for o in gc.get_objects()))
        await write(batch, wait=wait)

    store.write = counting_write  # type: ignore[method-assign]
    agent = hr.Agent(Scripted(list(TURNS[turns])), [add], policy=hr.Policy.default())
    # Batches other tests left alive (a failed test's traceback, say) are not this run's.
    gc.collect()
    before = sum(type(o) is Batch for o in gc.get_objects())
    result = await agent.run("add things", store=store)
    assert result.output == "done"
    assert held == [before + 1, before + 1]
