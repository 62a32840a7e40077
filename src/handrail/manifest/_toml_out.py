"""A small TOML writer for JSON-compatible data (what `Manifest.to_toml` needs, no more).

Tables are written as `[section]` headers and lists of tables as `[[section]]`, so a JSON
Schema or a policy reads the way a person would write it; anything nested inside a list of
scalars falls back to inline tables. `None` has no TOML spelling: a key whose value is None is
left out (every reader here treats a missing key as None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["key", "string", "table", "value"]

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


def table(header: str, data: Mapping[str, Any], *, array: bool = False) -> list[str]:
    """Lines for the table `data` under `header` (a dotted key), sub-tables after it."""
    lines = [f"[[{header}]]" if array else f"[{header}]"]
    later: list[tuple[str, Any]] = []
    for name, item in data.items():
        if item is None:
            continue
        if (isinstance(item, Mapping) and item) or _is_table_list(item):
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
