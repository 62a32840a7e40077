"""Tool names, tool ids, and the exact, reversible name a model sees.

Model-facing names must fit every provider's function-name alphabet (`[A-Za-z0-9_-]`), so a
tool id `server/name` is encoded:

- on the default server `local`, a name made only of `[A-Za-z0-9_]` is sent as is
  (`get_weather`), as users and providers expect;
- anything else is escaped, `-` standing as the escape character: `-` -> `-h`, `.` -> `-d`;
- a tool on another server is `<escaped server>--<escaped name>` (`ledger--transfer`).

Escaped text never holds `--` and plain text never holds `-`, so the three forms cannot collide
and decoding is exact: `ToolId.from_model_name` returns the only id whose encoding is that
string, or None. No case folding, no trimming, no nearest match.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from handrail.errors import UserError

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

__all__ = ["DEFAULT_SERVER", "ToolId", "ToolName"]

DEFAULT_SERVER = "local"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
# The same alphabet for pydantic's (Rust) regex engine, which searches rather than full-matches.
_NAME_ANCHORED = r"^[A-Za-z0-9_.\-]{1,64}$"
_PLAIN = re.compile(r"[A-Za-z0-9_]+")


class ToolName(str):
    """A tool or server name: 1 to 64 characters of `[A-Za-z0-9_.-]`.

    Constructing one validates it; `ToolName("get weather")` raises `UserError`. ASCII only, so
    a look-alike such as a Cyrillic `а` is refused rather than silently aliased.
    """

    __slots__ = ()
    max_length: ClassVar[int] = 64

    def __new__(cls, value: str) -> ToolName:
        if not isinstance(value, str):
            raise UserError(f"a tool name must be a string, not {type(value).__name__}")
        if _NAME.fullmatch(value) is None:
            raise UserError(
                f"invalid tool name {value!r}: use 1 to 64 characters of A-Z, a-z, 0-9, "
                "'_', '.' or '-' (no spaces, no '/', ASCII only)"
            )
        return super().__new__(cls, value)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        # Imported here: only a typed tool's schema needs pydantic (issue 11).
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(pattern=_NAME_ANCHORED)
        )


def _escape(part: str) -> str:
    return part.replace("-", "-h").replace(".", "-d")


class ToolId:
    """A tool's identity: `server/name`. Hashable, ordered, immutable.

    `str(ToolId("ledger", "transfer")) == "ledger/transfer"`. Everywhere a tool id is taken, a
    `ToolId` or its `"server/name"` string works (`ToolId.of`).
    """

    __slots__ = ("_model_name", "_str", "name", "server")
    _str: str
    _model_name: str | None
    server: str
    """The server (namespace) the tool lives on; `local` for plain Python tools."""
    name: str
    """The tool's name within its server."""

    def __init__(self, server: str, name: str) -> None:
        object.__setattr__(self, "server", str(ToolName(server)))
        object.__setattr__(self, "name", str(ToolName(name)))
        object.__setattr__(self, "_str", f"{self.server}/{self.name}")
        object.__setattr__(self, "_model_name", None)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("ToolId is immutable")

    @classmethod
    def parse(cls, text: str) -> ToolId:
        """Parse `"server/name"`; a bare `"name"` is on the default server `local`."""
        if not isinstance(text, str):
            raise UserError(f"a tool id must be a 'server/name' string, not {type(text).__name__}")
        server, sep, name = text.partition("/")
        if not sep:
            return cls(DEFAULT_SERVER, text)
        if "/" in name:
            raise UserError(f"invalid tool id {text!r}: expected exactly one '/' (server/name)")
        return cls(server, name)

    @classmethod
    def of(cls, value: ToolId | str) -> ToolId:
        """Return `value` as a ToolId (parsing a `"server/name"` string)."""
        return value if isinstance(value, ToolId) else cls.parse(value)

    @property
    def model_name(self) -> str:
        """The name the model sees; see the module docstring for the encoding."""
        cached: str | None = self._model_name
        if cached is None:
            if self.server == DEFAULT_SERVER:
                cached = self.name if _PLAIN.fullmatch(self.name) else _escape(self.name)
            else:
                cached = f"{_escape(self.server)}--{_escape(self.name)}"
            object.__setattr__(self, "_model_name", cached)
        return cached

    @classmethod
    def from_model_name(cls, model_name: str) -> ToolId | None:
        """The only id whose `model_name` is exactly `model_name`, or None."""
        if not isinstance(model_name, str) or not model_name:
            return None
        parts: list[list[str]] = [[]]
        i, n = 0, len(model_name)
        while i < n:
            ch = model_name[i]
            if ch != "-":
                if not (ch.isascii() and (ch.isalnum() or ch == "_")):
                    return None
                parts[-1].append(ch)
                i += 1
                continue
            if i + 1 >= n:
                return None
            nxt = model_name[i + 1]
            if nxt == "h":
                parts[-1].append("-")
            elif nxt == "d":
                parts[-1].append(".")
            elif nxt == "-" and len(parts) == 1:
                parts.append([])
            else:
                return None
            i += 2
        try:
            if len(parts) == 1:
                tid = cls(DEFAULT_SERVER, "".join(parts[0]))
            else:
                tid = cls("".join(parts[0]), "".join(parts[1]))
        except UserError:
            return None
        # Exactness: only the canonical spelling maps back (e.g. `local--x` is not `x`).
        return tid if tid.model_name == model_name else None

    def __str__(self) -> str:
        return self._str

    def __repr__(self) -> str:
        return f"ToolId({self.server!r}, {self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolId) and other._str == self._str

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ToolId):
            return NotImplemented
        return self._str < other._str

    def __le__(self, other: object) -> bool:
        if not isinstance(other, ToolId):
            return NotImplemented
        return self._str <= other._str

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, ToolId):
            return NotImplemented
        return self._str > other._str

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, ToolId):
            return NotImplemented
        return self._str >= other._str

    def __hash__(self) -> int:
        return hash(self._str)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ToolId, (self.server, self.name))
