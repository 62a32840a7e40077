"""JSON Schema generation and docstring parsing for Python-declared tools."""

from __future__ import annotations

import inspect
import re
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = ["ToolSchemaGenerator", "parse_docstring"]


class ToolSchemaGenerator(GenerateJsonSchema):
    """pydantic's generator without the per-field titles (noise for a model)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        out = super().generate(schema, mode)
        out.pop("title", None)
        return out


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Return|Raises|Yields|Examples|Example|Note|"
    r"Notes|Attributes|See Also|Warning|Warnings|Todo)\s*:\s*$"
)
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description}).

    The description is everything before the first section header; parameter descriptions
    come from the `Args:` (or `Arguments:`/`Parameters:`) section, continuation lines joined.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for raw in lines:
        stripped = raw.strip()
        header = _SECTION.match(stripped) if raw == raw.lstrip() else None
        if header:
            section = header.group(1)
            current, arg_indent = None, None
            continue
        if section is None:
            description.append(raw)
            continue
        if section not in ("Args", "Arguments", "Parameters", "Params") or not stripped:
            continue
        indent = len(raw) - len(raw.lstrip())
        match = _ARG.match(stripped)
        if match and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = match.group(1).lstrip("*")
            params[current] = match.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(description).strip(), params
