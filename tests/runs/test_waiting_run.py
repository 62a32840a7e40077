"""What a run holds while it waits in a store write, beyond its conversation (issue 24).

At 1,000 concurrent runs on one loop nearly every run waits its turn in the store's pacer at
any moment, and the collector's young passes walk what each holds there: the turn's
leftovers (the model's response, the gate's turn result, the list of calls), the batch
being written, the coroutines and the future it waits on. Measured on the waiting runs'
coroutine chains from the agent's loop inward, with the run's long-lived state (the runner,
its conversation, the store, the loop, the tasks) not counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import gc
import types
from collections.abc import Sequence
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, ToolCall, Turn, call, reply

pytestmark = pytest.mark.anyio

RUNS = 12
CALLS = 8
AT = 5
"""The call of run 0 at which the waiting runs are counted."""
MOST = 4
"""Tracked objects a waiting run may hold: 3 (22 when it held the turn's leftovers and batch)."""

_STOP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
         asyncio.AbstractEventLoop, asyncio.Task, contextvars.Context, enum.Enum)


def _reach(roots: Sequence[Any], seen: set[int]) -> list[Any]:
    """Tracked objects reachable from `roots` not in `seen` (added to it), stopping at the
    loop, tasks, contexts, classes, modules and functions."""
    found = []
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _STOP) or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        found.append(obj)
        stack.extend(gc.get_referents(obj))
    return found


def _chain(task: asyncio.Task[Any]) -> list[Any]:
    coro: Any = task.get_coro()
    out = []
    while coro is not None:
        out.append(coro)
        coro = getattr(coro, "cr_await", None)
    return out


def _held_by_waiting_runs() -> list[list[Any]]:
    """Per task waiting in `MemoryStore.write`: what its chain from `_Runner._loop` holds."""
    held = []
    for task in asyncio.all_tasks():
        chain = _chain(task)
        names = [getattr(c, "__qualname__", "") for c in chain]
        if "MemoryStore.write" not in names or "_Runner._loop" not in names:
            continue
        loop_coro = chain[names.index("_Runner._loop")]
        runner = loop_coro.cr_frame.f_locals["self"]
        seen: set[int] = set()
        _reach([runner.messages], seen)  # the conversation
        # The turn's assistant message, if the runner still kept it besides the batch.
        found = _reach([runner._turn_entry, runner._pending_message], seen)
        _reach([runner, runner.store], seen)  # the run's own, long-lived
        seen.add(id(loop_coro))
        # The loop's coroutine, its frame's cells (made once per run) not counted: what it
        # holds across this write, and everything the write holds.
        frame = loop_coro.cr_frame
        roots = [v for v in frame.f_locals.values() if type(v) is not types.CellType]
        roots.append(chain[names.index("_Runner._loop") + 1])
        held.append(found + _reach(roots, seen))
    return held


@hr.tool(mutates=False)
async def add(run: int, a: int) -> int:
    """Add one."""
    return a + 1


async def test_a_run_waiting_in_a_memory_store_write_holds_few_objects() -> None:
    counted: list[list[list[Any]]] = []

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            run = int(messages[0].text.rsplit(maxsplit=1)[-1])
            if run == 0 and n == AT:
                # Twice: a tuple whose items left tracking in one pass leaves it in the next
                # (as young passes do to it while it waits).
                gc.collect()
                gc.collect()
                counted.append(_held_by_waiting_runs())
            return call("add", {"run": run, "a": n}) if n < CALLS else reply("done")

        return make

    agent = hr.Agent(Scripted([turn(i) for i in range(CALLS + 1)]), [add],
                     policy=hr.Policy.default(), max_steps=CALLS + 5)
    store = hr.Store.memory()
    results = await asyncio.gather(*(agent.run(f"add, run {k}", store=store)
                                     for k in range(RUNS)))
    assert all(r.output == "done" for r in results)
    [held] = counted
    assert len(held) >= RUNS // 2, "most runs wait in the pacer's queue at any moment"
    kinds = [sorted(type(o).__name__ for o in h) for h in held]
    # The turn's leftovers are dropped before the write: the model's response (and its
    # usage), the gate's turn result (its lists of results and stored results), the list
    # of the turn's calls; the batch too (the memory store packs it before it waits, and
    # copies the run record after).
    for names in kinds:
        for gone in ("ModelResponse", "Usage", "TurnResult", "Batch", "CallRecord", "RunRecord"):
            assert gone not in names, (gone, names)
    for h in held:
        assert not [o for o in h if type(o) is list and o and type(o[0]) is ToolCall], \
            "the list of the turn's calls is held across the write"
        assert not [o for o in h if type(o) is dict and o.get("kind") == "assistant"], \
            "the turn's stored assistant message is held across the write"
    # What is left: the write's and the pacer's coroutines, the awaited future's iterator.
    most = max(len(h) for h in held)
    assert most <= MOST, (most, max(kinds, key=len))
