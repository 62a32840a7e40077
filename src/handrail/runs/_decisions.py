"""Recording a person's decision on a pending item: everything checked before it is recorded.

A decision is recorded with a compare-and-swap: once recorded it cannot be taken back (a
second one says "already decided"). So whatever would make it fail when the run applies it is
checked first, and a decision that cannot be applied is refused whole, nothing recorded.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from handrail.approval import Approve, Decision
from handrail.errors import InvalidArguments, UnknownTool, UserError
from handrail.store import PendingItem, Store
from handrail.tools import check_argument_payload

__all__ = ["check_decision", "record_decision", "without_contents", "wrong_kind"]

_COMMAND = {"approval": "handrail approve {id}` (or `handrail deny {id} --reason 'not now'",
            "question": "handrail answer {id} 'your answer'",
            "recovery": "handrail recover {id} --retry` (or `--completed 'what it did'`, "
                        "`--abort`"}
_NAME = {"approval": "an approval", "question": "a question", "recovery": "a recovery"}


def wrong_kind(item: PendingItem, kind: str) -> UserError:
    """The error for deciding an item as the wrong kind, naming the command that fits it."""
    return UserError(
        f"{item.id} is {_NAME.get(item.kind, item.kind)}, not {_NAME.get(kind, kind)}: "
        f"use `{_COMMAND.get(item.kind, 'handrail pending').format(id=item.id)}`"
    )


def check_decision(item: PendingItem, decision: dict[str, Any], *, agent: Any = None) -> None:
    """Raise `UserError` unless `decision` can be applied to `item` (with `agent`, when known).

    With the agent, modified arguments are validated against the tool's schema and a retry
    needs the tool to exist; without one, what can be checked from the item alone is.
    """
    if item.kind == "approval":
        parsed = Decision.from_dict(decision)
        if not isinstance(parsed, Approve):
            return
        parsed.check(str(item.payload.get("act", "")))
        if parsed.modified is not None and agent is not None:
            tool = str(item.payload.get("tool") or item.tool or "")
            impl = _impl(agent, tool)
            if impl is None:
                raise UserError(f"the tool {tool!r} is not in this agent, so modified "
                                "arguments cannot be checked; nothing was recorded")
            try:
                impl.validate(check_argument_payload(tool, parsed.modified,
                                                     agent.toolbox.max_argument_bytes))
            except InvalidArguments as exc:
                raise UserError(f"the modified arguments do not fit {tool}: {exc}; nothing "
                                "was recorded") from None
    elif item.kind == "question":
        if not isinstance(decision.get("answer"), str):
            raise UserError("an answer is text")
    elif item.kind == "recovery":
        kind = decision.get("kind")
        if kind not in ("retry", "completed", "abort"):
            raise UserError(f"a recovery is retry, completed or abort, not {kind!r}")
        if kind == "completed" and not isinstance(decision.get("observation"), str):
            raise UserError("a completed recovery needs the observation (what happened)")
        tool = str(item.tool or item.payload.get("tool") or "")
        if kind == "retry" and agent is not None and _impl(agent, tool) is None:
            raise UserError(
                f"cannot retry call {item.id}: its tool {tool!r} is not in this agent "
                "(another --agent, or a changed agent?); the call stays in doubt and nothing "
                "was recorded. Retry with an agent that has the tool, or decide it with "
                "--completed TEXT or --abort"
            )


def _impl(agent: Any, tool: str) -> Any:
    try:
        return agent.toolbox.get(tool)
    except UnknownTool:
        return None


async def record_decision(store: Store, item_id: str, kind: str, decision: dict[str, Any],
                          decided_by: str, *, agent: Any = None) -> PendingItem:
    """Check `decision` against the item (and agent), then record it (compare-and-swap).

    Raises:
        UserError: the item is of another kind, or the decision cannot be applied (nothing
            recorded).
        AlreadyDecided: it was decided before.
        NotFound: no such item.
    """
    if not isinstance(decided_by, str) or not decided_by.strip() or len(decided_by) > 200:
        raise UserError("decided_by names who decided (1 to 200 characters)")
    item = await store.pending_item(item_id)
    if item.kind != kind:
        raise wrong_kind(item, kind)
    check_decision(item, decision, agent=agent)
    payload = None
    if kind == "approval" and decision.get("kind") == "deny":
        payload = without_contents(item.payload)
    return await store.decide(item_id, decision, decided_by, payload=payload)


def without_contents(request: dict[str, Any]) -> dict[str, Any]:
    """A denied request as it is kept: what was asked and its digest, never the bytes."""
    kept = dict(request)
    content = kept.get("content")
    if content:
        raw = base64.b64decode(content)
        kept["content"] = None
        kept["content_sha256"] = hashlib.sha256(raw).hexdigest()
        kept["content_bytes"] = len(raw)
    kept["arguments"] = {"redacted": "a denied request keeps only what it touched"}
    kept["actions"] = [{**a, "content": None} for a in kept.get("actions", [])]
    return kept

