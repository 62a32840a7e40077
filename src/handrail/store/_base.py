"""Helpers every backend shares: run owners, the claim rule, the pending-age bound.

Public through `handrail.store.contract`; this module imports no backend (backends import it).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import os
import socket
import time
import unicodedata
from typing import Any

from handrail.errors import AlreadyDecided, ResumeRefused, StoreError, UserError
from handrail.store._records import PendingItem, RunRecord, RunStatus

__all__ = ["ACTIVE_OWNERS", "EXPIRY", "check_claimable", "check_run_record", "counted",
           "cutoff", "expired", "is_owner_alive", "new_owner", "principal",
           "status_after_decision"]

EXPIRY = "expiry"
"""Who decided an item whose deadline passed (`PendingItem.decided_by`)."""

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


def principal(name: str) -> str:
    """The person a `decided_by` names, for counting distinct approvers.

    NFKC-normalised, stripped and case-folded: "Alice", "alice " and a full-width "ａｌｉｃｅ"
    are one person, so nobody counts twice by spelling their name another way.
    """
    return unicodedata.normalize("NFKC", name).strip().casefold()


def counted(item: PendingItem, decision: dict[str, Any], decided_by: str, now: float,
            payload: dict[str, Any] | None = None) -> PendingItem | None:
    """`item` once `decided_by`'s decision is counted, or None when it changes nothing.

    Every backend's `decide` goes through this, inside its compare-and-swap. An item that
    needs one approval is decided by any decision. One that needs N (`approvals_needed`,
    four-eyes) stays open until N distinct people (`principal`) approved, each kept in
    `approvals`; its final decision lists them and `decided_by` names them all. A deny (or a
    defer) decides it at once. The same person approving again counts once: None.

    Raises:
        AlreadyDecided: the item is not open.
        UserError: a four-eyes approval that modifies the arguments or remembers a rule
            (each approver must approve the same request, and nothing may outlive it).
    """
    if item.state != "open":
        raise AlreadyDecided(f"{item.kind} {item.id} was already decided by {item.decided_by}")
    kept = item.payload if payload is None else payload
    if item.approvals_needed > 1 and decision.get("kind") == "approve":
        if decision.get("modified") is not None or decision.get("remember"):
            raise UserError(
                f"approval {item.id} needs {item.approvals_needed} approvers: each approves "
                "the request as it is, without edited arguments or remembered rules (deny it "
                "with a reason to have the agent ask for something else)")
        who = principal(decided_by)
        if any(principal(str(a.get("by", ""))) == who for a in item.approvals):
            return None
        approvals = [*item.approvals, {"by": decided_by, "at": now}]
        if len(approvals) < item.approvals_needed:
            return dataclasses.replace(item, approvals=approvals)
        names = [str(a["by"]) for a in approvals]
        return dataclasses.replace(
            item, approvals=approvals, state="decided",
            decision={**decision, "approvals": names}, decided_by=", ".join(names),
            decided_at=now, payload=kept)
    return dataclasses.replace(item, state="decided", decision=decision,
                               decided_by=decided_by, decided_at=now, payload=kept)


def expired(item: PendingItem, now: float) -> PendingItem:
    """`item` decided by `EXPIRY` with its default (`on_expiry`), its expiry noted.

    A denied approval keeps what it asked and its digest, never the bytes (as a person's
    deny does).
    """
    decision = item.on_expiry or {"kind": "deny", "reason": "expired"}
    payload = item.payload
    if item.kind == "approval" and decision.get("kind") == "deny":
        payload = _without_contents(payload)
    note = {"kind": "expired", "at": now, "decision": decision.get("kind")}
    return dataclasses.replace(item, state="decided", decision=decision, decided_by=EXPIRY,
                               decided_at=now, payload=payload, notes=[*item.notes, note])


def _without_contents(request: dict[str, Any]) -> dict[str, Any]:
    # As `handrail.runs.without_contents` (the store sits below runs and cannot import it).
    kept = dict(request)
    content = kept.get("content")
    if isinstance(content, str) and content:
        raw = base64.b64decode(content)
        kept["content"] = None
        kept["content_sha256"] = hashlib.sha256(raw).hexdigest()
        kept["content_bytes"] = len(raw)
    kept["arguments"] = {"redacted": "a denied request keeps only what it touched"}
    actions = kept.get("actions")
    if isinstance(actions, list):
        kept["actions"] = [{**a, "content": None} if isinstance(a, dict) else a
                           for a in actions]
    return kept
