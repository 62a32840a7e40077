"""Anthropic: conversions both ways, thinking echo, rich tool results, streaming details."""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_server import Reply, serve

from handrail.errors import ModelRequestError, ModelUnavailable
from handrail.models import (
    Anthropic,
    AssistantMessage,
    ModelSettings,
    ResponseDone,
    StreamingModel,
    SystemMessage,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolResultMessage,
    UserMessage,
)
from handrail.models._anthropic import convert_messages, wire_id
from handrail.tools import Audio, Image, Json, Text, ToolResult, ToolSpec

pytestmark = pytest.mark.anyio

PNG = Image.from_bytes(b"\x89PNG\r\n\x1a\n fake", "image/png")


def _message(content: list[dict[str, Any]], stop: str = "tool_use") -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "model": "claude-x-2025", "content": content,
            "stop_reason": stop, "usage": {"input_tokens": 10, "cache_read_input_tokens": 90,
                                           "cache_creation_input_tokens": 0,
                                           "output_tokens": 7}}


async def _ask(reply: Reply, messages: list[Any] | None = None,
               tools: list[ToolSpec] | None = None, settings: Any = None) -> Any:
    async with serve([reply]) as server:
        async with Anthropic("claude-x", base_url=server.url, api_key="k") as model:
            response = await model.request(messages or [UserMessage("go")], tools or [],
                                           settings)
    return response, server.requests[0].json()


def test_is_a_streaming_model() -> None:
    assert isinstance(Anthropic("c", base_url="http://127.0.0.1:1"), StreamingModel)


async def test_response_parts_usage_and_round_trip() -> None:
    content = [
        {"type": "thinking", "thinking": "plan", "signature": "SIG"},
        {"type": "redacted_thinking", "data": "OPAQUE"},
        {"type": "text", "text": "Calling two tools."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Zürich"}},
        {"type": "tool_use", "id": "toolu_2", "name": "ledger--read", "input": {}},
    ]
    response, _ = await _ask(Reply(200, _message(content)))
    assert response.message.parts == (
        ThinkingPart("plan", "SIG", "anthropic"),
        ThinkingPart("", None, "anthropic", "OPAQUE"),
        TextPart("Calling two tools."),
        ToolCall("toolu_1", "weather", '{"city":"Zürich"}'),
        ToolCall("toolu_2", "ledger--read", "{}"),
    )
    assert (response.usage.input_tokens, response.usage.output_tokens) == (100, 7)
    assert response.finish_reason == "tool_calls" and response.model == "claude-x-2025"

    results = [ToolResultMessage("toolu_1", "weather", ToolResult.text("cold")),
               ToolResultMessage("toolu_2", "ledger--read", ToolResult.error("locked"))]
    system, sent = convert_messages([SystemMessage("a"), SystemMessage("b"), UserMessage("go"),
                                     response.message, *results, UserMessage("thanks")])
    assert system == "a\n\nb"
    assert sent[1] == {"role": "assistant", "content": content}  # echoed unchanged
    assert sent[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "locked", "is_error": True},
        {"type": "text", "text": "thanks"}]}


def test_images_go_into_tool_results_and_the_rest_is_described() -> None:
    bmp = Image.from_bytes(b"BM...", "image/bmp")
    audio = Audio(data="AAAA", mime_type="audio/wav")
    _, sent = convert_messages([
        AssistantMessage([ToolCall("t1", "shot", "{}"), ToolCall("t2", "rec", "{}")]),
        ToolResultMessage("t1", "shot", ToolResult([Text("look"), PNG, Json({"w": 2})])),
        ToolResultMessage("t2", "rec", ToolResult([bmp, audio])),
    ])
    first, second = sent[1]["content"]
    assert first["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PNG.data}},
        {"type": "text", "text": '{"w":2}'}]
    assert second["content"] == ("[image image/bmp, 5 bytes, not shown]\n"
                                 "[audio audio/wav, 3 bytes, not shown]")


def test_thinking_from_other_providers_and_empty_text_are_not_sent() -> None:
    _, sent = convert_messages([
        UserMessage("q"),
        AssistantMessage([ThinkingPart("r1", provider="openai"), TextPart(""),
                          ThinkingPart("unsigned", None, "anthropic"), TextPart("a")]),
        AssistantMessage([TextPart("")]),
        UserMessage("q2"),
    ])
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "q"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
                    {"role": "user", "content": [{"type": "text", "text": "q2"}]}]


def test_foreign_call_ids_and_broken_arguments_still_make_a_valid_turn() -> None:
    _, sent = convert_messages([
        AssistantMessage([ToolCall("fc:1/x", "t", '{"a": tru'), ToolCall("fc:1.x", "t", "")]),
        ToolResultMessage("fc:1/x", "t", ToolResult.text("r1")),
        ToolResultMessage("fc:1.x", "t", ToolResult.text("r2")),
    ])
    uses, results = sent[0]["content"], sent[1]["content"]
    assert uses[0]["input"] == {"INVALID_JSON": '{"a": tru'} and uses[1]["input"] == {}
    ids = [u["id"] for u in uses]
    assert len(set(ids)) == 2 and all(wire_id(i) == i for i in ids)
    assert [r["tool_use_id"] for r in results] == ids


async def test_request_body_fields() -> None:
    spec = ToolSpec("ledger/transfer", "Move money.", {"type": "object", "properties": {}})
    settings = ModelSettings(temperature=0.5, tool_choice="required",
                             extra={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    _, body = await _ask(Reply(200, _message([{"type": "text", "text": "ok"}], "end_turn")),
                         [SystemMessage("sys"), UserMessage("go")], [spec], settings)
    assert body["system"] == "sys" and body["max_tokens"] == 4096
    assert body["tools"] == [{"name": "ledger--transfer", "description": "Move money.",
                              "input_schema": {"type": "object", "properties": {}}}]
    assert body["tool_choice"] == {"type": "any"}
    assert body["temperature"] == 0.5 and body["thinking"]["budget_tokens"] == 1024


@pytest.mark.parametrize(("raw", "expected"), [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
    ("refusal", "content_filter"), ("pause_turn", "pause_turn")])
async def test_stop_reason_normalised(raw: str, expected: str) -> None:
    response, _ = await _ask(Reply(200, _message([{"type": "text", "text": "x"}], raw)))
    assert response.finish_reason == expected


def _sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


START = {"type": "message_start", "message": {"model": "claude-x", "usage": {
    "input_tokens": 5, "output_tokens": 1}}}


async def _stream(body: str) -> list[Any]:
    async with serve([Reply(200, body, "text/event-stream")]) as server:
        async with Anthropic("claude-x", base_url=server.url, api_key="k") as model:
            events = [e async for e in model.request_stream([UserMessage("go")], [])]
    assert server.requests[0].json()["stream"] is True
    return events


async def test_stream_thinking_signature_text_and_calls() -> None:
    body = _sse(
        START,
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "let me"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "SIG"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "toolu_9", "name": "t", "input": {}}},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": {
            "type": "tool_use", "id": "toolu_9", "name": "u", "input": {"k": 1}}},
        {"type": "content_block_stop", "index": 3},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 30}},
        {"type": "message_stop"},
    )
    events = await _stream(body)
    second_id = events[4].id
    assert second_id != "toolu_9"  # a repeated id is replaced, consistently
    assert events[:-1] == [ThinkingDelta("let me"), TextDelta("ok"), ToolCallStart("toolu_9", "t"),
                           ToolCallStart(second_id, "u"), ToolCallDelta(second_id, '{"k":1}')]
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.parts == (
        ThinkingPart("let me", "SIG", "anthropic"), TextPart("ok"),
        ToolCall("toolu_9", "t", "{}"), ToolCall(second_id, "u", '{"k":1}'))
    assert (done.response.usage.input_tokens, done.response.usage.output_tokens) == (5, 30)


@pytest.mark.parametrize(("kind", "error"), [("overloaded_error", ModelUnavailable),
                                             ("invalid_request_error", ModelRequestError)])
async def test_stream_error_event(kind: str, error: type[Exception]) -> None:
    body = _sse(START, {"type": "error", "error": {"type": kind, "message": "it broke"}})
    with pytest.raises(error, match="it broke"):
        await _stream(body)


async def test_stream_without_message_stop_is_truncated() -> None:
    body = _sse(START, {"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": "par"}})
    with pytest.raises(ModelUnavailable, match="before message_stop"):
        await _stream(body)
