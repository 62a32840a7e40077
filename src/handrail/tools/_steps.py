"""The messages a `ToolHandler` takes and gives back.

It takes `Invoke`, `Respond` and `Cancel`; it gives back `Finished` and `Interaction`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from handrail.errors import UserError
from handrail.tools._content import ToolResult
from handrail.tools._context import Elicitation, Question
from handrail.tools._names import ToolId

__all__ = [
    "Cancel",
    "CancelInteraction",
    "Decline",
    "Finished",
    "Interaction",
    "Invoke",
    "Respond",
    "Submit",
]


@dataclass(frozen=True, slots=True)
class Submit:
    """An answer: text for a Question, an object for an Elicitation."""

    value: Any
    """The answer."""
    kind: Literal["submit"] = "submit"


@dataclass(frozen=True, slots=True)
class Decline:
    """The caller will not answer; `ctx.ask` raises `InteractionDeclined` in the tool."""

    reason: str = "declined"
    """Why, for the tool (and through it, the model)."""
    kind: Literal["decline"] = "decline"


@dataclass(frozen=True, slots=True)
class CancelInteraction:
    """The caller abandons the whole call rather than answer; the call ends as cancelled."""

    reason: str = "cancelled"
    """Why, for the record."""
    kind: Literal["cancel"] = "cancel"


@dataclass(frozen=True, slots=True)
class Invoke:
    """Start the call.

    `answers` replays responses recorded earlier (a call resumed in a new process is re-run
    from the start and its first questions are answered from this list, in order).
    """

    call_id: str
    """The call's id, as the model gave it."""
    arguments: Mapping[str, Any] | str | bytes
    """The arguments: a mapping, or JSON text of an object."""
    answers: Sequence[Submit | Decline] = field(default=())
    """Responses to replay to the call's first interactions."""

    def __post_init__(self) -> None:
        if not isinstance(self.call_id, str) or not self.call_id:
            raise UserError(f"Invoke.call_id must be a non-empty string, not {self.call_id!r}")
        answers = tuple(self.answers)
        for answer in answers:
            if not isinstance(answer, Submit | Decline):
                raise UserError(
                    f"Invoke.answers holds hr.Submit and hr.Decline, not {type(answer).__name__}"
                )
        object.__setattr__(self, "answers", answers)


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the pending interaction `interaction_id`."""

    interaction_id: str
    """The id of the `Interaction` being answered; any other id is refused."""
    response: Submit | Decline | CancelInteraction
    """The answer."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """End the call as cancelled (the step raises `hr.CallCancelled`)."""

    reason: str = "cancelled by the caller"
    """Why, for the record."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The call completed with `result` (which may be a model-visible error)."""

    result: ToolResult
    """What the tool returned."""
    kind: Literal["finished"] = "finished"


@dataclass(frozen=True, slots=True)
class Interaction:
    """The call is suspended on a question for its caller; answer with `Respond(id, ...)`."""

    id: str
    """This interaction's id; unique within the call (`<call_id>:<n>`)."""
    call_id: str
    """The suspended call."""
    tool_id: ToolId
    """The tool that asked."""
    request: Question | Elicitation
    """What it asks."""
    kind: Literal["interaction"] = "interaction"
