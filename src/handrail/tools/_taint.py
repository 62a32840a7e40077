"""Provenance of a run's data: what came from a trusted source, and what a tool returned.

A tool's output is an attacker's input (a fetched page, an email, a file, an MCP server's
answer). `Provenance` holds two corpora for one run: the *trusted* text (the task, the
instructions, a person's answers, the output of tools declared `trusted_output`, values a
tool vouched for with `ctx.trust` or `sanitizes`) and the *untrusted* text (every other tool
output). The gate asks it, for each protected argument of a call, whether the value was seen
in untrusted output and not in trusted text (`Provenance.taint`).

How a value is looked for (both corpora alike):

- every string is normalised once, when it is added: Unicode NFKC, then case folding;
- *exact* (a value under 8 characters): the normalised value equals a whole string of an
  output, or one of its tokens (split on white space, quotes and brackets, trailing
  punctuation dropped);
- *numbers* (a JSON number argument) by value: `5000`, `5000.0` and a token `5,000` match;
- *substring*: a string of 8 or more characters matches anywhere inside an output (a whole
  output or token included), through an index of 5-character grams taken every 4
  characters (any occurrence of 8 characters or more covers one such gram whole), so a
  lookup costs the few candidates of its rarest gram, never a scan of the history. Text
  the grams cannot narrow down (a few grams repeated: `aaaa...`) is scanned in C instead,
  linear in the text and bounded by the limit below.

The index is bounded: past `MAX_UNTRUSTED_CHARS` of untrusted text, nothing more is indexed
and every protected value counts as tainted from then on (failing closed, never open).
"""

from __future__ import annotations

import array
import bisect
import decimal
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from handrail.errors import UserError

__all__ = [
    "MAX_UNTRUSTED_CHARS",
    "MIN_SUBSTRING",
    "Corpus",
    "Provenance",
    "Taint",
    "check_pointers",
    "pointer_problem",
    "pointer_values",
    "result_strings",
]

MIN_SUBSTRING = 8
"""A protected string this long or longer is also looked for inside outputs (normalised)."""

MAX_UNTRUSTED_CHARS = 16 * 1024 * 1024
"""Untrusted text indexed per run; beyond it every protected value counts as tainted."""

_GRAM = 5
_STRIDE = 4
_BUCKET_MASK = (1 << 16) - 1
_MAX_CANDIDATES = 4096
# An occurrence of MIN_SUBSTRING characters always covers a gram starting at a multiple of
# _STRIDE: positions s..s+3 hold one, and it ends by s+3+_GRAM <= s+MIN_SUBSTRING.
assert _GRAM + _STRIDE - 1 <= MIN_SUBSTRING

_TOKEN = re.compile(r"[^\s\x00\"'`()\[\]{}<>,;|]+")
_EDGE = ".:!?*"
_NUMBER = re.compile(r"[-+]?\d[\d,_]*(?:\.\d+)?")
_SKIPPED_KEYS = frozenset({"kind", "type", "mime_type", "mimeType", "data"})


def normalise(text: str) -> str:
    """NFKC, then case folding; NUL becomes U+FFFD (it separates strings in the index)."""
    return unicodedata.normalize("NFKC", text).casefold().replace("\x00", "\ufffd")


def _number_key(value: Any) -> str | None:
    """A canonical text for a number, equal for equal values (`5000`, `5000.0`, `5,000`).

    Plain decimal text is canonicalised as text (a `Decimal` per number token costs more than
    the rest of indexing an output); only a float in exponent form goes through `Decimal`.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        text = repr(value)
        if "e" in text:
            return format(decimal.Decimal(text).normalize(), "f")
    elif isinstance(value, str) and len(value) <= 64:
        text = value.replace(",", "").replace("_", "")
    else:
        return None
    sign = ""
    if text[:1] in "+-":
        sign, text = ("-" if text[0] == "-" else ""), text[1:]
    whole, _, fraction = text.partition(".")
    if not whole.isdigit() or (fraction and not fraction.isdigit()):
        return None
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    key = f"{whole}.{fraction}" if fraction else whole
    return "0" if key == "0" else sign + key


@dataclass(frozen=True, kw_only=True, slots=True)
class Taint:
    """One protected argument found in earlier untrusted output: why a call is asked about."""

    pointer: str
    """The argument, as a JSON Pointer into the call's arguments (`/to`, `/argv/2`)."""
    value: Any
    """The argument's value there, exactly as it will be used."""
    source_call: str
    """The model's id of the earlier call whose output held it (`"*"`: the index overflowed)."""
    source_tool: str
    """That call's tool (`server/name`)."""
    match: Literal["exact", "number", "substring", "overflow"]
    """How it was found: a short value (under 8 characters) as a whole string or token, a
    number by value, a longer value anywhere in an output (normalised), or everything counts
    once the index overflowed."""
    kind: Literal["taint"] = "taint"

    def describe(self) -> str:
        """One line for a person: which argument, which value, from which call."""
        shown = repr(self.value)
        if len(shown) > 200:
            shown = shown[:200] + f"... ({len(shown)} characters)"
        if self.match == "overflow":
            return (f"{self.pointer} = {shown}: this run saw more untrusted output than the "
                    "taint index holds, so every protected value counts as tainted")
        return (f"{self.pointer} = {shown} appears in the output of call {self.source_call} "
                f"({self.source_tool}), which is untrusted")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form, for the verdict record and a persisted request."""
        return {"kind": "taint", "pointer": self.pointer, "value": self.value,
                "source_call": self.source_call, "source_tool": self.source_tool,
                "match": self.match}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Taint:
        """The inverse of `to_dict`."""
        return cls(pointer=str(data["pointer"]), value=data.get("value"),
                   source_call=str(data["source_call"]), source_tool=str(data["source_tool"]),
                   match=data["match"])


# ------------------------------------------------------------------ JSON Pointers


def pointer_problem(pointer: object) -> str | None:
    """What is wrong with `pointer` as a JSON Pointer into arguments, or None."""
    if not isinstance(pointer, str):
        return f"{pointer!r} is not a string"
    if not pointer.startswith("/"):
        return f"{pointer!r} must start with '/' (a JSON Pointer such as '/to' or '/argv')"
    if re.search(r"~(?![01])", pointer):
        return f"{pointer!r} has a '~' that is not '~0' or '~1' (RFC 6901 escapes)"
    return None


def _tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def pointer_values(document: Any, pointer: str) -> Iterator[tuple[str, Any]]:
    """`(pointer, leaf)` for every string or number at or under `pointer` in `document`.

    A pointer to a list or an object stands for each leaf under it (`/argv` is every argument
    of a command). A missing path yields nothing: an optional argument left out is not used.
    """
    node = document
    for token in _tokens(pointer):
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return
    stack: list[tuple[str, Any]] = [(pointer, node)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{where}/{_escape(str(k))}", v) for k, v in
                         reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{where}/{i}", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, str) or (isinstance(value, int | float)
                                        and not isinstance(value, bool)):
            yield where, value


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def result_strings(result: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """The strings and numbers of a stored result (`ToolResult.to_dict()`) a model sees.

    Content items and structured output; never `metadata` (the model is not shown it), nor
    binary data, nor the names of content kinds.
    """
    strings: list[str] = []
    numbers: list[Any] = []
    stack: list[Any] = [result.get("content"), result.get("structured")]
    while stack:
        value = stack.pop()
        # Exact types first: a stored result is plain JSON, and an ABC check costs more
        # than the rest of this loop for a small result (issue 11).
        kind = type(value)
        if kind is str:
            strings.append(value)
        elif kind is dict:
            for k, v in value.items():
                if k not in _SKIPPED_KEYS:
                    stack.append(v)
        elif kind is list:
            stack.extend(value)
        elif kind is int or kind is float:
            numbers.append(value)
        elif value is None or kind is bool:
            continue
        elif isinstance(value, str):
            strings.append(value)
        elif isinstance(value, Mapping):
            stack.extend(v for k, v in value.items() if k not in _SKIPPED_KEYS)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            numbers.append(value)
    strings.reverse()
    return strings, numbers


# ------------------------------------------------------------------ the index


class Corpus:
    """Normalised text from several sources, searchable for a value (see the module doc)."""

    __slots__ = ("_buckets", "_exact", "_numbers", "_segments", "_sources", "_starts", "chars",
                 "limit", "overflowed")

    def __init__(self, *, limit: int = MAX_UNTRUSTED_CHARS) -> None:
        self._segments: list[str] = []
        self._starts: list[int] = []  # each segment's offset in the whole (for the postings)
        self._sources: list[tuple[str, str]] = []
        self._exact: dict[str, int] = {}
        self._numbers: dict[str, int] = {}
        # Gram -> offsets, bucketed by the gram's hash: memory grows with the text, not with
        # the number of distinct grams an attacker can make up; a collision only costs a
        # candidate that fails its check.
        self._buckets: dict[int, array.array[int]] = {}
        self.chars = 0
        """Normalised characters indexed so far."""
        self.limit = limit
        """How many characters it indexes; past that, `overflowed` is set."""
        self.overflowed: tuple[str, str] | None = None
        """The source whose text went past `limit`, if one did."""

    def add(self, source: tuple[str, str], strings: Iterable[str],
            numbers: Iterable[Any] = ()) -> None:
        """Index `strings` (and JSON `numbers`) as coming from `source` (call id, tool)."""
        if self.overflowed is not None:
            return
        parts = [normalise(s) for s in strings if s]
        text = "\x00".join(parts) + "\x00"
        if self.chars + len(text) > self.limit:
            self.overflowed = source
            return
        seg = len(self._segments)
        base = self.chars
        self._sources.append(source)
        self._segments.append(text)
        self._starts.append(base)
        self.chars += len(text)
        exact, nums = self._exact, self._numbers
        for part in parts:
            # Only short strings need an exact entry: a value of MIN_SUBSTRING characters or
            # more is found inside the text by the grams anyway.
            whole = part.strip()
            if len(whole) < MIN_SUBSTRING:
                exact.setdefault(whole, seg)
        # Distinct tokens and numbers first (findall and set run in C): the loops below touch
        # each once per output, not once per occurrence.
        for token in set(_TOKEN.findall(text)):
            token = token.strip(_EDGE)
            if token and len(token) < MIN_SUBSTRING:
                exact.setdefault(token, seg)
        for found in set(_NUMBER.findall(text)):
            # Most numbers in text are plain digits, already in canonical form.
            key = found if found.isdigit() and found[0] != "0" else _number_key(found)
            if key is not None:
                nums.setdefault(key, seg)
        for value in numbers:
            key = _number_key(value)
            if key is not None:
                nums.setdefault(key, seg)
        buckets = self._buckets
        get = buckets.get
        for pos in range(0, len(text) - _GRAM + 1, _STRIDE):
            bucket = hash(text[pos:pos + _GRAM]) & _BUCKET_MASK
            postings = get(bucket)
            if postings is None:
                postings = buckets[bucket] = array.array("Q")
            postings.append(base + pos)

    def find(self, value: Any) -> tuple[tuple[str, str], str] | None:
        """The source a protected `value` was seen in, and how; None when it was not."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            key = _number_key(value)
            seg = None if key is None else self._numbers.get(key)
            return None if seg is None else (self._sources[seg], "number")
        if not isinstance(value, str):
            return None
        text = normalise(value)
        if len(text) >= MIN_SUBSTRING:
            seg = self._substring(text)
            return None if seg is None else (self._sources[seg], "substring")
        seg = self._exact.get(text.strip())
        return None if seg is None else (self._sources[seg], "exact")

    def _substring(self, text: str) -> int | None:
        """The first segment holding `text` (at least MIN_SUBSTRING characters), or None."""
        buckets = self._buckets
        best: int | None = None
        for align in range(_STRIDE):
            # An occurrence whose position + align is a multiple of _STRIDE has all of these
            # grams indexed; candidates come from the rarest bucket, each checked in place.
            chosen: array.array[int] | None = None
            at = 0
            for offset in range(align, len(text) - _GRAM + 1, _STRIDE):
                postings = buckets.get(hash(text[offset:offset + _GRAM]) & _BUCKET_MASK)
                if postings is None:
                    chosen = None
                    break
                if chosen is None or len(postings) < len(chosen):
                    chosen, at = postings, offset
            if chosen is None:
                continue
            if len(chosen) > _MAX_CANDIDATES:
                # Text made of a few grams repeated ("aaaa..."): the index cannot narrow it
                # down, and a scan in C (linear in the text) is the cheaper bound.
                return self._scan(text)
            found = self._check(text, chosen, at, best)
            if found is not None:
                best = found
        return best

    def _check(self, text: str, postings: array.array[int], at: int,
               before: int | None) -> int | None:
        starts, segments = self._starts, self._segments
        for offset in postings:
            seg = bisect.bisect_right(starts, offset) - 1
            if before is not None and seg >= before:
                return None
            pos = offset - starts[seg] - at
            if pos >= 0 and segments[seg].startswith(text, pos):
                return seg
        return None

    def _scan(self, text: str) -> int | None:
        for seg, segment in enumerate(self._segments):
            if text in segment:
                return seg
        return None


class Provenance:
    """Where one run's data came from: trusted text, and untrusted tool output.

    Built when a run starts (the task and the instructions), fed by the gate as calls finish,
    and rebuilt from the store when a run resumes (see `handrail.runs`).
    """

    __slots__ = ("trusted", "untrusted")

    def __init__(self, *, limit: int = MAX_UNTRUSTED_CHARS) -> None:
        self.trusted = Corpus(limit=limit)
        """Text a person or the developer vouched for."""
        self.untrusted = Corpus(limit=limit)
        """What tools returned."""

    def trust_text(self, source: str, *texts: str | None) -> None:
        """Add trusted text: the task, instructions, a person's answer (`source` names it)."""
        self.trusted.add((source, source), [t for t in texts if t])

    def trust_values(self, source: tuple[str, str], values: Iterable[Any]) -> None:
        """Add values a tool vouched for (`ctx.trust`, `sanitizes`) as trusted."""
        strings: list[str] = []
        numbers: list[Any] = []
        for _, leaf in pointer_values(list(values), ""):
            (strings if isinstance(leaf, str) else numbers).append(leaf)
        self.trusted.add(source, strings, numbers)

    def add_output(self, source: tuple[str, str], result: Mapping[str, Any], *,
                   trusted: bool) -> None:
        """Add a call's result (`ToolResult.to_dict()`) from `source` (call id, tool id)."""
        strings, numbers = result_strings(result)
        (self.trusted if trusted else self.untrusted).add(source, strings, numbers)

    def taint(self, arguments: Mapping[str, Any], protected: Iterable[str]) -> list[Taint]:
        """Each protected argument seen in untrusted output and nowhere trusted."""
        found: list[Taint] = []
        for pointer in protected:
            for where, value in pointer_values(arguments, pointer):
                if self.trusted.find(value) is not None:
                    continue
                overflow = self.untrusted.overflowed
                if overflow is not None:
                    found.append(Taint(pointer=where, value=value, source_call="*",
                                       source_tool=overflow[1], match="overflow"))
                    continue
                hit = self.untrusted.find(value)
                if hit is None:
                    continue
                (call, tool), how = hit
                found.append(Taint(pointer=where, value=value, source_call=call,
                                   source_tool=tool, match=how))  # type: ignore[arg-type]
        return found


def check_pointers(tool: str, label: str, pointers: object) -> tuple[Any, ...]:
    """`pointers` as a tuple of JSON Pointers, or a `UserError` naming the tool."""
    if isinstance(pointers, str):
        raise UserError(f"tool '{tool}': {label} takes a list of JSON Pointers, e.g. "
                        f"[{pointers!r}], not a string")
    if not isinstance(pointers, Iterable):
        raise UserError(f"tool '{tool}': {label} takes a list of JSON Pointers")
    items = tuple(pointers)
    for item in items:
        problem = pointer_problem(item)
        if problem:
            raise UserError(f"tool '{tool}': {label}: {problem}")
    return items
