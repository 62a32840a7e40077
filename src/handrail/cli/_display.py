r"""What the CLI prints of what a model or a tool wrote: never a terminal instruction.

A model chooses paths, argv, questions and text; a tool chooses its results. Printed raw, an
escape sequence in a path can rewrite the line a person reads (`sh -c 'curl ...'` displayed
as `exec git status`), and a bidi override can reorder it. Everything the CLI prints from a
model or a tool goes through `printable` (or `printable_json` / `argv_text`), which escapes:

- every control character: C0 (U+0000-001F), DEL (U+007F), C1 (U+0080-009F);
- every format character (Unicode category Cf): the bidi embeddings, overrides and isolates
  (U+202A-202E, U+2066-2069), zero-width characters (U+200B-200F), the BOM (U+FEFF), ...;
- line and paragraph separators (U+2028, U+2029) and lone surrogates (which a terminal
  cannot even encode);
- the backslash itself, so that every backslash printed starts an escape and `\x1b` typed
  by a model never reads like an escaped ESC.

`--json` output is exempt: `json.dumps` escapes everything outside printable ASCII.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

__all__ = ["argv_text", "needs_escape", "printable", "printable_json"]

_CANDIDATE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")  # all but printable ASCII other than "\"
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def needs_escape(char: str) -> bool:
    """Whether `char` (one character) may not reach a terminal as it is."""
    if char in _SHORT:
        return True
    if char < "\x80":
        return char < " " or char == "\x7f"
    return unicodedata.category(char) in _ESCAPED_CATEGORIES


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if not needs_escape(char):
        return char
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


def printable(value: object) -> str:
    """`value` as text that shows on a terminal exactly as it is (see the module docstring)."""
    return _CANDIDATE.sub(_escape, value if isinstance(value, str) else str(value))


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    if not needs_escape(char):
        return char
    code = ord(char)
    if code >= 0x10000:  # a JSON \u escape holds 16 bits: the surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


_JSON_LEFT = re.compile(r"[^\x20-\x7e]")


def printable_json(value: Any) -> str:
    r"""`value` as JSON, readable (non-ASCII letters kept) and with nothing a terminal obeys.

    Stays valid JSON: json.dumps escapes C0, quotes and backslashes; what it leaves (DEL, C1,
    format characters...) is escaped as `\uXXXX`.
    """
    text = json.dumps(value, ensure_ascii=False, default=str)
    return _JSON_LEFT.sub(_json_escape, text)


def argv_text(argv: Sequence[Any]) -> str:
    """An argv as the quoted list it is (`["sh", "-c", "echo hi"]`), never a joined line."""
    return printable_json([str(a) for a in argv])
