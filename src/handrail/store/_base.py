"""The `Store` contract: what every run store (memory, SQLite, PostgreSQL) provides."""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import os
import socket
import time
from typing import Any

from handrail.errors import ConfigError, ResumeRefused, StoreError
from handrail.store._records import Batch, CallRecord, PendingItem, RunRecord, RunStatus

__all__ = ["Store", "check_run_record", "is_owner_alive", "new_owner"]

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


class Store(abc.ABC):
    """Where runs, messages, calls and pending items live.

    Open one with `Store.open("runs.db")` (SQLite, the embedded default),
    `Store.open("postgresql://...")` (several workers), or `Store.memory()` (one process, for
    tests and benchmarks). Every method is async; blocking I/O never runs on the event loop.
    """

    lease_seconds: float = 30.0
    """How long a run's owner holds it without writing; a dead owner's run is claimable after."""

    durable: bool = True
    """Whether what is written outlives the process (False for `Store.memory()`)."""

    @staticmethod
    def open(url: str | os.PathLike[str]) -> Store:
        """Open a store: a SQLite file path (created if missing) or a `postgresql://` URL.

        Raises:
            ConfigError: the URL's scheme is unknown.
        """
        text = os.fspath(url)
        if not text:
            raise ConfigError("Store.open needs a path or URL; got an empty string")
        if text.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                "the PostgreSQL store is not built yet; use a SQLite path for now"
            )
        if "://" in text and not text.startswith("sqlite://"):
            raise ConfigError(
                f"unknown store URL {text!r}: use a file path (SQLite) or postgresql://..."
            )
        from handrail.store._sqlite import SQLiteStore

        return SQLiteStore(text.removeprefix("sqlite://"))

    @staticmethod
    def memory() -> Store:
        """An in-process store (lost when the process exits)."""
        from handrail.store._memory import MemoryStore

        return MemoryStore()

    @abc.abstractmethod
    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        """Commit every write of `batch` in one transaction.

        Raises `StoreError` (nothing written) when the batch's run has a status and an outcome
        that disagree (see `check_run_record`).

        With `wait=False` the write is queued and this returns at once; writes still apply
        in order, any later operation waits for it, and its failure is raised by the next
        operation (or `flush`). The batch may be changed as soon as this returns.
        """

    async def flush(self) -> None:  # noqa: B027 - nothing to flush in a synchronous store
        """Wait until every queued write has been committed; raise if one failed."""

    @abc.abstractmethod
    async def run(self, run_id: str) -> RunRecord:
        """One run.

        Raises:
            NotFound: no run has that id.
        """

    @abc.abstractmethod
    async def runs(self, *, limit: int = 50, status: RunStatus | None = None) -> list[RunRecord]:
        """The newest runs first."""

    @abc.abstractmethod
    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        """A run's messages, dumped (`handrail.models.load_messages` rebuilds them), in order."""

    @abc.abstractmethod
    async def calls(self, run_id: str) -> list[CallRecord]:
        """A run's calls in order (turn, index)."""

    @abc.abstractmethod
    async def call(self, record_id: str) -> CallRecord:
        """One call record (`<run_id>:<call_id>`).

        Raises:
            NotFound: no call has that id.
        """

    @abc.abstractmethod
    async def pending(
        self,
        kind: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        older_than: float | dt.timedelta | None = None,
    ) -> list[PendingItem]:
        """Open pending items, oldest first, filtered by kind, agent, tool and age."""

    @abc.abstractmethod
    async def pending_item(self, item_id: str) -> PendingItem:
        """One pending item, open or decided.

        Raises:
            NotFound: no item has that id.
        """

    @abc.abstractmethod
    async def decide(
        self, item_id: str, decision: dict[str, Any], decided_by: str, *,
        payload: dict[str, Any] | None = None,
    ) -> PendingItem:
        """Record the decision on an open item, atomically (compare-and-swap).

        `payload`, when given, replaces the item's payload in the same step (a denied write's
        bytes are dropped this way). In the same step a paused run moves on: to READY when
        nothing else of it is open (decided, not yet continued), else to the status of its
        oldest open item, so the run's status never names a decided item.

        Raises:
            NotFound: no item has that id.
            AlreadyDecided: it was decided before (by anyone, in any process).
        """

    @abc.abstractmethod
    async def claim(self, run_id: str, owner: str) -> RunRecord:
        """Take over a run atomically: mark it RUNNING under `owner` with a fresh lease.

        The run's outcome is cleared in the same step (a RUNNING run has none).

        Raises:
            NotFound: no run has that id.
            ResumeRefused: it is finished, or a live process drives it.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release connections."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def cutoff(older_than: float | dt.timedelta | None) -> float | None:
    """The creation-time bound for `pending(older_than=...)`."""
    if older_than is None:
        return None
    seconds = older_than.total_seconds() if isinstance(older_than, dt.timedelta) else older_than
    return time.time() - float(seconds)
