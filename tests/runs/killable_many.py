"""Many runs on one store and one event loop, for the batched-commit kill test.

    python killable_many.py DB EFFECTS start RUNS | finish

`start` drives RUNS runs concurrently (three effects each, one per turn). With `KILL_AT=K` the
process SIGKILLs itself inside the first group commit of at least 10 operations that reaches
the K-th operation, after half of the group's writes have executed and before its COMMIT: a
batched commit cut in the middle. `finish` resumes every unfinished run (deciding in-doubt
calls as an operator who looks at the effects file) and prints each run's outcome. An effect
appends `K:N` (run K, effect N) to EFFECTS.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, UserMessage, call, reply
from handrail.store import _sqlite

EFFECTS_PER_RUN = 3


def _plant_kill(at: int) -> None:
    """Die inside the first group commit of at least 10 operations that reaches the `at`-th
    operation committed, between half of its writes and its COMMIT.

    Counted in operations rather than groups: how many a group holds is the store's tuning
    (`LOOP_GROUP_LIMIT`), and the kill must land at the same point of the work either way.
    """
    original = _sqlite._apply_group
    done = 0

    def apply(db: sqlite3.Connection, ops: list[Any], tips: Any) -> list[tuple[bool, Any]]:
        nonlocal done
        done += len(ops)
        if len(ops) >= 10 and done >= at:
            db.execute("BEGIN IMMEDIATE")
            for op in ops[: len(ops) // 2]:
                op.fn(db)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(db, ops, tips)

    _sqlite._apply_group = apply  # type: ignore[assignment]


def build(effects: str) -> hr.Agent:
    @hr.tool(server="world", name="effect")
    async def effect(run: int, n: int) -> str:
        """Change the world once."""
        with open(effects, "a") as fh:  # noqa: ASYNC230 - the side effect under test
            fh.write(f"{run}:{n}\n")
            fh.flush()
        return f"effect {run}:{n}"

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            first = messages[0]
            assert isinstance(first, UserMessage)
            run = int(first.text.split()[-1])
            return call("world/effect", {"run": run, "n": n}) if n < EFFECTS_PER_RUN \
                else reply(f"run {run} done")

        return make

    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "world/effect")
    return hr.Agent(Scripted([turn(i) for i in range(EFFECTS_PER_RUN + 1)]), [effect],
                    policy=policy, name="killable-many")


def _landed(effects: str) -> set[str]:
    try:
        with open(effects) as fh:
            return set(fh.read().split())
    except FileNotFoundError:
        return set()


async def main(argv: list[str]) -> None:
    db, effects, mode, *rest = argv
    agent = build(effects)
    if os.environ.get("KILL_AT"):
        _plant_kill(int(os.environ["KILL_AT"]))
    outcomes: dict[str, str] = {}
    async with hr.Store.open(db) as store:
        if mode == "start":
            async def one(k: int) -> None:
                result = await agent.run(f"change the world, run {k}", store=store,
                                         approver=hr.ApproveAll())
                outcomes[result.run_id] = result.outcome.kind

            async with anyio.create_task_group() as tg:
                for k in range(int(rest[0])):
                    tg.start_soon(one, k)
        elif mode == "finish":
            for run in await store.runs(limit=10_000):
                if run.status is hr.RunStatus.COMPLETED:
                    outcomes[run.id] = "completed"
                    continue
                result = await hr.resume(store, run.id, agent=agent, approver=hr.ApproveAll())
                for _ in range(EFFECTS_PER_RUN + 1):
                    if result.outcome.kind != "awaiting_recovery":
                        break
                    record = await store.call(result.outcome.call_id)  # type: ignore[union-attr]
                    args = json.loads(record.arguments)
                    landed = f"{args['run']}:{args['n']}" in _landed(effects)
                    recovery = (hr.Recovery.completed("observed") if landed
                                else hr.Recovery.retry())
                    result = await hr.resume_with_recovery(
                        store, result.outcome.call_id, recovery,  # type: ignore[union-attr]
                        agent=agent, approver=hr.ApproveAll())
                outcomes[run.id] = result.outcome.kind
        else:
            raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(outcomes))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
