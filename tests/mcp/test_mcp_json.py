"""The MCP links' JSON (`handrail.mcp._json`): what `json` gives, without its per-call Python.

`loads` must give `json.loads`'s value or its error for every line, whatever a hostile peer
sends; the encoders must write what `json.dumps` writes with the same options.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from handrail.mcp import _json

LINES = [
    b'{"a":1}', b'{"a": [1, 2.5, null, true, "x"]}  \r\n\t', b'{"a":1} x', b'{"a":1}{"b":2}',
    b'{"a":', b'{"a":NaN, "b": -Infinity}', b'{"a":"\xed\xa0\x80"}',  # a lone surrogate
    b'{"a":"\xff"}',  # no UTF-8
    b'{"a":1}\x0b', b'{"a":1}\xc2\xa0',  # whitespace str.strip takes, JSON does not
    b'{"a":"x\ny"}', b'{"a":"\x01"}', b'[1]', b'"s"', b' {"a":1}', b'\xef\xbb\xbf{"a":1}',
    b'{"' + b"[" * 100_000, b'{"a": 1, "a": 2}', b"", b"{}", b'{"\x00":1}',
]


def _outcome(parse: Any, line: bytes) -> tuple[str, str]:
    try:
        return "value", repr(parse(line))
    except BaseException as exc:  # the error is what is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("line", LINES)
def test_loads_gives_what_json_loads_gives(line: bytes) -> None:
    assert _outcome(_json.loads, line) == _outcome(json.loads, line)


VALUES = [{"a": 1, "b": [1, 2.5, None, True, "é\u2028", {"c": {}}]}, {"x": float("nan")},
          {"s": "\ud800"}, "bare", [float("inf")], {"k": object()}, {1: "int key"}]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
@pytest.mark.parametrize(("encode", "options"), [
    (_json.compact_text, {"separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}),
    (_json.compact_ascii, {"separators": (",", ":")}),
    (_json.loose_text, {"separators": (",", ":"), "ensure_ascii": False}),
    (_json.strict_text, {"ensure_ascii": False, "allow_nan": False}),
])
def test_the_encoders_write_what_json_dumps_writes(encode: Any, options: dict[str, Any],
                                                   value: Any) -> None:
    assert _outcome(encode, value) == _outcome(lambda v: json.dumps(v, **options), value)
