"""A run driven from the command line, for the kill and race tests (real processes).

    python killable.py DB EFFECTS start|resume RUN|decide ID|recover CALL KIND

`KILL_AT` (environment) names a point where the process SIGKILLs itself:
`model:N` (asking for turn N), `before:N` / `after:N` (inside effect(N), around its side
effect). The side effect appends `N` to the EFFECTS file, so a test can count them.
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


def _maybe_die(point: str) -> None:
    if os.environ.get("KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def build(effects: str) -> hr.Agent:
    @hr.tool(server="world", name="effect")
    async def effect(n: int) -> str:
        """Change the world once."""
        _maybe_die(f"before:{n}")
        with open(effects, "a") as fh:  # noqa: ASYNC230 - the side effect under test
            fh.write(f"{n}\n")
            fh.flush()
            os.fsync(fh.fileno())
        _maybe_die(f"after:{n}")
        return f"effect {n}"

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            _maybe_die(f"model:{n}")
            return call("world/effect", {"n": n}) if n < 3 else reply("all done")

        return make

    policy = (hr.Policy.default().layer("app")
              .allow(hr.Act.CALL, "world/effect"))
    if os.environ.get("ASK") == "1":
        policy = hr.Policy.default()
    return hr.Agent(Scripted([turn(i) for i in range(4)]), [effect], policy=policy,
                    name="killable")


async def main(argv: list[str]) -> None:
    db, effects, mode, *rest = argv
    agent = build(effects)
    async with hr.Store.open(db) as store:
        if mode == "start":
            approver = hr.ApproveAll() if os.environ.get("ASK") != "1" else None
            result = await agent.run("change the world", store=store, approver=approver)
        elif mode == "resume":
            result = await hr.resume(store, rest[0], agent=agent, approver=hr.ApproveAll())
        elif mode == "decide":
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=agent)
        elif mode == "recover":
            recovery = (hr.Recovery.retry() if rest[1] == "retry"
                        else hr.Recovery.completed(rest[1]))
            result = await hr.resume_with_recovery(store, rest[0], recovery, agent=agent,
                                                   approver=hr.ApproveAll())
        else:
            raise SystemExit(f"unknown mode {mode}")
    print(json.dumps({"run_id": result.run_id, "outcome": result.outcome.kind,
                      "detail": vars_of(result.outcome)}))


def vars_of(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


if __name__ == "__main__":
    try:
        anyio.run(main, sys.argv[1:])
    except hr.HandrailError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
