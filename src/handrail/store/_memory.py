"""`MemoryStore`: the contract in plain dicts, for one process (tests, benchmarks).

A call record and a message are kept packed: every field of a record (its status as the
status's value), a message whole, as one `marshal` blob, unpacked into new objects on each
read. Builtin values round-trip exactly, nothing a caller keeps can change what is stored, and
a run's history is one byte string per call and per message, which the garbage collector does
not track, instead of a dozen containers it walks on every full pass (issue 11: those passes
were a fifth of a call's CPU; issue 24: a record object and its tuple per stored call were a
sixth of what a full pass walked at 1,000 concurrent runs). What marshal refuses (a subclass
of a builtin type, an unknown object) is kept as before: a shallow copy of the record, a
message as given.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import marshal
import time
from typing import Any

from handrail.errors import NotFound
from handrail.store._pace import Pacer
from handrail.store.contract import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    QuotaExceeded,
    RunRecord,
    RunStatus,
    Store,
    check_claimable,
    check_run_record,
    clone,
    continues_conversation,
    counted,
    cutoff,
    expired,
    logged_event,
    status_after_decision,
)

__all__ = ["MemoryStore"]

WRITERS_PER_ITERATION = 4
"""Writers resumed per event-loop iteration (`Pacer`); as the SQLite store's releases."""

def _call_packers() -> tuple[Any, Any]:
    """A straight-line `fields` and `unfields` of a call record: its fields as one tuple.

    Generated once, as `clone`'s copiers are (a loop over the fields costs a getattr/setattr
    call each, on the memory store's per-call path). Every slot of `CallRecord` is named, so
    a field added to it is packed without a change here. The status travels as its value
    (marshal takes no enum), looked up by the member's identity: a dict keyed by the enum
    itself calls `Enum.__hash__`, a Python function, on every call. A status that is not a
    `CallStatus` raises KeyError, and the record is kept unpacked.
    """
    fields = CallRecord.__slots__
    values = ", ".join(f"status[id(r.{name})]" if name == "status" else f"r.{name}"
                       for name in fields)
    targets = ", ".join(f"n.{name}" for name in fields)
    source = (f"def fields(r):\n    return ({values},)\n"
              f"def unfields(t):\n    n = new(cls)\n    {targets}, = t\n"
              f"    n.status = by_value[n.status]\n    return n\n")
    namespace: dict[str, Any] = {
        "new": object.__new__, "cls": CallRecord,
        # Members live as long as their class: no other object ever has one of these ids.
        "status": {id(s): s.value for s in CallStatus},
        "by_value": {s.value: s for s in CallStatus}}
    exec(source, namespace)
    return namespace["fields"], namespace["unfields"]


_call_fields, _call_from_fields = _call_packers()


def _pack_call(record: CallRecord) -> bytes | CallRecord:
    """A stored form of `record` alone: one byte string (see the module docstring)."""
    try:
        blob: bytes = marshal.dumps(_call_fields(record))
    except (ValueError, KeyError):  # not plain builtin values: kept as they are (shared,
        return clone(record)        # like clone)
    return blob


def _pack_message(message: dict[str, Any]) -> bytes | dict[str, Any]:
    try:
        return marshal.dumps(message)
    except ValueError:
        return message


_Stored = tuple[bytes, int]
"""A packed message or call record: the blob of its write, and its place in the blob."""


def _unpack_call(stored: _Stored | bytes | CallRecord) -> CallRecord:
    if type(stored) is tuple:
        record: CallRecord = _call_from_fields(marshal.loads(stored[0])[stored[1]])
        return record
    if type(stored) is bytes:
        record = _call_from_fields(marshal.loads(stored))
        return record
    assert isinstance(stored, CallRecord)
    return clone(stored)


def _unpack_message(stored: _Stored | bytes | dict[str, Any]) -> dict[str, Any]:
    if type(stored) is tuple:
        out: dict[str, Any] = marshal.loads(stored[0])[stored[1]]
        return out
    if type(stored) is bytes:
        out = marshal.loads(stored)
        return out
    assert isinstance(stored, dict)
    return stored


# A packed item while its write waits: the blob and the item's place in it, or (-1) the item
# packed alone (`_pack_message`, `_pack_call`). Flat: a tuple inside a tuple leaves the
# collector's tracking a young pass later than its items (issue 24: a waiting write holds it).
_PackedMessage = tuple[str, int, bytes | dict[str, Any], int]
_PackedCall = tuple[str, str, bytes | CallRecord, int]


def _packed(batch: Batch) -> tuple[RunRecord | None, tuple[_PackedMessage, ...],
                                   tuple[_PackedCall, ...], tuple[PendingItem, ...]]:
    """`batch` as `MemoryStore.write` keeps it while it waits its turn: packed, checked.

    Its messages and call records packed now (as they are at the call), all of them in one
    `marshal` blob (each dumps builds and frees a table of the objects it wrote: one a write
    instead of one an item, ~11 k instructions of a call's three), each stored as the blob and
    its place in it; in tuples of strings, ints and bytes, which leave the collector's
    tracking at its next pass. What marshal refuses packs item by item (`_pack_message`,
    `_pack_call`). Its run record checked now (a refused write never waits its turn), copied
    after the wait (the caller keeps it anyway: no copy held while waiting).
    """
    run = batch.run
    # A running run without an outcome agrees with itself: checked without a call (its
    # status's look-up in the check's table calls `Enum.__hash__`, a Python function).
    if run is not None and (run.status is not RunStatus.RUNNING or run.outcome is not None):
        check_run_record(run)
    count = len(batch.messages)
    try:
        # Loops, not comprehensions (a function call each on 3.11).
        items: list[Any] = []
        for entry in batch.messages:
            items.append(entry[2])
        for record in batch.calls:
            items.append(_call_fields(record))
        blob = marshal.dumps(items) if items else b""  # read back by index: a list will do
    except (ValueError, KeyError):
        messages = tuple((run_id, seq, _pack_message(message), -1)
                         for run_id, seq, message in batch.messages)
        calls = tuple((record.id, record.run_id, _pack_call(record), -1)
                      for record in batch.calls)
        return run, messages, calls, tuple(batch.pending)
    packed_messages: list[_PackedMessage] = []
    i = 0
    for run_id, seq, _ in batch.messages:
        packed_messages.append((run_id, seq, blob, i))
        i += 1
    packed_calls: list[_PackedCall] = []
    for record in batch.calls:
        packed_calls.append((record.id, record.run_id, blob, count))
        count += 1
    return run, tuple(packed_messages), tuple(packed_calls), tuple(batch.pending)


class MemoryStore(Store):
    """Everything in dicts. No awaits inside a change, so each change is atomic."""

    durable = False
    """Everything here is lost when the process exits."""

    def __init__(self) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._messages: dict[str, list[_Stored | bytes | dict[str, Any]]] = {}
        self._calls: dict[str, _Stored | bytes | CallRecord] = {}
        self._run_calls: dict[str, list[str]] = {}
        self._pending: dict[str, PendingItem] = {}
        self._pacer = Pacer(WRITERS_PER_ITERATION)
        self._quota: dict[tuple[str, int], int] = {}  # (counter, window) -> calls started
        self._timed: set[str] = set()  # open items with a deadline: what `_expire` looks at
        self._log: dict[str, list[dict[str, Any]]] = {}  # run -> what others recorded

    async def write(self, batch: Batch, *, wait: bool = True) -> None:
        # Packed before the wait, and the batch let go (issue 24): a run waiting here holds
        # byte strings, which the collector does not track, instead of the batch, its lists,
        # records and message dicts, which each young pass walks (at 1,000 concurrent runs
        # nearly every run waits here at any moment). A caller that does not keep the batch
        # itself lets it be freed now. What is written is the batch's messages, records and
        # pending items as they were at the call, and its run record as it is after the wait.
        run, messages, calls, pending = _packed(batch)
        claims = batch.claims or None  # not the batch's empty list, held across the wait
        del batch
        # Yield to the loop once per write, before the change (which stays atomic, and is not
        # made if the caller is cancelled here): otherwise a run on this store never yields,
        # and 100 concurrent runs hold every other task on the loop for ~0.5 s at a time.
        # Paced: a few writers resume per loop iteration, so an iteration is never every
        # run's turn at once (100 runs: 10-35 ms, the loop's lag).
        await self._pacer.yield_()
        if claims:
            # Checked whole before any change: a full window refuses the batch, nothing kept.
            counts = self._quota
            taken: dict[tuple[str, int], int] = {}
            for claim in sorted(claims, key=lambda c: (c.counter, c.window)):  # as SQL stores
                key = (claim.counter, claim.window)
                now = taken.get(key, counts.get(key, 0))
                if not claim.force and now >= claim.limit:
                    raise QuotaExceeded(claim, now)
                taken[key] = claim.count = now + 1
            counts.update(taken)
        if run is not None:
            self._runs[run.id] = clone(run)
        for run_id, seq, packed, place in messages:
            # Not `cast(bytes, packed)`: a Python function call per item (place >= 0: packed
            # is the write's blob).
            message: _Stored | bytes | dict[str, Any] = (
                packed if place < 0 else (packed, place))  # type: ignore[assignment]
            # seq is the message's position; a replayed write must not duplicate.
            log = self._messages.setdefault(run_id, [])
            if seq == len(log):
                log.append(message)
            elif seq < len(log):
                log[seq] = message
            else:
                raise AssertionError(f"message seq {seq} leaves a gap after {len(log)}")
        for record_id, run_id, packed_call, place in calls:
            if record_id not in self._calls:
                self._run_calls.setdefault(run_id, []).append(record_id)
            self._calls[record_id] = (packed_call if place < 0
                                      else (packed_call, place))  # type: ignore[assignment]
        for item in pending:
            self._pending[item.id] = item
            if item.deadline is not None and item.state == "open":
                self._timed.add(item.id)

    async def run(self, run_id: str) -> RunRecord:
        try:
            return clone(self._runs[run_id])
        except KeyError:
            raise NotFound(f"no run {run_id!r} in this store") from None

    async def runs(self, *, limit: int = 50, status: RunStatus | None = None) -> list[RunRecord]:
        found = [r for r in self._runs.values() if status is None or r.status is status]
        found.sort(key=lambda r: r.created_at, reverse=True)
        return [clone(r) for r in found[:limit]]

    async def continuations(self, conversation: str, *, since: float = 0.0,
                            limit: int = 1000) -> list[RunRecord]:
        found = [r for r in self._runs.values()
                 if r.created_at >= since and continues_conversation(r.events, conversation)]
        found.sort(key=lambda r: (r.created_at, r.id))
        return [clone(r) for r in found[:max(limit, 0)]]

    async def run_ids(self, prefix: str, *, limit: int = 1000) -> list[str]:
        return sorted(i for i in self._runs if i.startswith(prefix))[:max(limit, 0)]

    async def messages(self, run_id: str) -> list[dict[str, Any]]:
        return [_unpack_message(m) for m in self._messages.get(run_id, [])]

    async def calls(self, run_id: str) -> list[CallRecord]:
        found = [_unpack_call(self._calls[i]) for i in self._run_calls.get(run_id, [])]
        found.sort(key=lambda c: (c.turn, c.index))
        return found

    async def call(self, record_id: str) -> CallRecord:
        try:
            return _unpack_call(self._calls[record_id])
        except KeyError:
            raise NotFound(f"no call {record_id!r} in this store") from None

    async def pending(
        self,
        kind: str | None = None,
        agent: str | None = None,
        tool: str | None = None,
        older_than: float | dt.timedelta | None = None,
    ) -> list[PendingItem]:
        self._expire()
        bound = cutoff(older_than)
        found = [
            p for p in self._pending.values()
            if p.state == "open"
            and (kind is None or p.kind == kind)
            and (agent is None or p.agent == agent)
            and (tool is None or p.tool == tool)
            and (bound is None or p.created_at <= bound)
        ]
        found.sort(key=lambda p: p.created_at)
        return found

    async def pending_item(self, item_id: str) -> PendingItem:
        self._expire()
        try:
            return self._pending[item_id]
        except KeyError:
            raise NotFound(f"no pending item {item_id!r} in this store") from None

    async def decide(self, item_id: str, decision: dict[str, Any], decided_by: str, *,
                     payload: dict[str, Any] | None = None) -> PendingItem:
        self._expire()
        item = await self.pending_item(item_id)
        now = self.clock()
        after = counted(item, decision, decided_by, now, payload)
        if after is None:
            return item
        self._pending[item_id] = after
        if after.state != "open":
            self._move_run(after.run_id)
        return after

    def _move_run(self, run_id: str) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            still_open = [p for p in self._pending.values()
                          if p.run_id == run.id and p.state == "open"]
            moved = status_after_decision(run, still_open)
            if moved is not None:
                self._runs[run.id] = moved

    def _expire(self) -> list[PendingItem]:
        if not self._timed:
            return []
        now = self.clock()
        due = []
        for item_id in list(self._timed):
            p = self._pending[item_id]
            if p.state != "open":
                self._timed.discard(item_id)
            elif p.deadline is not None and p.deadline <= now:
                due.append(p)
                self._timed.discard(item_id)
        for item in due:
            self._pending[item.id] = expired(item, now)
            self._move_run(item.run_id)
        return [self._pending[item.id] for item in due]

    async def expire_due(self) -> list[PendingItem]:
        return self._expire()

    async def take_notifications(self, *, hold: float, limit: int = 50,
                                 ) -> list[PendingItem]:
        now = self.clock()
        owed = [p for p in self._pending.values()
                if p.state == "open" and p.notify_after <= now
                and (p.notified == 0 or (p.notified == 1 and p.escalate_at is not None
                                         and p.escalate_at <= now))]
        owed.sort(key=lambda p: p.created_at)
        taken = []
        for item in owed[:max(limit, 0)]:
            self._pending[item.id] = held = dataclasses.replace(item, notify_after=now + hold)
            taken.append(held)
        return taken

    async def record_notification(self, item_id: str, note: dict[str, Any], *,
                                  notified: int | None = None,
                                  retry_at: float | None = None) -> None:
        item = await self.pending_item(item_id)
        self._pending[item_id] = dataclasses.replace(
            item, notes=[*item.notes, note],
            notified=item.notified if notified is None else max(item.notified, notified),
            notify_after=item.notify_after if retry_at is None else retry_at)
        self._log.setdefault(item.run_id, []).append(logged_event(item_id, note))

    async def quota_count(self, counter: str, window: int) -> int:
        return self._quota.get((counter, window), 0)

    async def _logged_events(self, run_id: str) -> list[dict[str, Any]]:
        return [dict(e) for e in self._log.get(run_id, ())]

    async def claim(self, run_id: str, owner: str) -> RunRecord:
        self._expire()
        run = await self.run(run_id)
        now = time.time()
        check_claimable(run, now)
        run = dataclasses.replace(run, status=RunStatus.RUNNING, owner=owner, outcome=None,
                                  lease_until=now + self.lease_seconds, updated_at=now)
        self._runs[run_id] = run
        return run
