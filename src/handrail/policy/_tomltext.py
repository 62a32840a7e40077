"""TOML text before `tomllib` sees it: a leading BOM, and nesting too deep to parse.

`tomllib` recurses once per nested array or inline table, so `a = [[[[...]]]]` a few thousand
levels deep ends in a `RecursionError` with a traceback instead of an error naming the file and
line. Policy files and manifests never need more than a handful of levels, so nesting deeper
than `MAX_NESTING` is refused before parsing, with the line where it goes too deep.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NESTING", "too_deep", "without_bom"]

MAX_NESTING = 64
"""The deepest nesting of arrays and inline tables accepted in a policy file or manifest."""

# Strings and comments first, so brackets inside them are not counted.
_TOKEN = re.compile(
    r'"""(?:[^"\\]|\\.|"(?!""))*"""'
    r"|'''(?:[^']|'(?!''))*'''"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|#[^\n]*"
    r"|[\[\]{}\n]",
    re.DOTALL,
)


def without_bom(text: str) -> str:
    """`text` without a leading UTF-8 byte order mark (editors on Windows write one)."""
    return text[1:] if text.startswith("\ufeff") else text


def too_deep(text: str) -> int | None:
    """The 1-based line where arrays and inline tables nest deeper than `MAX_NESTING`, or None.

    A malformed file (an unclosed string) is left for the TOML parser to report.
    """
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return None
    depth = 0
    line = 1
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
        elif tok in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return line
        elif tok in "]}":
            depth = max(0, depth - 1)
        else:
            line += tok.count("\n")
    return None
