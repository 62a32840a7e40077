"""Bad input: every kind gets a clear error, and none reaches a tool body."""

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field

import handrail as hr
from handrail.tools import DEFAULT_MAX_ARGUMENT_BYTES, check_argument_payload

pytestmark = pytest.mark.anyio

calls: list[dict[str, Any]] = []


@hr.tool
async def book(room: str, guests: int = Field(ge=1, le=8), vip: bool = False,
               note: str | None = None) -> None:
    calls.append({"room": room, "guests": guests, "vip": vip, "note": note})


BOX = hr.Toolbox([book])


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


async def refused(arguments: Any, box: hr.Toolbox = BOX) -> hr.InvalidArguments:
    with pytest.raises(hr.InvalidArguments) as info:
        await box.call("book", arguments)
    assert calls == []
    assert info.value.disposition is hr.Disposition.NOT_SENT
    return info.value


@pytest.mark.parametrize(
    "arguments", [None, [], ["room"], 5, 1.5, True, ("room", "a"), {"room", "a"}],
)
async def test_non_object_arguments_are_refused(arguments: Any) -> None:
    error = await refused(arguments)
    assert error.issues[0].path == "$"
    assert "JSON object" in error.issues[0].message


@pytest.mark.parametrize("text", ["[]", "null", "5", '"x"', "{", "", "{'room': 'a'}",
                                  b"\xff\xfe", '{"room": "a", "guests": NaN}'])
async def test_non_object_or_malformed_json_text_is_refused(text: str | bytes) -> None:
    await refused(text)


async def test_unknown_fields_are_refused_by_default() -> None:
    error = await refused({"room": "a", "guests": 2, "pets": 1})
    assert [(i.path, i.message) for i in error.issues] == [
        ("$.pets", "unknown field; remove it (the tool accepts only the fields in its schema)")]


async def test_wrong_types_missing_fields_and_constraints_give_paths() -> None:
    error = await refused({"guests": "many", "vip": "perhaps"})
    paths = {i.path: i.message for i in error.issues}
    assert paths.keys() == {"$.room", "$.guests", "$.vip"}
    assert paths["$.room"] == "required field is missing"
    error = await refused({"room": "a", "guests": 9})
    assert [i.path for i in error.issues] == ["$.guests"]


async def test_the_rendering_tells_the_model_what_to_fix() -> None:
    error = await refused({"room": 5, "guests": 2})
    text = str(error)
    assert "invalid arguments for tool 'local/book'" in text
    assert "call it again" in text
    assert "- $.room: " in text


async def test_nested_paths_use_json_path_syntax() -> None:
    @hr.tool
    async def batch(items: list[dict[str, int]]) -> None: ...

    with pytest.raises(hr.InvalidArguments) as info:
        await hr.Toolbox([batch]).call("batch", {"items": [{"a": 1}, {"b": "x"}]})
    assert [i.path for i in info.value.issues] == ["$.items[1].b"]


async def test_arguments_may_be_any_mapping() -> None:
    from types import MappingProxyType

    await BOX.call("book", MappingProxyType({"room": "a", "guests": 1}))
    assert calls == [{"room": "a", "guests": 1, "vip": False, "note": None}]


# ---------------------------------------------------------------------------- size cap


async def test_default_size_cap_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_ARGUMENT_BYTES == 1 << 20
    assert BOX.max_argument_bytes == 1 << 20
    big = "x" * (1 << 20)
    error = await refused({"room": big, "guests": 1})
    assert "over the limit of 1048576 bytes" in error.issues[0].message
    await refused(json.dumps({"room": big, "guests": 1}))
    await refused(json.dumps({"room": big, "guests": 1}).encode())
    await BOX.call("book", {"room": "x" * 1000, "guests": 1})
    assert len(calls) == 1


async def test_configured_size_cap() -> None:
    box = hr.Toolbox([book], max_argument_bytes=64)
    await box.call("book", {"room": "a", "guests": 1})
    assert len(calls) == 1
    calls.clear()
    args = {"room": "x" * 60, "guests": 1}
    await refused(args, box)
    await refused(json.dumps(args), box)
    handler = box.handler("book")
    with pytest.raises(hr.InvalidArguments, match="over the limit of 64 bytes"):
        await handler.step(hr.Invoke("c", args))


async def test_size_counts_utf8_bytes_not_characters() -> None:
    box = hr.Toolbox([book], max_argument_bytes=100)
    room = "😀" * 20  # 20 characters, 80 bytes of UTF-8
    text = json.dumps({"room": room, "guests": 1}, ensure_ascii=False)
    assert len(text) < 100 < len(text.encode())
    await refused(text, box)
    await refused({"room": room, "guests": 1}, box)


@pytest.mark.parametrize(
    "arguments",
    [
        {"n": 10**40},  # a big int is long
        {"s": '"' * 30},  # every quote is escaped
        {"s": "\x01" * 30},  # control characters become \u0001
        {"k" * 10: [1] * 30},  # nested
        {1: "x" * 200},  # a key that is not a string
        {f"k{i}": i for i in range(40)},  # many keys
    ],
)
def test_the_size_check_is_exact(arguments: dict[Any, Any]) -> None:
    import pydantic_core

    exact = len(pydantic_core.to_json(arguments, fallback=repr))
    with pytest.raises(hr.InvalidArguments):
        check_argument_payload("t", arguments, exact - 1)
    assert check_argument_payload("t", arguments, exact) is arguments


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=20), json_values, max_size=20))
def test_the_cap_is_exact_at_its_edge(arguments: dict[str, Any]) -> None:
    import pydantic_core

    exact = len(pydantic_core.to_json(arguments))
    # Never refused at or under the cap, always over it: no payload slips past.
    assert check_argument_payload("t", arguments, exact) is arguments
    assert check_argument_payload("t", json.dumps(arguments, ensure_ascii=False),
                                  len(json.dumps(arguments, ensure_ascii=False).encode()))
    if exact > 1:
        with pytest.raises(hr.InvalidArguments):
            check_argument_payload("t", arguments, exact - 1)


# ---------------------------------------------------------------- property: validation

SCHEMA_VALIDATOR = jsonschema.Draft202012Validator(dict(book.spec.input_schema))
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "room": st.one_of(st.text(max_size=5), json_scalars),
        "guests": st.one_of(st.integers(-2, 10), json_scalars),
        "vip": st.one_of(st.booleans(), json_scalars),
        "note": st.one_of(st.none(), st.text(max_size=5), json_scalars),
        "extra": json_values,
    },
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.one_of(json_values, near_valid))
async def test_random_json_never_reaches_the_body_unless_it_validates(arguments: Any) -> None:
    calls.clear()
    valid_by_schema = SCHEMA_VALIDATOR.is_valid(arguments)
    for payload in (arguments, json.dumps(arguments)):
        calls.clear()
        try:
            await BOX.call("book", payload)
        except hr.InvalidArguments as exc:
            assert calls == []
            assert exc.issues and all(i.path.startswith("$") for i in exc.issues)
            # Everything the published schema accepts, the tool accepts.
            assert not valid_by_schema
            continue
        # What reached the body has the declared types and meets the constraints.
        (seen,) = calls
        assert isinstance(arguments, dict)
        assert type(seen["room"]) is str
        assert type(seen["guests"]) is int and 1 <= seen["guests"] <= 8
        assert type(seen["vip"]) is bool
        assert seen["note"] is None or type(seen["note"]) is str
        assert set(arguments) <= {"room", "guests", "vip", "note"}
        if valid_by_schema:
            assert seen == {"vip": False, "note": None, **arguments}


def test_a_payload_with_no_utf8_form_is_left_to_validation_but_still_capped() -> None:
    # A lone surrogate has no UTF-8 form; the size check measures its escaped form (never
    # smaller) and leaves it to the tool's validation to accept it or name the field.
    payload = {"room": "\ud800"}
    assert check_argument_payload("t", payload, 100) is payload
    with pytest.raises(hr.InvalidArguments, match="over the limit"):
        check_argument_payload("t", {"room": "\ud800" * 20}, 100)
    with pytest.raises(hr.InvalidArguments, match="not JSON-encodable"):
        check_argument_payload("t", {("a", 1): "\ud800"}, 100)
