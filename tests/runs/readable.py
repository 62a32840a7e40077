"""A run mixing mutating calls and read-only calls, for the read-turn kill test.

    python readable.py DB EFFECTS start|resume RUN

Turns: 0 `effect(0)` (mutates), 1 `look(1)` (mutates=False), 2 `effect(2)`, 3 the answer.
Every body appends a line to EFFECTS (`effect N` / `look N`). `KILL_AT=look:N` SIGKILLs the
process inside `look(N)`, after its line is written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, call, reply


def build(effects: str) -> hr.Agent:
    def note(line: str) -> None:
        with open(effects, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    @hr.tool(server="world", name="effect")
    async def effect(n: int) -> str:
        """Change the world once."""
        note(f"effect {n}")
        return f"effect {n}"

    @hr.tool(server="world", name="look", mutates=False)
    async def look(n: int) -> str:
        """Look at the world."""
        note(f"look {n}")
        if os.environ.get("KILL_AT") == f"look:{n}":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"seen {n}"

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            if n == 1:
                return call("world/look", {"n": n})
            return call("world/effect", {"n": n}) if n < 3 else reply("all done")

        return make

    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "world/effect")
    return hr.Agent(Scripted([turn(i) for i in range(4)]), [effect, look], policy=policy,
                    name="readable")


async def main(argv: list[str]) -> None:
    db, effects, mode, *rest = argv
    agent = build(effects)
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await agent.run("look and change", store=store)
        else:
            result = await hr.resume(store, rest[0], agent=agent)
    print(json.dumps({"run_id": result.run_id, "outcome": result.outcome.kind}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
