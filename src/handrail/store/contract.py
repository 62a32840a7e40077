"""The store contract: the one module the gate, runs, the CLI and every backend import.

It holds the `Store` interface, the records a store keeps (`RunRecord`, `CallRecord`,
`PendingItem`), the `Batch` of writes committed together, the public helpers the loop needs
(`update`, run owners, the claim rule) and the backend registry behind `Store.open(url)`.

A backend is a `Store` subclass in its own module that imports this one, never the other way
round. It plugs in by registering a factory for its URL scheme (`register_backend`); the
registrations of the built-in backends live in `handrail.store` (`__init__.py`), each importing
its module only when a store of that kind is opened. A PostgreSQL store registers
`postgresql://` there and touches nothing else.
"""

from __future__ import annotations

import abc
import datetime as dt
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from handrail.errors import ConfigError
from handrail.store._base import (
    ACTIVE_OWNERS,
    EXPIRY,
    check_claimable,
    check_run_record,
    counted,
    cutoff,
    expired,
    is_owner_alive,
    new_owner,
    owner_is_on_this_host,
    principal,
    status_after_decision,
)
from handrail.store._records import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    QuotaClaim,
    QuotaExceeded,
    RunRecord,
    RunStatus,
    clone,
    new_batch,
    positional_maker,
    update,
)

__all__ = [
    "ACTIVE_OWNERS",
    "EXPIRY",
    "Batch",
    "CallRecord",
    "CallStatus",
    "Durability",
    "PendingItem",
    "QuotaClaim",
    "QuotaExceeded",
    "RunRecord",
    "RunStatus",
    "Store",
    "StoreFactory",
    "check_claimable",
    "check_run_record",
    "clone",
    "continues_conversation",
    "counted",
    "cutoff",
    "expired",
    "is_owner_alive",
    "logged_event",
    "merged_events",
    "new_batch",
    "new_owner",
    "owner_is_on_this_host",
    "positional_maker",
    "principal",
    "redacted_url",
    "register_backend",
    "registered_schemes",
    "status_after_decision",
    "update",
]

Durability = Literal["process", "fsync"]
"""What a write survives once acknowledged.

`process`: the death of the process at any point (SIGKILL, OOM, a crash) — the contract of every
durable store. `fsync`: also a power loss or a kernel crash; each commit waits for the disk.
"""

StoreFactory = Callable[[str, "Durability"], "Store"]
"""Builds a store from the text of its URL (scheme included) and the durability asked for."""

_BACKENDS: dict[str, StoreFactory] = {}
_DEFAULT_SCHEME = "sqlite"


def continues_conversation(events: list[dict[str, Any]], conversation: str) -> bool:
    """Whether a run with these events continues conversation `conversation` (its first run).

    A continuing run records one `continues` event naming the run it continues and the
    conversation's first run (`handrail.runs.conversation_of` reads the same event).
    """
    for event in events:
        if isinstance(event, dict) and event.get("kind") == "continues":
            return event.get("conversation") == conversation
    return False


def register_backend(scheme: str, factory: StoreFactory) -> None:
    """Make `Store.open("<scheme>://...")` build a store with `factory`.

    A file path (no `://`) opens the `sqlite` backend. Registering a scheme twice replaces the
    first factory (a test may swap a backend in).

    Raises:
        ConfigError: the scheme is empty or has characters a URL scheme cannot.
    """
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ConfigError(f"a store URL scheme is letters, digits, + - or .; got {scheme!r}")
    _BACKENDS[scheme.lower()] = factory


def registered_schemes() -> list[str]:
    """The URL schemes `Store.open` knows, sorted."""
    return sorted(_BACKENDS)


_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&;])(?:password|passwd|sslpassword)=)[^&;]*")


def redacted_url(url: str) -> str:
    """`url` as it may be shown or logged, its password replaced by `***`.

    Both places libpq takes one: `user:secret@host` and a `password=` query parameter. A file
    path is returned unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    where, q, query = rest.partition("?")
    creds, at, host = where.rpartition("@")
    if at and ":" in creds:
        where = f"{creds.partition(':')[0]}:***@{host}"
    if q:
        query = _QUERY_SECRET.sub(lambda m: m.group(1) + "***", query)
    return f"{scheme}{sep}{where}{q}{query}"


class Store(abc.ABC):
    """Where runs, messages, calls and pending items live.

    Open one with `Store.open("runs.db")` (SQLite, the embedded default),
    `Store.open("postgresql://...")` (several workers, once that backend lands), or
    `Store.memory()` (one process, for tests and benchmarks). Every method is async; nothing
    that can wait (a lock, an fsync, the network) runs on the event loop.

    Durability: when `write` (or `decide`, `claim`) returns, its change is committed to the
    level the store was opened with (`durability=`); a change is never acknowledged before.
    """

    lease_seconds: float = 30.0
    """How long a run's owner holds it without writing; a dead owner's run is claimable after."""

    durable: bool = True
    """Whether what is written outlives the process (False for `Store.memory()`)."""

    clock: Callable[[], float] = staticmethod(time.time)
    """What time it is (Unix time) for deadlines and notification retries: a test sets
    `store.clock = lambda: t` to move time without waiting."""

    @staticmethod
    def open(url: str | os.PathLike[str], *, durability: Durability = "process") -> Store:
        """Open a store by URL: a file path (SQLite, created if missing) or `scheme://...`.

        Args:
            url: A SQLite file path, `sqlite://PATH`, `memory://`, or the URL of another
                registered backend.
            durability: `"process"` (the default): an acknowledged write survives the death
                of the process. `"fsync"`: it also survives a power loss (each commit waits
                for the disk; concurrent runs share those waits).

        Raises:
            ConfigError: the URL's scheme is unknown, or `durability` is not one of the two.
        """
        text = os.fspath(url)
        if not text:
            raise ConfigError("Store.open needs a path or URL; got an empty string")
        if durability not in ("process", "fsync"):
            raise ConfigError(
                f"durability is 'process' or 'fsync'; got {durability!r}"
            )
        scheme = text.partition("://")[0].lower() if "://" in text else _DEFAULT_SCHEME
        factory = _BACKENDS.get(scheme)
        if factory is None:
            if scheme in ("postgresql", "postgres"):
                raise ConfigError(
                    "the PostgreSQL store is not built yet; use a SQLite path for now"
                )
            raise ConfigError(
                f"unknown store URL {text!r}: use a file path (SQLite) or one of "
                + ", ".join(f"{s}://" for s in registered_schemes())
            )
        return factory(text, durability)

    @staticmethod
    def memory() -> Store:
        """An in-process store (lost when the process exits)."""
        return Store.open("memory://")

    @abc.abstractmethod
    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        """Commit every write of `batch` in one transaction.

        Raises `StoreError` (nothing written) when the batch's run has a status and an outcome
        that disagree (see `check_run_record`).

        Each of `batch.claims` adds one call to its quota window in the same transaction
        (sets `claim.count`); when a claim that is not `force`d finds its window at its
        limit, nothing of the batch is written and `QuotaExceeded` names that claim. However
        many processes write at once, a window never counts more than its limit from claims
        that are not forced. Claims are never made with `wait=False`.

        With `wait=False` the write is queued and this returns at once; writes still apply
        in order, any later operation waits for it, and its failure is raised by the next
        operation (or `flush`). Nothing may rely on a write made with `wait=False` being
        durable until a later awaited operation returns. The batch may be changed as soon as
        this returns.

        Raises:
            QuotaExceeded: a claim's window is full (nothing of the batch was kept).
            StoreError: the transaction holding this write failed (nothing of it was kept).
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

    async def run_ids(self, prefix: str, *, limit: int = 1000) -> list[str]:
        """Ids of runs that start with `prefix`, in id order, at most `limit` of them.

        For naming a run by the start of its id (`handrail show 3f9a`). This default looks
        among the newest 10,000 runs; a store overrides it to look at every run by its id.
        """
        runs = await self.runs(limit=10_000)
        return sorted(r.id for r in runs if r.id.startswith(prefix))[:max(limit, 0)]

    async def continuations(self, conversation: str, *, since: float = 0.0,
                            limit: int = 1000) -> list[RunRecord]:
        """The runs that continue conversation `conversation`, oldest first, at most `limit`.

        Those created at or after `since` whose `continues` event names `conversation` as the
        conversation's first run (`handrail show` lists a conversation with them). This
        default looks among the newest 1,000 runs; a store overrides it to look at every run.
        """
        found = [r for r in await self.runs(limit=1000)
                 if r.created_at >= since and continues_conversation(r.events, conversation)]
        found.sort(key=lambda r: (r.created_at, r.id))
        return found[:max(limit, 0)]

    async def call_history(self, *, since: float = 0.0, decisions_only: bool = False,
                           ) -> AsyncIterator[tuple[RunRecord, list[CallRecord]]]:
        """Every run created at or after `since`, oldest first, each with its calls in order.

        For reading the whole record (`handrail policy what-if`, `suggest`): it never writes
        the store, not even the housekeeping a read may do elsewhere (the SQLite store's fold
        of its log); a SQLite file and a PostgreSQL database are read in one read-only
        transaction, so the history is one consistent snapshot. With `decisions_only`, a
        store may leave out of each call what the policy did not decide on (arguments,
        result, answers, timings, provenance: left at their defaults), and records whose
        actions, verdict or decision were recorded alike may share one decoded value: treat
        them as read-only. This default lists runs with `runs` and their calls with `calls`; a store
        overrides it to read in bulk.
        """
        found = [r for r in await self.runs(limit=2**62) if r.created_at >= since]
        found.sort(key=lambda r: (r.created_at, r.id))
        for run in found:
            yield run, await self.calls(run.id)

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

    async def pending_page(self, limit: int, *, kind: str | None = None,
                           agent: str | None = None, tool: str | None = None,
                           ) -> tuple[list[PendingItem], int]:
        """The oldest `limit` open items (as `pending` lists them), and how many are open.

        For a listing that shows a page (`handrail pending`). This default reads every item;
        a store overrides it to read no more than the page.
        """
        items = await self.pending(kind=kind, agent=agent, tool=tool)
        return items[:max(limit, 0)], len(items)

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

        An item needing several approvers (`approvals_needed`) counts an approval and stays
        open until enough distinct people approved (`counted`); the same person again
        changes nothing; a deny decides it at once. The returned item says which.

        `payload`, when given, replaces the item's payload in the same step (a denied write's
        bytes are dropped this way). In the same step a paused run moves on: to READY when
        nothing else of it is open (decided, not yet continued), else to the status of its
        oldest open item, so the run's status never names a decided item.

        Raises:
            NotFound: no item has that id.
            AlreadyDecided: it was decided before (by anyone, in any process).
        """

    async def expire_due(self) -> list[PendingItem]:
        """Decide every open item whose deadline has passed with its default, by "expiry".

        Each with the same compare-and-swap as `decide` (so an item is expired exactly once
        whichever processes touch the store at once, and never after a person decided it),
        the paused run moved on as `decide` moves it. Returns the items this call expired.
        A backend's `pending`, `pending_page`, `pending_item`, `decide` and `claim` call it
        when something is due: whatever process next touches the store enforces a deadline.

        Raises:
            ConfigError: this backend keeps no deadlines.
        """
        raise ConfigError(f"{type(self).__name__} keeps no deadlines on pending items")

    async def take_notifications(self, *, hold: float, limit: int = 50,
                                 ) -> list[PendingItem]:
        """Open items owed a notification now, each held for `hold` seconds for the caller.

        Owed: never notified yet, or notified once and past `escalate_at`; not held
        (`notify_after` passed). Holding (`notify_after = now + hold`) keeps two senders
        from taking the same item at once; a sender that dies lets it go when the hold ends.

        Raises:
            ConfigError: this backend keeps no notifications.
        """
        raise ConfigError(f"{type(self).__name__} keeps no notifications of pending items")

    async def record_notification(self, item_id: str, note: dict[str, Any], *,
                                  notified: int | None = None,
                                  retry_at: float | None = None) -> None:
        """Append `note` to an item's notes (a notification attempt, an escalation).

        In the same transaction the note becomes an event of the item's run, in the run's
        append-only log (`run_events`, the note with `item` naming the item): it touches no
        row a run's driver writes.

        `notified` raises its stage; `retry_at` sets when the next attempt may be made
        (`notify_after`).

        Raises:
            NotFound: no item has that id.
            ConfigError: this backend keeps no notifications.
        """
        raise ConfigError(f"{type(self).__name__} keeps no notifications of pending items")

    async def quota_count(self, counter: str, window: int) -> int:
        """How many calls started in one quota window (0 when none did).

        `counter` is `Limit.counter(key value)`, `window` the first of `Limit.window(now)`. A
        read for a person (the inbox, `handrail show`); what a start claims is counted in its
        own transaction (`write`).

        Raises:
            ConfigError: this backend keeps no quota counts.
        """
        raise ConfigError(f"{type(self).__name__} keeps no quota counts")

    async def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """Every event of a run, as a person reads it, oldest first.

        `RunRecord.events` (what the run's own driver recorded) with what other processes
        recorded about the run interleaved by time: each delivery attempt of a notification
        of its pending items (`kind` `notified` or `notify_failed`, see `Dispatcher`).

        Those others are kept in an append-only log beside the run, never in its row: the
        driver rewrites `RunRecord.events` whole with each write of the run, so an event put
        there by a dispatcher (while the run waits, or after a decision let a worker take the
        run again) would be lost to that worker's next write. An append races nobody.

        Raises:
            NotFound: no run has that id.
        """
        run = await self.run(run_id)
        return merged_events(run.events, await self._logged_events(run_id))

    async def _logged_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's append-only log, oldest first (a backend without one: none)."""
        return []

    @abc.abstractmethod
    async def claim(self, run_id: str, owner: str) -> RunRecord:
        """Take over a run atomically: mark it RUNNING under `owner` with a fresh lease.

        The run's outcome is cleared in the same step (a RUNNING run has none).

        Raises:
            NotFound: no run has that id.
            ResumeRefused: it is finished, or a live process drives it.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Commit what is queued and release connections."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def merged_events(own: list[dict[str, Any]], logged: list[dict[str, Any]],
                  ) -> list[dict[str, Any]]:
    """A run's own events with its logged ones (both oldest first) interleaved by `at`.

    The run's own order is kept as it is; a logged event goes before the first own event
    recorded after it (an own event without a time keeps its place).
    """
    if not logged:
        return list(own)
    out: list[dict[str, Any]] = []
    i = 0
    for event in own:
        at = event.get("at") if isinstance(event, dict) else None
        if isinstance(at, int | float):
            while i < len(logged) and float(logged[i].get("at") or 0.0) <= at:
                out.append(logged[i])
                i += 1
        out.append(event)
    out.extend(logged[i:])
    return out


def logged_event(item_id: str, note: dict[str, Any]) -> dict[str, Any]:
    """The run event of a pending item's note (`record_notification`): the note, naming it."""
    return {**note, "item": item_id}
