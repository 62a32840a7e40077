"""A reference MCP server for the official conformance suite's server scenarios (0.1.16).

Written on the SDK's `MCPServer` from the scenarios' own descriptions, so that it passes all of
them directly; `benchmarks/mcp_conformance.py` then runs the same scenarios through `handrail
serve` in front of it, which must pass each one this server passes.

    python tests/mcp/conformance_server.py --http 127.0.0.1:PORT   # streamable HTTP, /mcp
    python tests/mcp/conformance_server.py --stdio                 # behind handrail serve
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from typing import Any

import anyio
import mcp_types as t
from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.streamable_http import EventMessage, EventStore
from pydantic import BaseModel, Field

warnings.filterwarnings("ignore")  # logging is deprecated at 2026-07-28; the suite tests it

# A 1x1 PNG and a minimal WAV (the scenarios ask for "a minimal test image / audio file").
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5"
       "ErkJggg==")
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

server = MCPServer(name="handrail-conformance-reference", version="1.0.0")
subscribed: set[str] = set()
_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
level = {"min": "debug"}


async def _log(ctx: Context, message: str) -> None:
    if _LEVELS.index("info") >= _LEVELS.index(level["min"]):
        await ctx.info(message)


@server.tool(description="Returns a simple text.")
def test_simple_text() -> str:
    return "This is a simple text response for testing."


@server.tool(description="Returns an image.")
def test_image_content() -> list[t.ImageContent]:
    return [t.ImageContent(type="image", data=PNG, mime_type="image/png")]


@server.tool(description="Returns an audio clip.")
def test_audio_content() -> list[t.AudioContent]:
    return [t.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]


@server.tool(description="Returns an embedded resource.")
def test_embedded_resource() -> list[t.EmbeddedResource]:
    return [t.EmbeddedResource(type="resource", resource=t.TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain",
        text="This is an embedded resource content."))]


@server.tool(description="Returns text, an image and a resource.")
def test_multiple_content_types() -> list[t.TextContent | t.ImageContent | t.EmbeddedResource]:
    return [t.TextContent(type="text", text="Multiple content types test:"),
            t.ImageContent(type="image", data=PNG, mime_type="image/png"),
            t.EmbeddedResource(type="resource", resource=t.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123})))]


@server.tool(description="Logs three messages while it runs.")
async def test_tool_with_logging(ctx: Context) -> str:
    await _log(ctx, "Tool execution started")
    await anyio.sleep(0.05)
    await _log(ctx, "Tool processing data")
    await anyio.sleep(0.05)
    await _log(ctx, "Tool execution completed")
    return "Logging test completed"


@server.tool(description="Always fails.")
def test_error_handling() -> str:
    raise RuntimeError("This tool intentionally returns an error for testing")


@server.tool(description="Reports progress 0, 50, 100 of 100.")
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(progress=step, total=100, message=f"step {step} of 100")
        if step < 100:
            await anyio.sleep(0.05)
    return "Progress test completed"


@server.tool(description="Asks the client's model.")
async def test_sampling(prompt: str, ctx: Context) -> str:
    result = await ctx.session.create_message(
        messages=[t.SamplingMessage(role="user", content=t.TextContent(type="text", text=prompt))],
        max_tokens=100, related_request_id=ctx.request_id)
    content = result.content
    text = content.text if isinstance(content, t.TextContent) else "(no text)"
    return f"LLM response: {text}"


class _User(BaseModel):
    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


@server.tool(description="Asks the client's user.")
async def test_elicitation(message: str, ctx: Context) -> str:
    result = await ctx.elicit(message=message, schema=_User)
    content = result.data.model_dump() if result.action == "accept" else None
    return f"User response: action={result.action}, content={json.dumps(content)}"


async def _elicit_raw(ctx: Context, message: str, schema: dict[str, Any]) -> str:
    result = await ctx.request_context.session.elicit_form(
        message=message, requested_schema=schema, related_request_id=ctx.request_id)
    return (f"Elicitation completed: action={result.action}, "
            f"content={json.dumps(result.content)}")


@server.tool(description="Asks with a default for each primitive type (SEP-1034).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    return await _elicit_raw(ctx, "Please provide user information", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive", "pending"],
                       "default": "active"},
            "verified": {"type": "boolean", "default": True},
        }})


@server.tool(description="Asks with the five enum forms (SEP-1330).")
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    return await _elicit_raw(ctx, "Please choose options", {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"}]},
            "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                           "enumNames": ["Option One", "Option Two", "Option Three"]},
            "untitledMulti": {"type": "array", "items": {
                "type": "string", "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {"type": "array", "items": {"anyOf": [
                {"const": "value1", "title": "First Choice"},
                {"const": "value2", "title": "Second Choice"},
                {"const": "value3", "title": "Third Choice"}]}},
        }})


@server.tool(name="json_schema_2020_12_tool",
             description="Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None,
                             ) -> str:
    return f"name={name}, address={address}"


# The SDK derives a tool's schema from its signature; this one states the suite's schema.
_tool = server._tool_manager.get_tool("json_schema_2020_12_tool")
assert _tool is not None
_tool.parameters = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


@server.tool(description="Closes the SSE stream mid-call (SEP-1699).")
async def test_reconnection(ctx: Context) -> str:
    await ctx.info("Before disconnect")
    await ctx.close_sse_stream()
    await anyio.sleep(0.2)
    await ctx.info("After reconnect")
    return "Reconnection test completed"


@server.resource("test://static-text", name="static-text", description="A static text.",
                 mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", name="static-binary", description="A static PNG.",
                 mime_type="image/png")
def static_binary() -> bytes:
    import base64

    return base64.b64decode(PNG)


@server.resource("test://template/{id}/data", name="template", description="Data for an id.",
                 mime_type="application/json")
def template(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.resource("test://watched-resource", name="watched", description="A watched resource.",
                 mime_type="text/plain")
def watched() -> str:
    return "Watched resource content"


@server.prompt(description="A simple prompt.")
def test_simple_prompt() -> list[UserMessage]:
    return [UserMessage(role="user", content="This is a simple prompt for testing.")]


@server.prompt(description="A prompt with two arguments.")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
    return [UserMessage(role="user", content=f"Prompt with arguments: arg1='{arg1}', "
                                             f"arg2='{arg2}'")]


@server.prompt(description="A prompt embedding a resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
    return [UserMessage(role="user", content=t.EmbeddedResource(
                type="resource", resource=t.TextResourceContents(
                    uri=resourceUri, mime_type="text/plain",
                    text="Embedded resource content for testing."))),
            UserMessage(role="user", content="Please process the embedded resource above.")]


@server.prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list[UserMessage]:
    return [UserMessage(role="user", content=t.ImageContent(type="image", data=PNG,
                                                            mime_type="image/png")),
            UserMessage(role="user", content="Please analyze the image above.")]


@server.completion()
async def complete(ref: Any, argument: t.CompletionArgument, context: Any) -> t.Completion:
    values = [v for v in ("paris", "park", "party") if v.startswith(argument.value)]
    return t.Completion(values=values, total=len(values), has_more=False)


async def _set_level(ctx: ServerRequestContext[Any], params: t.SetLevelRequestParams,
                     ) -> t.EmptyResult:
    level["min"] = params.level
    return t.EmptyResult()


async def _subscribe(ctx: ServerRequestContext[Any], params: t.SubscribeRequestParams,
                     ) -> t.EmptyResult:
    subscribed.add(str(params.uri))
    return t.EmptyResult()


async def _unsubscribe(ctx: ServerRequestContext[Any], params: t.UnsubscribeRequestParams,
                       ) -> t.EmptyResult:
    subscribed.discard(str(params.uri))
    return t.EmptyResult()


_low = server._lowlevel_server  # MCPServer has no decorator for these three
_low.add_request_handler("logging/setLevel", t.SetLevelRequestParams, _set_level)
_low.add_request_handler("resources/subscribe", t.SubscribeRequestParams, _subscribe)
_low.add_request_handler("resources/unsubscribe", t.UnsubscribeRequestParams, _unsubscribe)


class _Events(EventStore):
    """An in-memory event store: a client that reconnects with Last-Event-ID is replayed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        stream = next((s for s, e, _ in self.events if e == last_event_id), None)
        if stream is None:
            return None
        for s, e, message in self.events:
            if s == stream and int(e) > int(last_event_id) and message is not None:
                await send_callback(EventMessage(message, e))
        return stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--http", metavar="HOST:PORT")
    way.add_argument("--stdio", action="store_true")
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if ns.stdio:
        server.run("stdio")
        return
    host, _, port = ns.http.rpartition(":")
    server.run("streamable-http", host=host, port=int(port), retry_interval=100,
               event_store=_Events())


if __name__ == "__main__":
    main()
