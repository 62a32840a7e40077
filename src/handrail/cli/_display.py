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
import os
import re
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["Out", "argv_text", "needs_escape", "printable", "printable_json", "style", "table",
           "width"]

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


# ------------------------------------------------------------------ output
#
# The reading commands (`runs`, `show`, `pending`) answer in well under 200 ms on a store of
# 10,000 runs (issue 11): rich costs ~40 ms of import and ~0.1 ms a line, more than everything
# else they do. What they need of it is a few styles and an aligned table, done here.
#
# A styled span is marked with C0 characters that `printable` never lets through (it escapes
# every one), so nothing a model or a tool wrote can open, close or fake a style: the markers
# are the only C0 characters a line can hold, and `Out` turns each into an SGR sequence on a
# terminal, or drops it elsewhere.

_OPEN, _BODY, _CLOSE = "\x01", "\x02", "\x03"
_MARKED = re.compile("\x01([a-z ]*)\x02|\x03")
_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34",
        "magenta": "35", "cyan": "36", "white": "37"}


def style(name: str, text: str) -> str:
    """`text` (made printable already) shown in `name`: "bold", "red", "bold cyan", ...

    Styles nest; off a terminal they vanish and only `text` is printed.
    """
    return f"{_OPEN}{name}{_BODY}{text}{_CLOSE}"


def _colour_wanted(stream: TextIO) -> bool:
    """Whether `stream` is a terminal that wants colours (https://no-color.org, TERM=dumb)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


class Out:
    """Lines for stdout: styled on a terminal, plain text otherwise, written in one go.

    Args:
        stream: Where to write (default: `sys.stdout` when `flush` runs, which is what a
            test's capture or `contextlib.redirect_stdout` replaced it with).
    """

    __slots__ = ("_lines", "_stream")

    def __init__(self, stream: TextIO | None = None) -> None:
        self._lines: list[str] = []
        self._stream = stream

    def print(self, text: str = "") -> None:
        """Add a line (or several, separated by newlines) of printable, possibly styled text."""
        self._lines.append(text)

    def flush(self) -> None:
        """Write the lines kept so far (one write: per-line writes cost on a 1,000-line page)."""
        if not self._lines:
            return
        stream = self._stream if self._stream is not None else sys.stdout
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        stream.write(_render(text, _colour_wanted(stream)))
        stream.flush()


def _render(text: str, colour: bool) -> str:
    if not colour:
        return _MARKED.sub("", text)
    stack: list[str] = []

    def sgr(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            stack.append(";".join(_SGR[n] for n in match.group(1).split() if n in _SGR))
        elif stack:
            stack.pop()
        # Reset, then every style still open: a span closing inside another restores it.
        return "\x1b[0m" + "".join(f"\x1b[{s}m" for s in stack if s)

    return _MARKED.sub(sgr, text)


def width(text: str) -> int:
    """Columns `text` (printable) takes on a terminal: wide characters 2, combining ones 0."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of printable cells as aligned lines under a bold header; no cell is ever cut."""
    widths = [max([width(h), *(width(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c + " " * (w - width(c)) for c, w in zip(cells, widths, strict=True)]
        return "  ".join(padded).rstrip()

    return [style("bold", line(headers)), *(line(r) for r in rows)]
