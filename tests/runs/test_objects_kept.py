"""What a run keeps alive per call, for the collector to walk (issue 11).

Every container alive is walked by each full pass of the garbage collector, and the passes
come as the heap grows: each object a finished call leaves behind costs every later pass.
A call on the memory store keeps its history (the assistant message, its tool call and
parts, the result message, the result and its content) and the store's copy of its record.
The taint index's queue kept each result's dict too (with its content list, and a list per
call for vouched values): three more, until a call with protected arguments came, which in
most runs never does.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, Turn, call, reply

pytestmark = pytest.mark.anyio


@hr.tool(mutates=False)
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_a_finished_call_keeps_ten_tracked_objects_alive() -> None:
    counted: dict[int, int] = {}

    def counting(k: int) -> Any:
        def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            gc.collect()
            counted[k] = len(gc.get_objects())
            return call("add", {"a": k, "b": 1})
        return turn

    turns: list[Any] = [counting(i) if i in (50, 250) else call("add", {"a": i, "b": 1})
                        for i in range(300)]
    agent = hr.Agent(Scripted([*turns, reply("done")]), [add], policy=hr.Policy.default(),
                     max_steps=400)
    result = await agent.run("add", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    per_call = (counted[250] - counted[50]) / 200
    assert per_call <= 10.5, f"{per_call} tracked objects kept alive per call"
