"""A small TOML writer for JSON-compatible data (what `Manifest.to_toml` needs, no more).

Tables are written as `[section]` headers and lists of tables as `[[section]]`, so a JSON
Schema or a policy reads the way a person would write it; anything nested inside a list of
scalars falls back to inline tables. `None` has no TOML spelling: a key whose value is None is
left out (every reader here treats a missing key as None).

A JSON Schema is different: `null` in it is meaning (`"default": null`), so schemas pass through
`encode_json` on the way out and `decode_json` on the way in. A JSON value TOML cannot hold
(`null`, an integer outside TOML's 64 bits) is written as the one-key inline table
`{ "$json" = "<its JSON text>" }`; a JSON object whose only key is `"$json"` is written that way
too, so the spelling can never be read back as something else. The round trip is exact.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["JSON_ESCAPE_KEY", "decode_json", "encode_json", "key", "string", "table", "value"]

JSON_ESCAPE_KEY = "$json"
"""The key of the one-key table that spells a JSON value TOML has no form for."""

_INT_RANGE = range(-(2**63), 2**63)


def encode_json(data: Any) -> Any:
    """JSON-compatible `data` as data TOML can hold, losslessly (see the module docstring)."""
    if data is None or (isinstance(data, int) and not isinstance(data, bool)
                        and data not in _INT_RANGE):
        return {JSON_ESCAPE_KEY: json.dumps(data)}
    if isinstance(data, Mapping):
        if set(data) == {JSON_ESCAPE_KEY}:
            return {JSON_ESCAPE_KEY: json.dumps(data, ensure_ascii=False, allow_nan=False)}
        return {k: encode_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [encode_json(v) for v in data]
    return data


def decode_json(data: Any) -> Any:
    """The inverse of `encode_json`, for data read from TOML.

    Raises:
        ValueError: a `{ "$json" = ... }` table whose value is not a string of JSON text.
    """
    if isinstance(data, dict):
        if set(data) == {JSON_ESCAPE_KEY}:
            text = data[JSON_ESCAPE_KEY]
            if not isinstance(text, str):
                raise ValueError(f'"{JSON_ESCAPE_KEY}" must be a string of JSON text')
            try:
                return json.loads(text)
            except ValueError as exc:
                raise ValueError(f'"{JSON_ESCAPE_KEY}" = {text!r} is not JSON text: {exc}'
                                 ) from None
        return {k: decode_json(v) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_json(v) for v in data]
    return data

_WIDTH = 88
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
_MULTILINE_ESCAPE = re.compile(r'\\|"(?="")|"\Z|[\x00-\x08\x0b-\x1f\x7f]')


def key(name: str) -> str:
    """`name` as a TOML key: bare when it can be, quoted otherwise."""
    return name if _BARE_KEY.fullmatch(name) else string(name, multiline=False)


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group()
    return _ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def string(text: str, *, multiline: bool = True) -> str:
    """`text` as a TOML basic string; multi-line (`\"\"\"`) when it holds line breaks."""
    if multiline and "\n" in text:
        # The newline right after the opening delimiter is trimmed by readers.
        return '"""\n' + _MULTILINE_ESCAPE.sub(_escape_char, text) + '"""'
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def value(data: Any) -> str:
    """A JSON-compatible value as an inline TOML value."""
    if isinstance(data, bool):
        return "true" if data else "false"
    if isinstance(data, int):
        return str(data)
    if isinstance(data, float):
        if not math.isfinite(data):
            raise ValueError(f"{data!r} has no JSON form")
        return repr(data)
    if isinstance(data, str):
        return string(data, multiline=False)
    if isinstance(data, Mapping):
        items = [f"{key(k)} = {value(v)}" for k, v in data.items() if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(data, Sequence):
        if any(v is None for v in data):
            raise ValueError("a list holding null has no TOML form")
        return "[" + ", ".join(value(v) for v in data) + "]"
    raise ValueError(f"a {type(data).__name__} has no TOML form")


def _is_table_list(data: Any) -> bool:
    return (isinstance(data, Sequence) and not isinstance(data, str) and bool(data)
            and all(isinstance(v, Mapping) for v in data))


def _inline(name: str, data: Any) -> bool:
    # Small tables (`items = { type = "string" }`, the `{ "$json" = "null" }` spelling) and
    # short lists of them (`anyOf = [{ type = "integer" }, { type = "null" }]`) read best on
    # one line; anything larger gets a `[header]` of its own, one key a line.
    if isinstance(data, Mapping) and set(data) == {JSON_ESCAPE_KEY}:
        return True
    limit = _WIDTH // 2 if isinstance(data, Mapping) else _WIDTH
    return len(f"{key(name)} = {value(data)}") <= limit


def table(header: str, data: Mapping[str, Any], *, array: bool = False) -> list[str]:
    """Lines for the table `data` under `header` (a dotted key), sub-tables after it."""
    lines = [f"[[{header}]]" if array else f"[{header}]"]
    later: list[tuple[str, Any]] = []
    for name, item in data.items():
        if item is None:
            continue
        if ((isinstance(item, Mapping) and item) or _is_table_list(item)) and not _inline(
                name, item):
            later.append((name, item))
        elif isinstance(item, str):
            lines.append(f"{key(name)} = {string(item)}")
        else:
            line = f"{key(name)} = {value(item)}"
            if len(line) > _WIDTH and isinstance(item, Sequence) and len(item) > 1:
                # One element a line: a reviewer's diff then shows exactly what changed.
                lines.append(f"{key(name)} = [")
                lines.extend(f"    {value(element)}," for element in item)
                lines.append("]")
            else:
                lines.append(line)
    if not array and len(lines) == 1 and later:
        lines = []  # a table holding only tables needs no header of its own
    for name, item in later:
        sub = f"{header}.{key(name)}"
        if lines:
            lines.append("")
        if isinstance(item, Mapping):
            lines.extend(table(sub, item))
        else:
            for index, element in enumerate(item):
                if index:
                    lines.append("")
                lines.extend(table(sub, element, array=True))
    return lines
