"""MCP content blocks <-> `ToolResult`, both ways, with sizes bounded.

What a server returns is an attacker's input: its total size is bounded before anything is
copied, and a block handrail cannot represent faithfully is described, never silently dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handrail.errors import InvalidOutput, Issue
from handrail.mcp._json import loose_text
from handrail.tools import (
    Audio,
    EmbeddedResource,
    Image,
    Json,
    ResourceLink,
    Text,
    ToolResult,
)

if TYPE_CHECKING:
    import mcp_types

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "from_mcp_result", "plain_call_result", "to_mcp_dict",
           "to_mcp_result"]

DEFAULT_MAX_RESULT_BYTES = 8 << 20
"""A server's result larger than this (text and base64 data, summed) is refused: 8 MiB."""

_Item = Text | Json | Image | Audio | ResourceLink | EmbeddedResource


def _size(block: Any) -> int:
    size = 0
    for name in ("text", "data", "blob", "uri"):
        value = getattr(block, name, None)
        if isinstance(value, str):
            size += len(value)
    resource = getattr(block, "resource", None)
    if resource is not None:
        size += _size(resource)
    return size


def from_mcp_result(result: mcp_types.CallToolResult, *, tool: str,
                    max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> ToolResult:
    """A server's `CallToolResult` as a `ToolResult` (`isError` -> `is_error`).

    Raises:
        InvalidOutput: the result is over `max_bytes`, or a block is malformed (bad base64,
            a wrong mime type) (LANDED: the server ran the tool).
    """
    import mcp_types as t

    total = sum(_size(b) for b in result.content)
    if total > max_bytes:
        raise InvalidOutput(tool, [Issue(path="$.content", message=f"the server returned "
                                         f"{total} bytes, over the limit of {max_bytes}")])
    items: list[_Item] = []
    try:
        for block in result.content:
            if isinstance(block, t.TextContent):
                items.append(Text(block.text))
            elif isinstance(block, t.ImageContent):
                items.append(Image(data=block.data, mime_type=block.mime_type))
            elif isinstance(block, t.AudioContent):
                items.append(Audio(data=block.data, mime_type=block.mime_type))
            elif isinstance(block, t.ResourceLink):
                items.append(ResourceLink(uri=str(block.uri), name=block.name,
                                          mime_type=block.mime_type,
                                          description=block.description))
            elif isinstance(block, t.EmbeddedResource):
                res = block.resource
                if isinstance(res, t.TextResourceContents):
                    items.append(EmbeddedResource(uri=str(res.uri), mime_type=res.mime_type,
                                                  text=res.text))
                else:
                    items.append(EmbeddedResource(uri=str(res.uri), mime_type=res.mime_type,
                                                  blob=res.blob))
            else:  # a block type newer than this mapping: described, not dropped
                items.append(Text(f"[{getattr(block, 'type', type(block).__name__)} content "
                                  "from the server, not shown]"))
    except ValueError as exc:
        raise InvalidOutput(tool, [Issue(path="$.content", message=str(exc))]) from None
    structured = result.structured_content
    if not items:
        items.append(Json(structured) if structured is not None else Text(""))
    return ToolResult(tuple(items), structured, bool(result.is_error))


_PLAIN_KEYS = frozenset({"content", "structuredContent", "isError"})
# The slots' setters of `Text` and `ToolResult`: `plain_call_result` has checked what their
# frozen `__init__` and `__post_init__` check (a string; a tuple of items, never empty), so it
# builds them through these, in about a third of the work (issue 38).
_NEW = object.__new__
_SET_TEXT, _SET_TEXT_KIND = (getattr(Text, name).__set__ for name in ("text", "kind"))
_SET_RESULT = tuple(getattr(ToolResult, name).__set__
                    for name in ("content", "structured", "is_error", "metadata"))


def _text(text: str) -> Text:
    item: Text = _NEW(Text)
    _SET_TEXT(item, text)
    _SET_TEXT_KIND(item, "text")
    return item


def plain_call_result(raw: Any, *, max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                      metadata: dict[str, Any] | None = None) -> ToolResult | None:
    """A `tools/call` result of text blocks as `from_mcp_result` returns it; None for others.

    The result almost every server sends (`{"content": [{"type": "text", "text": ...}],
    "isError": false}`, with or without a `structuredContent` object) is valid in each of its
    parts at every protocol version, so the SDK's two validations of it (the negotiated
    version's result row, then `CallToolResult`: ~55 µs of `handrail serve`'s ~750 µs a
    call in front of an upstream, issue 38) prove nothing more of it. Only that exact shape
    is taken here, each value of the one JSON type allowed; anything else (another block or
    key, `_meta`, annotations, a value of another type, a result over `max_bytes`) is None,
    for the general path that validates it and says what is wrong. `metadata` is the
    result's (what the caller would otherwise add with a second `ToolResult`).
    """
    if type(raw) is not dict or not _PLAIN_KEYS.issuperset(raw):
        return None
    content = raw.get("content")
    is_error = raw.get("isError", False)
    structured = raw.get("structuredContent")
    if (type(content) is not list or type(is_error) is not bool
            or (structured is not None and type(structured) is not dict)):
        return None
    items: list[_Item] = []
    total = 0
    for block in content:
        if type(block) is not dict or len(block) != 2 or block.get("type") != "text":
            return None
        text = block.get("text")
        if type(text) is not str:
            return None
        total += len(text)
        items.append(_text(text))
    if total > max_bytes:
        return None  # refused by the general path, which says so
    if structured:
        try:  # a lone surrogate (json.loads makes them) is no UTF-8: the SDK's check raises
            loose_text(structured).encode()
        except (UnicodeEncodeError, ValueError, RecursionError):
            return None
    if not items:
        items.append(Json(structured) if structured is not None else Text(""))
    result: ToolResult = _NEW(ToolResult)
    set_content, set_structured, set_is_error, set_metadata = _SET_RESULT
    set_content(result, tuple(items))
    set_structured(result, structured)
    set_is_error(result, is_error)
    set_metadata(result, {} if metadata is None else metadata)
    return result


def to_mcp_result(result: ToolResult) -> mcp_types.CallToolResult:
    """A `ToolResult` as the `CallToolResult` `handrail serve` sends its client."""
    import mcp_types as t

    blocks: list[Any] = []
    for item in result.content:
        if isinstance(item, Text):
            blocks.append(t.TextContent(type="text", text=item.text))
        elif isinstance(item, Json):
            blocks.append(t.TextContent(type="text", text=item_text(item)))
        elif isinstance(item, Image):
            blocks.append(t.ImageContent(type="image", data=item.data, mime_type=item.mime_type))
        elif isinstance(item, Audio):
            blocks.append(t.AudioContent(type="audio", data=item.data, mime_type=item.mime_type))
        elif isinstance(item, ResourceLink):
            blocks.append(t.ResourceLink(type="resource_link", uri=item.uri, name=item.name,
                                         mime_type=item.mime_type,
                                         description=item.description))
        else:
            contents: Any = (
                t.TextResourceContents(uri=item.uri, mime_type=item.mime_type, text=item.text)
                if item.text is not None
                else t.BlobResourceContents(uri=item.uri, mime_type=item.mime_type,
                                            blob=item.blob or ""))
            blocks.append(t.EmbeddedResource(type="resource", resource=contents))
    structured = result.structured if isinstance(result.structured, dict) else None
    return t.CallToolResult(content=blocks, structured_content=structured,
                            is_error=result.is_error)


def to_mcp_dict(result: ToolResult, version: str) -> dict[str, Any]:
    """`to_mcp_result(result)` as the wire dict the SDK's server writes for it at `version`.

    `handrail serve`'s own link (`_serve_link`) writes it without building the model: text
    and JSON blocks are built here (what the SDK's per-version sieve leaves of them, for
    every handshake-era version); any other block goes through `to_mcp_result` and the sieve.
    """
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, Text):
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, Json):
            blocks.append({"type": "text", "text": item_text(item)})
        else:
            from mcp_types import methods

            dumped = to_mcp_result(result).model_dump(by_alias=True, mode="json",
                                                      exclude_none=True)
            sieved: dict[str, Any] = methods.serialize_server_result("tools/call", version,
                                                                     dumped)
            return sieved
    wire: dict[str, Any] = {"content": blocks}
    if isinstance(result.structured, dict):
        wire["structuredContent"] = result.structured
    wire["isError"] = bool(result.is_error)
    return wire


def item_text(item: Json) -> str:
    """A Json item as the compact JSON text a client is shown."""
    import pydantic_core

    return pydantic_core.to_json(item.value).decode()
