"""OpenAIChat: conversions both ways, call ids, strict mode, quirks of compatible servers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_server import Reply, serve
from pydantic import BaseModel, Field

from handrail.models import (
    AssistantMessage,
    ModelSettings,
    OpenAIChat,
    ResponseDone,
    StreamingModel,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolResultMessage,
    UserMessage,
)
from handrail.models._openai import convert_messages, strict_compatible
from handrail.tools import Audio, Image, Json, ResourceLink, Text, ToolId, ToolResult, ToolSpec

pytestmark = pytest.mark.anyio

PNG = Image.from_bytes(b"\x89PNG\r\n\x1a\n fake", "image/png")


def _completion(message: dict[str, Any], finish: Any = "tool_calls") -> dict[str, Any]:
    return {"model": "m-2025", "choices": [{"index": 0, "message": message,
                                            "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def _call(call_id: Any, name: str, arguments: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not ...:
        out["id"] = call_id
    return out


async def _ask(reply: Reply, messages: list[Any] | None = None,
               tools: list[ToolSpec] | None = None, settings: Any = None) -> Any:
    async with serve([reply]) as server:
        async with OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k") as model:
            response = await model.request(messages or [UserMessage("go")], tools or [],
                                           settings)
    return response, server.requests[0].json()


def test_is_a_streaming_model() -> None:
    assert isinstance(OpenAIChat("m", base_url="http://127.0.0.1:1/v1"), StreamingModel)


async def test_parallel_calls_parsed_in_order_and_sent_back_paired() -> None:
    reply = Reply(200, _completion({"role": "assistant", "content": "Checking both.",
                                    "tool_calls": [_call("a1", "weather", '{"city":"Paris"}'),
                                                   _call("a2", "ledger--read", '{"id":7}')]}))
    response, _ = await _ask(reply)
    calls = response.message.tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("a1", "weather", '{"city":"Paris"}'), ("a2", "ledger--read", '{"id":7}')]
    assert ToolId.from_model_name(calls[1].name) == ToolId("ledger", "read")
    assert response.message.text == "Checking both."
    assert response.finish_reason == "tool_calls" and response.model == "m-2025"

    history = [UserMessage("go"), response.message,
               ToolResultMessage("a1", "weather", ToolResult.text("sunny")),
               ToolResultMessage("a2", "ledger--read", ToolResult.json({"balance": 3}))]
    sent = convert_messages(history)
    assert sent[1] == {"role": "assistant", "content": "Checking both.", "tool_calls": [
        {"id": "a1", "type": "function", "function": {"name": "weather",
                                                      "arguments": '{"city":"Paris"}'}},
        {"id": "a2", "type": "function", "function": {"name": "ledger--read",
                                                      "arguments": '{"id":7}'}}]}
    assert sent[2:] == [{"role": "tool", "tool_call_id": "a1", "content": "sunny"},
                        {"role": "tool", "tool_call_id": "a2", "content": '{"balance":3}'}]


@pytest.mark.parametrize("given", ["", None, ..., "dup"])
async def test_missing_or_repeated_call_ids_are_invented(given: Any) -> None:
    reply = Reply(200, _completion({"role": "assistant", "content": None, "tool_calls": [
        _call(given, "a", "{}"), _call(given, "b", "{}")]}))
    response, _ = await _ask(reply)
    ids = [c.id for c in response.message.tool_calls]
    assert len(set(ids)) == 2 and all(ids)
    if given == "dup":
        assert ids[0] == "dup"  # the first keeps the provider's id
    # The ids we made are the ones the results answer, and they go back as sent.
    results = [ToolResultMessage(i, n, ToolResult.text("ok"))
               for i, n in zip(ids, "ab", strict=True)]
    history = [UserMessage("go"), response.message, *results]
    sent = convert_messages(history)
    assert [c["id"] for c in sent[1]["tool_calls"]] == ids
    assert [m["tool_call_id"] for m in sent[2:]] == ids


async def test_arguments_are_kept_verbatim_even_when_not_json() -> None:
    broken = '{"city": "Tok'
    reply = Reply(200, _completion({"role": "assistant", "tool_calls": [
        _call("c1", "weather", broken), _call("c2", "now", ""), _call("c3", "now", None)]}))
    response, _ = await _ask(reply)
    assert [c.arguments for c in response.message.tool_calls] == [broken, "{}", "{}"]
    sent = convert_messages([response.message])
    assert sent[0]["tool_calls"][0]["function"]["arguments"] == broken


@pytest.mark.parametrize(
    ("raw", "has_calls", "expected"),
    [("stop", False, "stop"), ("length", False, "length"), ("content_filter", False,
     "content_filter"), ("function_call", True, "tool_calls"), ("stop", True, "tool_calls"),
     (None, True, "tool_calls"), (None, False, "stop"), ("eos_token", False, "eos_token")],
)
async def test_finish_reason_normalised(raw: Any, has_calls: bool, expected: str) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": "x"}
    if has_calls:
        message["tool_calls"] = [_call("c", "t", "{}")]
    response, _ = await _ask(Reply(200, _completion(message, raw)))
    assert response.finish_reason == expected


async def test_reasoning_of_compatible_servers_is_kept_and_never_sent_back() -> None:
    reply = Reply(200, _completion({"role": "assistant", "content": "4",
                                    "reasoning_content": "2+2"}, "stop"))
    response, _ = await _ask(reply)
    assert response.message.parts == (ThinkingPart("2+2", provider="openai"), TextPart("4"))
    sent = convert_messages([response.message])
    assert sent == [{"role": "assistant", "content": "4"}]


async def test_request_body_fields() -> None:
    spec = ToolSpec("ledger/transfer", "Move money.", {
        "type": "object", "properties": {"amount": {"type": "integer"}},
        "required": ["amount"], "additionalProperties": False})
    loose = ToolSpec("note", "Note.", {"type": "object", "properties": {"x": {"type": "string"}}})
    settings = ModelSettings(max_tokens=50, temperature=0.2, tool_choice="required",
                             extra={"seed": 7})
    _, body = await _ask(Reply(200, _completion({"content": "ok"}, "stop")),
                         [SystemMessage("be brief"), UserMessage("pay")], [spec, loose], settings)
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "pay"}]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "ledger--transfer", "description": "Move money.",
                                          "parameters": dict(spec.input_schema), "strict": True}},
        {"type": "function", "function": {"name": "note", "description": "Note.",
                                          "parameters": dict(loose.input_schema)}}]
    assert body["tool_choice"] == "required"
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2 and body["seed"] == 7
    assert "stream" not in body


async def test_no_tools_means_no_tool_choice() -> None:
    _, body = await _ask(Reply(200, _completion({"content": "ok"}, "stop")))
    assert "tools" not in body and "tool_choice" not in body


def test_strict_mode_only_when_the_schema_allows_it() -> None:
    class Address(BaseModel):
        street: str
        zip_code: str = Field(pattern=r"^\d{5}$")

    class Closed(BaseModel, extra="forbid"):
        name: str
        tags: list[str]
        kind: int | None

    closed = Closed.model_json_schema()
    assert strict_compatible(closed)
    assert strict_compatible({"type": "object", "properties": {}, "additionalProperties": False})
    # an optional property
    assert not strict_compatible({"type": "object", "properties": {"a": {"type": "string"}},
                                  "additionalProperties": False})
    # additional properties allowed (the default)
    assert not strict_compatible({"type": "object", "properties": {"a": {"type": "string"}},
                                  "required": ["a"]})
    # an open nested object
    assert not strict_compatible(
        {"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
         "required": ["a"], "additionalProperties": False})
    # a keyword strict mode does not take
    assert not strict_compatible(
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}},
         "required": ["a"], "additionalProperties": False})
    # $defs are checked too: Address allows additional properties
    class Person(BaseModel, extra="forbid"):
        address: Address
    assert not strict_compatible(Person.model_json_schema())


def test_images_follow_the_run_of_tool_messages_and_other_content_is_described() -> None:
    audio = Audio(data="AAAA", mime_type="audio/wav")
    link = ResourceLink(uri="file:///r.txt", name="r")
    history = [
        AssistantMessage([ThinkingPart("hmm", "sig", "anthropic"),
                          ToolCall("c1", "shot", "{}"), ToolCall("c2", "rec", "{}")]),
        ToolResultMessage("c1", "shot", ToolResult([Text("done"), PNG, Json([1])])),
        ToolResultMessage("c2", "rec", ToolResult([audio, link], is_error=True)),
        UserMessage("and now?"),
    ]
    sent = convert_messages(history)
    assert [m["role"] for m in sent] == ["assistant", "tool", "tool", "user", "user"]
    assert sent[0]["content"] is None  # thinking from another provider is dropped
    assert sent[1]["content"] == ("done\n[image 1 (image/png) of this result follows in the "
                                  "next user message]\n[1]")
    assert sent[2]["content"].startswith("Error: [audio audio/wav, 3 bytes, not shown]")
    assert "[resource r: file:///r.txt]" in sent[2]["content"]
    assert sent[3]["content"] == [
        {"type": "text", "text": "Image 1 returned by tool call c1 (shot):"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG.data}"}}]
    assert sent[4] == {"role": "user", "content": "and now?"}


def test_unknown_message_type_is_refused() -> None:
    from handrail.errors import UserError

    with pytest.raises(UserError, match="cannot send dict"):
        convert_messages([{"role": "user", "content": "hi"}])


def _sse(*chunks: Any, done: bool = True) -> str:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return body + ("data: [DONE]\n\n" if done else "")


def _delta(delta: dict[str, Any], finish: Any = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def _stream(body: str) -> list[Any]:
    async with serve([Reply(200, body, "text/event-stream")]) as server:
        async with OpenAIChat("m", base_url=f"{server.url}/v1", api_key="k") as model:
            events = [e async for e in model.request_stream([UserMessage("go")], [])]
    sent = server.requests[0].json()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    return events


async def test_stream_assembles_parallel_calls_from_interleaved_deltas() -> None:
    body = _sse(
        _delta({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "a",
                                                                      "arguments": ""}}]}),
        _delta({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "b",
                                                                      "arguments": '{"y'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
        _delta({"tool_calls": [{"index": 1, "function": {"arguments": '":2}'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        _delta({}, "tool_calls"),
    )
    events = await _stream(body)
    assert events[:-1] == [
        ToolCallStart("c0", "a"), ToolCallStart("c1", "b"), ToolCallDelta("c1", '{"y'),
        ToolCallDelta("c0", '{"x":'), ToolCallDelta("c1", '":2}'), ToolCallDelta("c0", "1}")]
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.tool_calls == [ToolCall("c0", "a", '{"x":1}'),
                                                ToolCall("c1", "b", '{"y":2}')]


async def test_stream_from_a_server_without_ids_or_indexes() -> None:
    # Some compatible servers send each call whole, with no index and an empty id.
    body = _sse(
        _delta({"tool_calls": [{"id": "", "function": {"name": "a", "arguments": '{"x":1}'}}]}),
        _delta({"tool_calls": [{"id": "", "function": {"name": "b", "arguments": "{}"}}]}),
        _delta({}, "stop"),
    )
    events = await _stream(body)
    done = events[-1]
    assert isinstance(done, ResponseDone)
    calls = done.response.message.tool_calls
    assert done.response.finish_reason == "tool_calls"
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(c.name, c.arguments) for c in calls] == [("a", '{"x":1}'), ("b", "{}")]
    assert [s.id for s in starts] == [c.id for c in calls]
    assert all(c.id.startswith("call_hr_") for c in calls)


async def test_stream_without_done_marker_but_with_finish_is_complete() -> None:
    events = await _stream(_sse(_delta({"content": "hi"}), _delta({}, "stop"), done=False))
    done = events[-1]
    assert isinstance(done, ResponseDone) and done.response.message.text == "hi"


async def test_error_inside_a_200() -> None:
    from handrail.errors import ModelUnavailable

    reply = Reply(200, {"error": {"message": "upstream timeout", "code": 502}})
    with pytest.raises(ModelUnavailable, match="upstream timeout"):
        await _ask(reply)
    with pytest.raises(ModelUnavailable, match="provider down"):
        await _stream(_sse({"error": {"message": "provider down"}}))


def test_encoded_body_is_the_converted_history_on_every_call() -> None:
    model = OpenAIChat("m", base_url="http://127.0.0.1:1/v1", api_key="k")
    history: list[Any] = [SystemMessage("s"), UserMessage("u")]
    for i in range(3):
        history.append(AssistantMessage([TextPart(f"t{i}"), ToolCall(f"c{i}", "shot", "{}")]))
        history.append(ToolResultMessage(f"c{i}", "shot", ToolResult([Text("x"), PNG])))
        body = json.loads(model._body(history, [], ModelSettings(temperature=0.1), False))
        assert body == {"model": "m", "temperature": 0.1, "messages": convert_messages(history)}
    # the image message follows the run of tool messages, also when the run ends the history
    assert body["messages"][-1]["role"] == "user"
    replaced = json.loads(model._body(history, [], ModelSettings(extra={"messages": []}), False))
    assert replaced["messages"] == []
