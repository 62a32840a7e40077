"""The model seam's vocabulary: messages, parts, responses, usage and settings.

Provider-neutral and persisted with every run, so every type here is a frozen dataclass with
a `kind` tag; `dump_messages`/`load_messages` round-trip them through JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from handrail.tools import TaggedUnion, ToolResult

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "MAX_COUNT",
    "AssistantMessage",
    "Message",
    "ModelResponse",
    "ModelSettings",
    "Part",
    "ResponseDone",
    "StreamEvent",
    "SystemMessage",
    "TextDelta",
    "TextPart",
    "ThinkingDelta",
    "ThinkingPart",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStart",
    "ToolResultMessage",
    "Usage",
    "UserMessage",
    "dump_messages",
    "load_messages",
    "provider_int",
    "replay",
]


@dataclass(frozen=True, slots=True)
class SystemMessage:
    """Instructions for the model."""

    text: str
    """The instructions."""
    kind: Literal["system"] = "system"


@dataclass(frozen=True, slots=True)
class UserMessage:
    """What the user says (the task)."""

    text: str
    """The user's words."""
    kind: Literal["user"] = "user"


@dataclass(frozen=True, slots=True)
class TextPart:
    """Text the model wrote."""

    text: str
    """The text."""
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for."""

    id: str
    """The call id; every id gets exactly one `ToolResultMessage`."""
    name: str
    """The model-facing tool name (`ToolId.model_name`), exactly as the model sent it."""
    arguments: str
    """The arguments as the JSON text the model produced (validated by the gate, not here)."""
    kind: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True, slots=True)
class ThinkingPart:
    """Reasoning a provider returned and requires to be sent back unchanged (Anthropic)."""

    text: str
    """The visible reasoning text (empty for redacted thinking)."""
    signature: str | None = None
    """The provider's signature over the block."""
    provider: str = ""
    """Which provider produced it; other providers drop it when sending."""
    redacted: str | None = None
    """Opaque data of a redacted thinking block."""
    kind: Literal["thinking"] = "thinking"


Part = Annotated[TextPart | ToolCall | ThinkingPart, TaggedUnion("kind")]
"""One part of an assistant message, in the order the model produced them."""


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """One model turn: text, thinking and tool calls, in order."""

    parts: Sequence[TextPart | ToolCall | ThinkingPart]
    """The turn's parts, in the order produced."""
    kind: Literal["assistant"] = "assistant"

    def __post_init__(self) -> None:
        if type(self.parts) is not tuple:
            object.__setattr__(self, "parts", tuple(self.parts))

    @property
    def text(self) -> str:
        """All text parts joined."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls, in order."""
        calls: list[ToolCall] = []
        for p in self.parts:  # a loop, not a comprehension: the loop reads this every turn
            if isinstance(p, ToolCall):
                calls.append(p)
        return calls


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    """The result of one tool call, sent back to the model."""

    call_id: str
    """The id of the `ToolCall` this answers."""
    name: str
    """The model-facing name of the tool that was called."""
    result: ToolResult
    """What the model sees (may be `is_error`)."""
    kind: Literal["tool_result"] = "tool_result"


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolResultMessage,
    TaggedUnion("kind"),
]
"""Any message of a conversation."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one model request cost."""

    input_tokens: int = 0
    """Prompt tokens (including cached)."""
    output_tokens: int = 0
    """Completion tokens (including reasoning)."""
    requests: int = 1
    """How many requests this covers."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.requests + other.requests,
        )


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What a model returned for one request."""

    message: AssistantMessage
    """The assistant turn."""
    usage: Usage = field(default_factory=Usage)
    """What it cost."""
    finish_reason: str | None = None
    """The provider's stop reason, normalised: `stop`, `tool_calls`, `length`, ..."""
    model: str | None = None
    """The model that answered, as the provider names it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """Per-request settings; None means the provider's default."""

    max_tokens: int | None = None
    """Upper bound on output tokens."""
    temperature: float | None = None
    """Sampling temperature."""
    tool_choice: Literal["auto", "required", "none"] | None = None
    """Whether the model may, must, or must not call tools."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Provider-specific fields merged into the request body."""
    stream: bool | None = None
    """False: never ask the server to stream (for servers that ignore or break `stream`);
    a streamed request then sends one plain request and replays its answer as events."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A fragment of assistant text, as it streams in."""

    text: str
    """The new text; concatenating every delta gives the turn's text."""
    kind: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A fragment of the model's visible reasoning, as it streams in."""

    text: str
    """The new reasoning text."""
    kind: Literal["thinking_delta"] = "thinking_delta"


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model began a tool call; its arguments follow as `ToolCallDelta`s."""

    id: str
    """The call id (invented when the provider sent none), as in the final `ToolCall`."""
    name: str
    """The model-facing tool name, exactly as the provider sent it."""
    kind: Literal["tool_call_start"] = "tool_call_start"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call's JSON arguments text."""

    id: str
    """The id of the call the fragment belongs to (a `ToolCallStart` came first)."""
    arguments_fragment: str
    """Raw text; the fragments of one call concatenated are its `ToolCall.arguments`."""
    kind: Literal["tool_call_delta"] = "tool_call_delta"


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """The stream ended; always the last event, carrying the whole assembled response."""

    response: ModelResponse
    """The same response `Model.request` would have returned."""
    kind: Literal["response_done"] = "response_done"


StreamEvent = TextDelta | ThinkingDelta | ToolCallStart | ToolCallDelta | ResponseDone
"""One event of a streamed model response; `ResponseDone` is always last."""


@functools.cache
def _adapter() -> TypeAdapter[list[Any]]:
    # pydantic is imported on first use, not with the module (issue 11).
    from pydantic import TypeAdapter

    return TypeAdapter(list[Message])


def _dump_part(part: TextPart | ToolCall | ThinkingPart) -> dict[str, Any]:
    if isinstance(part, ToolCall):
        return {"kind": "tool_call", "id": part.id, "name": part.name,
                "arguments": part.arguments}
    if isinstance(part, TextPart):
        return {"kind": "text", "text": part.text}
    return {"kind": "thinking", "text": part.text, "signature": part.signature,
            "provider": part.provider, "redacted": part.redacted}


def dump_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as JSON-compatible dicts; `load_messages` reverses it.

    Written out by hand rather than through pydantic: the agent loop dumps every message it
    stores, so this is on the per-turn path.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if type(message) is AssistantMessage:
            # A model's turn, every turn: its parts in a loop, a call's dict written here (a
            # comprehension and a function call a part cost as much as the dicts, issue 38).
            parts: list[dict[str, Any]] = []
            for p in message.parts:
                parts.append({"kind": "tool_call", "id": p.id, "name": p.name,
                              "arguments": p.arguments} if type(p) is ToolCall
                             else _dump_part(p))
            out.append({"kind": "assistant", "parts": parts})
        elif isinstance(message, ToolResultMessage):
            out.append({"kind": "tool_result", "call_id": message.call_id, "name": message.name,
                        "result": message.result.to_dict()})
        elif isinstance(message, AssistantMessage):
            out.append({"kind": "assistant", "parts": [_dump_part(p) for p in message.parts]})
        elif isinstance(message, SystemMessage | UserMessage):
            out.append({"kind": message.kind, "text": message.text})
        else:
            raise TypeError(f"not a message: {message!r}")
    return out


def load_messages(data: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Rebuild messages from `dump_messages` output."""
    out: list[Any] = []
    for item in data:
        if item.get("kind") == "tool_result":
            out.append(ToolResultMessage(item["call_id"], item["name"],
                                         ToolResult.from_dict(item["result"])))
        else:
            out.append(_adapter().validate_python([item])[0])
    return out


def replay(response: ModelResponse) -> list[StreamEvent]:
    """The events a stream of `response` would have carried, `ResponseDone` last.

    For a streamed request answered whole (a server that ignores `stream: true`, or
    `ModelSettings(stream=False)`): listeners see the same kinds of events either way.
    """
    events: list[StreamEvent] = []
    for part in response.message.parts:
        if isinstance(part, TextPart) and part.text:
            events.append(TextDelta(part.text))
        elif isinstance(part, ThinkingPart) and part.text:
            events.append(ThinkingDelta(part.text))
        elif isinstance(part, ToolCall):
            events.append(ToolCallStart(part.id, part.name))
            if part.arguments:
                events.append(ToolCallDelta(part.id, part.arguments))
    events.append(ResponseDone(response))
    return events


MAX_COUNT = 2**53
"""The largest count (tokens, an index) a provider's answer may carry: JSON's exact integers."""


def provider_int(value: Any, what: str) -> int:
    """A count from a provider's answer (absent is 0), checked: a whole number in 0..2**53.

    `int()` alone turns `1e999` (infinity) into an OverflowError, `NaN` into a ValueError, and
    `1e300` into an integer no store can hold; a count like that means the answer is malformed.

    Raises:
        ValueError: anything else (caught with `MALFORMED`, it becomes a `ModelResponseError`).
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (isinstance(value, float) and not value.is_integer()) or \
            not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} is {value!r}, not a whole number from 0 to 2**53")
    return int(value)
