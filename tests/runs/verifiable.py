"""A run checked by `hr.Verify`, paused mid-retry and continued by separate processes.

    python verifiable.py DB WORKSPACE command|check start
    python verifiable.py DB WORKSPACE command|check decide REQUEST_ID

The answer never passes its check (answer.txt stays 41), and `max_verify_attempts=2`.

- `command`: the check is `python check.py`, which the default policy asks about: every
  check pauses for an approval (the default approver defers), so each attempt runs in the
  process that approved it.
- `check`: a callable check; after the first failure the model writes answer.txt (ask: the
  run pauses), and the second answer is checked in the process that approved the write.

Each attempt names the process that ran it. Prints the outcome as one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import anyio

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.models import Scripted, call, reply

CHECK = "import os, sys\nprint('pid', os.getpid())\nsys.exit(1)\n"


def check_answer(ctx: hr.VerifyContext) -> hr.NotVerified:
    """Never passes; says which process ran it."""
    return hr.NotVerified(f"answer.txt is wrong (pid {os.getpid()})")


def build(kind: str, workspace: str) -> hr.Agent:
    with open(os.path.join(workspace, "check.py"), "w") as fh:
        fh.write(CHECK)
    if kind == "command":
        turns = [reply("done"), reply("done again")]
        verify = hr.Verify.command([sys.executable, "check.py"])
    else:
        turns = [reply("done"), call("workspace/write_file",
                                     {"path": "answer.txt", "content": "41"}),
                 reply("done again")]
        verify = hr.Verify.check(check_answer)
    # Unconfined: the check prints its pid to prove each attempt ran in another process, and a
    # sandboxed program sees its own pid namespace (every check would be pid 2).
    return hr.Agent(Scripted(turns), workspace_tools(), workspace=workspace, verify=verify,
                    max_verify_attempts=2, name="verifiable", sandbox="off")


async def main(argv: list[str]) -> None:
    db, workspace, kind, mode, *rest = argv
    agent = build(kind, workspace)
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await agent.run("make answer.txt say 42", store=store)
        else:
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=agent)
        run = await store.run(result.run_id)
        messages = await store.messages(result.run_id)
    attempts = [e for e in run.events if e.get("kind") == "verification"]
    pids = [int(m.group(1)) for e in attempts
            if (m := re.search(r"pid (\d+)", e.get("output", "") + e.get("reason", "")))]
    out: dict[str, Any] = {
        "pid": os.getpid(), "run_id": result.run_id, "outcome": result.outcome.kind,
        "request_id": getattr(result.outcome, "request_id", None),
        "attempts": [e["attempt"] for e in attempts], "pids": pids,
        "told": sum(1 for m in messages[1:] if m.get("kind") == "user"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
