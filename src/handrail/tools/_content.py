"""What a tool returns: `ToolResult` and its content items.

Content items are frozen dataclasses discriminated by `kind`, shaped after MCP's content blocks
so results cross the MCP bridge unchanged. A result's content is never empty.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from handrail.tools._tagged import TaggedUnion

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "Audio",
    "Content",
    "EmbeddedResource",
    "Image",
    "Json",
    "ResourceLink",
    "Text",
    "ToolResult",
]


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text."""

    text: str
    """The text."""
    kind: Literal["text"] = "text"

    def __post_init__(self) -> None:
        if type(self.text) is not str and not isinstance(self.text, str):
            raise TypeError(f"Text.text must be a string, not {type(self.text).__name__}")


@dataclass(frozen=True, slots=True)
class Json:
    """A JSON value, sent to a model as its compact JSON text."""

    value: Any
    """Any JSON-serialisable value."""
    kind: Literal["json"] = "json"


def _check_base64(data: str, what: str) -> None:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{what}.data must be base64 text: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """An image, as base64 data with its mime type (`image/png`, `image/jpeg`, ...)."""

    data: str
    """The image bytes, base64-encoded."""
    mime_type: str
    """The image's mime type."""
    kind: Literal["image"] = "image"

    def __post_init__(self) -> None:
        if not self.mime_type.startswith("image/"):
            raise ValueError(f"Image.mime_type must be image/*, got {self.mime_type!r}")
        _check_base64(self.data, "Image")

    @classmethod
    def from_bytes(cls, data: bytes, mime_type: str) -> Image:
        """Build an Image from raw bytes."""
        return cls(data=base64.b64encode(data).decode("ascii"), mime_type=mime_type)


@dataclass(frozen=True, slots=True, kw_only=True)
class Audio:
    """Audio, as base64 data with its mime type (`audio/wav`, `audio/mpeg`, ...)."""

    data: str
    """The audio bytes, base64-encoded."""
    mime_type: str
    """The audio's mime type."""
    kind: Literal["audio"] = "audio"

    def __post_init__(self) -> None:
        if not self.mime_type.startswith("audio/"):
            raise ValueError(f"Audio.mime_type must be audio/*, got {self.mime_type!r}")
        _check_base64(self.data, "Audio")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceLink:
    """A pointer to a resource the caller may fetch (MCP `resource_link`)."""

    uri: str
    """The resource's URI."""
    name: str
    """A short name for it."""
    mime_type: str | None = None
    """Its mime type, when known."""
    description: str | None = None
    """What it is."""
    kind: Literal["resource_link"] = "resource_link"


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddedResource:
    """A resource's contents, inline: `text` or base64 `blob`, exactly one."""

    uri: str
    """The resource's URI."""
    mime_type: str | None = None
    """Its mime type, when known."""
    text: str | None = None
    """Its contents as text."""
    blob: str | None = None
    """Its contents as base64 bytes."""
    kind: Literal["resource"] = "resource"

    def __post_init__(self) -> None:
        if (self.text is None) == (self.blob is None):
            raise ValueError("EmbeddedResource needs exactly one of text= or blob=")
        if self.blob is not None:
            _check_base64(self.blob, "EmbeddedResource")


Content = Annotated[
    Text | Json | Image | Audio | ResourceLink | EmbeddedResource, TaggedUnion("kind")
]
"""Any content item, discriminated by `kind`."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_CONTENT_TYPES = (Text, Json, Image, Audio, ResourceLink, EmbeddedResource)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A completed call's result, as the model will see it.

    A model-visible failure (the tool ran and says it could not do the thing) is a result with
    `is_error=True`; an operation failure (timeout, invalid output, denied) is a `ToolError`.

    Build one with `ToolResult.text(...)`, `ToolResult.json(...)`, `ToolResult.error(...)`, or
    directly: `ToolResult([Text("hi"), Image.from_bytes(png, "image/png")])`.
    """

    content: Sequence[Text | Json | Image | Audio | ResourceLink | EmbeddedResource]
    """What the model is shown; never empty."""
    structured: Any = None
    """Structured output, checked against the tool's output schema on success."""
    is_error: bool = False
    """True when the tool reports a failure the model should read and act on."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Data for the host, never shown to the model."""

    def __post_init__(self) -> None:
        content = self.content
        if type(content) is not tuple:
            if isinstance(content, str | bytes) or not isinstance(content, Sequence):
                raise TypeError(
                    "ToolResult.content must be a list of content items; "
                    "use ToolResult.text(...) for plain text"
                )
            content = tuple(content)
            object.__setattr__(self, "content", content)
        if not content:
            raise ValueError("ToolResult.content must not be empty")
        for item in content:
            if not isinstance(item, _CONTENT_TYPES):
                raise TypeError(
                    "ToolResult.content items must be hr.Text, hr.Json, hr.Image, hr.Audio, "
                    f"hr.ResourceLink or hr.EmbeddedResource, not {type(item).__name__}"
                )

    @classmethod
    def text(cls, text: str, *, structured: Any = None) -> ToolResult:
        """A successful result of one text item."""
        return cls((Text(text),), structured)

    @classmethod
    def json(cls, value: Any) -> ToolResult:
        """A successful result carrying `value` as structured content and as JSON text.

        `value` is converted to its JSON form first (models, dataclasses, dates...), so the
        result can be stored and sent as is.

        Raises:
            TypeError: `value` cannot be represented as JSON.
        """
        import pydantic_core  # not at import: pydantic_core alone costs ~20 ms (issue 11)

        try:
            plain = pydantic_core.to_jsonable_python(value)
        except pydantic_core.PydanticSerializationError as exc:
            raise TypeError(f"ToolResult.json needs a JSON-serialisable value: {exc}") from None
        return cls((Json(plain),), plain)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A model-visible failure: the model reads `message` and may try something else."""
        return cls((Text(message),), None, True)

    def render_text(self) -> str:
        """All content as one text, for transports that take only text.

        Non-text items are described, never silently dropped.
        """
        return "\n".join(render_item(item) for item in self.content)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (for stores and wire formats); `from_dict` reverses it."""
        # A loop, not a comprehension (a function call on 3.11): every call's result passes
        # here once (issue 38).
        content: list[dict[str, Any]] = []
        for item in self.content:
            content.append({"kind": "text", "text": item.text} if type(item) is Text
                           else _content_adapter().dump_python([item], mode="json")[0])
        return {
            "content": content,
            "structured": self.structured,
            "is_error": self.is_error,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolResult:
        """Rebuild a result from `to_dict` output."""
        content = _content_adapter().validate_python(data["content"])
        return cls(
            tuple(content),
            data.get("structured"),
            bool(data.get("is_error", False)),
            dict(data.get("metadata") or {}),
        )


_new = object.__new__


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of slot `name` of a slotted (frozen) dataclass.

    What a frozen dataclass's `__init__` reaches through `object.__setattr__` per field, at
    about half the cost: for objects built on every call (issue 11). Nothing is checked
    that `__init__` would check: a caller passes exactly what the fields hold.
    """
    setter: Callable[[Any, Any], None] = vars(cls)[name].__set__
    return setter


_set_text, _set_text_kind = slot_setter(Text, "text"), slot_setter(Text, "kind")
_set_content = slot_setter(ToolResult, "content")
_set_structured = slot_setter(ToolResult, "structured")
_set_is_error = slot_setter(ToolResult, "is_error")
_set_metadata = slot_setter(ToolResult, "metadata")


def text_result(text: str, structured: Any) -> ToolResult:
    """`ToolResult((Text(text),), structured)` for a `text` known to be a str.

    The hot path of a typed tool: skips the checks `__post_init__` would make of a content
    tuple we build ourselves.
    """
    item = _new(Text)
    _set_text(item, text)
    _set_text_kind(item, "text")
    result = _new(ToolResult)
    _set_content(result, (item,))
    _set_structured(result, structured)
    _set_is_error(result, False)
    _set_metadata(result, {})
    return result


@functools.cache
def _content_adapter() -> TypeAdapter[list[Content]]:
    # Built on first use: storing results is off the hot path of a call.
    from pydantic import TypeAdapter

    return TypeAdapter(list[Content])


def render_item(item: Text | Json | Image | Audio | ResourceLink | EmbeddedResource) -> str:
    """One content item as text for a model that takes only text."""
    if isinstance(item, Text):
        return item.text
    if isinstance(item, Json):
        import pydantic_core

        return pydantic_core.to_json(item.value).decode()
    if isinstance(item, Image | Audio):
        size = len(item.data) * 3 // 4 - item.data[-2:].count("=")
        return f"[{item.kind} {item.mime_type}, {size} bytes, not shown]"
    if isinstance(item, ResourceLink):
        return f"[resource {item.name}: {item.uri}]"
    if item.text is not None:
        return item.text
    return f"[resource {item.uri}, binary, not shown]"
