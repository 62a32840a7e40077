"""A run with a finished call beside a deferred one, driven by separate processes.

    python resumable.py DB EFFECTS start
    python resumable.py DB EFFECTS decide REQUEST_ID

Turn 0 calls `world/count` (read-only: allowed, it runs at once) and `world/effect` (asks: the
default approver defers, the run pauses). Each body appends a line to EFFECTS, so a test counts
how often each really ran. `count` answers with the id of the process that ran it: a result
reused on resume names the first process, one re-run names the second. The last turn repeats
every tool result the model was shown. Prints the outcome as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, calls, reply


def build(effects: str) -> hr.Agent:
    def note(line: str) -> None:
        with open(effects, "a") as fh:
            fh.write(line + "\n")

    @hr.tool(server="world", name="count", mutates=False)
    async def count() -> str:
        """Count something (a side effect we can count)."""
        note("count")
        return f"counted in {os.getpid()}"

    @hr.tool(server="world", name="effect")
    async def effect(n: int) -> str:
        """Change the world."""
        note(f"effect {n}")
        return f"effect {n} in {os.getpid()}"

    def repeat(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        shown = [m.result.render_text() for m in messages if isinstance(m, ToolResultMessage)]
        return reply(" | ".join(shown))

    return hr.Agent(Scripted([calls([("world/count", {}), ("world/effect", {"n": 1})]),
                              repeat]),
                    [count, effect], name="resumable")


async def main(argv: list[str]) -> None:
    db, effects, mode, *rest = argv
    agent = build(effects)
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await agent.run("count, then change the world", store=store)
        elif mode == "decide":
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=agent)
        else:
            raise SystemExit(f"unknown mode {mode}")
    outcome = result.outcome
    print(json.dumps({"pid": os.getpid(), "run_id": result.run_id, "outcome": outcome.kind,
                      "detail": {f: getattr(outcome, f) for f in outcome.__dataclass_fields__}}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
