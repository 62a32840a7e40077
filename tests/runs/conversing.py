"""One message of a conversation per process.

    python conversing.py DB send RUN_ID|- MESSAGE
    python conversing.py DB approve REQUEST_ID

The model answers each user message with the list of every user message it has seen, so a
test reads the history it was given. The message "pay" makes it call a mutating tool first
(deferred: the run pauses). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, UserMessage, call, reply


@hr.tool(server="ledger")
async def pay(amount: int) -> str:
    """Pay."""
    return f"paid {amount}"


def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    users = [m.text for m in messages if isinstance(m, UserMessage)]
    if users[-1] == "pay" and isinstance(messages[-1], UserMessage):
        return call("ledger/pay", {"amount": 3})
    return reply(" | ".join(users))


def build() -> hr.Agent:
    return hr.Agent(Scripted([turn] * 20), [pay], instructions="be brief")


async def main(argv: list[str]) -> None:
    db, mode, *rest = argv
    async with hr.Store.open(db) as store:
        if mode == "send":
            chat = hr.Conversation(build(), store=store,
                                   run_id=None if rest[0] == "-" else rest[0])
            result = await chat.send(rest[1])
        else:
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=build())
    print(json.dumps({"run_id": result.run_id, "outcome": result.outcome.kind,
                      "output": getattr(result.outcome, "output", None),
                      "request_id": getattr(result.outcome, "request_id", None)}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
