"""What a tree of agents and a thread of runs look like in the store: the display half.

`child_run_id`, `sub_runs`, `conversation_of` and `thread` need only the store, so `handrail
runs` and `handrail show` (which count and draw a tree, and list a conversation) take them
without importing the agent loop, the gate, the models or the policy (docs/subagents.md;
import weight: issue 11).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from handrail.errors import NotFound
from handrail.store import CallRecord, CallStatus, RunRecord, Store

__all__ = ["child_run_id", "conversation_of", "sub_runs", "thread"]

_OPEN_CALL = (CallStatus.STARTED, CallStatus.IN_DOUBT)
"""A delegating call's statuses while its child's run may still move."""


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The id of the run a delegating call drives: the same in every process, for ever."""
    return hashlib.sha256(f"{parent_run_id}\0{call_id}".encode()).hexdigest()[:16]


async def sub_runs(store: Store, run: RunRecord,
                   calls: Sequence[CallRecord] | None = None) -> dict[str, RunRecord]:
    """The runs `run` delegated to, by the id of the delegating call (for display).

    Found from the run's `delegated` events and, for a call still in flight (whose event a
    crash may have lost), by the child's derived id.
    """
    ids = [str(e["run"]) for e in run.events if e.get("kind") == "delegated" and "run" in e]
    for call in calls or ():
        if call.status in _OPEN_CALL:
            ids.append(child_run_id(run.id, call.call_id))
    found: dict[str, RunRecord] = {}
    for child_id in dict.fromkeys(ids):
        try:
            child = await store.run(child_id)
        except NotFound:
            continue
        if child.parent_id == run.id and child.parent_call_id is not None:
            found[child.parent_call_id] = child
    return found


def conversation_of(run: RunRecord) -> tuple[str, str] | None:
    """(first run, continued run) of a run that continues a conversation, else None."""
    for event in run.events:
        if event.get("kind") == "continues":
            return str(event["conversation"]), str(event["run"])
    return None


async def thread(store: Store, run: RunRecord) -> list[RunRecord]:
    """The runs of `run`'s conversation, first to last (just `[run]` outside one).

    The runs before `run` are exactly the chain it continues (followed link by link); the
    runs after it are those of the same conversation created after it (`Store.continuations`).
    """
    earlier: list[RunRecord] = []
    link = conversation_of(run)
    seen = {run.id}
    while link is not None and link[1] not in seen:
        previous = await store.run(link[1])
        seen.add(previous.id)
        earlier.append(previous)
        link = conversation_of(previous)
    root = earlier[-1].id if earlier else run.id
    later = [r for r in await store.continuations(root, since=run.created_at)
             if r.id not in seen and (r.created_at, r.id) > (run.created_at, run.id)]
    return [*reversed(earlier), run, *later]
