"""In-band approval: a call `handrail serve` asks about, put to the MCP client's own user.

A desktop client that declared `elicitation` can show its user a form. Where the server's
operator allows it (`Gateway(client_approval=ACTS)`, `handrail serve --client-approval
write,call`), a call the policy asks about whose every action is of those acts is put to the
client's user as an approval form, during the call: *approve* runs it at once, recorded as
decided by "the MCP client's user (<client name>)"; *decline* (or approve unticked) denies
it, with that reason; *cancel*, no answer, an error, or a client that cannot be asked leave
it to the pending request as before (a person decides with `handrail approve` or the inbox).

Why opt-in, per act: the client's user is whoever drives the client, the same person who
asked the model for the call; a policy that asks so that someone *else* looks (four eyes, a
secret, an exec) must not be answered by them. The operator names the acts whose asks that
person may answer. A call the tool control held, or whose arguments are tainted by a tool's
output, is never put to the client (a person reviews those in the queue).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from handrail.approval import Decision
from handrail.errors import UserError
from handrail.mcp._relay import RELAY
from handrail.tools import Act

if TYPE_CHECKING:
    from handrail.approval import Request

__all__ = ["ClientApprover", "client_acts"]

MAX_SHOWN = 4000
"""Characters of the request shown in the form (what a write puts, truncated beyond)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def client_acts(acts: Collection[str | Act] | None) -> frozenset[Act]:
    """The acts whose asks the MCP client's user may decide; checked (`Gateway`).

    Raises:
        UserError: an entry is not an act (`read`, `write`, `exec`, `net`, `call`...).
    """
    if acts is None:
        return frozenset()
    if isinstance(acts, str | Act):
        raise UserError("client_approval is a collection of acts, e.g. {'write', 'call'}, "
                        f"not {acts!r}")
    out = set()
    for act in acts:
        try:
            out.add(Act(act))
        except ValueError:
            names = ", ".join(a.value for a in Act)
            raise UserError(f"client_approval: {act!r} is not an act (one of {names})"
                            ) from None
    return frozenset(out)


def _shown(text: str, limit: int = MAX_SHOWN) -> str:
    text = _CONTROL.sub("?", text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more)"


def approval_message(request: Request) -> str:
    """What the client's user reads: the tool, each action, the bytes a write puts, why."""
    actions = request.actions or ()
    lines = [f"handrail asks you to approve a call of {request.tool}:"]
    for action in actions:
        lines.append(f"- {action.describe()}")
    if not actions:
        lines.append(f"- {request.act.value} {request.target}")
    if request.content is not None:
        try:
            body = request.content.decode("utf-8")
        except UnicodeDecodeError:
            body = f"<{len(request.content)} bytes, not text>"
        lines.append(f"It writes ({len(request.content)} bytes):\n{body}")
    if request.verdict_reason:
        lines.append(f"Why it asks: {request.verdict_reason}")
    return _shown("\n".join(lines))


class ClientApprover:
    """Puts an ask to the MCP client's user by elicitation, else defers; see the module.

    One per session (its `name` is who is recorded as having decided).

    Args:
        acts: The acts whose asks the client's user may decide (`client_acts`).
        client: The client's name, as it gave it (already kept to plain characters).
        record: Keeps an event in the session's run (`GatewaySession.call_event`).
    """

    defers_everything = False

    def __init__(self, acts: frozenset[Act], client: str, record: Any = None) -> None:
        self.acts = acts
        self.name = f"the MCP client's user ({client})"
        self._record = record

    def allowed(self, request: Request) -> bool:
        """Whether this request may be put to the client's user at all."""
        if not self.acts or request.held is not None or request.taint:
            return False
        acts = [a.act for a in request.actions] or [request.act]
        return all(act in self.acts for act in acts)

    async def decide(self, request: Request) -> Decision:
        """Ask the client's user, when allowed and the client can be asked; else defer."""
        import mcp_types as t

        relay = RELAY.get()
        if relay is None or not self.allowed(request) or not relay.declares("elicitation"):
            return Decision.defer()
        params = t.ElicitRequestFormParams(
            message=approval_message(request),
            requested_schema={
                "type": "object",
                "properties": {"approve": {
                    "type": "boolean", "title": "Approve",
                    "description": "Tick to run the call as shown; leave unticked to refuse it"}},
                "required": ["approve"]})
        try:
            result = await relay.elicit(params)
        except Exception as exc:  # boundary: a client that cannot answer leaves it to the queue
            await self._event(request, "error", f"{type(exc).__name__}: {exc}"[:500])
            return Decision.defer()
        action = getattr(result, "action", None)
        content = getattr(result, "content", None) or {}
        if action == "accept" and content.get("approve") is True:
            await self._event(request, "approve")
            return Decision.approve()
        if action == "accept" or action == "decline":
            await self._event(request, "deny")
            return Decision.deny(f"declined by {self.name}")
        await self._event(request, "defer")  # cancelled: a person in the queue decides
        return Decision.defer()

    async def _event(self, request: Request, outcome: str, error: str | None = None) -> None:
        if self._record is None:
            return
        detail: dict[str, Any] = {"request_id": request.id, "tool": request.tool,
                                  "outcome": outcome, "by": self.name}
        if error is not None:
            detail["error"] = error
        await self._record("mcp_client_approval", True, **detail)
