"""Where each key of a TOML document is written: the line numbers `tomllib` does not give.

`key_lines(text)` maps every key path to the 1-based line that first mentions it. A path is a
tuple of keys and array indexes, the same path one would use on `tomllib.loads(text)`:
`("tools", 2, "description")` is the `description` of the third `[[tools]]` entry, whether it
was written as a table, an inline table or an array of inline tables.

The scanner assumes `text` is valid TOML (the caller parses it with `tomllib` first), so it
only has to find where things are, not to check them.
"""

from __future__ import annotations

import bisect
import re

__all__ = ["Path", "key_lines", "line_of"]

Path = tuple[str | int, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = frozenset(",]}\n#")


def key_lines(text: str) -> dict[Path, int]:
    """Map each key path of the (valid) TOML `text` to the line that first mentions it."""
    scanner = _Scanner(text)
    scanner.document()
    return scanner.lines


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of `path`, or of its nearest ancestor that has one."""
    while True:
        line = lines.get(path)
        if line is not None or not path:
            return line
        path = path[:-1]


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.lines: dict[Path, int] = {}
        self._newlines = [m.start() for m in re.finditer("\n", text)]
        # The current length of each array of tables, so `[a.b]` after `[[a]]` lands in the
        # last element.
        self._aot: dict[Path, int] = {}

    def line(self, pos: int) -> int:
        return bisect.bisect_left(self._newlines, pos) + 1

    def record(self, path: Path, pos: int) -> None:
        self.lines.setdefault(path, self.line(pos))

    # -- structure ---------------------------------------------------------------------------

    def document(self) -> None:
        table: Path = ()
        s = self.s
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(s):
                return
            start = self.i
            if s.startswith("[[", self.i):
                self.i += 2
                key = self.key()
                self.skip_blank()
                self.i += 2  # ]]
                array = (*self.resolve(key[:-1]), key[-1])
                index = self._aot.get(array, -1) + 1
                self._aot[array] = index
                table = (*array, index)
                self.record_prefixes(array, start)
                self.record(table, start)
            elif s[self.i] == "[":
                self.i += 1
                key = self.key()
                self.skip_blank()
                self.i += 1  # ]
                table = self.resolve(key)
                self.record_prefixes(table, start)
            else:
                key = self.key()
                self.skip_blank()
                self.i += 1  # =
                self.skip_blank()
                self.record_prefixes((*table, *key), start)
                self.value((*table, *key))

    def resolve(self, key: tuple[str, ...]) -> Path:
        path: Path = ()
        for part in key:
            path = (*path, part)
            if path in self._aot:
                path = (*path, self._aot[path])
        return path

    def record_prefixes(self, path: Path, pos: int) -> None:
        for end in range(1, len(path) + 1):
            self.record(path[:end], pos)

    # -- lexical -----------------------------------------------------------------------------

    def skip_blank(self, *, newlines: bool = False) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end
            else:
                return

    def key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self.skip_blank()
            c = self.s[self.i]
            if c == '"':
                start = self.i
                self.basic_string()
                parts.append(_decode_quoted_key(self.s[start:self.i]))
            elif c == "'":
                start = self.i
                self.literal_string()
                parts.append(self.s[start + 1:self.i - 1])
            else:
                match = _BARE_KEY.match(self.s, self.i)
                if match is None:  # not valid TOML; stop rather than loop
                    raise ValueError(f"unexpected {c!r} at line {self.line(self.i)}")
                parts.append(match.group())
                self.i = match.end()
            self.skip_blank()
            if self.i < len(self.s) and self.s[self.i] == ".":
                self.i += 1
                continue
            return tuple(parts)

    def value(self, path: Path) -> None:
        s = self.s
        self.record(path, self.i)
        c = s[self.i]
        if s.startswith('"""', self.i):
            self.multiline('"""')
        elif s.startswith("'''", self.i):
            self.multiline("'''")
        elif c == '"':
            self.basic_string()
        elif c == "'":
            self.literal_string()
        elif c == "[":
            self.i += 1
            index = 0
            while True:
                self.skip_blank(newlines=True)
                if s[self.i] == "]":
                    self.i += 1
                    return
                self.value((*path, index))
                index += 1
                self.skip_blank(newlines=True)
                if s[self.i] == ",":
                    self.i += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip_blank(newlines=True)
                if s[self.i] == "}":
                    self.i += 1
                    return
                start = self.i
                key = self.key()
                self.skip_blank()
                self.i += 1  # =
                self.skip_blank()
                self.record_prefixes((*path, *key), start)
                self.value((*path, *key))
                self.skip_blank(newlines=True)
                if s[self.i] == ",":
                    self.i += 1
        else:  # number, boolean, date-time: nothing to find inside
            while self.i < len(s) and s[self.i] not in _SCALAR_END:
                self.i += 1

    def basic_string(self) -> None:
        s, i = self.s, self.i + 1
        while s[i] != '"':
            i += 2 if s[i] == "\\" else 1
        self.i = i + 1

    def literal_string(self) -> None:
        self.i = self.s.index("'", self.i + 1) + 1

    def multiline(self, quotes: str) -> None:
        s, i = self.s, self.i + 3
        while not s.startswith(quotes, i):
            i += 2 if quotes == '"""' and s[i] == "\\" else 1
        i += 3
        # Up to two quote characters may end the content right before the delimiter.
        for _ in range(2):
            if i < len(s) and s[i] == quotes[0]:
                i += 1
        self.i = i


def _decode_quoted_key(raw: str) -> str:
    import tomllib

    # The escapes of a quoted key are a basic string's; let the real parser decode them.
    (key,) = tomllib.loads(f"{raw} = 0")
    return key
