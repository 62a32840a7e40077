"""Objects built on every call through their slots' setters (issue 11) are the objects their
constructors build: every field set, nothing else, equal and hashed alike."""

from __future__ import annotations

import dataclasses

import pytest

from handrail import gate
from handrail.models import (
    AssistantMessage,
    ModelResponse,
    Scripted,
    TextPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    _scripted,
    calls,
)
from handrail.tools import Text, ToolResult
from handrail.tools._content import text_result

pytestmark = pytest.mark.anyio


def _field_values(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def test_a_text_result_is_the_constructors() -> None:
    built = text_result("3", 3)
    assert _field_values(built) == _field_values(ToolResult((Text("3"),), 3))
    assert _field_values(built.content[0]) == _field_values(Text("3"))
    assert built == ToolResult((Text("3"),), 3)


def test_a_result_message_is_the_constructors() -> None:
    result = ToolResult.text("ok")
    built = gate._result_message("c1", "srv--tool", result)
    made = ToolResultMessage("c1", "srv--tool", result)
    assert _field_values(built) == _field_values(made)
    assert built == made


async def test_a_scripted_response_is_the_constructors() -> None:
    model = Scripted([calls([("srv/a", {"x": 1}), ("srv/b", "{}")])])
    built = await model.request([], [])
    made = ModelResponse(AssistantMessage((ToolCall("call_0_0", "srv--a", '{"x": 1}'),
                                           ToolCall("call_0_1", "srv--b", "{}"))),
                         Usage(0, 0), "tool_calls", "scripted")
    assert built == made and hash(built.message) == hash(made.message)
    assert _field_values(built) == _field_values(made)
    for part, expected in zip(built.message.parts, made.message.parts, strict=True):
        assert _field_values(part) == _field_values(expected)
    text = _scripted._response((TextPart("hi"),), "stop", "m")
    assert text == ModelResponse(AssistantMessage((TextPart("hi"),)), Usage(0, 0), "stop", "m")


@pytest.mark.parametrize(("cls", "names"), [
    (ToolCall, ("id", "name", "arguments", "kind")),
    (AssistantMessage, ("parts", "kind")),
    (ModelResponse, ("message", "usage", "finish_reason", "model")),
    (ToolResultMessage, ("call_id", "name", "result", "kind")),
    (ToolResult, ("content", "structured", "is_error", "metadata")),
    (Text, ("text", "kind")),
])
def test_the_fast_builders_set_every_field(cls: type, names: tuple[str, ...]) -> None:
    # A field added to one of these classes must be set by its builder too.
    assert tuple(f.name for f in dataclasses.fields(cls)) == names
