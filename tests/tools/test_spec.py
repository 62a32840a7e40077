"""ToolSpec: a tool declared in plain JSON Schema."""

from typing import Any

import pytest

import handrail as hr

OBJ = {"type": "object", "properties": {"q": {"type": "string"}}}


def test_defaults_and_id_parsing() -> None:
    spec = hr.ToolSpec("search/web", "Search the web.", OBJ)
    assert spec.id == hr.ToolId("search", "web")
    assert spec.output_schema is None
    assert spec.annotations == {}
    assert spec.mutates is True
    assert spec.idempotent is False
    assert spec.interactions == frozenset()
    assert spec.timeout is None
    assert hr.ToolSpec(hr.ToolId("a", "b"), "", OBJ).id == hr.ToolId("a", "b")
    assert hr.ToolSpec("bare", "", OBJ).id == hr.ToolId("local", "bare")


def test_full_declaration_and_replace() -> None:
    spec = hr.ToolSpec("a/b", "d", OBJ, output_schema={"type": "integer"},
                       annotations={"readOnlyHint": True}, mutates=False,
                       interactions={"form"}, timeout=1.5)
    assert spec.interactions == frozenset({"form"})
    changed = spec.replace(description="reviewed")
    assert changed.description == "reviewed" and changed.id == spec.id
    assert spec.description == "d"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"id": "a b/c"}, "invalid tool name"),
        ({"description": 5}, "description"),
        ({"input_schema": "{}"}, "input_schema"),
        ({"input_schema": {"type": "string"}}, "JSON object"),
        ({"output_schema": "x"}, "output_schema"),
        ({"interactions": {"chat"}}, "unknown interaction"),
        ({"interactions": "question"}, "set of kinds"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
    ],
)
def test_bad_declarations(kwargs: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {"id": "a/b", "description": "d", "input_schema": OBJ}
    with pytest.raises(hr.UserError, match=match):
        hr.ToolSpec(**{**base, **kwargs})
