"""ToolResult and its content items."""

import base64
import datetime
from typing import Any

import pytest
from pydantic import BaseModel

import handrail as hr

PNG = base64.b64encode(b"\x89PNG fake").decode()


def test_helpers() -> None:
    assert hr.ToolResult.text("hi") == hr.ToolResult((hr.Text("hi"),))
    assert hr.ToolResult.text("hi", structured={"a": 1}).structured == {"a": 1}
    assert hr.ToolResult.json({"a": [1]}) == hr.ToolResult((hr.Json({"a": [1]}),), {"a": [1]})
    error = hr.ToolResult.error("no such account")
    assert error.is_error and error.render_text() == "no such account"
    assert error.structured is None


def test_defaults() -> None:
    result = hr.ToolResult([hr.Text("x")])
    assert result.structured is None and result.is_error is False and result.metadata == {}
    assert isinstance(result.content, tuple)


def test_json_helper_stores_the_json_form() -> None:
    class P(BaseModel):
        when: datetime.date

    result = hr.ToolResult.json(P(when=datetime.date(2024, 1, 2)))
    assert result.structured == {"when": "2024-01-02"}
    with pytest.raises(TypeError, match="JSON-serialisable"):
        hr.ToolResult.json(object())


@pytest.mark.parametrize("content", [[], (), "text", b"bytes", None, hr.Text("x")])
def test_content_is_never_empty_and_always_a_list(content: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        hr.ToolResult(content)


def test_content_items_are_typed() -> None:
    with pytest.raises(TypeError, match="content items"):
        hr.ToolResult(["raw string"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be a string"):
        hr.Text(5)  # type: ignore[arg-type]


def test_media_items_check_mime_type_and_base64() -> None:
    assert hr.Image(data=PNG, mime_type="image/png").kind == "image"
    assert hr.Image.from_bytes(b"abc", "image/png").data == "YWJj"
    assert hr.Audio(data=PNG, mime_type="audio/wav").kind == "audio"
    with pytest.raises(ValueError, match="image/"):
        hr.Image(data=PNG, mime_type="text/plain")
    with pytest.raises(ValueError, match="audio/"):
        hr.Audio(data=PNG, mime_type="image/png")
    with pytest.raises(ValueError, match="base64"):
        hr.Image(data="not base64!", mime_type="image/png")
    with pytest.raises(ValueError, match="base64"):
        hr.EmbeddedResource(uri="file:///x", blob="%%%")


def test_embedded_resource_needs_exactly_one_body() -> None:
    assert hr.EmbeddedResource(uri="file:///a", text="hi").text == "hi"
    assert hr.EmbeddedResource(uri="file:///a", blob=PNG).blob == PNG
    with pytest.raises(ValueError, match="exactly one"):
        hr.EmbeddedResource(uri="file:///a")
    with pytest.raises(ValueError, match="exactly one"):
        hr.EmbeddedResource(uri="file:///a", text="x", blob=PNG)


def test_render_text_describes_every_item() -> None:
    result = hr.ToolResult([
        hr.Text("hello"),
        hr.Json({"a": 1}),
        hr.Image.from_bytes(b"12345", "image/png"),
        hr.Audio.from_bytes(b"1", "audio/wav") if hasattr(hr.Audio, "from_bytes")
        else hr.Audio(data="MQ==", mime_type="audio/wav"),
        hr.ResourceLink(uri="https://x/y", name="y"),
        hr.EmbeddedResource(uri="file:///t", text="inline"),
        hr.EmbeddedResource(uri="file:///b", blob=PNG),
    ])
    assert result.render_text().splitlines() == [
        "hello",
        '{"a":1}',
        "[image image/png, 5 bytes, not shown]",
        "[audio audio/wav, 1 bytes, not shown]",
        "[resource y: https://x/y]",
        "inline",
        "[resource file:///b, binary, not shown]",
    ]


def test_round_trip_through_dict() -> None:
    result = hr.ToolResult(
        [
            hr.Text("t"), hr.Json([1, "2"]), hr.Image(data=PNG, mime_type="image/png"),
            hr.Audio(data=PNG, mime_type="audio/mpeg"),
            hr.ResourceLink(uri="u", name="n", mime_type="text/plain", description="d"),
            hr.EmbeddedResource(uri="u", text="x", mime_type="text/plain"),
        ],
        structured={"k": [1]},
        is_error=True,
        metadata={"m": 1},
    )
    data = result.to_dict()
    assert data["content"][0] == {"text": "t", "kind": "text"}
    assert hr.ToolResult.from_dict(data) == result
    import json

    assert hr.ToolResult.from_dict(json.loads(json.dumps(data))) == result


def test_results_are_frozen() -> None:
    result = hr.ToolResult.text("x")
    with pytest.raises(AttributeError):
        result.is_error = True  # type: ignore[misc]
