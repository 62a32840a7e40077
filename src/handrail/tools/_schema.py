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
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|"
    r"Attributes|Returns|Return|Raises|Raise|Yields|Yield|Examples|Example|Note|Notes|"
    r"See Also|Warning|Warnings|Todo|References|Methods|Caution|Attention|Danger|Error|Hint|"
    r"Important|Tip)\s*:\s*$"
)
_PARAM_SECTIONS = frozenset(
    {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments",
     "Other Parameters", "Attributes"}
)
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(\(.*?\))?\s*:(?:\s+(.*)|$)")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description}).

    The description is the text outside sections: everything before the first section header,
    plus any unindented paragraph after a section (which ends that section). Parameter
    descriptions come from the `Args:` section (or `Arguments:`, `Parameters:`,
    `Keyword Args:`, `Attributes:` ...), continuation lines joined with single spaces.
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
        indent = len(raw) - len(raw.lstrip())
        header = _SECTION.match(stripped) if indent == 0 else None
        if header:
            section = header.group(1)
            current, arg_indent = None, None
            continue
        if section is not None and stripped and indent == 0:
            # Text back at the section's own indentation ends the section (as in napoleon).
            section, current, arg_indent = None, None, None
        if section is None:
            description.append(raw)
            continue
        if section not in _PARAM_SECTIONS or not stripped:
            continue
        match = _ARG.match(stripped)
        if match and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = match.group(1).lstrip("*")
            params[current] = (match.group(3) or "").strip()
        elif current is not None:
            params[current] = f"{params[current]} {stripped}".strip()
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(description).strip())
    return text, params
