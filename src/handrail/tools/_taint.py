"""Provenance of a run's data: what came from a trusted source, and what a tool returned.

A tool's output is an attacker's input (a fetched page, an email, a file, an MCP server's
answer). `Provenance` holds two corpora for one run: the *trusted* text (the task, the
instructions, a person's answers, the output of tools declared `trusted_output`, values a
tool vouched for with `ctx.trust` or `sanitizes`) and the *untrusted* text (every other tool
output). The gate asks it, for each protected argument of a call, whether the value was seen
in untrusted output and not in trusted text (`Provenance.taint`).

How a value is looked for (every corpus alike):

- every string is normalised once, when it is added, and a looked-up value the same way:
  HTML character references undone (`&#64;`, `&commat;`, `&amp;#64;`), Unicode NFKC,
  invisible format characters removed (category Cf: zero-width space, soft hyphen, word
  joiner...), percent-decoding (`%40`, `%2540`), repeated while it changes (three rounds at
  most), then case folding;
- *exact* (a value under 8 characters): the normalised value equals a whole string of an
  output, or one of its tokens (split on white space, quotes and brackets, trailing
  punctuation dropped);
- *numbers* (a JSON number argument) by value: `5000`, `5000.0` and a token `5,000` match;
- *substring*: a string of 8 or more characters matches anywhere inside an output (a whole
  output or token included). The most recent outputs (up to 64 KB) are kept joined and
  searched with one `str.find` (C, a fraction of a nanosecond a character); older text is
  in an index of 5-character grams taken every 4 characters (any occurrence of 8
  characters or more covers one such gram whole), so a lookup costs the few candidates of
  its rarest gram, never a scan of the whole history. The index is built by the lookup
  that finds more than 64 KB not yet indexed: an output costs ~0.05 µs a character when it
  is added, and its grams (~0.1 µs a character) are paid only by a run that looks a value
  up past that point. Text the grams cannot narrow down (a few grams repeated: `aaaa...`)
  is scanned in C instead, linear in the text and bounded by the limit below;
- *contains*: a protected string that is not found whole is cut into its parts (tokens,
  an address and its domain, a URL's host, path segments and query values), and each part
  that looks like an identifier (4 characters or more with a digit or one of `@.:/_-`, or
  12 characters or more) is looked up as above: `Attacker <attacker@evil.com>` holds
  `attacker@evil.com`. Plain words are not parts: a display name copied from a page is
  not steering.

Trusted text clears a value the untrusted side holds, with two limits:

- a value under 3 characters (`13`) is cleared only by a whole trusted string or JSON
  number (a person's answer, a vouched value, a field of a trusted output), never by a
  token of free text: a date in the task does not vouch for a file id in an email;
- the output of a tool declared `trusted_output` clears a value only when it showed it in
  an earlier turn than any untrusted output did: an echo of an argument the model chose
  after reading a page (a written file's path) is never trusted text.

The index is bounded: past `MAX_UNTRUSTED_CHARS` of untrusted text, nothing more is indexed
and every protected value counts as tainted from then on (failing closed, never open).
"""

from __future__ import annotations

import array
import bisect
import decimal
import html
import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import filterfalse, repeat
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote

from handrail.errors import UserError

__all__ = [
    "MAX_NAMED_CHARS",
    "MAX_NAMING_SENTENCES",
    "MAX_UNTRUSTED_CHARS",
    "MIN_SUBSTRING",
    "SHORT_VOUCHED",
    "Corpus",
    "Hit",
    "Provenance",
    "Taint",
    "address_pointers",
    "call_words",
    "check_pointers",
    "is_address",
    "link_pointers",
    "named_values",
    "pointer_problem",
    "pointer_values",
    "result_strings",
    "value_parts",
]

MIN_SUBSTRING = 8
"""A protected string this long or longer is also looked for inside outputs (normalised)."""

MAX_UNTRUSTED_CHARS = 16 * 1024 * 1024
"""Untrusted text indexed per run; beyond it every protected value counts as tainted."""

SHORT_VOUCHED = 3
"""A value shorter than this (`13`) is cleared only by a whole trusted string or number."""

_MIN_PART = 4
"""The shortest part of a value looked up alone (an identifier: see *contains*)."""

_GRAM = 5
_STRIDE = 4
_BUCKET_MASK = (1 << 16) - 1
_MAX_CANDIDATES = 4096
# An occurrence of MIN_SUBSTRING characters always covers a gram starting at a multiple of
# _STRIDE: positions s..s+3 hold one, and it ends by s+3+_GRAM <= s+MIN_SUBSTRING.
assert _GRAM + _STRIDE - 1 <= MIN_SUBSTRING
_FIND_LIMIT = 64 * 1024
# Text not yet in the gram index is searched with `str.find` (C, ~0.1-0.3 ns a character):
# up to this many characters that is cheaper than indexing it (~0.3 µs a character in
# Python); past it, the lookup indexes what the find would have had to scan.

# Tokens: what is left between white space (str.isspace, as `\s` in `re`), NUL, quotes,
# brackets, `,;|`. The separators other than white space become spaces, and `str.split`
# cuts at white space: both in C, ~4x faster than `re.findall` over the same text.
_SEPARATORS = str.maketrans(dict.fromkeys("\x00\"'`()[]{}<>,;|", " "))
# Every ASCII character a number cannot hold becomes a space (other scripts' digits and
# letters are left as they are), so `_NUMBER` runs over the few runs left instead of trying
# a match at every character (~10x faster on prose). The matches are the same: a space can
# no more be part of a match than what it replaced.
_NOT_NUMERIC = str.maketrans({chr(c): " " for c in range(128) if chr(c) not in "0123456789+-.,_"})


def _ascii_table(table: dict[int, str]) -> bytes:
    """`table` (ASCII characters to one ASCII character each) as a `bytes.translate` table."""
    return bytes(ord(table.get(c, chr(c))) if c < 128 else c for c in range(256))


_SEPARATORS_ASCII = _ascii_table(_SEPARATORS)
_NOT_NUMERIC_ASCII = _ascii_table(_NOT_NUMERIC)


def _spaced(text: str, table: dict[int, str], ascii_table: bytes) -> str:
    """`text.translate(table)`, for the tables above (issue 38: indexing an output).

    An ASCII text (nearly every output) goes through `bytes.translate`, one lookup a byte:
    `str.translate` costs ~3x that (2.5 against 0.8 µs for 1 KB), the encode and decode
    of ASCII are copies. The result is the same text: the tables map ASCII to ASCII.
    """
    if text.isascii():
        return text.encode("ascii").translate(ascii_table).decode("ascii")
    return text.translate(table)


_EDGE = ".:!?*"
_NUMBER = re.compile(r"[-+]?\d[\d,_]*(?:\.\d+)?")
# Invisible characters a model reads through: Unicode's format characters (Cf, as of
# Unicode 14; tests/taint checks the running Python's table has no others), the combining
# grapheme joiner and the variation selectors.
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f\u034f\ufe00-\ufe0f\U000e0100-\U000e01ef]")
_ROUNDS = 3
# Binary content items: their payload is base64 of bytes, not text a model reads.
_BINARY_FIELDS = {"image": "data", "audio": "data", "resource": "blob"}


def normalise(text: str) -> str:
    """The form both sides are compared in (see the module doc); NUL becomes U+FFFD."""
    if text.isascii() and "&" not in text and "%" not in text:
        # Nothing to decode, and NFKC and case folding are `lower` on ASCII (the common
        # case, and the one a protected value is almost always in).
        text = text.lower()
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    for _ in range(_ROUNDS):
        before = text
        if "&" in text:
            text = html.unescape(text)
        text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
        if "%" in text:
            text = unquote(text, errors="surrogatepass")
        if text == before or ("&" not in text and "%" not in text):
            break
    return text.casefold().replace("\x00", "\ufffd")


_SPLIT = re.compile(r"[\s\x00\"'`()\[\]{}<>,;|\\]+")
_URL_PIECES = re.compile(r"[/?#&=+]+")
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*:(?://)?")
# A value with none of these is one plain token: it has no parts.
_HAS_PARTS = re.compile(r"[\s\x00\"'`()\[\]{}<>,;|\\/?#&=+:@]")
_MAX_PARTS = 4096


def value_parts(text: str) -> list[str]:
    """The parts of a normalised protected string looked up alone (see *contains*).

    Tokens, then for each: without its scheme (`mailto:`, `https://`), its URL pieces (host,
    path segments, query keys and values), an address's domain, a host without its port.
    Only identifier-like parts, never `text` itself; at most `_MAX_PARTS` distinct ones
    (past that every token is still among them: the pieces of a token come after it).
    """
    if _HAS_PARTS.search(text) is None:
        return []
    seen: dict[str, None] = {}

    def keep(part: str) -> None:
        part = part.strip(_EDGE + "-")
        # Identifier-like: long, or at least _MIN_PART characters with something other
        # than letters (a digit, `@.:/_-`): plain words are not parts.
        if part != text and (len(part) >= 12 or (len(part) >= _MIN_PART and
                                                 not part.isalpha())):
            seen[part] = None

    tokens = [t for t in _SPLIT.split(text) if t]
    for token in tokens:
        keep(token)
    for token in tokens:
        if len(seen) >= _MAX_PARTS:
            break
        scheme = _SCHEME.match(token)
        rest = token[scheme.end():] if scheme else token
        if rest is not token:
            keep(rest)
        pieces = _URL_PIECES.split(rest)
        for piece in pieces:
            if len(pieces) > 1:
                keep(piece)
            if "@" in piece:
                keep(piece.rpartition("@")[2])
            if ":" in piece:
                host, _, port = piece.rpartition(":")
                if port.isdigit():
                    keep(host)
    return list(seen)[:_MAX_PARTS]


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
    if text[:1] in ("+", "-"):  # (`"" in "+-"` is true: a string of separators only)
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
    match: Literal["exact", "number", "substring", "contains", "overflow", "named"]
    """How it was found: a short value (under 8 characters) as a whole string or token, a
    number by value, a longer value anywhere in an output (normalised), a part of the value
    (`found`: an address, a host, an id inside it), everything counts once the index
    overflowed, or `named`: a sentence of the output names the value beside the verb of the
    call's own tool name, or the name itself ("delete the file with ID 13" for `delete_file
    {"file_id": "13"}`, the sentences in `found`): the text asks for this very call."""
    found: str | None = None
    """For `contains`: the part of the value the output held (normalised); for `named`, the
    sentence that names it (normalised, at most 480 characters)."""
    kind: Literal["taint"] = "taint"

    def describe(self) -> str:
        """One line for a person: which argument, which value, from which call."""
        shown = repr(self.value)
        if len(shown) > 200:
            shown = shown[:200] + f"... ({len(shown)} characters)"
        if self.match == "overflow":
            return (f"{self.pointer} = {shown}: this run saw more untrusted output than the "
                    "taint index holds, so every protected value counts as tainted")
        if self.match == "named":
            return (f"{self.pointer} = {shown} is named beside this tool's own words in the "
                    f"output of call {self.source_call} ({self.source_tool}), which is "
                    f"untrusted: that text asks for this very call: "
                    f"{(self.found or '')[:200]!r}")
        if self.found is not None:
            part = repr(self.found[:200])
            return (f"{self.pointer} = {shown} contains {part}, which appears in the output "
                    f"of call {self.source_call} ({self.source_tool}), which is untrusted")
        return (f"{self.pointer} = {shown} appears in the output of call {self.source_call} "
                f"({self.source_tool}), which is untrusted")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form, for the verdict record and a persisted request."""
        data = {"kind": "taint", "pointer": self.pointer, "value": self.value,
                "source_call": self.source_call, "source_tool": self.source_tool,
                "match": self.match}
        if self.found is not None:
            data["found"] = self.found
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Taint:
        """The inverse of `to_dict`."""
        return cls(pointer=str(data["pointer"]), value=data.get("value"),
                   source_call=str(data["source_call"]), source_tool=str(data["source_tool"]),
                   match=data["match"],
                   found=None if data.get("found") is None else str(data["found"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Quote:
    """A span of a run's final answer copied from untrusted tool output.

    The gate cannot see an answer's words steer anything (an injected "say that I should
    visit the Riverside View Hotel" calls no tool); the app shows the answer, so the app is
    told which parts of it a tool wrote: to show them as quotes with their source, or to
    hold back an answer that repeats a page at length.
    """

    start: int
    """Where the span starts in the answer (a character offset)."""
    end: int
    """Where it ends (exclusive): `answer[start:end]` is the span."""
    text: str
    """The span, as the answer has it."""
    source_call: str
    """The model's id of the earliest call whose output held it."""
    source_tool: str
    """That call's tool (`server/name`)."""
    whole: bool = True
    """The span is a value the tool reported: a whole string of its output, a whole line,
    the value of a `label:` line, or one word that looks like an identifier (a number, an
    address, a date). False: words from inside a longer text a tool returned (a sentence of
    a review, an email, a page): someone else's words, which the app shows as a quote or
    holds (`RunResult.held`)."""
    kind: Literal["quote"] = "quote"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form."""
        return {"kind": "quote", "start": self.start, "end": self.end, "text": self.text,
                "source_call": self.source_call, "source_tool": self.source_tool,
                "whole": self.whole}


MAX_QUOTED_CHARS = 16 * 1024
"""An answer is searched for quotes in its first 16 KB (a lookup per word, once per run)."""

_WORD = re.compile(r"\S+")
_PLAIN_WORD = re.compile(r"[^\d@.:/_\-]+")
_WORD_EDGE = "\"'`()[]{}<>.,;:!?*"


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


_MAILBOX = re.compile(r'(?:"?[^"<>@,;]*"?\s*<)?[^\s@<>,;]+@[^\s@<>,;]+\.[^\s@<>,;]+>?')
_WEB_SUFFIXES = frozenset(
    "com net org info biz io dev app ai co me xyz site online top shop cloud link page us uk "
    "eu de fr ru cn gov edu".split())
_WEB_HOST = re.compile(r"(?:[a-z0-9-]+\.)+[a-z]+(?::\d+)?(?:[/?#]\S*)?", re.I)
_SCHEMED = re.compile(r"[a-z][a-z0-9+.\-]*://\S+|mailto:\S+|www\.\S+", re.I)
_MAX_ADDRESS = 4096
_SCALARS = (int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)


def is_address(value: str, *, mailboxes: bool = True) -> bool:
    """Whether a string is, as a whole, where something goes: a URL, a host, an email.

    A URL with a scheme, `mailto:`, `www.`; a host under a common web suffix
    (`news.example.com/x`); with `mailboxes`, an email address or a list of them
    (`a@x.io, Bob <b@y.io>`). Free text that merely mentions one (a message body) is not
    an address.
    """
    text = value.strip()
    if not text or len(text) > _MAX_ADDRESS or ("." not in text and ":" not in text):
        return False
    if "@" in text and not text.lower().startswith(("http:", "https:", "mailto:")):
        return mailboxes and all(_MAILBOX.fullmatch(piece.strip())
                                 for piece in re.split(r"[,;]", text) if piece.strip())
    if len(text.split(None, 1)) > 1:
        return False
    lower = text.lower()
    if "://" in lower or lower.startswith(("www.", "mailto:")):
        return _SCHEMED.fullmatch(text) is not None
    host = lower.partition("/")[0].partition("?")[0].partition("#")[0].partition(":")[0]
    return host.rpartition(".")[2] in _WEB_SUFFIXES and _WEB_HOST.fullmatch(text) is not None


def address_pointers(arguments: Any, *, mutates: bool = True,
                     links: list[tuple[str, tuple[str, ...]]] | None = None) -> list[str]:
    """The JSON Pointers of the arguments that are addresses (`is_address`), at any depth.

    Protected for every tool, declared or not: a URL or host a read-only tool reaches is how
    data leaves, and a recipient is where a mutating call sends it. An email address given
    to a tool that changes nothing (a lookup, a check) goes nowhere: not protected there.
    `links`, when given, gets the other strings that hold links (`link_pointers`), found in
    the same walk.
    """
    # Every call passes here, most with a few short arguments: a pointer is made only for a
    # container to walk or a string that may be an address (issue 11: a call's fixed cost).
    # Arguments of numbers, booleans and nulls alone hold no address, and are told in C (a
    # type per value, one set test: issue 38, the walk was 3% of the memory loop's bytecode).
    if type(arguments) is dict and _SCALAR_TYPES.issuperset(map(type, arguments.values())):
        return []
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", arguments)]
    while stack:
        where, node = stack.pop()
        kind = type(node)
        items = (node.items() if kind is dict else enumerate(node) if kind is list
                 else node.items() if isinstance(node, Mapping) else ())
        for key, leaf in items:
            kind = type(leaf)
            if kind is str:
                # A link holds a `.` (`www.`) or a `:` (`://`) too.
                if "." in leaf or ":" in leaf:
                    if is_address(leaf, mailboxes=mutates):
                        found.append(f"{where}/{_escape(str(key))}")
                    elif links is not None:
                        held = _links_in(leaf)
                        if held:
                            links.append((f"{where}/{_escape(str(key))}", held))
            elif kind is dict or kind is list or (kind not in _SCALARS and
                                                  isinstance(leaf, Mapping | list)):
                stack.append((f"{where}/{_escape(str(key))}", leaf))
    return found


_LINK = re.compile(r"(?:[a-z][a-z0-9+.\-]*://|www\.)[^\s\"'`<>()\[\]{}|\\^]+", re.I)


def link_pointers(arguments: Any) -> list[tuple[str, tuple[str, ...]]]:
    """The string arguments (at any depth) that hold a link without being an address.

    Each with its links (`https://...`, `www....`, trailing `.,;:!?` left out). A link in
    a mutating call's free text (a message body, a post, a file's content) sends whoever
    reads it somewhere: protected like an address, though the text around it is not (only
    the links are looked up). The gate finds them in `address_pointers`' walk.
    """
    found: list[tuple[str, tuple[str, ...]]] = []
    address_pointers(arguments, links=found)
    return found


def _links_in(text: str) -> tuple[str, ...]:
    if "://" not in text and "www." not in text and _LINK.search(text) is None:
        return ()
    links = dict.fromkeys(m.rstrip(".,;:!?") for m in _LINK.findall(text[:_MAX_LINK_TEXT]))
    return tuple(links)[:_MAX_LINKS]


_MAX_LINK_TEXT = 1024 * 1024
_MAX_LINKS = 256


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def result_strings(result: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """The strings and numbers of a stored result (`ToolResult.to_dict()`) a model sees.

    Content items and structured output, every key of them at any depth (a key named `data`
    or `type` is where a JSON:API answer keeps its values); never `metadata` (the model is
    not shown it), nor a content item's own `kind` tag, nor the base64 payload of a binary
    content item (image, audio, a resource's blob).
    """
    strings: list[str] = []
    numbers: list[Any] = []
    stack: list[Any] = [result.get("structured")]
    content = result.get("content")
    if type(content) is list:
        for item in content:
            if type(item) is dict and "kind" in item:
                # A content item's `kind` is handrail's own tag, not the tool's text.
                skip = _BINARY_FIELDS.get(item["kind"])
                stack.extend(v for k, v in item.items() if k != "kind" and k != skip)
            else:
                stack.append(item)
    else:
        stack.append(content)
    while stack:
        value = stack.pop()
        # Exact types first: a stored result is plain JSON, and an ABC check costs more
        # than the rest of this loop for a small result (issue 11).
        kind = type(value)
        if kind is str:
            strings.append(value)
        elif kind is dict:
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is int or kind is float:
            numbers.append(value)
        elif value is None or kind is bool:
            continue
        elif isinstance(value, str):
            strings.append(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            numbers.append(value)
    strings.reverse()
    return strings, numbers


def _number_keys(text: str) -> list[str]:
    """The canonical keys (`_number_key`) of every number written in `text` (repeats kept).

    Runs of the characters a number can hold: plain ASCII digits are canonical without their
    leading zeros (most numbers in text) and skip the regex; it runs over the other runs only
    (signs, separators, decimals, leading zeros, other scripts' characters), whose matches go
    through `_number_key`. A match never spans two runs, so this finds what one pass over the
    whole text would.

    Every pass over the runs is one C call a run, and no set is built of them (issue 38: a
    set's growth and its sparse table cost more than the lookups the repeats take): the
    caller enters the keys with `dict.setdefault`, for which a repeat is one lookup.
    """
    ascii = text.isascii()
    runs = _spaced(text, _NOT_NUMERIC, _NOT_NUMERIC_ASCII).split()
    # An ASCII text's runs are ASCII already; elsewhere `isdigit` holds for `²` and `٣`.
    plain = list(filter(str.isdigit, runs if ascii else filter(str.isascii, runs)))
    keys = plain
    # Plain digits' canonical form: without leading zeros (`007` is 7, `000` is 0). The
    # least run in string order starts with a zero when any does (one C pass, `min`).
    if plain and min(plain)[0] == "0":
        keys = [run.lstrip("0") or "0" for run in plain]
    if len(plain) < len(runs):
        others = set(filterfalse(str.isdigit, runs)) if ascii else {
            run for run in runs if not (run.isascii() and run.isdigit())}
        for other in set(_NUMBER.findall(" ".join(others))):
            key = _number_key(other)
            if key is not None:
                keys.append(key)
    return keys


# ------------------------------------------------------------------ the index


class Corpus:
    """Normalised text from several sources, searchable for a value (see the module doc)."""

    __slots__ = ("_buckets", "_exact", "_find_limit", "_indexed", "_joined", "_numbers",
                 "_segments", "_sources", "_starts", "_turns", "_whole", "_whole_numbers", "chars",
                 "limit", "overflowed")

    def __init__(self, *, limit: int = MAX_UNTRUSTED_CHARS) -> None:
        self._segments: list[str] = []
        self._starts: list[int] = []  # each segment's offset in the whole
        self._indexed = 0  # segments before this one are in the gram index
        self._find_limit = _FIND_LIMIT  # (tests lower it to reach the index with little text)
        self._joined = ""  # segments from `_indexed` on, joined as far as a lookup needed
        self._sources: list[tuple[str, str]] = []
        self._turns: list[int] = []  # the turn of the call each segment came from
        self._exact: dict[str, int] = {}  # whole strings and tokens (looked up when short)
        self._whole: dict[str, int] = {}  # short whole strings only (not tokens of text)
        self._numbers: dict[str, int] = {}  # JSON numbers and numbers in text
        self._whole_numbers: dict[str, int] = {}  # JSON numbers and whole-string numbers
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
            numbers: Iterable[Any] = (), *, turn: int = -1) -> None:
        """Index `strings` (and JSON `numbers`) as coming from `source` (call id, tool).

        `turn` is the model turn of the call the text came from (-1: before any turn, as
        the task), which orders a trusted output against untrusted ones (module doc).
        """
        if self.overflowed is not None:
            return
        parts = [normalise(s) for s in strings if s]
        text = "\x00".join(parts) + "\x00"
        if self.chars + len(text) > self.limit:
            self.overflowed = source
            return
        seg = len(self._segments)
        self._sources.append(source)
        self._segments.append(text)
        self._starts.append(self.chars)
        self._turns.append(turn)
        self.chars += len(text)
        exact, nums, whole_strings = self._exact, self._numbers, self._whole
        for part in parts:
            # Only short strings need an exact entry: a value of MIN_SUBSTRING characters or
            # more is found inside the text anyway.
            whole = part.strip()
            if len(whole) < MIN_SUBSTRING:
                exact.setdefault(whole, seg)
                whole_strings.setdefault(whole, seg)
                key = _number_key(whole)
                if key is not None:
                    self._whole_numbers.setdefault(key, seg)
        # Everything per token runs in C (map over C functions, drained by a zero-length
        # deque): a Python loop over the distinct tokens of an output cost as much as the
        # rest of indexing it. Long tokens are kept too (only a short value is looked up
        # here, so they cost memory, never a wrong answer); the empty token is not one.
        # Each token as written and without its edge punctuation (`rm!` and `rm`): a value
        # copied with the punctuation is found as it was copied.
        words = _spaced(text, _SEPARATORS, _SEPARATORS_ASCII).split()
        empty = "" in exact  # (a token of edge punctuation alone strips to "": not a token)
        deque(map(exact.setdefault, words, repeat(seg)), 0)
        deque(map(exact.setdefault, map(str.strip, words, repeat(_EDGE)), repeat(seg)), 0)
        if not empty:
            exact.pop("", None)
        deque(map(nums.setdefault, _number_keys(text), repeat(seg)), 0)
        for value in numbers:
            key = _number_key(value)
            if key is not None:
                nums.setdefault(key, seg)
                self._whole_numbers.setdefault(key, seg)

    def find(self, value: Any, *, whole_only: bool = False) -> Hit | None:
        """Where a protected `value` was seen, and how; None when it was not.

        `whole_only`: a value under `SHORT_VOUCHED` characters (or a number of fewer digits)
        counts only as a whole string or a JSON number, never as a token of a longer text.
        """
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            key = _number_key(value)
            if key is None:
                return None
            numbers = self._whole_numbers if whole_only and len(key.lstrip("-")) < \
                SHORT_VOUCHED else self._numbers
            return self._hit(numbers.get(key), "number")
        if not isinstance(value, str):
            return None
        return self.find_normalised(normalise(value), whole_only=whole_only)

    def find_normalised(self, text: str, *, whole_only: bool = False) -> Hit | None:
        """`find` for a string already normalised."""
        if len(text) >= MIN_SUBSTRING:
            return self._hit(self._substring(text), "substring")
        text = text.strip()
        short = self._whole if whole_only and len(text) < SHORT_VOUCHED else self._exact
        return self._hit(short.get(text), "exact")

    def _hit(self, seg: int | None, how: str) -> Hit | None:
        return None if seg is None else Hit(self._sources[seg], self._turns[seg], how)

    def _substring(self, text: str) -> int | None:
        """The first segment holding `text` (at least MIN_SUBSTRING characters), or None.

        The indexed segments by their grams, then the rest with one `str.find` over them
        joined: segments end in NUL and a normalised value holds none (NUL becomes U+FFFD),
        so a match never spans two.
        """
        self.settle()
        starts, indexed = self._starts, self._indexed
        tail = starts[indexed] if indexed < len(starts) else self.chars
        if indexed:
            found = self._gram_search(text)
            if found is not None:
                return found
        if tail == self.chars:
            return None
        joined = self._joined
        if tail + len(joined) < self.chars:  # outputs added since the last lookup
            joined = self._joined = joined + "".join(
                self._segments[bisect.bisect_left(starts, tail + len(joined)):])
        at = joined.find(text)
        return None if at < 0 else bisect.bisect_right(starts, tail + at) - 1

    def unindexed(self) -> int:
        """Characters not yet in the gram index (searched with `str.find` until indexed)."""
        indexed = self._indexed
        return self.chars - (self._starts[indexed] if indexed < len(self._starts) else self.chars)

    def settle_due(self, coming: int = 0) -> bool:
        """Whether a lookup (after `coming` more characters) would build the gram index."""
        return self.unindexed() + coming > self._find_limit

    def settle(self) -> None:
        """Build the gram index now if a lookup would.

        The gate calls it where indexing an output runs (a worker thread for large outputs),
        so the lookup on the event loop finds the work done.
        """
        if self.settle_due():
            self._index_rest()

    def _index_rest(self) -> None:
        """Put every segment not yet in the gram index into it."""
        buckets = self._buckets
        get = buckets.get
        for seg in range(self._indexed, len(self._segments)):
            text, base = self._segments[seg], self._starts[seg]
            for pos in range(0, len(text) - _GRAM + 1, _STRIDE):
                bucket = hash(text[pos:pos + _GRAM]) & _BUCKET_MASK
                postings = get(bucket)
                if postings is None:
                    postings = buckets[bucket] = array.array("Q")
                postings.append(base + pos)
        self._indexed = len(self._segments)
        self._joined = ""

    def _gram_search(self, text: str) -> int | None:
        """The first indexed segment holding `text`, by the candidates of its grams."""
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
        for seg in range(self._indexed):
            if text in self._segments[seg]:
                return seg
        return None


class Hit(NamedTuple):
    """Where a value was found in a corpus."""

    source: tuple[str, str]
    """(call id, tool) of the output that held it."""
    turn: int
    """That call's model turn (-1: before any, as the task)."""
    how: str
    """`exact`, `number` or `substring` (see `Taint.match`)."""


class Provenance:
    """Where one run's data came from: trusted text, and untrusted tool output.

    Built when a run starts (the task and the instructions), fed by the gate as calls finish,
    and rebuilt from the store when a run resumes (see `handrail.runs`). A delegated run
    `inherit`s its parent's: what the parent read taints what the child does, and what the
    parent's person wrote stays trusted below it.
    """

    __slots__ = ("_naming", "echoed", "parents", "trusted", "untrusted")

    def __init__(self, *, limit: int = MAX_UNTRUSTED_CHARS) -> None:
        self.trusted = Corpus(limit=limit)
        """Text a person or the developer vouched for (the task, answers, ctx.trust...)."""
        self.echoed = Corpus(limit=limit)
        """What tools declared `trusted_output` returned (trusted when it came first)."""
        self.untrusted = Corpus(limit=limit)
        """What tools returned."""
        self.parents: tuple[Provenance, ...] = ()
        """The provenance of the runs above a delegated run, the root first."""
        self._naming: dict[tuple[str, ...], _Naming] = {}

    def inherit(self, parent: Provenance) -> None:
        """Look up values in `parent`'s corpora (and its parents') too, before this run's."""
        self.parents = (*parent.parents, parent)

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

    def settle_due(self, coming: int = 0) -> bool:
        """Whether `settle` (after `coming` more characters) would build a gram index."""
        return any(c.settle_due(coming) for c in (self.trusted, self.echoed, self.untrusted))

    def settle(self) -> None:
        """Build the gram indexes a lookup would build (see `Corpus.settle`), off its path."""
        for corpus in (self.trusted, self.echoed, self.untrusted):
            corpus.settle()

    def add_output(self, source: tuple[str, str], result: Mapping[str, Any], *,
                   trusted: bool, turn: int = 0) -> None:
        """Add a call's result (`ToolResult.to_dict()`) from `source` (call id, tool id).

        `turn` is the call's model turn (a trusted output counts only before the untrusted).
        """
        strings, numbers = result_strings(result)
        (self.echoed if trusted else self.untrusted).add(source, strings, numbers, turn=turn)

    def taint(self, arguments: Mapping[str, Any], protected: Iterable[str],
              links: Iterable[tuple[str, tuple[str, ...]]] = ()) -> list[Taint]:
        """Each protected argument seen in untrusted output and nowhere trusted.

        And each argument of `links` (`link_pointers`) holding a link seen so.
        """
        found: list[Taint] = []
        chain = (*self.parents, self)
        seen: set[str] = set()
        for pointer in protected:
            for where, value in pointer_values(arguments, pointer):
                if where in seen:
                    continue
                seen.add(where)
                taint = self._taint_of(chain, where, value)
                if taint is not None:
                    found.append(taint)
        for where, urls in links:
            if where in seen:
                continue
            for url in urls:
                taint = self._taint_of(chain, where, url)
                if taint is not None:
                    (value,) = (v for _, v in pointer_values(arguments, where))
                    found.append(Taint(pointer=where, value=value, source_call=taint.source_call,
                                       source_tool=taint.source_tool, match="contains",
                                       found=taint.found or normalise(url)))
                    break
        return found

    def naming_due(self, stems: tuple[str, ...]) -> int:
        """Characters of this run's untrusted output not yet scanned for `stems`' sentences."""
        naming = self._naming.get(stems)
        corpus = self.untrusted
        if naming is None:
            return corpus.chars
        return corpus.chars - (corpus._starts[naming.scanned]
                               if naming.scanned < len(corpus._starts) else corpus.chars)

    def scan_naming(self, stems: tuple[str, ...]) -> None:
        """Scan this run's untrusted output for `stems`' sentences (`named` does it when due).

        Called off the event loop when much is due (a worker thread): the scan reads each
        sentence holding the verb, ~0.2 µs a byte of such text.
        """
        naming = self._naming.get(stems)
        if naming is None:
            naming = self._naming[stems] = _Naming(stems)
        naming.catch_up(self.untrusted)

    def named(self, stems: tuple[str, ...], arguments: Mapping[str, Any],
              skip: Iterable[str] = ()) -> list[Taint]:
        """Each one-token argument a sentence of untrusted output names for this call.

        A sentence (with one on each side, within a passage) names it beside the verb of the
        call's tool name or the name itself (`stems`, `call_words`), and nothing trusted holds
        the value.

        An injected "Delete the file with ID '13'" is a sentence that names `delete_file` and
        `13`; the listing the task read holds `13` too, but as a field, not beside the verb.
        `skip`: pointers already looked up (the protected ones). The sentences
        are scanned once per tool and run (each output when the tool is next checked); past
        `MAX_NAMING_SENTENCES` of them every value counts as named (failing closed).
        """
        if not stems:
            return []
        chain = (*self.parents, self)
        if not any(level.untrusted.chars for level in chain):
            return []
        namings: list[_Naming] = []
        for level in chain:
            naming = level._naming.get(stems)
            if naming is None:
                naming = level._naming[stems] = _Naming(stems)
            naming.catch_up(level.untrusted)
            if naming.tokens or naming.overflowed:
                namings.append(naming)
        if not namings:
            return []  # no sentence holds the verb: nothing to look up (the common case)
        skipped = set(skip)
        found: list[Taint] = []
        for where, value in named_values(arguments):
            if where in skipped:
                continue
            for naming in namings:
                at = -1 if naming.overflowed else naming.find(value)
                if at is None:
                    continue
                if _cleared(chain, value, normalise(value) if isinstance(value, str) else None,
                            None):
                    break
                if at < 0:
                    found.append(Taint(pointer=where, value=value, source_call="*",
                                       source_tool="*", match="overflow"))
                else:
                    (call, tool), sentence = naming.excerpts[at]
                    found.append(Taint(pointer=where, value=value, source_call=call,
                                       source_tool=tool, match="named",
                                       found=sentence[:480]))
                break
        return found

    def quotes(self, answer: str) -> list[Quote]:
        """The longest runs of whole words of `answer` that untrusted output holds.

        A run of at least `MIN_SUBSTRING` normalised characters, found whole in one output
        (of this run or the runs above it) and not in trusted text: what the user typed in
        the task and the answer repeats is not a quote. Words are cut at white space, with
        the punctuation at their edges left out of the span; a span of one word counts only
        when it looks like an identifier (a digit, or one of `@.:/_-`). Greedy, left to
        right: at most two lookups per word, over the first `MAX_QUOTED_CHARS` of the answer.
        Each says whether it is `whole`: one word, words that all look like identifiers (a
        date and a time), or a span that stands between a value's edges in some output
        (`_is_value`); else it is words from inside a tool's text.
        """
        chain = (*self.parents, self)
        if not any(level.untrusted.chars for level in chain):
            return []
        words: list[tuple[int, int]] = []
        for match in _WORD.finditer(answer, 0, min(len(answer), MAX_QUOTED_CHARS)):
            word = match.group()
            core = word.strip(_WORD_EDGE)
            if core:
                start = match.start() + word.index(core)
                words.append((start, start + len(core)))
        found: list[Quote] = []
        budget = [_VALUE_SCAN_CHARS]
        i = 0
        while i < len(words):
            best: tuple[int, tuple[int, Hit]] | None = None
            j = i
            while j < len(words):
                text = normalise(answer[words[i][0]:words[j][1]])
                if len(text) >= MIN_SUBSTRING:
                    hit = _first(chain, text, text)
                    if hit is None:
                        break
                    best = (j, hit)
                j += 1
            if best is None:
                i += 1
                continue
            j, hit = best
            start, end = words[i][0], words[j][1]
            text = answer[start:end]
            # One plain word a page also has is no evidence; one that looks like an
            # identifier (an address, a URL, a number) is.
            if (j > i or not _PLAIN_WORD.fullmatch(text)) and \
                    not _cleared(chain, text, normalise(text), None):
                (call, tool), _, _ = hit[1]
                found.append(Quote(start=start, end=end, text=text, source_call=call,
                                   source_tool=tool,
                                   whole=j == i or _identifiers(text) or
                                   _is_value(chain, normalise(text), budget)))
            i = j + 1
        return found

    @staticmethod
    def _taint_of(chain: tuple[Provenance, ...], where: str, value: Any) -> Taint | None:
        for level in chain:
            overflow = level.untrusted.overflowed
            if overflow is not None:
                if _cleared(chain, value, None, None):
                    return None
                return Taint(pointer=where, value=value, source_call="*",
                             source_tool=overflow[1], match="overflow")
        text = normalise(value) if isinstance(value, str) else None
        hit = _first(chain, value, text)
        if hit is not None:
            if _cleared(chain, value, text, hit):
                return None
            (call, tool), _, how = hit[1]
            return Taint(pointer=where, value=value, source_call=call, source_tool=tool,
                         match=how)  # type: ignore[arg-type]
        if text is None:
            return None
        for part in value_parts(text):
            hit = _first(chain, part, part)
            if hit is not None and not _cleared(chain, part, part, hit):
                (call, tool), _, _ = hit[1]
                return Taint(pointer=where, value=value, source_call=call, source_tool=tool,
                             match="contains", found=part)
        return None


# A value's edges in printed output: the start or end of a string, a line break (or its
# escape, `\n` inside a printed string), a quote mark, a bracket, a list separator, a tab;
# on the left also a `label:` and a list marker; on the right a closing `.!?:`.
_CELL_LEFT = re.compile(r"(?:[\n\x00'\"`(\[{,;|\t:]|\\[nrt])[ \t]*"
                        r"(?:[-*+\u2022][ \t]+|\d{1,3}[.)][ \t]+)?\Z")
_CELL_RIGHT = re.compile(r"[.!?:]*[ \t]*(?:\Z|[\n\x00'\"`)\]},;|\t]|\\[nrt])")
_CELL_WINDOW = 64
_MAX_OCCURRENCES = 64
_VALUE_SCAN_CHARS = 64 * 1024 * 1024
"""Characters of untrusted output an answer's quotes are searched in for a whole value."""


def _identifiers(text: str) -> bool:
    """Whether every word of `text` looks like an identifier (`2024-05-21 18:00`).

    Data wherever it stands, as one such word is.
    """
    return not any(_PLAIN_WORD.fullmatch(word.strip(_WORD_EDGE)) for word in text.split())


def _is_value(chain: tuple[Provenance, ...], text: str, budget: list[int]) -> bool:
    """Whether `text` (normalised) stands whole between a value's edges in untrusted output.

    A whole string, a line, a quoted string, an item of a list, a labelled value.

    `budget` (one count, shared by an answer's quotes) bounds the characters searched: past
    it, a span counts as words from inside a text (held, never shown unmarked).
    """
    for provenance in chain:
        for segment in provenance.untrusted._segments:
            if budget[0] <= 0:
                return False
            budget[0] -= len(segment)
            at = segment.find(text)
            seen = 0
            while at >= 0 and seen < _MAX_OCCURRENCES:
                seen += 1
                left = segment[max(0, at - _CELL_WINDOW):at]
                if at <= _CELL_WINDOW:
                    left = "\x00" + left
                if _CELL_LEFT.search(left) and _CELL_RIGHT.match(segment, at + len(text)):
                    return True
                at = segment.find(text, at + 1)
    return False


def _first(chain: tuple[Provenance, ...], value: Any,
           text: str | None) -> tuple[int, Hit] | None:
    """The earliest untrusted output holding `value` along `chain`: (level, hit)."""
    for level, provenance in enumerate(chain):
        hit = (provenance.untrusted.find(value) if text is None
               else provenance.untrusted.find_normalised(text))
        if hit is not None:
            return level, hit
    return None


def _cleared(chain: tuple[Provenance, ...], value: Any, text: str | None,
             hit: tuple[int, Hit] | None) -> bool:
    """Whether trusted text vouches for `value`, found untrusted at `hit` (see module doc)."""
    for level, provenance in enumerate(chain):
        found = (provenance.trusted.find(value, whole_only=True) if text is None
                 else provenance.trusted.find_normalised(text, whole_only=True))
        if found is not None:
            return True
        echoed = (provenance.echoed.find(value, whole_only=True) if text is None
                  else provenance.echoed.find_normalised(text, whole_only=True))
        # A trusted output counts when it showed the value no later than the first
        # untrusted output did (an earlier level of the tree, an earlier turn, or the same
        # turn, whose calls were all chosen before any of them returned): a later one may
        # be an echo of what the model read.
        if echoed is not None and hit is not None and \
                (level, echoed.turn) <= (hit[0], hit[1].turn):
            return True
    return False


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


# ------------------------------------------------------------------ a call the text names

_NAME_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_INFLECTION = r"(?:e|es|s|ed|d|ing|ion|ions|ation|ations)?"
# Where a sentence ends in printed output: `.!?` before white space (or an escaped line
# break) ends a sentence (the `soft` group); a blank line, an escaped `\n` (a line of a
# printed string), a NUL (between the strings of an output) or a line break before a line
# that opens with a key (`  id_: '24'`, `- filename: x`: a record printed as YAML, whose
# fields are data, not one sentence) ends a passage. The sentences a word of the tool's
# name is in are its own and one on each side within the passage ("Delete the file. Its ID
# is 13."), at most `_SENTENCE_REACH` characters each side. A word of the name is a whole
# word of the text: `shared_with:` or `delete_id` holds none (the whole name counts); an
# escaped line break before it (`first:\ndelete`, a printed string) is no letter.
_SENTENCE_END = re.compile(r"(?P<soft>[.!?]+(?=\s|\\[nrt]|\x00|\Z))|\n[ \t]*\n|\\[nrt]|\x00"
                           r"|\n(?=[ \t]*(?:- )?[\w.-]+:(?:\s|\Z))")
# A token of a naming sentence is also looked up in pieces: `id=13`, `#13`, `file:13`.
_PIECES = re.compile(r"[=:#]+")
_SENTENCE_REACH = 240
MAX_NAMING_SENTENCES = 4096
"""Sentences naming a tool's words kept per tool and run; past it every value counts."""
MAX_NAMED_CHARS = 64
"""A value longer than this (or holding white space) is text, not a value a sentence names."""


def call_words(name: str) -> tuple[str, ...]:
    """The words a sentence naming a call of tool `name` holds one of: its verb, or the name.

    The verb is the name's first word (`delete_file` -> `delet`, the common verb-object
    form), of 3 letters or more, a trailing `e` cut so that `delete`, `deleted`, `deleting`
    and `deletion` all match; the whole name comes next when it has more than one word
    (`delete_file(13)` names the call too). The other words of a name are not enough: the
    objects a text mentions ("messages sent to the general channel", for
    `send_channel_message`) are not the action it asks for.
    """
    words = _NAME_WORDS.findall(name)
    stems: list[str] = []
    if words and len(words[0]) >= 3:
        verb = words[0].casefold()
        stems.append(verb[:-1] if len(verb) > 3 and verb.endswith("e") else verb)
    if len(words) > 1:
        stems.append(normalise(name).strip())
    return tuple(stems)


def named_values(arguments: Any) -> list[tuple[str, Any]]:
    """The arguments of a call a sentence could name: one token each (an id, a number)."""
    found: list[tuple[str, Any]] = []
    for where, value in pointer_values(arguments, ""):
        if isinstance(value, str):
            # One token: no white space inside (`split` in C, not a loop per character).
            if len(value) <= MAX_NAMED_CHARS and len(value.split()) == 1:
                found.append((where, value))
        elif not isinstance(value, bool):
            found.append((where, value))  # a number (`pointer_values` yields no other)
    return found


class _Naming:
    """The sentences of one corpus that hold a word of one tool's name, scanned so far."""

    __slots__ = ("excerpts", "numbers", "overflowed", "pattern", "scanned", "tokens")

    def __init__(self, stems: tuple[str, ...]) -> None:
        alternatives = "|".join(re.escape(s) for s in sorted(stems, key=len, reverse=True))
        self.pattern = re.compile(
            rf"(?:(?<!\w)|(?<=\\[nrt]))(?:{alternatives}){_INFLECTION}(?!\w)")
        self.scanned = 0  # segments scanned
        self.tokens: dict[str, int] = {}  # token -> its first sentence
        self.numbers: dict[str, int] = {}  # a number's key (`_number_key`) -> the same
        self.excerpts: list[tuple[tuple[str, str], str]] = []  # (source, sentence)
        self.overflowed = False

    def catch_up(self, corpus: Corpus) -> None:
        segments, sources = corpus._segments, corpus._sources
        tokens, numbers, excerpts = self.tokens, self.numbers, self.excerpts
        for seg in range(self.scanned, len(segments)):
            text = segments[seg]
            first = end = -1
            for match in self.pattern.finditer(text):
                start = match.start()
                stop = min(len(text), match.end() + _SENTENCE_REACH)
                reach = _window_end(text, match.end(), stop)
                if start < end and reach <= end:
                    continue  # within the sentences found last
                if len(excerpts) >= MAX_NAMING_SENTENCES:
                    self.overflowed = True
                    break
                begin = _window_start(text, max(0, start - _SENTENCE_REACH), start)
                # What the last window held is in the index already (under its excerpt,
                # which holds it): only the rest is read, from the token the last one cut.
                read = begin
                if first <= begin < end:
                    read = max(begin, text.rfind(" ", begin, end) + 1)
                first, end = begin, reach
                sentence = text[begin:end]
                index = len(excerpts)
                excerpts.append((sources[seg], " ".join(sentence.split())))
                sentence = text[read:end]
                # Per token in C (`map`, drained by a zero-length deque), as `Corpus.add`.
                raw = set(_spaced(sentence, _SEPARATORS, _SEPARATORS_ASCII).split())
                words = raw.union(map(str.strip, raw, repeat(_EDGE)))
                for word in filter(_PIECES.search, raw):
                    words.update(p.strip(_EDGE) for p in _PIECES.split(word))
                words.discard("")
                deque(map(tokens.setdefault, words, repeat(index)), 0)
                deque(map(numbers.setdefault, _number_keys(sentence), repeat(index)), 0)
            if self.overflowed:
                break
        self.scanned = len(segments)

    def find(self, value: Any) -> int | None:
        if isinstance(value, int | float):
            key = _number_key(value)
            return None if key is None else self.numbers.get(key)
        text = normalise(value).strip()
        found = self.tokens.get(text)
        if found is None:
            key = _number_key(text)
            if key is not None:
                found = self.numbers.get(key)
        return found


def _window_start(text: str, left: int, start: int) -> int:
    """Where the sentences before `start` that name it begin: one sentence back at most."""
    ends = list(_SENTENCE_END.finditer(text, left, start))
    if not ends:
        return left
    last = ends[-1]
    if last.group("soft") is None:
        return last.end()  # a passage ends there
    return ends[-2].end() if len(ends) > 1 else left


def _window_end(text: str, after: int, stop: int) -> int:
    """Where the sentences after `after` that name it end: one sentence on at most."""
    first = _SENTENCE_END.search(text, after, stop)
    if first is None:
        return stop
    if first.group("soft") is None:
        return first.start()
    second = _SENTENCE_END.search(text, first.end(), stop)
    return second.start() if second else stop
