"""JSON for the MCP links' hot path: `json.loads` / `json.dumps`, without their Python around C.

`json.loads(line)` of a bytes line runs `detect_encoding`, `JSONDecoder.decode`, `raw_decode`
and two whitespace regexes in Python around the C scanner; `json.dumps(obj, separators=...)`
builds a `JSONEncoder` and a C encoder for every call. `handrail serve` in front of an
upstream does each twice a call (the client's request and the upstream's answer; the
request to the upstream and the answer to the client): issue 38. These do the same work
once: `loads` gives exactly what `json.loads` gives (the same value, or the same error: any
line the fast path does not take goes to `json.loads` itself), and the encoders write
exactly what `json.dumps` writes with the same options, except that a circular structure is
a `RecursionError`, not a `ValueError` (what they encode came from JSON, or is a tool's
result its caller has already refused if it is no JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["compact_ascii", "compact_text", "loads", "loose_text", "strict_text"]

_SCAN = json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner (it clears its memo per call)
_WHITESPACE = " \t\n\r"  # what JSON allows around a value (str.strip's default takes more)


def loads(line: bytes) -> Any:
    """`json.loads(line)`: the same value, or the same error.

    The fast path takes a line that opens an object with a key (`{"`: UTF-8, as
    `json.detect_encoding` finds for such a start), decoded as `json.loads` decodes it
    (`surrogatepass`), scanned once, followed by nothing but JSON whitespace. Anything else
    (another start, a scan that fails, extra data) is `json.loads`'s, which raises its error.
    """
    if line[:2] == b'{"':
        text = line.decode("utf-8", "surrogatepass")  # a UnicodeDecodeError, as json.loads
        try:
            value, end = _SCAN(text, 0)
        except StopIteration:
            return json.loads(line)  # raises the JSONDecodeError it would
        if end == len(text) or not text[end:].strip(_WHITESPACE):
            return value
    return json.loads(line)


def _encoder(ensure_ascii: bool, allow_nan: bool, separators: tuple[str, str] = (",", ":")
             ) -> Callable[[Any], str]:
    """`json.dumps(value, separators=..., ensure_ascii=..., allow_nan=...)`."""
    options: dict[str, Any] = {"separators": separators, "ensure_ascii": ensure_ascii,
                               "allow_nan": allow_nan}
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has the C encoder
        return json.JSONEncoder(**options).encode
    default = json.JSONEncoder(**options).default  # a TypeError naming the type, as dumps
    strings = (json.encoder.encode_basestring_ascii if ensure_ascii
               else json.encoder.encode_basestring)
    item, key = separators
    encoder = make(None, default, strings, None, key, item, False, False, allow_nan)

    def encode(value: Any) -> str:
        if type(value) is str:  # what JSONEncoder.encode does for a bare string
            return strings(value)
        return "".join(encoder(value, 0))

    return encode


compact_text = _encoder(ensure_ascii=False, allow_nan=False)
"""Compact strict JSON, non-ASCII as itself (a NaN is refused: ValueError)."""
compact_ascii = _encoder(ensure_ascii=True, allow_nan=True)
"""`json.dumps(value, separators=(",", ":"))`: compact, ASCII-escaped."""
loose_text = _encoder(ensure_ascii=False, allow_nan=True)
"""Compact JSON, non-ASCII as itself, NaN as `NaN` (`json.dumps`'s default leniency)."""
strict_text = _encoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
"""`json.dumps(value, ensure_ascii=False, allow_nan=False)`: its default separators."""
