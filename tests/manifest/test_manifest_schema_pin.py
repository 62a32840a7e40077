"""Grants pin the schemas the model is offered: written readably, read back exactly, checked."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.manifest import Grant, Manifest, problems, review, schema_changes
from handrail.manifest._toml_out import decode_json, encode_json


def _exact(a: Any, b: Any) -> bool:
    """Equal as JSON values *and* as types: 1, 1.0 and True are three different values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):  # key order is not meaning in JSON
        return set(a) == set(b) and all(_exact(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_exact(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


# Text a TOML writer must escape: quotes, backslashes, line breaks, controls, TOML syntax.
_TRICKY = st.text(alphabet=st.sampled_from(['"', "\\", "\n", "\r", "\t", "'", "a", "\x00",
                                            "\x7f", "é", "\u2028", "#", "[", "]", "="]),
                  max_size=12)
_KEYS = st.one_of(st.text(max_size=6), _TRICKY,
                  st.sampled_from(["$json", "type", "a.b", "", " ", "\n"]))
_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12), _TRICKY,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_JSON, name=_KEYS)
@example(value='say """hi"""\nthen "', name='a"""\nb')  # delimiters inside a multi-line text
@example(value={"$json": None}, name="$json")           # the escape's own spelling
@example(value=[None, 2**64, -0.0, {}], name="")
def test_any_json_in_a_schema_round_trips_through_toml_exactly(value: Any, name: str) -> None:
    # Unknown keywords and `default`/`examples` may hold any JSON value; parameter names are
    # any string. Both must come back exactly, null and all.
    schema = {"type": "object", "x-data": value,
              "properties": {name: {"default": value, "examples": [value]}}}
    manifest = Manifest(grants=(Grant(ref="a/b", description="d", arguments=schema,
                                      output={"x-data": value}),))
    text = manifest.to_toml()
    again = Manifest.from_toml(text)
    (grant,) = again.grants
    assert grant.arguments is not None and grant.output is not None
    assert _exact(grant.arguments, schema), text
    assert _exact(grant.output, {"x-data": value}), text
    assert again.digest == manifest.digest
    assert _exact(decode_json(encode_json(value)), value)


def test_the_null_spelling_is_one_documented_table() -> None:
    assert encode_json({"default": None}) == {"default": {"$json": "null"}}
    assert encode_json(2**64) == {"$json": str(2**64)}
    # An object that looks like the spelling is itself escaped, so it cannot be misread.
    assert encode_json({"$json": "null"}) == {"$json": '{"$json": "null"}'}
    with pytest.raises(ValueError, match="JSON text"):
        decode_json({"$json": "nul"})
    with pytest.raises(hr.ManifestError, match=r'arguments of .a/b.*"\$json" = .nul.'):
        Manifest.from_toml('[[tools]]\nref = "a/b"\n[tools.arguments]\n'
                           'default = { "$json" = "nul" }\n')


@hr.tool(server="notes")
async def write_note(title: str, text: str, mode: Literal["w", "a"] = "w",
                     tags: list[str] | None = None) -> dict[str, int]:
    """Write a note.

    Args:
        title: The note title.
        text: What to write.
        mode: Overwrite or append.
        tags: Labels.
    """
    return {"bytes": len(text)}


def test_init_writes_a_schema_a_reviewer_can_read() -> None:
    text = Manifest.from_toolbox(hr.Toolbox([write_note])).to_toml()
    assert text.endswith(
        '[[tools]]\nref = "notes/write_note"\ndescription = "Write a note."\nmutates = true\n'
        'idempotent = false\n\n'
        '[tools.arguments]\ntype = "object"\nrequired = ["title", "text"]\n'
        'additionalProperties = false\n\n'
        '[tools.arguments.properties.title]\ntype = "string"\n'
        'description = "The note title."\n\n'
        '[tools.arguments.properties.text]\ntype = "string"\ndescription = "What to write."\n\n'
        '[tools.arguments.properties.mode]\ntype = "string"\n'
        'description = "Overwrite or append."\ndefault = "w"\nenum = ["w", "a"]\n\n'
        '[tools.arguments.properties.tags]\ndescription = "Labels."\n'
        'default = { "$json" = "null" }\n'
        'anyOf = [{ type = "array", items = { type = "string" } }, { type = "null" }]\n\n'
        '[tools.output]\ntype = "object"\nadditionalProperties = { type = "integer" }\n'
    )
    again = Manifest.from_toml(text)
    assert again.grants[0].arguments == write_note.spec.input_schema
    assert again.grants[0].output == write_note.spec.output_schema
    assert problems(hr.Toolbox([write_note]), again) == []


def test_the_digest_covers_the_schema() -> None:
    m = Manifest.from_toolbox(hr.Toolbox([write_note]))
    (grant,) = m.grants
    assert grant.arguments is not None
    changed = json.loads(json.dumps(grant.arguments))
    changed["properties"]["mode"]["enum"] = ["w", "a", "x"]
    other = Manifest(grants=(Grant(ref=grant.ref, description=grant.description,
                                   arguments=changed, output=grant.output),))
    assert other.digest != m.digest
    no_output = Manifest(grants=(Grant(ref=grant.ref, description=grant.description,
                                       arguments=grant.arguments),))
    assert no_output.digest != m.digest


def test_each_changed_parameter_is_named() -> None:
    old = {"type": "object", "required": ["path", "n"],
           "properties": {"path": {"type": "string"}, "n": {"type": "integer", "minimum": 0},
                          "mode": {"type": "string", "enum": ["w", "a"], "default": "w"},
                          "gone": {"type": "boolean"}}}
    new = {"type": "object", "required": ["path"], "additionalProperties": False,
           "properties": {"path": {"type": "string", "maxLength": 200},
                          "n": {"type": "integer", "minimum": 1, "default": 3},
                          "mode": {"type": "string", "enum": ["w", "a", "x"], "default": "a"},
                          "append": {"type": "boolean", "default": False}}}
    assert schema_changes(old, new) == [
        "added parameter 'append' (boolean, optional, default false)",
        "removed parameter 'gone' (boolean, optional)",
        "changed parameter 'path': maxLength 200 added",
        "changed parameter 'n': now optional, minimum 0 → 1, default 3 added",
        'changed parameter \'mode\': enum ["w", "a"] → ["w", "a", "x"], default "w" → "a"',
        "keyword 'additionalProperties' false added",
    ]
    assert schema_changes({"type": "object", "required": ["a", "b"]},
                          {"type": "object", "required": ["b", "a"]}) == [
        "keyword 'required' [\"a\", \"b\"] → [\"b\", \"a\"]"]
    huge = {"type": "object", "properties": {"p": {"enum": list(range(10_000))}}}
    (line,) = schema_changes({"type": "object", "properties": {"p": {}}}, huge)
    assert len(line) < 300 and line.endswith("… added")  # bounded, whatever the schema


def test_an_output_schema_change_is_drift() -> None:
    m = Manifest.from_toolbox(hr.Toolbox([write_note]))
    (grant,) = m.grants
    pinned = Manifest(grants=(Grant(ref=grant.ref, description="d", arguments=grant.arguments,
                                    output={"type": "object",
                                            "properties": {"bytes": {"type": "string"}}}),))
    (problem,) = problems(hr.Toolbox([write_note]), pinned)
    assert problem.startswith("the output schema of 'notes/write_note' (function "
                              "test_manifest_schema_pin.write_note) differs from the one pinned "
                              "in the manifest: removed field 'bytes' (string, optional); keyword "
                              "'additionalProperties' {\"type\": \"integer\"} added — ")


def test_a_grant_without_a_schema_is_not_pinned_a_warning_or_a_strict_error() -> None:
    m = Manifest.from_toml('[[tools]]\nref = "notes/write_note"\ndescription = "Write."\n',
                           source="handrail.toml")
    box = hr.Toolbox([write_note])
    assert problems(box, m) == []  # a warning does not fail the plain check
    (warning,) = review(box, m)
    assert (warning.kind, warning.severity, warning.ref) == (
        "schema_not_pinned", "warning", "notes/write_note")
    assert warning.message.startswith(
        "schema not pinned: the grant of 'notes/write_note' in handrail.toml:1 states no input "
        "and output schema")
    (strict,) = review(box, m, strict=True)
    assert strict.severity == "error" and strict.message == warning.message
    with pytest.raises(hr.ManifestDrift, match="schema not pinned"):
        hr.manifest.check_against(box, m, strict=True)
    hr.manifest.check_against(box, m)


def test_a_schema_keeps_nothing_a_toml_reader_could_mistake() -> None:
    # Floats stay floats, integers integers, and -0.0 its sign; 1 and 1.0 differ in a pin.
    schema = {"type": "object", "properties": {"x": {"minimum": 1.0, "maximum": 2,
                                                     "default": -0.0, "multipleOf": 0.1}}}
    again = Manifest.from_toml(Manifest(grants=(Grant(ref="a/b", arguments=schema),)).to_toml())
    assert _exact(again.grants[0].arguments, schema)
    assert math.copysign(1, again.grants[0].arguments["properties"]["x"]["default"]) == -1


def test_a_report_is_bounded_and_cannot_drive_a_terminal() -> None:
    # A schema from an MCP server is anyone's text: thousands of parameters, escape sequences.
    many = {"type": "object", "properties": {f"p{i}": {} for i in range(5000)}}
    changes = schema_changes({"type": "object"}, many)
    assert len(changes) == 26 and changes[-1] == "… and 4975 more changes"
    hostile = {"type": "object", "properties": {"\x1b[2Jx": {"description": "\x9b31m"}}}
    text = "; ".join(schema_changes({"type": "object"}, hostile)) + "; ".join(
        schema_changes({"type": "object", "properties": {"\x1b[2Jx": {}}}, hostile))
    assert "\x1b" not in text and "\x9b" not in text
    assert "\\u001b[2Jx" in text and "\\u009b31m" in text
