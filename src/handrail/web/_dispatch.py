"""`Dispatcher`: sends what the store owes, and enforces deadlines, beside the runs.

The store is the outbox: every open item records whether it was notified, and what each
attempt did (`PendingItem.notified`, `notes`; each attempt is also an event of the item's run,
`Store.run_events`). The dispatcher takes what is owed, sends it with retries and backoff,
records each attempt, and after a failed round leaves the item owed
for the next round (nothing lost while a receiver is down). It runs beside the runs, never in
their way: a run only writes its pending item. Every round also expires what is due
(`Store.expire_due`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from handrail.approval import (
    DecisionLinks,
    Notification,
    Notifier,
    clean,
    default_backoff,
)
from handrail.errors import DeliveryFailed, HandrailError, UserError
from handrail.store import PendingItem, Store

__all__ = ["Dispatcher", "notification_of"]

MAX_TAINT_LINES = 20


def _taint_lines(payload: Mapping[str, Any]) -> list[str]:
    lines = []
    for t in list(payload.get("taint") or [])[:MAX_TAINT_LINES]:
        if isinstance(t, Mapping):
            lines.append(clean(f"{t.get('pointer', '?')} = {t.get('value', '')!r} came from "
                                f"the output of {t.get('source_tool', '?')} (call "
                                f"{t.get('source_call', '?')})", 500))
    return lines


def _summary(item: PendingItem) -> str:
    p = item.payload
    if item.kind == "approval":
        return clean(f"{p.get('act', '?')} {p.get('target', '')}", 500)
    if item.kind == "question":
        return clean(p.get("question") or p.get("message") or "a question", 500)
    return clean(f"call of {item.tool or p.get('tool') or '?'} in doubt after a crash", 500)



def notification_of(item: PendingItem, *, event: Literal["pending", "escalation"],
                    inbox_url: str | None = None, approve_url: str | None = None,
                    deny_url: str | None = None) -> Notification:
    """The notification of `item` (everything from the store's copy of it, bounded)."""
    p = item.payload
    if item.kind == "approval":
        reason = p.get("verdict_reason") or "the policy asks"
    elif item.kind == "question":
        reason = p.get("context") or "a tool asks"
    else:
        reason = "its process died while the call ran: it may or may not have happened"
    path = p.get("agent_path") or ()
    return Notification(
        id=f"{item.id}:{1 if event == 'pending' else 2}", event=event, item_id=item.id,
        item_kind=item.kind, run_id=item.run_id,
        agent=None if item.agent is None else clean(item.agent, 200),
        agent_path=tuple(clean(a, 200) for a in list(path)[:16]),
        tool=None if item.tool is None else clean(item.tool, 300),
        summary=_summary(item), reason=clean(reason), taint=tuple(_taint_lines(p)),
        inbox_url=inbox_url, approve_url=approve_url, deny_url=deny_url,
        deadline=item.deadline,
        on_expiry=None if item.on_expiry is None else str(item.on_expiry.get("kind")),
        approvals_needed=item.approvals_needed, approvals_so_far=len(item.approvals),
        created_at=item.created_at)



@dataclass
class Dispatcher:
    """Sends what the store owes: each new pending item once, each escalation once.

    `await dispatcher.deliver()` makes one round: expire what is due, take the items owed a
    notification (held for `hold` seconds, so another dispatcher does not take them too),
    send each with up to `attempts` tries (`backoff(n)` seconds apart, via `sleep`), and
    record every attempt as an event of the item's run (`Store.run_events`: the target, the
    try's number, delivered / refused with the HTTP status / unreachable, when the next try
    is due) and in the item's notes. An item whose every try failed stays owed: it is taken
    again `backoff(n)` seconds later, n counting this notification's tries over every round
    (within a round the waits are `backoff(1)`, `backoff(2)`, ...).
    `await dispatcher.run()` makes a round every `poll_interval` seconds until cancelled
    (`handrail inbox --notify-url` runs one).

    An item past its `escalate_at` gets a second notification, to `escalate_to` (or to
    `notifier` when there is no second target), before its deadline's default applies.

    Decision links go into an approval's notification when `links` is given; `inbox_url`
    (else `links.base_url`) makes each notification's link to the item.
    """

    store: Store
    """The store whose pending items are notified."""
    notifier: Notifier
    """Where each new item's notification goes."""
    escalate_to: Notifier | None = None
    """Where escalations go; None: to `notifier`."""
    links: DecisionLinks | None = None
    """Makes approve / deny links for approvals; None: no links."""
    inbox_url: str | None = None
    """The inbox's address, for the link to each item; None: `links.base_url`, or none."""
    attempts: int = 4
    """Tries per round before an item is left for the next round."""
    backoff: Callable[[int], float] = default_backoff
    """Seconds before try n+1 (and, after the last, before the next round takes it)."""
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    """How to wait between tries (a test passes one that returns at once)."""
    hold: float = 120.0
    """How long an item taken is held from other dispatchers (longer than a round)."""
    poll_interval: float = 2.0
    """Seconds between rounds of `run`."""


    def __post_init__(self) -> None:
        if not isinstance(self.notifier, Notifier):
            raise UserError("Dispatcher(notifier=...) takes a Notifier (an object with name "
                            "and async send(notification)), e.g. hr.WebhookNotifier")
        if self.escalate_to is not None and not isinstance(self.escalate_to, Notifier):
            raise UserError("Dispatcher(escalate_to=...) takes a Notifier")
        if not (isinstance(self.attempts, int) and 1 <= self.attempts <= 20):
            raise UserError("Dispatcher(attempts=...) is 1 to 20")
        if not (isinstance(self.poll_interval, int | float) and 0 < self.poll_interval <= 600):
            raise UserError("Dispatcher(poll_interval=...) is seconds in (0, 600]")

    async def run(self) -> None:
        """Make a round every `poll_interval` seconds until cancelled.

        A round's failure (the store unreachable) is logged in no item and retried next
        round; a cancellation ends the loop (a half-sent item is held, then taken again).
        """
        while True:
            try:
                await self.deliver()
            except HandrailError:
                pass  # the store failed this round; the next round tries again
            await anyio.sleep(self.poll_interval)

    async def deliver(self) -> int:
        """One round (see the class); returns how many notifications were delivered."""
        await self.store.expire_due()
        delivered = 0
        for item in await self.store.take_notifications(hold=self.hold):
            delivered += await self._notify(item)
        return delivered

    def notification(self, item: PendingItem, event: Literal["pending", "escalation"],
                     to: str) -> Notification:
        """The notification `item` gets now, with fresh links for `to`."""
        base = self.inbox_url.rstrip("/") if self.inbox_url else (
            self.links.base_url if self.links is not None else None)
        inbox = None if base is None else f"{base}/items/{urllib.parse.quote(item.id, safe='')}"
        approve = deny = None
        if self.links is not None and item.kind == "approval":
            until = None if item.deadline is None else min(
                item.deadline, self.links.clock() + self.links.ttl)
            approve = self.links.make(item.id, "approve", to=to, expires=until)
            deny = self.links.make(item.id, "deny", to=to, expires=until)
        return notification_of(item, event=event, inbox_url=inbox, approve_url=approve,
                               deny_url=deny)

    async def _notify(self, item: PendingItem) -> int:
        stage = 1 if item.notified == 0 else 2
        event: Literal["pending", "escalation"] = "pending" if stage == 1 else "escalation"
        target = self.notifier if stage == 1 or self.escalate_to is None else self.escalate_to
        note = self.notification(item, event, target.name)
        clock = self.store.clock
        # Tries are numbered across rounds (this notification's failed tries so far), as the
        # run's record shows them. Within a round the waits are `backoff(1..)`, so a round
        # stays short (it must end within `hold`, and other items wait behind it); the wait
        # before the next round is `backoff` of the overall try, so a receiver down for long
        # is tried ever less often, up to `backoff`'s cap.
        tried = sum(1 for n in item.notes
                    if n.get("kind") == "notify_failed" and n.get("event") == event)
        for n in range(1, self.attempts + 1):
            attempt = tried + n
            try:
                await target.send(note)
            except Exception as exc:  # any failure of a send is recorded, then retried
                last = n == self.attempts
                now = clock()
                wait = self.backoff(attempt if last else n)
                # Recorded on the item and, in the same transaction, as an event of its run
                # (an append-only log: no write of the run's row, which its driver owns).
                await self.store.record_notification(
                    item.id, {"kind": "notify_failed", "event": event, "to": target.name,
                              "attempt": attempt, **_outcome(exc),
                              "error": clean(str(exc), 300), "at": now,
                              "next_try": now + wait},
                    retry_at=now + wait if last else None)
                if not last:
                    await self.sleep(wait)
                continue
            await self.store.record_notification(
                item.id, {"kind": "notified", "event": event, "to": target.name,
                          "attempt": attempt, "outcome": "delivered", "delivery": note.id,
                          "at": clock()},
                notified=stage, retry_at=0.0)
            return 1
        return 0


def _outcome(exc: BaseException) -> dict[str, Any]:
    """What a failed send's record says happened: refused (with the HTTP status), no answer."""
    if isinstance(exc, DeliveryFailed):
        if exc.status is not None:
            return {"outcome": "refused", "status": exc.status}
        return {"outcome": "unreachable"}
    return {"outcome": "failed"}
