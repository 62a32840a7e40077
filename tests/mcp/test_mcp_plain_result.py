"""The plain `tools/call` result's fast path (`plain_call_result`) agrees with the SDK's path.

A result of text blocks is taken without the SDK's validations (issue 38); anything else
goes the general way (`check_call_result`, then `from_mcp_result`). The property: for any
result, plain or near it, the fast path answers None or exactly what the general path
answers, and None wherever the general path refuses the result.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import handrail as hr
from handrail.mcp._content import from_mcp_result, plain_call_result
from handrail.mcp._wire import check_call_result

VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
MAX = 200

# Text as JSON can carry it: any code point, lone surrogates too (json.loads makes them).
texts = st.text(st.characters(codec=None, categories=None), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
text_blocks = st.builds(lambda t: {"type": "text", "text": t}, texts)
plain_results = st.fixed_dictionaries(
    {"content": st.lists(text_blocks, max_size=4)},
    optional={
        "isError": st.booleans(),
        "structuredContent": st.none() | st.dictionaries(texts, json_values, max_size=3),
    },
)
# Near a plain result: a block or a key added, a value of another type.
odd_blocks = (
    text_blocks
    | st.builds(
        lambda t, k, v: {"type": "text", "text": t, k: v},
        texts,
        st.sampled_from(["annotations", "_meta", "extra"]),
        json_values,
    )
    | st.builds(lambda t: {"type": "image", "data": t, "mimeType": "image/png"}, texts)
    | st.builds(lambda v: {"type": "text", "text": v}, json_values)
    | st.builds(lambda v: {"type": v, "text": "x"}, json_values)
    | json_values
)
odd_results = st.one_of(
    plain_results,
    st.fixed_dictionaries(
        {"content": st.lists(odd_blocks, max_size=3) | json_values},
        optional={
            "isError": json_values,
            "structuredContent": json_values,
            "_meta": json_values,
            "ttlMs": json_values,
            "resultType": json_values,
        },
    ),
    json_values,
)


def general(raw: Any, version: str) -> hr.ToolResult | Exception:
    # UnicodeEncodeError: the SDK's check of a structuredContent holding a lone surrogate.
    try:
        return from_mcp_result(
            check_call_result(copy.deepcopy(raw), version), tool="s/t", max_bytes=MAX
        )
    except (ValidationError, hr.InvalidOutput, UnicodeEncodeError) as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(plain_results, st.sampled_from(VERSIONS))
def test_a_plain_result_is_taken_and_is_what_the_general_path_makes(
    raw: dict[str, Any], version: str
) -> None:
    expected = general(raw, version)
    fast = plain_call_result(copy.deepcopy(raw), max_bytes=MAX)
    if isinstance(expected, Exception):  # its size, or a surrogate the SDK's check raises on
        assert isinstance(expected, hr.InvalidOutput | UnicodeEncodeError) and fast is None
    elif fast is None:
        # Left to the general path only for a structuredContent no UTF-8 can carry (which
        # that path takes at some protocol versions and places: a key at the top).
        with pytest.raises(UnicodeEncodeError):
            json.dumps(raw.get("structuredContent"), ensure_ascii=False).encode()
    else:
        assert fast == expected


@settings(max_examples=600, deadline=None)
@given(odd_results, st.sampled_from(VERSIONS))
def test_any_other_result_is_left_to_the_general_path_or_made_the_same(
    raw: Any, version: str
) -> None:
    fast = plain_call_result(copy.deepcopy(raw), max_bytes=MAX)
    if fast is not None:
        assert fast == general(raw, version)


@pytest.mark.parametrize(
    "raw",
    [
        {"content": [{"type": "text", "text": "x", "annotations": {"priority": 9}}]},
        {"content": [{"type": "text", "text": "x"}], "isError": "true"},
        {"content": [{"type": "text", "text": "x"}], "isError": 1},
        {"content": [{"type": "text", "text": 7}]},
        {"content": [{"type": "text", "text": "x"}], "structuredContent": [1]},
        {"content": [{"type": "text", "text": "x"}], "_meta": {}},
        {"content": [{"type": "image", "data": "eA==", "mimeType": "image/png"}]},
        {"content": ({"type": "text", "text": "x"},)},
        {"content": [{"type": "text", "text": "x" * (MAX + 1)}]},
        {"content": [], "structuredContent": {"a": {"\ud800": None}}},
        {"isError": False},
        [{"type": "text", "text": "x"}],
    ],
    ids=[
        "annotations",
        "error-str",
        "error-int",
        "text-int",
        "structured-list",
        "meta",
        "image",
        "tuple",
        "too-long",
        "surrogate",
        "no-content",
        "not-a-dict",
    ],
)
def test_what_is_not_exactly_plain_is_not_taken(raw: Any) -> None:
    assert plain_call_result(raw, max_bytes=MAX) is None


def test_the_common_results_are_taken() -> None:
    assert plain_call_result(
        {
            "content": [{"type": "text", "text": "5"}],
            "structuredContent": {"result": 5},
            "isError": False,
        }
    ) == hr.ToolResult((hr.Text("5"),), {"result": 5}, False)
    assert plain_call_result({"content": [], "structuredContent": {"n": 1}}) == hr.ToolResult(
        (hr.Json({"n": 1}),), {"n": 1}, False
    )
    assert plain_call_result({"content": [], "isError": True}) == hr.ToolResult(
        (hr.Text(""),), None, True
    )
