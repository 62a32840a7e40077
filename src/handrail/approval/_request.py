"""`Request`: everything a human needs to decide one call, with no trip back to a store."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from handrail.errors import UserError
from handrail.policy import AskTerms
from handrail.policy._policy import parse_act
from handrail.tools import Act, Action, Taint

__all__ = ["Request", "action_from_dict", "action_to_dict"]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data.encode("ascii"), validate=True)


def action_to_dict(action: Action) -> dict[str, Any]:
    """A JSON-compatible form of an action (content as base64)."""
    target = list(action.target) if isinstance(action.target, tuple) else action.target
    return {"act": action.act.value, "target": target, "content": _b64(action.content)}


def action_from_dict(data: Mapping[str, Any]) -> Action:
    """The inverse of `action_to_dict`."""
    target = data["target"]
    return Action(
        parse_act(data["act"]),
        tuple(target) if isinstance(target, list) else target,
        _unb64(data.get("content")),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """One call the policy said to ask about, as the approver sees it.

    It carries all a human needs to decide: what is touched (canonical target), the bytes a
    write would put, the tool and its arguments, and who is asking. It is persisted as is
    when a decision is deferred, and approving it performs exactly this.
    """

    act: Act
    """The act of the (first) action needing approval."""
    target: str
    """Its canonical target (workspace-relative path, argv joined by spaces, host...)."""
    content: bytes | None
    """The bytes a WRITE would put; None otherwise."""
    tool: str
    """The tool called, `server/name`."""
    arguments: Mapping[str, Any]
    """The validated arguments, as JSON."""
    call_id: str
    """The model's id for the call."""
    agent: str | None
    """The name of the agent making the call."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This request's id (a deferred decision is resumed by it)."""
    run_id: str | None = None
    """The run the call belongs to."""
    workspace: str | None = None
    """The absolute workspace root, so an approver can diff a write against the file."""
    actions: tuple[Action, ...] = ()
    """Every action of the call that needs approval (the first is `act`/`target`)."""
    verdict_reason: str = ""
    """Why the policy asked (`rule ask write 'src/**' in layer 'app'`), for the operator."""
    taint: tuple[Taint, ...] = ()
    """The protected arguments that came from untrusted tool output: which argument, which
    value, and which earlier call's output it appeared in (docs/taint.md). Empty when the
    policy alone asked."""
    held: str | None = None
    """The tool control's reason when it held this call for a person (see docs/control.md);
    None when only the policy asked. Such a request is decided by a person through the
    pending item (`handrail approve`, the inbox, `resume_with_decision`), never by the
    agent's approver."""
    agent_path: tuple[str, ...] = ()
    """Who asks, from the root of a tree of agents: `("planner", "coder")` for the sub-agent
    `coder` of `planner` (docs/subagents.md). Empty for an agent that is not in a tree."""
    terms: AskTerms = field(default_factory=AskTerms)
    """How the request is decided beyond one yes or no, from the rules that asked
    (`AskTerms`: distinct approvers, a deadline with its default, escalation)."""
    kind: Literal["request"] = field(default="request", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "act", parse_act(self.act))
        if not isinstance(self.target, str):
            raise UserError(f"Request.target must be the canonical target string, got "
                            f"{type(self.target).__name__}")
        if self.content is not None and not isinstance(self.content, bytes):
            raise UserError("Request.content must be bytes or None")
        object.__setattr__(self, "arguments", dict(self.arguments))
        object.__setattr__(self, "actions", tuple(self.actions))
        object.__setattr__(self, "taint", tuple(self.taint))
        object.__setattr__(self, "agent_path", tuple(self.agent_path))
        if not isinstance(self.terms, AskTerms):
            raise UserError("Request.terms takes hr.AskTerms")

    def describe(self) -> str:
        """`write src/app.py (tool local/write_file)`: one line for people."""
        return f"{self.act.value} {self.target} (tool {self.tool})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form (bytes as base64) for persistence."""
        return {
            "kind": "request",
            "id": self.id,
            "act": self.act.value,
            "target": self.target,
            "content": _b64(self.content),
            "tool": self.tool,
            "arguments": dict(self.arguments),
            "call_id": self.call_id,
            "agent": self.agent,
            "run_id": self.run_id,
            "workspace": self.workspace,
            "actions": [action_to_dict(a) for a in self.actions],
            "verdict_reason": self.verdict_reason,
            "taint": [t.to_dict() for t in self.taint],
            # Only when held: requests persisted before the tool control keep their form.
            **({"held": self.held} if self.held is not None else {}),
            **({"agent_path": list(self.agent_path)} if self.agent_path else {}),
            **({"terms": self.terms.to_dict()} if not self.terms.plain else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        """The inverse of `to_dict`.

        Raises:
            UserError: the data is not a request (wrong kind, missing or unknown keys).
        """
        data = dict(data)
        if data.pop("kind", "request") != "request":
            raise UserError(f"not a request: kind {data.get('kind')!r}")
        known = {"id", "act", "target", "content", "tool", "arguments", "call_id", "agent",
                 "run_id", "workspace", "actions", "verdict_reason", "taint", "held", "agent_path",
                 "terms"}
        unknown = set(data) - known
        if unknown:
            raise UserError(f"unknown request key(s): {sorted(unknown)}")
        try:
            return cls(
                id=data["id"],
                act=parse_act(data["act"]),
                target=data["target"],
                content=_unb64(data.get("content")),
                tool=data["tool"],
                arguments=data.get("arguments", {}),
                call_id=data["call_id"],
                agent=data.get("agent"),
                run_id=data.get("run_id"),
                workspace=data.get("workspace"),
                actions=tuple(action_from_dict(a) for a in data.get("actions", ())),
                verdict_reason=data.get("verdict_reason", ""),
                taint=tuple(Taint.from_dict(t) for t in data.get("taint", ())),
                held=data.get("held"),
                agent_path=tuple(str(a) for a in data.get("agent_path", ())),
                terms=AskTerms.from_dict(data.get("terms") or {}),
            )
        except KeyError as exc:
            raise UserError(f"a persisted request lacks the key {exc.args[0]!r}") from None
