"""The compiled fast path for plain JSON Schemas agrees with jsonschema, value for value.

`compile_check` answers "valid" without jsonschema's walk for the schemas most tools have;
it must never say valid where jsonschema finds an error (an invalid argument would reach a
body), and it should say valid wherever jsonschema does for plain JSON values (else the fast
path is not taken). Both directions are checked against jsonschema itself, on generated
schemas of the subset and generated JSON values.
"""

from __future__ import annotations

import math
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import handrail as hr
from handrail.tools import SchemaTool
from handrail.tools._schemas import compile_check, local_validator, schema_issues

TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
    | st.integers(-6, 6) | st.sampled_from([0.5, -1.5, 2.0])  # the bounds themselves
    | st.sampled_from([0.0, 1.0, -2.0, 3.5, 1e20]) | st.text(max_size=6)
    | st.sampled_from(["a", "b", "ab", "é", ""]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=4),
    max_leaves=12,
)


def _leaf_schema() -> st.SearchStrategy[dict[str, Any]]:
    numbers = st.integers(-5, 5) | st.sampled_from([0.5, -1.5, 2.0])
    keyword = st.one_of(
        st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
        st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1,
                                                      max_size=3, unique=True)),
        st.builds(lambda n: {"minimum": n}, numbers),
        st.builds(lambda n: {"maximum": n}, numbers),
        st.builds(lambda n: {"exclusiveMinimum": n}, numbers),
        st.builds(lambda n: {"exclusiveMaximum": n}, numbers),
        st.builds(lambda n: {"minLength": n}, st.integers(0, 3)),
        st.builds(lambda n: {"maxLength": n}, st.integers(0, 3)),
        st.builds(lambda n: {"minItems": n}, st.integers(0, 3)),
        st.builds(lambda n: {"maxItems": n}, st.integers(0, 3)),
        st.builds(lambda e: {"enum": e}, st.lists(st.sampled_from(["a", "b", "ab", ""]),
                                                  min_size=1, max_size=3)),
        st.just({"title": "T", "description": "d", "format": "uri", "default": 3}),
    )
    return st.lists(keyword, min_size=0, max_size=3).map(
        lambda parts: {k: v for part in parts for k, v in part.items()})


schemas = st.recursive(
    _leaf_schema() | st.booleans(),
    lambda inner: st.one_of(
        st.builds(lambda props, req, extra, base: {
            **base, "properties": props, "required": req,
            **({} if extra is None else {"additionalProperties": extra})},
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            st.lists(st.sampled_from(["a", "b", "d"]), max_size=2, unique=True),
            st.none() | st.booleans() | inner,
            st.sampled_from([{}, {"type": "object"}])),
        st.builds(lambda item, base: {**base, "items": item}, inner,
                  st.sampled_from([{}, {"type": "array"}])),
        st.builds(lambda branches: {"anyOf": branches}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda branches: {"allOf": branches}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return False


@settings(max_examples=400, deadline=None)
@given(schemas, st.lists(json_values, min_size=1, max_size=6))
def test_the_fast_path_says_valid_exactly_where_jsonschema_does(schema: Any,
                                                                values: list[Any]) -> None:
    check = compile_check(schema)
    assert check is not None, f"a schema of the plain subset was not compiled: {schema}"
    validator = local_validator(schema if isinstance(schema, dict) else {"allOf": [schema]})
    for value in values:
        assert check(value) == validator.is_valid(value), (schema, value)


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "integer"}}},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"type": "string", "pattern": "^a"},
    {"type": "object", "patternProperties": {"^x": {"type": "integer"}},
     "additionalProperties": False},
    {"items": [{"type": "integer"}], "$schema": "http://json-schema.org/draft-07/schema#"},
    {"prefixItems": [{"type": "integer"}], "items": False},
    {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": True,
     "minimum": 0},
    {"type": "widget"},
    {"enum": [1, True]},
    {"const": 1},
    {"properties": {"a": {"not": {"type": "null"}}}},
    {"minimum": True},
    {"minLength": -1},
    {"maximum": float("nan")},
])
def test_a_schema_outside_the_subset_is_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None


@pytest.mark.parametrize("extra", ["a", "b", "c", "d", "q"])
def test_additional_properties_false_refuses_every_key_not_declared(extra: str) -> None:
    # A key named in `required` (or anywhere but `properties`) is still an additional one.
    # Every key, not only the ones the property test happens to draw: a check that let
    # one name through was found by that test on some seeds only.
    schema = {"type": "object", "properties": {"p": {"type": "integer"}},
              "required": ["d"], "additionalProperties": False}
    check = compile_check(schema)
    assert check is not None
    validator = local_validator(schema)
    for value in ({"p": 1, extra: 1}, {extra: None}, {"d": 1, extra: "x"}):
        assert check(value) is validator.is_valid(value) is False, value
    assert check({"p": 1}) is validator.is_valid({"p": 1}) is False  # "d" is required
    assert check({}) is False


def test_python_values_json_has_no_type_for_go_to_jsonschema() -> None:
    check = compile_check({"type": "object", "properties": {"a": {"type": "array"}}})
    assert check is not None
    assert check({"a": [1]})
    assert not check({"a": (1,)})  # a tuple: jsonschema's verdict, not the fast path's
    integer = compile_check({"type": "integer"})
    assert integer is not None
    assert integer(3) and integer(3.0) and not integer(True) and not integer(3.5)


def test_issues_are_still_jsonschemas_messages() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    check = compile_check(schema)
    issues = schema_issues(local_validator(schema), {"a": "x"}, check)
    assert [i.message for i in issues] == ["'x' is not of type 'integer'"]
    assert schema_issues(local_validator(schema), {"a": 1}, check) == []


def test_a_schema_tool_refuses_what_its_schema_refuses_on_the_fast_path() -> None:
    async def run(arguments: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.json({"result": arguments["a"] + arguments["b"]})

    spec = hr.ToolSpec("up/add", "Add.", {
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "maximum": 10}}})
    tool = SchemaTool(spec, run)
    assert tool.validate({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    for bad in ({"a": 1}, {"a": 1, "b": 11}, {"a": "1", "b": 2}, {"a": True, "b": 2}):
        with pytest.raises(hr.InvalidArguments):
            tool.validate(bad)


@pytest.mark.parametrize("keyword", ["minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum", "minLength", "maxLength", "minItems",
                                     "maxItems"])
def test_each_bound_at_its_edge(keyword: str) -> None:
    for bound in (0, 2, 2.0, 0.5) if "Length" not in keyword and "Items" not in keyword \
            else (0, 1, 2):
        schema = {keyword: bound}
        check = compile_check(schema)
        assert check is not None
        validator = local_validator(schema)
        for value in (bound, bound + 1, bound - 1, bound + 0.5, bound - 0.5, True, None,
                      "", "ab", "a" * int(bound), [], [1, 2], [0] * int(bound)):
            assert check(value) == validator.is_valid(value), (schema, value)


@pytest.mark.parametrize(("depth", "compiled"), [(5, True), (31, True), (40, False)])
def test_deep_schemas_compile_to_functions_not_nested_blocks(depth: int,
                                                             compiled: bool) -> None:
    # Python refuses more than 20 statically nested blocks: each nested object schema gets
    # a generated function of its own, so any depth up to the bound compiles.
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    check = compile_check(schema)
    assert (check is not None) is compiled
    if check is not None:
        value: Any = 1
        for _ in range(depth):
            value = {"a": value}
        assert check(value)
        assert not check({"a": None} if depth > 1 else {"a": "x"})


def test_a_schemas_names_are_values_of_the_check_never_its_source() -> None:
    # A server's schema is someone else's text: a property named like code stays a name.
    hostile = "'] or True or x0['"
    schema = {"type": "object", "required": [hostile, '"q"'],
              "properties": {hostile: {"type": "integer"}, "__class__": {"type": "string"}},
              "additionalProperties": False}
    check = compile_check(schema)
    assert check is not None
    assert check({hostile: 1, '"q"': 2, "__class__": "s"}) is False  # `"q"` not declared
    schema["properties"]['"q"'] = {"enum": ["a"]}  # type: ignore[index]
    check = compile_check(schema)
    assert check is not None
    assert check({hostile: 1, '"q"': "a", "__class__": "s"})
    assert not check({hostile: "1", '"q"': "a"})
    assert not check({'"q"': "a"})  # the hostile name is required


def test_a_schema_too_large_to_generate_is_left_to_jsonschema() -> None:
    # A server can send any schema: past `_MAX_LINES` its check is not compiled (that
    # would cost ~0.15 ms a line, seconds for a large one) and jsonschema says the same.
    def schema(n: int) -> dict[str, Any]:
        return {"type": "object", "required": ["p0"], "additionalProperties": False,
                "properties": {f"p{i}": {"type": "integer", "minimum": 0} for i in range(n)}}

    assert compile_check(schema(1000)) is not None
    large = schema(5000)
    assert compile_check(large) is None
    tool = SchemaTool(hr.ToolSpec(id=hr.ToolId.parse("big/t"), description="d",
                                  input_schema=large),
                      lambda arguments, ctx: None)  # type: ignore[arg-type, return-value]
    assert tool.validate({"p0": 1, "p4999": 2}) == {"p0": 1, "p4999": 2}
    for bad in ({"p0": -1}, {"p1": 1}, {"p0": 1, "q": 1}):
        with pytest.raises(hr.InvalidArguments):
            tool.validate(bad)


def test_a_type_list_with_repeats_checks_as_its_set() -> None:
    check = compile_check({"type": ["integer"] * 1000 + ["string"]})
    assert check is not None and check(1) and check("a") and not check(1.5)
