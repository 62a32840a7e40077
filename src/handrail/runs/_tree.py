"""What a tree of agents looks like in the store: the display half of sub-agents.

`child_run_id` and `sub_runs` need only the store, so `handrail runs` and `handrail show`
(which count and draw a tree) take them without importing the agent loop, the gate or the
approval machinery (docs/subagents.md; import weight: issue 11).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from handrail.errors import NotFound
from handrail.store import CallRecord, CallStatus, RunRecord, Store

__all__ = ["child_run_id", "sub_runs"]

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
