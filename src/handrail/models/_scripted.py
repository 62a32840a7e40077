"""`Scripted`: a deterministic model for tests, benchmarks and the demo."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from handrail.errors import ModelResponseError, UserError
from handrail.models._messages import (
    AssistantMessage,
    ModelResponse,
    ModelSettings,
    TextPart,
    ToolCall,
    Usage,
)
from handrail.tools import ToolId, ToolSpec, slot_setter

__all__ = ["Scripted", "Turn", "call", "calls", "reply"]


def _json_text() -> Callable[[Any], str]:
    """`json.dumps` with its defaults, its C encoder built once (issue 11).

    `json.dumps` builds a C encoder per call, ~3 µs of a scripted turn; this is the same
    encoder with the same options (so the same text), built without a `markers` dict: it
    keeps no state between calls, and a circular value fails with RecursionError.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.dumps
    base = json.JSONEncoder()
    strings = json.encoder.encode_basestring_ascii  # ensure_ascii=True
    encoder = make(None, base.default, strings, None, ": ", ", ", False, False, True)

    def dumps(value: Any) -> str:
        if type(value) is str:
            return strings(value)
        return "".join(encoder(value, 0))

    return dumps


_dumps = _json_text()

_NO_USAGE = Usage(0, 0)
"""What every scripted turn reports (frozen: one object shared by every response)."""

_new = object.__new__
# Each turn builds a call, a message and a response: through their slots' setters, at about
# half the cost of their frozen `__init__`s (issue 11); each gets every field (the test
# compares them with the constructors' objects).
_call_fields = tuple(slot_setter(ToolCall, f) for f in ("id", "name", "arguments", "kind"))
_set_parts, _set_message_kind = (slot_setter(AssistantMessage, f) for f in ("parts", "kind"))
_response_fields = tuple(slot_setter(ModelResponse, f)
                         for f in ("message", "usage", "finish_reason", "model"))


def _tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    call: ToolCall = _new(ToolCall)
    set_id, set_name, set_arguments, set_kind = _call_fields
    set_id(call, call_id)
    set_name(call, name)
    set_arguments(call, arguments)
    set_kind(call, "tool_call")
    return call


def _response(parts: tuple[TextPart | ToolCall, ...], finish: str, model: str
              ) -> ModelResponse:
    message: AssistantMessage = _new(AssistantMessage)
    _set_parts(message, parts)
    _set_message_kind(message, "assistant")
    response: ModelResponse = _new(ModelResponse)
    set_message, set_usage, set_finish, set_model = _response_fields
    set_message(response, message)
    set_usage(response, _NO_USAGE)
    set_finish(response, finish)
    set_model(response, model)
    return response


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted assistant turn: text and/or tool calls (`(tool_id, arguments)` pairs)."""

    text: str = ""
    """Text of the turn; a turn with no calls is the final answer."""
    tool_calls: tuple[tuple[str, Mapping[str, Any] | str], ...] = ()
    """Calls as `("server/name", arguments)`; a string argument is sent as raw JSON text."""


def call(tool_id: ToolId | str, arguments: Mapping[str, Any] | str | None = None) -> Turn:
    """A turn that calls one tool.

    Arguments given as a string are sent verbatim (even invalid JSON, to test how a run
    handles it).
    """
    return Turn(tool_calls=((str(ToolId.of(tool_id)), arguments or {}),))


def calls(items: Sequence[tuple[ToolId | str, Mapping[str, Any] | str]]) -> Turn:
    """A turn that calls several tools at once (parallel calls)."""
    return Turn(tool_calls=tuple((str(ToolId.of(t)), a) for t, a in items))


def reply(text: str) -> Turn:
    """A final answer."""
    return Turn(text=text)


TurnSource = Turn | Callable[[Sequence[Any], Sequence[ToolSpec]], Turn]


class Scripted:
    """A model that plays back `turns`, one per assistant turn.

    It picks its turn by the number of assistant turns already in the history, so a run resumed
    in a new process (with a new `Scripted`) continues where it paused. Call ids are
    deterministic (`call_<turn>_<index>`) for the same reason. A turn may be a callable
    `(messages, tools) -> Turn` to react to what happened.

    Tool ids are `"server/name"`; calls are sent under each id's model-facing name, exactly as
    a real provider would see them.
    """

    def __init__(self, turns: Sequence[TurnSource], *, name: str = "scripted") -> None:
        if isinstance(turns, str | bytes) or not isinstance(turns, Sequence):
            raise UserError("Scripted takes a list of turns (hr.models.call/calls/reply)")
        for i, turn in enumerate(turns):
            if not (isinstance(turn, Turn) or callable(turn)):
                raise UserError(
                    f"turn {i} is {turn!r}: use hr.models.call(...), calls([...]), reply(...) "
                    "or a callable (messages, tools) -> turn"
                )
        self.turns = list(turns)
        self._name = name
        # (history list, its length, assistant turns in it): the agent loop appends to one
        # list, so counting only the new tail keeps each request O(1) in the history length.
        self._seen: tuple[Sequence[Any], int, int] | None = None
        self._names: dict[str, str] = {}  # "server/name" -> model-facing name

    @property
    def name(self) -> str:
        """The label recorded with runs."""
        return self._name

    async def request(
        self,
        messages: Sequence[Any],
        tools: Sequence[ToolSpec],
        settings: ModelSettings | None = None,
    ) -> ModelResponse:
        """Return the next scripted turn."""
        start, index = 0, 0
        seen = self._seen
        if seen is not None and seen[0] is messages and seen[1] <= len(messages):
            start, index = seen[1], seen[2]
        for i in range(start, len(messages)):
            if isinstance(messages[i], AssistantMessage):
                index += 1
        self._seen = (messages, len(messages), index)
        if index >= len(self.turns):
            raise ModelResponseError(
                f"the scripted model ran out of turns: it has {len(self.turns)} and the "
                f"conversation already holds {index} assistant turns; add a reply(...) turn"
            )
        source = self.turns[index]
        turn = source if isinstance(source, Turn) else source(messages, tools)
        if not isinstance(turn, Turn):
            raise UserError(f"scripted turn {index} returned {turn!r}, not a Turn")
        parts: list[TextPart | ToolCall] = [TextPart(turn.text)] if turn.text else []
        names = self._names
        i = 0
        for tool_id, arguments in turn.tool_calls:  # no enumerate: one object less a turn
            text = arguments if isinstance(arguments, str) else _dumps(arguments)
            name = names.get(tool_id)
            if name is None:
                name = names[tool_id] = ToolId.parse(tool_id).model_name
            parts.append(_tool_call(f"call_{index}_{i}", name, text))
            i += 1
        if not parts:
            parts.append(TextPart(""))
        finish = "tool_calls" if turn.tool_calls else "stop"
        return _response(tuple(parts), finish, self._name)
