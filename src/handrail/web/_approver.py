"""`InboxApprover`: a long-lived process puts its asks in the inbox and waits for a person."""

from __future__ import annotations

import math
import time

import anyio

from handrail.approval import Decision, Request
from handrail.errors import AlreadyDecided, UserError
from handrail.store import Batch, PendingItem, Store

__all__ = ["InboxApprover"]


class InboxApprover:
    """Defers each request to the inbox and waits, in this process, for a person's decision.

    For a server that stays up: the request appears in `handrail inbox` (and
    `handrail pending`) while the run keeps running; whoever decides there (or with
    `handrail approve`) unblocks this call, with no resume. When nobody decides within
    `timeout` seconds the run pauses as `AwaitingApproval` instead, under the same request id,
    and is continued the usual way (`hr.resume_with_decision`, the inbox's resume).

    The timeout is settled with the same compare-and-swap as a decision: a person who decided
    just before it wins (their decision is used), one who decides just after is told it was
    already decided, so a decision is never lost and never applied twice.

    Args:
        store: The run store the inbox reads (the one the agent runs with).
        timeout: Seconds to wait for a decision before pausing the run.
        poll_interval: Seconds between looks at the store.
    """

    name = "inbox"
    """The approver's name, recorded on a call; the person is recorded on the pending item."""

    def __init__(self, store: Store, *, timeout: float = 300.0,
                 poll_interval: float = 0.25) -> None:
        if not isinstance(store, Store):
            raise UserError("InboxApprover(store) takes the hr.Store the agent runs with")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0):
            raise UserError("InboxApprover(timeout=...) takes a non-negative number of seconds")
        if not (isinstance(poll_interval, int | float) and 0 < poll_interval <= 60):
            raise UserError("InboxApprover(poll_interval=...) takes seconds in (0, 60]")
        self.store = store
        self.timeout = float(timeout)
        self.poll_interval = float(poll_interval)

    async def decide(self, request: Request) -> Decision:
        """Publish `request` to the inbox, wait for a decision; `Defer` after the timeout."""
        if request.run_id is None:
            raise UserError("InboxApprover needs a request from a run (an Agent with a store)")
        now = time.time()
        # The rule's terms hold here too: two people must approve, the default at the deadline.
        item = PendingItem(id=request.id, kind="approval", run_id=request.run_id,
                           call_record=f"{request.run_id}:{request.call_id}",
                           agent=request.agent, tool=request.tool, payload=request.to_dict(),
                           created_at=now, **request.terms.item_fields(now))
        await self.store.write(Batch(pending=[item]))
        deadline = time.monotonic() + self.timeout
        while True:
            current = await self.store.pending_item(item.id)
            if current.state != "open":
                return self._decided(current)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await anyio.sleep(min(self.poll_interval, left))
        try:
            # Close the item before the run pauses: the gate then persists it afresh, open.
            await self.store.decide(item.id, Decision.defer().to_dict(), "inbox (timed out)")
        except AlreadyDecided:
            return self._decided(await self.store.pending_item(item.id))
        return Decision.defer()

    @staticmethod
    def _decided(item: PendingItem) -> Decision:
        return Decision.from_dict(item.decision or {})
