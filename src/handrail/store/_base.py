"""Helpers every backend shares: run owners, the claim rule, the pending-age bound.

Public through `handrail.store.contract`; this module imports no backend (backends import it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import time

from handrail.errors import ResumeRefused, StoreError
from handrail.store._records import PendingItem, RunRecord, RunStatus

__all__ = ["ACTIVE_OWNERS", "check_claimable", "check_run_record", "cutoff", "is_owner_alive",
           "new_owner", "status_after_decision"]

_TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED)

# The outcome kind each status carries: a run's status and its outcome never disagree (what
# `handrail runs` shows and what `handrail pending` lists are read from these two).
_OUTCOME_OF: dict[RunStatus, str | None] = {
    RunStatus.RUNNING: None,
    RunStatus.READY: None,
    RunStatus.AWAITING_APPROVAL: "awaiting_approval",
    RunStatus.AWAITING_ANSWER: "awaiting_answer",
    RunStatus.AWAITING_RECOVERY: "awaiting_recovery",
    RunStatus.COMPLETED: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
}
_PAUSED = (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_ANSWER, RunStatus.AWAITING_RECOVERY)
_STATUS_OF_ITEM = {"approval": RunStatus.AWAITING_APPROVAL, "question": RunStatus.AWAITING_ANSWER,
                   "recovery": RunStatus.AWAITING_RECOVERY}
_ID_FIELD = {"approval": "request_id", "question": "question_id", "recovery": "call_id"}


def check_run_record(run: RunRecord) -> None:
    """Raise `StoreError` unless the run's status and outcome agree (the store invariant).

    RUNNING and READY carry no outcome; every other status carries an outcome of its kind.
    """
    expected = _OUTCOME_OF[run.status]
    kind = None if run.outcome is None else run.outcome.get("kind")
    if kind != expected:
        raise StoreError(
            f"run {run.id}: status {run.status.value} with outcome {kind or 'none'} — a run's "
            f"status and outcome must agree (expected outcome {expected or 'none'})"
        )


def status_after_decision(run: RunRecord, still_open: list[PendingItem]) -> RunRecord | None:
    """The run as it must read once one of its pending items was decided, or None (unchanged).

    A paused run whose every item is decided becomes READY (decided, not yet continued); one
    that still waits on another item points at the oldest open one. A run some process is
    driving (an approver deciding during a resume) is left to its runner.
    """
    if run.status not in _PAUSED:
        return None
    if not still_open:
        return dataclasses.replace(run, status=RunStatus.READY, outcome=None,
                                   updated_at=time.time())
    first = min(still_open, key=lambda p: p.created_at)
    status = _STATUS_OF_ITEM.get(first.kind, RunStatus.AWAITING_APPROVAL)
    return dataclasses.replace(run, status=status, updated_at=time.time(),
                               outcome={"kind": status.value, _ID_FIELD[first.kind]: first.id})


ACTIVE_OWNERS: set[str] = set()
"""Owners (of this process) whose runner is driving a run right now."""


def new_owner() -> str:
    """An owner label for this process: `host:pid:nonce`."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


def is_owner_alive(owner: str | None) -> bool:
    """Whether `owner` is a live process on this host (False for other hosts: unknowable)."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        # This process: alive only while one of its runners is still driving that run (a
        # runner that died on an exception must not block a resume in the same process).
        return owner in ACTIVE_OWNERS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def owner_is_on_this_host(owner: str) -> bool:
    """Whether `owner` (`host:pid:nonce`) names a process of this machine."""
    return owner.partition(":")[0] == socket.gethostname()


def check_claimable(run: RunRecord, now: float) -> None:
    """Raise `ResumeRefused` unless another process may take over `run` now.

    A RUNNING run is taken over only when its owner is gone: on this machine that is known
    (the process is dead), so a live owner keeps its run however long a tool call takes; an
    owner on another machine is presumed gone once its lease has lapsed.
    """
    if run.status in _TERMINAL:
        raise ResumeRefused(f"run {run.id} is {run.status.value}; there is nothing to resume")
    if run.status is not RunStatus.RUNNING or not run.owner:
        return
    if owner_is_on_this_host(run.owner):
        alive = is_owner_alive(run.owner)
    else:
        alive = run.lease_until > now
    if alive:
        raise ResumeRefused(
            f"run {run.id} is being driven by {run.owner} right now; wait for it to pause or "
            "finish"
        )


def cutoff(older_than: float | dt.timedelta | None) -> float | None:
    """The creation-time bound for `pending(older_than=...)`."""
    if older_than is None:
        return None
    seconds = older_than.total_seconds() if isinstance(older_than, dt.timedelta) else older_than
    return time.time() - float(seconds)
