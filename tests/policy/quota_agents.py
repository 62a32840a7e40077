"""The agent the quota race rebuilds in each `handrail worker` (`quota_agents:AGENT`).

A run's task is its key. Its first call, `world/hold`, is asked (the run pauses for a
decision); once approved and resumed by a worker, its second call is `world/send`, allowed by
the rules and limited to `LIMIT` starts for everyone (then deny). A send that ran appends
`send KEY` to the file named by `$EFFECTS`, so the test counts what happened in the world,
not what the store says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import handrail as hr
from handrail.models import Scripted, Turn, call, reply

LIMIT = 100
"""How many sends may start in the window, across every worker."""


@hr.tool(server="world", name="hold")
async def hold(key: str) -> str:
    """Wait for a person's approval (the run pauses until a worker resumes it)."""
    return f"held {key}"


@hr.tool(server="world", name="send")
async def send(key: str) -> str:
    """Change the world once (counted by the quota)."""
    # O_APPEND: lines from several worker processes never interleave.
    fd = os.open(os.environ["EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"send {key}\n".encode())
    finally:
        os.close(fd)
    return f"sent {key}"


def _task(messages: Sequence[Any]) -> str:
    for m in messages:
        if type(m).__name__ == "UserMessage":
            return str(m.text)
    raise AssertionError("no task")


def _hold(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    return call("world/hold", {"key": _task(messages)})


def _send(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    return call("world/send", {"key": _task(messages)})


POLICY = (hr.Policy.default().layer("app").allow(hr.Act.CALL, "world/send")
          .limit(hr.Act.CALL, "world/send", LIMIT, per="366d", key="global", then="deny"))

AGENT = hr.Agent(Scripted([_hold, _send, reply("done")]), [hold, send], policy=POLICY,
                 name="quota-race", ref="quota_agents:AGENT")
