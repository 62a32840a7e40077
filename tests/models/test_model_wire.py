"""The adapters replay real recorded exchanges (tests/fixtures/wire, see its README).

A local server answers with the recorded responses in order. Each test runs the adapter
through the recorded conversation (prompt and tools from the first request, tool results from
the later ones, our own parsed assistant turns in between) and checks that (1) the tool calls
parsed from each response are the recorded ones and (2) every request the adapter sent equals
the recorded request on the fields the adapter controls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from model_server import load_wire, replies_from_wire, serve

from handrail.models import (
    Anthropic,
    AssistantMessage,
    ModelResponse,
    ModelSettings,
    OpenAIChat,
    ResponseDone,
    SystemMessage,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolResultMessage,
    UserMessage,
)
from handrail.models._openai import strict_compatible
from handrail.tools import Image, Text, ToolId, ToolResult, ToolSpec

pytestmark = pytest.mark.anyio

OPENAI = [
    "openai-chat__single_tool_call",
    "openai-chat__multi_turn_tool_history",
    "openai-chat__image_tool_response",
    "openai-chat__stream_tool_call",
    "openai-chat__tool_choice_required_output_tool",
]
ANTHROPIC = [
    "anthropic-messages__tool_with_thinking",
    "anthropic-messages__extended_thinking_with_tool_use",
    "anthropic-messages__sequential_tool_calls_strict",
    "anthropic-messages__stream_tool_use",
]


def _spec(name: str, description: str, schema: dict[str, Any]) -> ToolSpec:
    tool_id = ToolId.from_model_name(name)
    assert tool_id is not None
    return ToolSpec(tool_id, description, schema)


# --- decoding recorded requests into our messages (the test's own, independent reading) ---


def _decode_openai(messages: Sequence[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    names: dict[str, str] = {}
    for m in messages:
        content = m.get("content")
        if m["role"] == "system":
            out.append(SystemMessage(content))
        elif m["role"] == "user":
            if isinstance(content, list) and any(p["type"] == "image_url" for p in content):
                # How the adapter shows a tool result's image: fold it back into that result.
                previous = out[-1]
                assert isinstance(previous, ToolResultMessage)
                images = []
                for p in content:
                    if p["type"] == "image_url":
                        head, _, data = p["image_url"]["url"].partition(";base64,")
                        images.append(Image(data=data, mime_type=head.removeprefix("data:")))
                out[-1] = ToolResultMessage(previous.call_id, previous.name, ToolResult(images))
                continue
            if isinstance(content, list):
                content = "".join(p["text"] for p in content)
            out.append(UserMessage(content))
        elif m["role"] == "assistant":
            parts: list[Any] = [TextPart(content)] if content else []
            for c in m.get("tool_calls") or []:
                names[c["id"]] = c["function"]["name"]
                parts.append(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]))
            out.append(AssistantMessage(parts))
        elif m["role"] == "tool":
            call_id = m["tool_call_id"]
            out.append(ToolResultMessage(call_id, names[call_id], ToolResult.text(content)))
    return out


def _decode_anthropic(body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    if body.get("system"):
        out.append(SystemMessage(body["system"]))
    names: dict[str, str] = {}
    for m in body["messages"]:
        blocks = m["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if m["role"] == "user":
            for b in blocks:
                if b["type"] == "text":
                    out.append(UserMessage(b["text"]))
                elif b["type"] == "tool_result":
                    result = ToolResult((Text(b["content"]),), None, b.get("is_error", False))
                    out.append(ToolResultMessage(b["tool_use_id"], names[b["tool_use_id"]], result))
        else:
            parts: list[Any] = []
            for b in blocks:
                if b["type"] == "thinking":
                    parts.append(ThinkingPart(b["thinking"], b["signature"], "anthropic"))
                elif b["type"] == "text":
                    parts.append(TextPart(b["text"]))
                elif b["type"] == "tool_use":
                    names[b["id"]] = b["name"]
                    parts.append(ToolCall(b["id"], b["name"], json.dumps(b["input"])))
            out.append(AssistantMessage(parts))
    return out


# --- normalising request bodies to the fields the adapter controls ---


def _norm_openai(body: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for m in body["messages"]:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list) and any(p["type"] == "image_url" for p in content):
            # Our caption text differs from pydantic-ai's; the image itself must be identical.
            m["content"] = [p for p in content if p["type"] == "image_url"]
            messages[-1]["content"] = "<text of a tool result whose image follows>"
        elif isinstance(content, list):
            m["content"] = "".join(p["text"] for p in content)
        messages.append(m)
    tools = [
        {k: t["function"][k] for k in ("name", "description", "parameters")}
        for t in body.get("tools", [])
    ]
    return {
        "model": body["model"],
        "messages": messages,
        "tools": tools,
        "tool_choice": body.get("tool_choice"),
        "stream": bool(body.get("stream")),
    }


def _norm_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for m in body["messages"]:
        blocks = []
        for b in m["content"]:
            b = dict(b)
            if b["type"] == "tool_result" and not b.get("is_error"):
                b.pop("is_error", None)
            blocks.append(b)
        messages.append({"role": m["role"], "content": blocks})
    server_tools = any("type" in t for t in body.get("tools", []))
    return {
        "model": body["model"],
        "system": body.get("system"),
        "messages": messages,
        # `strict` on a tool is pydantic-ai's choice (see the wire README).
        "tools": None if server_tools else [
            {k: v for k, v in t.items() if k != "strict"} for t in body.get("tools", [])
        ],
        "tool_choice": body.get("tool_choice"),
        "stream": bool(body.get("stream")),
        "max_tokens": body["max_tokens"],
        "thinking": body.get("thinking"),
        "temperature": body.get("temperature"),
    }


def _continues(previous: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    if previous is None:
        return False
    n = len(previous["messages"])
    return len(current["messages"]) > n and current["messages"][:n] == previous["messages"]


async def _run(model: Any, messages: list[Any], tools: list[ToolSpec], settings: Any, stream: bool
               ) -> ModelResponse:
    if not stream:
        response: ModelResponse = await model.request(messages, tools, settings)
        return response
    events = [e async for e in model.request_stream(messages, tools, settings)]
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert not any(isinstance(e, ResponseDone) for e in events[:-1])
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == done.response.message.text
    for call in done.response.message.tool_calls:
        starts = [e for e in events if isinstance(e, ToolCallStart) and e.id == call.id]
        assert starts == [ToolCallStart(call.id, call.name)]
        fragments = [e.arguments_fragment for e in events
                     if isinstance(e, ToolCallDelta) and e.id == call.id]
        assert "".join(fragments) == call.arguments
        assert len(fragments) > 1  # the recorded arguments arrive in several fragments
    return done.response


# --- OpenAI ---


def _openai_response(body: Any) -> dict[str, Any]:
    """The assistant message and usage of a recorded response (JSON or SSE)."""
    if isinstance(body, dict):
        message = body["choices"][0]["message"]
        return {
            "text": message.get("content") or "",
            "calls": [(c["id"], c["function"]["name"], c["function"]["arguments"])
                      for c in message.get("tool_calls") or []],
            "usage": (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]),
            "finish": body["choices"][0]["finish_reason"],
        }
    text, calls, usage, finish = "", {}, (0, 0), None
    for line in body.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line.removeprefix("data: "))
        if chunk.get("usage"):
            usage = (chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
            for c in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(c["index"], [c.get("id"), "", ""])
                entry[1] += c["function"].get("name") or ""
                entry[2] += c["function"].get("arguments") or ""
    return {"text": text, "calls": [tuple(c) for c in calls.values()], "usage": usage,
            "finish": finish}


@pytest.mark.parametrize("name", OPENAI)
async def test_openai_replays_recorded_exchange(name: str) -> None:
    wire = load_wire(name)
    interactions = wire["interactions"]
    first = interactions[0]["request"]["body"]
    tools = [_spec(t["function"]["name"], t["function"]["description"],
                   t["function"]["parameters"]) for t in first["tools"]]
    async with serve(replies_from_wire(wire)) as server:
        async with OpenAIChat(first["model"], base_url=f"{server.url}/v1", api_key="sk-test",
                              backoff_base=0.001) as model:
            history: list[Any] | None = None
            previous: dict[str, Any] | None = None
            for i, interaction in enumerate(interactions):
                recorded = interaction["request"]["body"]
                decoded = _decode_openai(recorded["messages"])
                if _continues(previous, recorded):
                    assert history is not None
                    messages = history + decoded[len(history):]
                else:
                    messages = decoded
                settings = ModelSettings(tool_choice=recorded.get("tool_choice"))
                response = await _run(model, messages, tools, settings, bool(recorded["stream"]))

                sent = server.requests[i]
                assert sent.path == "/v1/chat/completions"
                assert sent.headers["authorization"] == "Bearer sk-test"
                assert _norm_openai(sent.json()) == _norm_openai(recorded)
                for tool in sent.json()["tools"]:
                    function = tool["function"]
                    assert function.get("strict", False) == strict_compatible(
                        function["parameters"])

                expected = _openai_response(interaction["response"]["body"])
                got = response.message
                assert got.text == expected["text"]
                assert [(c.id, c.name, c.arguments) for c in got.tool_calls] == expected["calls"]
                assert (response.usage.input_tokens, response.usage.output_tokens) == \
                    expected["usage"]
                assert response.finish_reason == expected["finish"]
                history = [*messages, response.message]
                previous = recorded
    assert len(server.requests) == len(interactions)


async def test_openai_image_result_is_sent_as_a_following_user_message() -> None:
    wire = load_wire("openai-chat__image_tool_response")
    recorded = wire["interactions"][1]["request"]["body"]["messages"]
    async with serve(replies_from_wire(wire)) as server:
        async with OpenAIChat("gpt-4o", base_url=f"{server.url}/v1", api_key="k") as model:
            tool = _spec("get_image", "", {"type": "object", "properties": {}})
            first = await model.request([UserMessage("What fruit?")], [tool])
            (call,) = first.message.tool_calls
            image = recorded[-1]["content"][1]["image_url"]["url"].partition(";base64,")[2]
            result = ToolResult([Text("here it is"), Image(data=image, mime_type="image/jpeg")])
            await model.request(
                [UserMessage("What fruit?"), first.message,
                 ToolResultMessage(call.id, call.name, result)],
                [tool],
            )
    sent = server.requests[1].json()["messages"]
    tool_message, image_message = sent[-2], sent[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == call.id
    assert tool_message["content"].startswith("here it is\n[image 1 (image/jpeg)")
    assert "follows in the next user message" in tool_message["content"]
    assert image_message["role"] == "user"
    assert image_message["content"][0]["type"] == "text"
    assert call.id in image_message["content"][0]["text"]
    assert image_message["content"][1] == recorded[-1]["content"][1]


# --- Anthropic ---


def _anthropic_response(body: Any) -> dict[str, Any]:
    if isinstance(body, str):
        blocks: dict[int, dict[str, Any]] = {}
        usage = [0, 0]
        for line in body.splitlines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "message_start":
                usage[0] = event["message"]["usage"]["input_tokens"]
            elif event["type"] == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"], partial="")
            elif event["type"] == "content_block_delta":
                delta = event["delta"]
                block = blocks[event["index"]]
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "input_json_delta":
                    block["partial"] += delta["partial_json"]
            elif event["type"] == "message_delta":
                usage[1] = event["usage"]["output_tokens"]
                stop = event["delta"]["stop_reason"]
        content = []
        for _, block in sorted(blocks.items()):
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["partial"])
            block.pop("partial")
            content.append(block)
        body = {"content": content, "usage": {"input_tokens": usage[0],
                                              "output_tokens": usage[1]}, "stop_reason": stop}
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ANTHROPIC)
async def test_anthropic_replays_recorded_exchange(name: str) -> None:
    wire = load_wire(name)
    interactions = wire["interactions"]
    first = interactions[0]["request"]["body"]
    async with serve(replies_from_wire(wire)) as server:
        async with Anthropic(first["model"], base_url=server.url, api_key="sk-ant-test",
                             backoff_base=0.001) as model:
            history: list[Any] | None = None
            previous: dict[str, Any] | None = None
            for i, interaction in enumerate(interactions):
                recorded = interaction["request"]["body"]
                decoded = _decode_anthropic(recorded)
                tools = [_spec(t["name"], t.get("description", ""),
                               t.get("input_schema", {"type": "object"}))
                         for t in recorded["tools"]]
                if _continues(previous, recorded):
                    assert history is not None
                    messages = history + decoded[len(history):]
                else:
                    messages = decoded
                extra = {"thinking": recorded["thinking"]} if "thinking" in recorded else {}
                settings = ModelSettings(max_tokens=recorded["max_tokens"],
                                         temperature=recorded.get("temperature"), extra=extra)
                response = await _run(model, messages, tools, settings, bool(recorded["stream"]))

                sent = server.requests[i]
                assert sent.path == "/v1/messages"
                assert sent.headers["x-api-key"] == "sk-ant-test"
                assert sent.headers["anthropic-version"] == "2023-06-01"
                ours, theirs = _norm_anthropic(sent.json()), _norm_anthropic(recorded)
                if theirs["tools"] is None:  # Anthropic's own text-editor tool: no schema
                    names = [t["name"] for t in recorded["tools"]]
                    assert [t["name"] for t in ours["tools"]] == names
                    ours["tools"] = None
                assert ours == theirs

                expected = _anthropic_response(interaction["response"]["body"])
                parts = []
                for block in expected["content"]:
                    if block["type"] == "thinking":
                        parts.append(ThinkingPart(block["thinking"], block["signature"],
                                                  "anthropic"))
                    elif block["type"] == "text":
                        parts.append(TextPart(block["text"]))
                    elif block["type"] == "tool_use":
                        parts.append(("call", block["id"], block["name"], block["input"]))
                got = [("call", p.id, p.name, json.loads(p.arguments))
                       if isinstance(p, ToolCall) else p for p in response.message.parts]
                assert got == parts
                usage = expected["usage"]
                assert response.usage.input_tokens == usage["input_tokens"]
                assert response.usage.output_tokens == usage["output_tokens"]
                assert response.finish_reason == {"tool_use": "tool_calls", "end_turn": "stop"}[
                    expected["stop_reason"]]
                history = [*messages, response.message]
                previous = recorded
    assert len(server.requests) == len(interactions)
