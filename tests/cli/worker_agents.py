"""The agent `handrail worker` rebuilds in the worker tests (`worker_agents:AGENT`).

A run's task is `KIND:KEY`. `approve`/`deny` runs call `world/act` (asked: the run pauses for a
decision); `answer` runs call `world/ask`, whose body asks a question (the run pauses for an
answer). A performed action appends one line to the file named by `$EFFECTS`: `act KEY` or
`ask KEY ANSWER`, so a test counts side effects in the world, not in the store.
`$DIE_AFTER_EFFECTS` kills the process mid-call (see `_effect`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, Turn, call, reply

_performed = 0


def _effect(line: str) -> None:
    # O_APPEND: lines from several worker processes never interleave.
    fd = os.open(os.environ["EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    # `$DIE_AFTER_EFFECTS=N`: this process SIGKILLs itself right after its N-th effect landed,
    # inside the call (its result unrecorded): the crash a worker must survive.
    global _performed
    _performed += 1
    if str(_performed) == os.environ.get("DIE_AFTER_EFFECTS"):
        os.kill(os.getpid(), signal.SIGKILL)


@hr.tool(server="world", name="act")
async def act(key: str) -> str:
    """Change the world once."""
    _effect(f"act {key}")
    return f"acted {key}"


@hr.tool(server="world", name="ask", interactions={"question"})
async def ask(key: str, ctx: hr.CallContext) -> str:
    """Ask, then change the world once with the answer."""
    answer = await ctx.ask(hr.Question(f"go ahead with {key}?"))
    _effect(f"ask {key} {answer}")
    return f"asked {key}: {answer}"


@hr.tool(server="world", name="slow")
async def slow(key: str) -> str:
    """Start, wait until the file `$GO` exists (a long call), then change the world once."""
    _effect(f"slow-start {key}")
    # The tool's own wait for the outside world (a file another process creates).
    # (Lint: a stat takes microseconds; no event crosses processes.)
    while not os.path.exists(os.environ["GO"]):  # noqa: ASYNC110, ASYNC240
        await anyio.sleep(0.02)
    _effect(f"slow {key}")
    return f"slow {key}"


def _task(messages: Sequence[Any]) -> str:
    for m in messages:
        if type(m).__name__ == "UserMessage":
            return str(m.text)
    raise AssertionError("no task")


def _first(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    kind, _, key = _task(messages).partition(":")
    tool = {"answer": "world/ask", "slow": "world/slow"}.get(kind, "world/act")
    return call(tool, {"key": key})


AGENT = hr.Agent(
    Scripted([_first, reply("done")]),
    [act, ask, slow],
    policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "world/ask"),
    name="worker-test",
    ref="worker_agents:AGENT",
)
