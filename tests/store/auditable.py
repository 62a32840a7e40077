"""Many runs writing one store at once, for the audit chain's concurrent-writer tests.

    python auditable.py STORE RUNS TAG

Drives RUNS runs concurrently on one event loop (each: two effects, each asked of the policy
and approved by `ApproveAll`, then a final answer). Several of these processes started at
once on one store are several writers chaining into it together. Prints the run ids.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, UserMessage, call, reply

EFFECTS_PER_RUN = 2


def build() -> hr.Agent:
    @hr.tool(server="world", name="effect")
    async def effect(run: str, n: int) -> str:
        """Change the world once (here: nothing; the record is what is under test)."""
        return f"effect {run}:{n}"

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            first = messages[0]
            assert isinstance(first, UserMessage)
            run = first.text.split()[-1]
            return call("world/effect", {"run": run, "n": n}) if n < EFFECTS_PER_RUN \
                else reply(f"run {run} done")

        return make

    policy = hr.Policy.default().layer("app").ask(hr.Act.CALL, "world/effect")
    return hr.Agent(Scripted([turn(i) for i in range(EFFECTS_PER_RUN + 1)]), [effect],
                    policy=policy, name="auditable")


async def main(argv: list[str]) -> None:
    url, runs, tag = argv
    agent = build()
    ids: list[str] = []
    async with hr.Store.open(url) as store:
        async def one(k: int) -> None:
            result = await agent.run(f"change the world, run {tag}-{k}", store=store,
                                     approver=hr.ApproveAll())
            assert result.outcome.kind == "completed", result.outcome
            ids.append(result.run_id)

        async with anyio.create_task_group() as tg:
            for k in range(int(runs)):
                tg.start_soon(one, k)
    print(json.dumps(ids))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
