"""A tree of three agents driven by separate processes (`trees.three_levels`).

    python tree_process.py DB EFFECTS start
    python tree_process.py DB EFFECTS decide REQUEST_ID
    python tree_process.py DB EFFECTS crash        (SIGKILLs itself in the child's call)
    python tree_process.py DB EFFECTS resume RUN_ID
    python tree_process.py DB EFFECTS recover CALL_ID

`start` runs the planner; the tester (its grandchild) asks before its effect, the default
approver defers, the whole tree pauses and this process exits. `decide` approves that request
in a new process with a newly built root agent: the tree continues from its root. Prints the
outcome as one JSON line; the effect's line in EFFECTS counts how often it really ran.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
from trees import crashing, three_levels

import handrail as hr


async def main(argv: list[str]) -> None:
    db, effects, mode, *rest = argv
    agent = three_levels(effects)
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await agent.run("build and test it", store=store)
        elif mode == "decide":
            try:
                result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                       agent=agent)
            except hr.AlreadyDecided as exc:
                print(json.dumps({"pid": os.getpid(), "error": f"already decided: {exc}"}))
                return
        elif mode == "crash":
            result = await crashing(effects, die=True).run(
                "go", store=store, approver=hr.ApproveAll())
        elif mode == "resume":
            result = await hr.resume(store, rest[0], agent=crashing(effects),
                                     approver=hr.ApproveAll())
        elif mode == "recover":
            result = await hr.resume_with_recovery(store, rest[0],
                                                   hr.Recovery.completed("it ran once"),
                                                   agent=crashing(effects))
        else:
            raise SystemExit(f"unknown mode {mode}")
    outcome = result.outcome
    print(json.dumps({"pid": os.getpid(), "run_id": result.run_id, "outcome": outcome.kind,
                      "detail": {f: getattr(outcome, f) for f in outcome.__dataclass_fields__}}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
