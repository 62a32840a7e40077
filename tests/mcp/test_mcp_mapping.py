"""The two MCP boundaries that need no server: errors -> dispositions, content <-> ToolResult."""

from __future__ import annotations

import base64

import anyio
import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

import handrail as hr
from handrail.mcp import from_mcp_result, map_mcp_error, to_mcp_result

NS, DOUBT, LANDED = hr.Disposition.NOT_SENT, hr.Disposition.IN_DOUBT, hr.Disposition.LANDED


def _validation_error() -> ValidationError:
    try:
        t.CallToolResult.model_validate({"content": "nope"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


CASES: list[tuple[BaseException, bool, type[hr.ToolError], hr.Disposition]] = [
    (MCPError(t.METHOD_NOT_FOUND, "no such method"), True, hr.UnknownTool, NS),
    (MCPError(t.INVALID_PARAMS, "Unknown tool: x"), True, hr.UnknownTool, NS),
    (MCPError(t.INVALID_PARAMS, "bad"), True, hr.InvalidArguments, NS),
    (MCPError(t.INVALID_REQUEST, "bad"), True, hr.InvalidArguments, NS),
    (MCPError(t.PARSE_ERROR, "bad"), True, hr.InvalidArguments, NS),
    (MCPError(t.REQUEST_TIMEOUT, "late"), True, hr.ToolTimeout, DOUBT),
    (MCPError(t.CONNECTION_CLOSED, "closed"), True, hr.TransportError, DOUBT),
    (MCPError(t.CONNECTION_CLOSED, "closed"), False, hr.TransportError, NS),
    (MCPError(t.INTERNAL_ERROR, "oops"), True, hr.TransportError, DOUBT),
    (MCPError(-31999, "server-defined"), True, hr.TransportError, DOUBT),
    (TimeoutError(), True, hr.ToolTimeout, DOUBT),
    (anyio.ClosedResourceError(), True, hr.TransportError, DOUBT),
    (anyio.BrokenResourceError(), True, hr.TransportError, DOUBT),
    (anyio.EndOfStream(), True, hr.TransportError, DOUBT),
    (BrokenPipeError(), False, hr.TransportError, NS),
    (_validation_error(), True, hr.InvalidOutput, LANDED),
]


@pytest.mark.parametrize(("exc", "sent", "kind", "disposition"), CASES)
def test_every_mcp_failure_maps_to_a_tool_error_with_its_disposition(
        exc: BaseException, sent: bool, kind: type[hr.ToolError],
        disposition: hr.Disposition) -> None:
    mapped = map_mcp_error(exc, tool="s/t", server="s", sent=sent)
    assert type(mapped) is kind
    assert mapped.disposition is disposition


def test_an_unknown_exception_is_a_bug_not_a_guess() -> None:
    with pytest.raises(TypeError, match="does not know"):
        map_mcp_error(RuntimeError("x"), tool="s/t", server="s")


PNG = base64.b64encode(b"\x89PNG fake").decode()


def test_every_content_type_maps_and_round_trips() -> None:
    result = t.CallToolResult(content=[
        t.TextContent(type="text", text="hi"),
        t.ImageContent(type="image", data=PNG, mime_type="image/png"),
        t.AudioContent(type="audio", data=PNG, mime_type="audio/wav"),
        t.ResourceLink(type="resource_link", uri="file:///a.txt", name="a"),
        t.EmbeddedResource(type="resource", resource=t.TextResourceContents(
            uri="file:///b.txt", text="inside")),
        t.EmbeddedResource(type="resource", resource=t.BlobResourceContents(
            uri="file:///c.bin", blob=PNG)),
    ], structured_content={"n": 1})
    mapped = from_mcp_result(result, tool="s/t")
    assert [i.kind for i in mapped.content] == ["text", "image", "audio", "resource_link",
                                                "resource", "resource"]
    assert mapped.structured == {"n": 1} and not mapped.is_error
    back = to_mcp_result(mapped)
    assert back.model_dump() == result.model_dump()


def test_is_error_and_empty_content() -> None:
    mapped = from_mcp_result(t.CallToolResult(content=[], is_error=True), tool="s/t")
    assert mapped.is_error and mapped.render_text() == ""
    mapped = from_mcp_result(t.CallToolResult(content=[], structured_content={"a": 1}),
                             tool="s/t")
    assert mapped.render_text() == '{"a":1}'


def test_malformed_or_oversized_content_is_invalid_output() -> None:
    bad = t.CallToolResult(content=[t.ImageContent(type="image", data="###",
                                                   mime_type="image/png")])
    with pytest.raises(hr.InvalidOutput):
        from_mcp_result(bad, tool="s/t")
    wrong = t.CallToolResult(content=[t.ImageContent(type="image", data=PNG,
                                                     mime_type="text/html")])
    with pytest.raises(hr.InvalidOutput):
        from_mcp_result(wrong, tool="s/t")
    big = t.CallToolResult(content=[t.TextContent(type="text", text="x" * 101)])
    with pytest.raises(hr.InvalidOutput, match="over the limit"):
        from_mcp_result(big, tool="s/t", max_bytes=100)
