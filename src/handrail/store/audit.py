"""The tamper-evident record: a hash chain over the facts a store keeps, and its verification.

Every fact that matters (a run's start, each status and outcome it takes, each state a call
record is written in — its whole row: actions, verdict, decision and who made it, arguments
and result —, each state of a pending item, its decision included) is appended to the
store's `audit` table in the transaction that writes it, as one row:

    seq   its place in the store (1, 2, 3, ...: no gaps)
    run   its run; n: its place in the run's chain (0, 1, 2, ...)
    kind  run | status | call | pending;  ref: the run, call record or item it is about
    body  the fact: compact JSON in the fixed field order of `ENCODING` below; NULL for a
          `call` fact, whose body is the call's row (hashed, not copied: `STORED_BODY`)
    hash  sha256(prev + body): `prev` is the hash of the run's previous fact (zeros for its
          first), not kept (version 3; `fact_hash`)
    link  sha256(the previous fact's link + hash): the store-wide chain (zeros before the
          first fact; `fact_link`)

Version 3 (`VERSION`, SQLite stores since their migration 0013) keeps `hash` and `link` as
their 32 raw bytes and hashes them so; version 2 (PostgreSQL stores, and the facts a SQLite
store recorded before 0013) keeps a `prev` column too, and all three as hex text, hashed as
text. Each fact is checked by the version it was written in: its hash's type says which.

The run's chain says "this run's record is these facts, in this order"; the store-wide chain
(every run's head, as each fact extends it) says "the store is these runs, in this order":
a fact moved, dropped or inserted breaks both, and a run deleted whole still breaks the
store's. `verify` recomputes both, and compares every row the store holds now with the last
fact recorded about it. An Ed25519 signature over a head (`seq`, `link`, hex), kept in
`audit_signatures`, makes a rewrite of everything up to that head detectable too: the chain
alone can be recomputed by anyone who can write the store.

This module is the reference, docs/audit.md the description a reader without handrail
follows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import marshal
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from handrail.errors import ConfigError

__all__ = [
    "ENCODING",
    "EXPORT_FORMAT",
    "SIGNATURE_CONTEXT",
    "STORED_BODY",
    "VERSION",
    "ZERO",
    "ZERO_HASH",
    "Break",
    "Reader",
    "Report",
    "Source",
    "call_body",
    "chain_hash",
    "encode_row",
    "export_lines",
    "fact_hash",
    "fact_link",
    "generate_key",
    "link_hash",
    "load_private_key",
    "load_public_key",
    "open_reader",
    "pending_body",
    "public_key_id",
    "run_body",
    "sign",
    "sign_head",
    "signed_message",
    "status_body",
    "verify",
]

VERSION = 3
"""The version of the canonical encoding this handrail writes (SQLite stores); every body
starts `[3,` (a call's: `(3,`). Version 2 (PostgreSQL stores, and SQLite stores before
migration 0013) is still read, and a fact is checked by the version it was written in."""

ZERO = "0" * 64
"""Version 2: the `prev` of a run's first fact, and the link before the store's first fact."""

ZERO_HASH = bytes(32)
"""Version 3: the same, as the raw 32 bytes a version 3 hash is."""

SIGNATURE_CONTEXT = "handrail-audit/1 head"
"""What a signature signs: `f"{SIGNATURE_CONTEXT} {seq} {link}"`, UTF-8."""

_ENCODE = json.JSONEncoder(ensure_ascii=True, check_circular=False,
                           separators=(",", ":")).encode
"""The canonical JSON of a body: compact, ASCII (`\\uXXXX` escapes), floats as Python's repr."""


def chain_hash(prev: str, body: str | bytes) -> str:
    """A fact's hash: sha256 of its run's previous hash (hex, ASCII) followed by its body.

    A body is JSON text (ASCII) or, for a call, the bytes of its row (`call_body`).
    """
    if isinstance(body, bytes):
        return hashlib.sha256(prev.encode() + body).hexdigest()
    return hashlib.sha256((prev + body).encode("utf-8", "surrogatepass")).hexdigest()


def link_hash(prev_link: str, fact_hash: str) -> str:
    """A fact's link in the store-wide chain: sha256 of the previous link and its hash.

    Version 2 (`fact_hash` for version 3, whose hash is its link).
    """
    return hashlib.sha256((prev_link + fact_hash).encode()).hexdigest()


def fact_hash(prev: bytes, body: str | bytes) -> bytes:
    """A version 3 fact's hash: sha256 of its run's previous hash, raw, then its body.

    `prev` is the 32 bytes of the run's previous hash (`ZERO_HASH` for its first fact), the
    body's bytes follow (JSON text as UTF-8, or a call's row encoding). Version 2 hashed
    the same as hex text, and gave the hash as hex too (each fact paid for the text twice).
    """
    data = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
    return hashlib.sha256(prev + data).digest()


def fact_link(link: bytes, digest: bytes) -> bytes:
    """A version 3 fact's link: sha256 of the store's previous link and its hash, raw.

    The store-wide chain is over the facts' hashes alone, so whoever rewrites a fact
    anywhere before a head (and the hashes after it, to make the chain consistent) changes
    that head's link: a signed head shows it, even across a call's earlier state, whose
    body is not kept (its hash is, and the link covers it).
    """
    return hashlib.sha256(link + digest).digest()


def _raw(value: str | bytes) -> bytes:
    """A hash as raw bytes: version 3 stores them so; version 2 as hex text.

    Raises:
        ValueError: the text is not hex.
    """
    return value if isinstance(value, bytes) else bytes.fromhex(value)


def _d(text: str | None) -> str | None:
    """The sha256 of a stored text (UTF-8), hex, or None."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _real(value: float | None) -> float | None:
    """A REAL column as the store gives it back (an int written there reads as a float)."""
    return None if value is None else float(value)


def _int(value: int | None) -> int | None:
    return None if value is None else int(value)


# The canonical encoding, version 3 (and 2: the same bodies, with 2 for 3). A `run`, `status`
# or `pending` body is the compact JSON
# (ASCII, no spaces) of `[3, kind, run, ref, [values]]`: the values are the columns below,
# in this order, as the store holds them (text as a JSON string, REAL as a float in Python's
# shortest repr, INTEGER as an integer, NULL as null); a `#` column is the hex sha256 of its
# UTF-8 text instead. A `call` body is its whole row, the 23 columns as stored, in the row
# encoding (`encode_row`: binary, length-prefixed): a call's arguments, result, ... are
# hashed as they are. A verifier recomputes a body from the row as stored and compares it
# with the last fact about that row.
ENCODING = {
    "run": ("id", "task#", "agent", "parent", "parent_call", "depth", "policy#",
            "manifest_digest", "model", "workspace", "agent_ref", "created_at"),
    "status": ("id", "status", "outcome"),
    "call": ("id", "run_id", "call_id", "turn", "index", "name", "tool", "arguments",
             "arguments_digest", "performed", "actions", "verdict", "decision", "decided_by",
             "status", "result", "disposition", "error", "answers", "pending", "started_at",
             "ended_at", "provenance"),
    "pending": ("id", "item_kind", "run", "call", "agent", "tool", "payload#", "created_at",
                "state", "decision", "decided_by", "decided_at"),
}
"""Each kind's values, in order (`#`: the sha256 of the column's text)."""

STORED_BODY = frozenset({"run", "status", "pending"})
"""The kinds whose fact keeps its body. A `call` fact keeps only its hash: its body is the
call's row, which the store holds (its latest state; an earlier state is the hash alone)."""


def run_body(row: Sequence[Any], version: int = VERSION) -> str:
    """The `run` fact (what a run started as) of a run row in the stores' run column order.

    Those columns never change after a run is created. `version`: the encoding's (2 or 3).
    """
    return _ENCODE((version, "run", row[0], row[0], (
        row[0], _d(row[1]), row[2], row[4], row[21], _int(row[22]), _d(row[5]), row[6],
        row[7], row[8], row[20], _real(row[9]))))


def status_body(run_id: str, status: str, outcome: str | None, version: int = VERSION) -> str:
    """The `status` fact: a run's status and its outcome (the stored JSON text)."""
    return _ENCODE((version, "status", run_id, run_id, (run_id, status, outcome)))


def call_body(c: Sequence[Any], version: int = VERSION) -> bytes:
    """The `call` fact of a call row in the stores' call column order (23 values).

    The bytes of `(3, "call", row)` in the row encoding (`encode_row`; `version` 2: `(2,
    "call", row)`). The row as the store
    holds it: its REAL columns (started_at, ended_at) floats, its INTEGER ones (turn, index)
    ints (the stores write a call's row so). CPython's `marshal` (format 2) writes exactly
    these bytes for such values, at C speed: a call's fact costs the writer one pass over
    its row, no escaping, no float formatting (issue 42: a JSON body cost ~30k
    instructions a call, most of it escaping and formatting floats).
    """
    try:
        return _MARSHAL((version, "call", tuple(c)), 2)
    except ValueError:  # a subclass of str or int (an enum's value): as the store keeps it
        return _MARSHAL((version, "call", tuple([_plain(v) for v in c])), 2)


_MARSHAL = marshal.dumps


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def encode_row(value: Any) -> bytes:
    """The row encoding (versions 2 and 3), spelled out: what `call_body` writes, to port.

    A tuple is `(` and its length (uint32, little-endian) then its items; NULL is `N`; an
    integer in [-2**31, 2**31) is `i` and an int32; a larger one is `l`, the count of its
    15-bit digits (int32, negative for a negative number) and the digits (uint16 each,
    least significant first); a REAL is `g` and its IEEE-754 binary64; a text is `u`, its
    UTF-8 length (uint32) and its UTF-8 bytes (a lone surrogate as its 3 bytes). All
    little-endian. (It is CPython's marshal format 2 for these types.)
    """
    if value is None:
        return b"N"
    if isinstance(value, bool):
        raise TypeError("a row holds no booleans (the store keeps them as integers)")
    if isinstance(value, tuple):
        return b"(" + struct.pack("<I", len(value)) + b"".join(encode_row(v) for v in value)
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return b"i" + struct.pack("<i", value)
        digits, rest = [], abs(value)
        while rest:
            digits.append(rest & 0x7FFF)
            rest >>= 15
        count = len(digits) if value > 0 else -len(digits)
        return b"l" + struct.pack("<i", count) + struct.pack(f"<{len(digits)}H", *digits)
    if isinstance(value, float):
        return b"g" + struct.pack("<d", value)
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        return b"u" + struct.pack("<I", len(data)) + data
    raise TypeError(f"a row holds no {type(value).__name__}")


def pending_body(p: Sequence[Any], version: int = VERSION) -> str:
    """The `pending` fact of a pending row in the stores' pending column order (12 values)."""
    return _ENCODE((version, "pending", p[2], p[0], (
        p[0], p[1], p[2], p[3], p[4], p[5], _d(p[6]), _real(p[7]), p[8], p[9], p[10],
        _real(p[11]))))


def _prefix(kind: str, run_id: str, ref: str, version: int) -> str:
    """How a body of this kind about `ref` starts.

    The columns kind, run and ref are not hashed: this binds them to the body, which is.
    """
    return _ENCODE((version, kind, run_id, ref))[:-1] + ","


# ---------------------------------------------------------------- signing


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise ConfigError("signing the audit chain needs the `cryptography` package: "
                          "pip install 'handrail[audit]'") from exc
    return ed25519


def generate_key() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as PEM: (private key, PKCS#8 unencrypted; public key)."""
    _crypto()
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.PEM,
                                           ser.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def load_private_key(data: bytes) -> Any:
    """An Ed25519 private key from PEM (what `generate_key` or `openssl genpkey` writes).

    Raises:
        ConfigError: it is not an unencrypted Ed25519 private key in PEM.
    """
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization as ser

    try:
        key = ser.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError("the signing key must be an Ed25519 key "
                          "(`handrail audit keygen`, or `openssl genpkey -algorithm ed25519`)")
    return key


def load_public_key(data: bytes) -> Any:
    """An Ed25519 public key from PEM.

    Raises:
        ConfigError: it is not an Ed25519 public key in PEM.
    """
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization as ser

    try:
        key = ser.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a PEM public key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigError("the verification key must be an Ed25519 public key")
    return key


def public_key_id(public_key: Any) -> str:
    """A key's id as signatures record it: the hex of its 32 raw bytes."""
    from cryptography.hazmat.primitives import serialization as ser

    raw: bytes = public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return raw.hex()


def signed_message(seq: int, link: str) -> bytes:
    """The bytes a head's signature signs."""
    return f"{SIGNATURE_CONTEXT} {seq} {link}".encode()


def sign_head(private_key: Any, seq: int, link: str) -> tuple[str, str]:
    """Sign the head (`seq`, `link`): (the key's id, the signature's hex)."""
    signature: bytes = private_key.sign(signed_message(seq, link))
    return public_key_id(private_key.public_key()), signature.hex()


# ---------------------------------------------------------------- verification


@dataclass(frozen=True, kw_only=True, slots=True)
class Break:
    """One place where the record is not what its chain says."""

    what: str
    """`edited`, `deleted`, `reordered`, `inserted`, or `rewritten` (a signed head that no
    longer matches, or a signature that does not verify)."""
    where: str
    """The row: `fact #12 (run R, n 3)`, `call R:c1`, `run R`, `pending item P`, ..."""
    detail: str
    """What differs, in a sentence."""
    seq: int = 0
    """The fact it was found at (0: none), for ordering: the first break is the lowest."""

    def __str__(self) -> str:
        return f"{self.what}: {self.where}: {self.detail}"


@dataclass(kw_only=True, slots=True)
class Report:
    """What `verify` found."""

    facts: int = 0
    """Facts checked."""
    runs: int = 0
    """Runs checked."""
    rows: int = 0
    """Rows of the record (runs, calls, pending items) compared with their facts."""
    head: tuple[int, str] | None = None
    """The store's head (`seq`, `link`), or None for an empty chain."""
    signed: tuple[int, str] | None = None
    """The latest head a valid signature of the given key covers (`seq`, `signed_at`)."""
    breaks: list[Break] = field(default_factory=list)
    """Every break found (up to `MAX_BREAKS`), first one first."""
    more: int = 0
    """Breaks found beyond those listed."""

    @property
    def ok(self) -> bool:
        """Whether nothing is broken."""
        return not self.breaks

    def add(self, found: Break) -> None:
        """Record a break (the list is bounded; the rest are counted)."""
        if len(self.breaks) < MAX_BREAKS:
            self.breaks.append(found)
        else:
            self.more += 1


MAX_BREAKS = 100
"""Breaks a report lists; a store rewritten wholesale would otherwise list every row."""

Fact = tuple[int, str, int, str, str, "str | None", "str | None", "str | bytes", "str | None"]
"""An audit row as `verify` reads it: seq, run, n, kind, ref, body (None: a call's), prev,
hash, link. Version 2: prev, hash and link hex text; version 3: the hash raw (32 bytes, also
its link), prev and link None. A fact's hash's type is its version."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """What `verify` reads, from any store, as iterators of rows as stored.

    Grouped streams are ordered by run id (binary order of the id's UTF-8), so verification
    holds one run in memory at a time.
    """

    facts: Callable[[], Iterable[Fact]]
    """Audit rows ordered by run, then n, then seq."""
    links: Callable[[], Iterable[tuple[int, str, str]]]
    """(seq, hash, link) of every audit row, in seq order (empty when verifying one run)."""
    runs: Callable[[], Iterable[Sequence[Any]]]
    """Run rows (the stores' run columns), ordered by id."""
    calls: Callable[[], Iterable[Sequence[Any]]]
    """Call rows (the stores' call columns), ordered by run id."""
    pending: Callable[[], Iterable[Sequence[Any]]]
    """Pending rows (the stores' pending columns), ordered by run id."""
    signatures: Callable[[], Iterable[tuple[int, str, str, str, float]]]
    """(seq, link, key id, signature hex, signed_at), in seq order."""
    previous_link: Callable[[int], str | None] = lambda seq: None
    """The link of fact `seq - 1` (`ZERO` for seq 1), or None when the store has none: one
    run's verification checks its facts' links against it."""
    ordered_facts: Callable[[], Iterable[Fact]] | None = None
    """Every audit row in seq order (the whole store's scan: sequential reads)."""
    all_runs: Callable[[], Iterable[Sequence[Any]]] | None = None
    """Every run row, in any order."""
    all_calls: Callable[[], Iterable[Sequence[Any]]] | None = None
    """Every call row, in any order."""
    all_pending: Callable[[], Iterable[Sequence[Any]]] | None = None
    """Every pending row, in any order."""
    fact: Callable[[int], Fact | None] | None = None
    """One audit row by its seq."""
    for_run: Callable[[str], Source] | None = None
    """The source of one run (its rows grouped), for a closer look at a broken run."""


def _grouped(rows: Iterable[Sequence[Any]], key: int) -> Iterator[tuple[str, list[Any]]]:
    it = iter(rows)
    current: str | None = None
    group: list[Any] = []
    for row in it:
        k = row[key]
        if k != current:
            if current is not None:
                yield current, group
            current, group = k, []
        group.append(row)
    if current is not None:
        yield current, group


def _merge(*streams: Iterator[tuple[str, list[Any]]]) -> Iterator[tuple[str, list[list[Any]]]]:
    """Merge streams of (run id, rows) ordered by run id: (run id, rows of each stream)."""
    heads: list[tuple[str, list[Any]] | None] = [next(s, None) for s in streams]
    while True:
        keys = [h[0] for h in heads if h is not None]
        if not keys:
            return
        k = min(keys)
        out: list[list[Any]] = []
        for i, h in enumerate(heads):
            if h is not None and h[0] == k:
                out.append(h[1])
                heads[i] = next(streams[i], None)
            else:
                out.append([])
        yield k, out


def _hex(value: str | bytes) -> str:
    """A hash or link as text (version 3 keeps them raw)."""
    return value.hex() if isinstance(value, bytes) else value


def _raw_or_none(value: Any) -> bytes | None:
    try:
        return _raw(value)
    except (ValueError, TypeError):
        return None


def _holds(ctx: str | bytes | None, now: str | bytes, digest: Any) -> bool:
    """Whether `now` (a body the row gives, in the fact's version) hashes to `digest`."""
    if ctx is None:
        return False
    if isinstance(ctx, bytes):
        data = now if isinstance(now, bytes) else now.encode("utf-8", "surrogatepass")
        return bool(hashlib.sha256(ctx + data).digest() == digest)
    return bool(chain_hash(ctx, now) == digest)


def _version(fact: Fact) -> int:
    """The encoding a fact was written in: version 3 keeps its hash raw, 2 as hex text."""
    return 3 if isinstance(fact[7], bytes) else 2


def _diff(recorded: str | None, now: str) -> str:
    """Which values differ between a recorded body and the one the row gives now."""
    if recorded is None:
        return "a column"
    try:
        a, b = json.loads(recorded), json.loads(now)
        names = ENCODING[b[1]]
        was, is_ = a[4], b[4]
    except (ValueError, KeyError, IndexError, TypeError):
        return "the row no longer encodes"
    differ = [name.rstrip("#") for name, x, y in zip(names, was, is_, strict=False) if x != y]
    return ", ".join(differ) or "its encoding"


def _recorded(fact: Fact, ctx: str | bytes | None, now: str | bytes) -> bool:
    """Whether `now` (a body the row gives) is what `fact` recorded."""
    body = fact[5]
    if body is None:  # a call's fact keeps its hash alone
        return _holds(ctx, now, fact[7])
    return body == now


def _moved(row: Sequence[Any], fact: Fact, ctx: str | bytes | None,
           others: Sequence[Sequence[Any]]) -> Sequence[Any] | None:
    """The other call whose place (turn, index) `row` had when `fact` recorded it, if any.

    A call's fact keeps only its hash: a row that differs from it only in its place hashes
    right at the place of the call now there (two calls swapped). `others`: the calls of the
    run that differ from their facts too.
    """
    version = _version(fact)
    for other in others:
        if other[0] != row[0]:
            moved = (*row[:3], other[3], other[4], *row[5:])
            if _recorded(fact, ctx, call_body(moved, version)):
                return other
    return None


def _placed(facts: list[Fact], raws: list[bytes | None], i: int, data: bytes
            ) -> tuple[str, int, str] | None:
    """Where a version 3 fact was chained, when its hash does not hold where it is now.

    Version 3 keeps no `prev`: a fact's hash covers its run's previous hash, so a fact
    moved, or one slipped in before it, hashes right only after the fact it followed: the
    run's other facts are tried in that place, later ones first. (what, the seq of the fact
    it names, detail), or None: after none of them (its content was changed).
    """
    seq, digest = facts[i][0], facts[i][7]
    sha256 = hashlib.sha256
    for j in sorted(range(min(len(raws), 10 * MAX_BREAKS)), key=lambda j: j < i):
        other = raws[j]
        if i - 1 <= j <= i or other is None or sha256(other + data).digest() != digest:
            continue
        if j > i:
            return ("reordered", seq, f"it follows fact #{facts[j][0]}, which comes after it")
        return ("inserted", seq, f"it follows fact #{facts[j][0]}: the facts between are not "
                "in its chain")
    return None


def _named(run_id: str, placed: list[tuple[str, int, str]], report: Report) -> None:
    """Report where facts were found chained (`_placed`).

    A fact that was moved is not also one slipped in before the fact after it (two facts
    swapped: each follows what the other followed).
    """
    moved = {at for what, at, _ in placed if what == "reordered"}
    for what, at, detail in placed:
        if what != "inserted" or at not in moved:
            report.add(Break(what=what, where=f"fact #{at} (run {run_id})", seq=at,
                             detail=detail))


def _check_run(run_id: str, facts: list[Fact], runs: list[Any], calls: list[Any],
               pending: list[Any], report: Report,
               links: dict[int, tuple[Any, Any]] | None) -> None:
    """One run: its chain, then each of its rows against the last fact about it."""
    facts.sort(key=lambda f: (f[2], f[0]))
    placed: list[tuple[str, int, str]] = []
    raws = [_raw_or_none(f[7]) for f in facts]
    hashes = {h: i for i, h in enumerate(raws) if h is not None}
    prev, expected_n = ZERO_HASH, 0
    last: dict[tuple[str, str], tuple[Fact, str | bytes | None]] = {}
    status: tuple[Fact, str | bytes | None] | None = None
    for i, f in enumerate(facts):
        seq, _, n, kind, ref, body, f_prev, f_hash, _ = f
        where = f"fact #{seq} (run {run_id}, n {n})"
        ctx: str | bytes | None
        if isinstance(f_hash, bytes):  # version 3
            ctx = prev
            if (kind != "call" if body is None else kind == "call"
                    or not body.startswith(_prefix(kind, run_id, ref, 3))):
                report.add(Break(what="edited", where=where, seq=seq,
                                 detail="its content does not match its hash"))
            elif n != expected_n:
                report.add(_numbered(where, seq, n, expected_n))
            elif body is not None and not _holds(ctx, body, f_hash):
                spot = _placed(facts, raws, i, body.encode("utf-8", "surrogatepass"))
                if spot is None:
                    report.add(Break(what="edited", where=where, seq=seq,
                                     detail="its content does not match its hash"))
                else:
                    placed.append(spot)
        else:
            ctx = f_prev = str(f_prev)
            if (kind != "call" if body is None else chain_hash(f_prev, body) != f_hash
                    or not body.startswith(_prefix(kind, run_id, ref, 2))):
                report.add(Break(what="edited", where=where, seq=seq,
                                 detail="its content does not match its hash"))
            elif n != expected_n:
                report.add(_numbered(where, seq, n, expected_n))
            elif _raw_or_none(f_prev) != prev:
                j = hashes.get(_raw_or_none(f_prev))  # type: ignore[arg-type]
                if j is not None and j > i:
                    report.add(Break(what="reordered", where=where, seq=seq, detail=(
                        f"it follows fact #{facts[j][0]}, which comes after it")))
                elif j is not None and j < i - 1:
                    report.add(Break(what="inserted", where=where, seq=seq, detail=(
                        f"it follows fact #{facts[j][0]}: the facts between are not in its "
                        "chain")))
                else:
                    report.add(Break(what="deleted", where=where, seq=seq, detail=(
                        "the fact it follows is not in the run's chain")))
        prev, expected_n = raws[i] or b"", n + 1
        if kind in ("run", "status"):
            last[(kind, run_id)] = (f, ctx)
            if kind == "status":
                status = (f, ctx)
        else:
            last[(kind, ref)] = (f, ctx)
    # Each row now against the last fact recorded about it.
    for row in runs:
        report.rows += 1
        start = last.pop(("run", run_id), None)
        if start is None:
            report.add(Break(what="inserted", where=f"run {run_id}",
                             detail="no fact records its start"))
        elif not _recorded(*start, now := run_body(row, _version(start[0]))):
            report.add(Break(what="edited", where=f"run {run_id}", seq=start[0][0], detail=(
                f"its {_diff(start[0][5], now)} differ from fact #{start[0][0]}")))
        last.pop(("status", run_id), None)
        if status is None:
            report.add(Break(what="inserted", where=f"run {run_id}",
                             detail="no fact records its status"))
        elif not _recorded(*status, now := status_body(run_id, row[3], row[11],
                                                        _version(status[0]))):
            report.add(Break(what="edited", where=f"run {run_id}", seq=status[0][0], detail=(
                f"its {_diff(status[0][5], now)} differ from fact #{status[0][0]}")))
    differ: list[tuple[Any, Fact, str | bytes | None]] = []
    for row in calls:
        report.rows += 1
        found = last.pop(("call", row[0]), None)
        if found is None:
            report.add(Break(what="inserted", where=f"call {row[0]}",
                             detail="no fact records this call"))
        elif not _recorded(*found, call_body(row, _version(found[0]))):
            differ.append((row, *found))
    # Two calls swapped both differ from their facts: each is tried at the other's place
    # (bounded: a run rewritten whole would otherwise cost a hash per pair of its calls).
    moved = [row for row, _, _ in differ[:MAX_BREAKS]]
    index = {f[0]: i for i, f in enumerate(facts)}
    for row, fact, ctx in differ:
        where = f"call {row[0]}"
        spot = None
        if isinstance(fact[7], bytes) and len(differ) <= MAX_BREAKS:
            # (Its fact moved in the chain: it hashes right with the context it had.)
            spot = _placed(facts, raws, index[fact[0]], call_body(row, 3))
        other = _moved(row, fact, ctx, moved) if len(differ) > 1 and not spot else None
        if spot is not None:
            placed.append(spot)
        elif other is not None:
            report.add(Break(what="reordered", where=where, seq=fact[0], detail=(
                f"it is at turn {row[3]} index {row[4]}; fact #{fact[0]} recorded it at "
                f"turn {other[3]} index {other[4]}, where call {other[0]} is now")))
        else:
            report.add(Break(what="edited", where=where, seq=fact[0], detail=(
                f"its row is not the one fact #{fact[0]} recorded (a column was changed)")))
    for row in pending:
        report.rows += 1
        found = last.pop(("pending", row[0]), None)
        where = f"pending item {row[0]}"
        if found is None:
            report.add(Break(what="inserted", where=where,
                             detail="no fact records this item"))
        elif not _recorded(*found, now := pending_body(row, _version(found[0]))):
            report.add(Break(what="edited", where=where, seq=found[0][0], detail=(
                f"its {_diff(found[0][5], now)} differ from fact #{found[0][0]}")))
    _named(run_id, placed, report)
    for (kind, ref), (fact, _) in last.items():
        what = "run" if kind in ("run", "status") else "call" if kind == "call" else (
            "pending item")
        report.add(Break(what="deleted", where=f"{what} {ref}", seq=fact[0], detail=(
            f"fact #{fact[0]} records it; the store no longer holds it")))
    if links is not None:
        for f in facts:
            links[f[0]] = (f[7], f[8])


def _linked(before: str, digest: Any, link: Any) -> bool:
    """Whether `link` is the link of a fact of hash `digest` after the link `before` (hex).

    Version 3 (raw hash and link): `fact_link`; version 2 (hex): `link_hash`.
    """
    if isinstance(digest, bytes):
        raw = _raw_or_none(before)
        return raw is not None and isinstance(link, bytes) and fact_link(raw, digest) == link
    return isinstance(link, str) and link_hash(before, str(digest)) == link


def _numbered(where: str, seq: int, n: int, expected_n: int) -> Break:
    """A fact at another place of its run's chain than the one after the fact before it."""
    if n > expected_n:
        return Break(what="deleted", where=where, seq=seq, detail=(
            f"the run's facts {expected_n}..{n - 1} are missing"))
    return Break(what="inserted", where=where, seq=seq, detail=(
        f"a second fact at position {n} of the run's chain"))


def verify(source: Source, *, run_id: str | None = None,
           keys: Sequence[Any] = ()) -> Report:
    """Recompute the chains of `source` and compare the record with them.

    With `run_id`, only that run's chain and rows (and its facts' links to the store's
    chain). With `keys` (Ed25519 public keys), every signature made by one of them must
    verify and sign a head the chain still has; at least one must exist.
    """
    report = Report()
    if run_id is None and source.ordered_facts is not None:
        signatures = list(source.signatures())
        heads = _scan_store(source, report, signatures)
        _check_signatures(signatures, heads, keys, report, whole=True)
        report.breaks.sort(key=lambda b: b.seq or 2**62)
        return report
    one: dict[int, tuple[Any, Any]] | None = {} if run_id is not None else None
    streams = (_grouped(source.facts(), 1), _grouped(source.runs(), 0),
               _grouped(source.calls(), 1), _grouped(source.pending(), 2))
    for rid, (facts, runs, calls, pending) in _merge(*streams):
        if run_id is not None and rid != run_id:
            continue
        report.runs += 1
        report.facts += len(facts)
        _check_run(rid, facts, runs, calls, pending, report, one)
    signatures = list(source.signatures())
    if run_id is None:
        heads = _check_links(source.links(), report, signatures)
    else:
        heads = {}
        assert one is not None
        for seq in sorted(one):
            f_hash, link = one[seq]
            heads[seq] = _hex(link)
            before = source.previous_link(seq)
            if before is None:
                report.add(Break(what="deleted", where=f"fact #{seq}", seq=seq,
                                 detail=f"the store's fact #{seq - 1} is missing"))
            elif not _linked(before, f_hash, link):
                report.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        if one:
            report.head = (max(one), heads[max(one)])
    _check_signatures(signatures, heads, keys, report, whole=run_id is None)
    report.breaks.sort(key=lambda b: b.seq or 2**62)
    return report


def _scan_store(source: Source, report: Report,
                signatures: list[tuple[int, str, str, str, float]]) -> dict[int, str]:
    """The whole store in two sequential passes; returns the links of the signed heads.

    First every fact in store order: the store-wide links, each run's chain (its n, prev
    and hash), and the digest of the last fact about each run, call and item. Then every
    row, whose body is recomputed and compared with that digest. A run whose chain is not
    whole is looked at again closely (`_check_run` on its rows alone), which names what
    happened to it. Memory: a tip a run, and a call's last fact as 73 bytes (its version,
    the previous hash its hash covers and the hash, raw, and its seq): ~200 bytes a call
    with its id and the dict's share.
    """
    assert source.ordered_facts is not None and source.all_runs is not None
    assert source.all_calls is not None and source.all_pending is not None
    assert source.fact is not None and source.for_run is not None
    sha256 = hashlib.sha256
    wanted = {s[0] for s in signatures}
    heads: dict[int, str] = {}
    tips: dict[str, tuple[int, bytes]] = {}
    suspect: set[str] = set()
    # The last fact about each row: (seq, what its hash covers besides the body, hash, run).
    # A row's body now hashes with that to that hash when the row is as recorded.
    Last = tuple[int, "str | bytes", "str | bytes", str]
    starts: dict[str, Last] = {}
    statuses: dict[str, Last] = {}
    calls: dict[str, bytes] = {}
    """A call's last fact: its version (1 byte), the previous hash its hash covers (32, raw),
    its hash (32) and seq (8, little-endian)."""
    items: dict[str, Last] = {}
    last_of = {"run": starts, "status": statuses, "pending": items}
    fromhex = bytes.fromhex
    prev_link, expected, before_prev = ZERO_HASH, 1, b""
    head: tuple[int, Any] | None = None
    fromhex = bytes.fromhex
    count = 0
    # The store-wide chain's breaks are listed after a broken run's own (which say better
    # what happened at the same fact: reordered, inserted).
    linked = Report()
    for seq, run, n, kind, ref, body, f_prev, f_hash, link in source.ordered_facts():
        count += 1
        v3 = isinstance(f_hash, bytes)
        if not v3:  # version 2: hex text
            f_hash, link, f_prev = str(f_hash), str(link), str(f_prev)
        if seq in wanted:
            heads[seq] = _hex(link)  # type: ignore[arg-type]
        tip = tips.get(run)
        tip_hash = ZERO_HASH if tip is None else tip[1]
        raw_link: bytes
        raw_hash: bytes
        try:
            raw_link = cast(bytes, link) if v3 else fromhex(str(link))
            raw_hash = cast(bytes, f_hash) if v3 else fromhex(str(f_hash))
        except (ValueError, TypeError):  # not hashes: the close look names it
            raw_link = raw_hash = b""
            suspect.add(run)
        if seq != expected:
            if seq > expected:
                linked.add(Break(what="deleted", where=f"fact #{seq}", seq=seq, detail=(
                    f"the store's facts #{expected}..#{seq - 1} are missing")))
            else:
                linked.add(Break(what="inserted", where=f"fact #{seq}", seq=seq,
                                 detail="a second fact with this number"))
        elif (sha256(prev_link + raw_hash).digest() if v3 else sha256(
                (prev_link.hex() + str(f_hash)).encode()).digest()) != raw_link:
            if before_prev and (sha256(before_prev + raw_hash).digest() if v3 else sha256(
                    (before_prev.hex() + str(f_hash)).encode()).digest()) == raw_link:
                linked.add(Break(what="inserted", where=f"fact #{seq - 1}", seq=seq - 1,
                                 detail="it is not in the store-wide chain: the fact after "
                                        "it follows the one before it"))
            else:
                linked.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        before_prev, prev_link, expected = prev_link, raw_link, seq + 1
        head = (seq, link)
        # (The columns kind, run and ref are not hashed: a fact moved to another ref or
        # kind no longer matches the row it is compared with below; to another run, it
        # breaks that run's chain. The close look names it.) Version 3 keeps no `prev`:
        # its hash covers the run's previous hash (`tip_hash`), which a body shows here,
        # and a call's row below.
        if n != (0 if tip is None else tip[0] + 1) or (
                not v3 and f_prev != tip_hash.hex()) or (
                kind != "call" if body is None else
                (sha256(tip_hash + body.encode("utf-8", "surrogatepass")).digest() if v3 else
                 sha256((str(f_prev) + body).encode()).hexdigest()) != f_hash):
            suspect.add(run)
        tips[run] = (n, raw_hash)
        ctx: str | bytes = tip_hash if v3 else str(f_prev)  # (its hash covers, and its body)
        if kind == "call":
            if body is None:
                # Its version's byte, then what its hash covers and the hash, then its seq.
                calls[ref] = (b"\x03" + tip_hash if v3 else b"\x02" + (
                    _raw_or_none(f_prev) or b"")) + raw_hash + seq.to_bytes(8, "little")
                if len(calls[ref]) != 73:  # not hashes: the close look names it
                    suspect.add(run)
            else:
                suspect.add(run)
            continue
        last = last_of.get(kind)
        if last is None:
            suspect.add(run)
        else:
            last[run if kind in ("run", "status") else ref] = (seq, ctx, f_hash, run)
    report.head = None if head is None else (head[0], _hex(head[1]))
    report.facts = count
    found: dict[str, list[Break]] = {}
    """Breaks of runs whose chain holds, reported unless a row sends the run to a close look."""

    def compare(where: str, recorded: Last | None, body: Callable[[int], str], what: str,
                run: str) -> None:
        if recorded is None:
            found.setdefault(run, []).append(Break(what="inserted", where=where,
                                                   detail=f"no fact records {what}"))
        elif not _holds(recorded[1], body(3 if isinstance(recorded[1], bytes) else 2),
                        recorded[2]):
            suspect.add(run)  # the close look names what changed

    seen_runs = set(tips)
    for row in source.all_runs():
        report.rows += 1
        rid = row[0]
        seen_runs.add(rid)
        if rid in suspect:
            continue
        compare(f"run {rid}", starts.pop(rid, None), functools.partial(run_body, row),
                "its start", rid)
        compare(f"run {rid}", statuses.pop(rid, None),
                functools.partial(status_body, rid, row[3], row[11]), "its status", rid)
    for row in source.all_calls():
        report.rows += 1
        run = row[1]
        if run in suspect:
            continue
        packed = calls.pop(row[0], None)
        if packed is None:
            found.setdefault(run, []).append(Break(what="inserted", where=f"call {row[0]}",
                                                   detail="no fact records this call"))
        elif (sha256(packed[1:33] + call_body(row, 3)).digest() if packed[0] == 3 else sha256(
                packed[1:33].hex().encode() + call_body(row, 2)).digest()) != packed[33:65]:
            suspect.add(run)  # the close look names what changed
    for row in source.all_pending():
        report.rows += 1
        if row[2] in suspect:
            continue
        compare(f"pending item {row[0]}", items.pop(row[0], None),
                functools.partial(pending_body, row), "this item", row[2])
    gone = [("call", ref, int.from_bytes(packed[-8:], "little"), "")
            for ref, packed in calls.items()]
    calls.clear()
    for name, last in (("run", starts), ("run", statuses), ("pending item", items)):
        gone += [(name, ref, seq, run) for ref, (seq, _, _, run) in last.items()]
    for name, ref, seq, run in gone:
        if not run:  # (a call's: its fact says which run)
            fact = source.fact(seq)
            run = "" if fact is None else fact[1]
        found.setdefault(run, []).append(Break(
            what="deleted", where=f"{name} {ref}", seq=seq,
            detail=f"fact #{seq} records it; the store no longer holds it"))
    for run, breaks in found.items():
        if run not in suspect:
            for one_break in breaks:
                report.add(one_break)
    report.runs = len(seen_runs)
    for rid in sorted(suspect):
        one = source.for_run(rid)
        streams = (_grouped(one.facts(), 1), _grouped(one.runs(), 0),
                   _grouped(one.calls(), 1), _grouped(one.pending(), 2))
        for _, (facts, runs, run_calls, pending) in _merge(*streams):
            rows = report.rows
            _check_run(rid, facts, runs, run_calls, pending, report, None)
            report.rows = rows  # counted in the scan already
    for one_break in linked.breaks:
        report.add(one_break)
    report.more += linked.more
    return heads


def _check_links(links: Iterable[tuple[int, Any, Any]], report: Report,
                 signatures: list[tuple[int, str, str, str, float]]) -> dict[int, str]:
    """The store-wide chain, in seq order; returns the links of the signed heads."""
    wanted = {s[0] for s in signatures}
    heads: dict[int, str] = {}
    prev_link, expected = ZERO, 1
    before_prev = ""
    head: tuple[int, str] | None = None
    for seq, f_hash, link in links:
        if seq in wanted:
            heads[seq] = _hex(link)
        if seq != expected:
            if seq > expected:
                report.add(Break(what="deleted", where=f"fact #{seq}", seq=seq, detail=(
                    f"the store's facts #{expected}..#{seq - 1} are missing")))
            else:
                report.add(Break(what="inserted", where=f"fact #{seq}", seq=seq,
                                 detail="a second fact with this number"))
        elif not _linked(prev_link, f_hash, link):
            if before_prev and _linked(before_prev, f_hash, link):
                report.add(Break(what="inserted", where=f"fact #{seq - 1}", seq=seq - 1,
                                 detail="it is not in the store-wide chain: the fact after "
                                        "it follows the one before it"))
            else:
                report.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        current = _hex(link)
        before_prev, prev_link, expected = prev_link, current, seq + 1
        head = (seq, current)
    report.head = head
    return heads


def _check_signatures(signatures: list[tuple[int, str, str, str, float]],
                      heads: dict[int, str], keys: Sequence[Any], report: Report, *,
                      whole: bool) -> None:
    if not keys:
        return
    from cryptography.exceptions import InvalidSignature

    by_id = {public_key_id(k): k for k in keys}
    found = False
    for seq, link, key_id, signature, signed_at in signatures:
        key = by_id.get(key_id)
        if key is None:
            continue
        found = True
        where = f"signed head #{seq}"
        try:
            key.verify(bytes.fromhex(signature), signed_message(seq, link))
        except (InvalidSignature, ValueError):
            report.add(Break(what="rewritten", where=where, seq=seq, detail=(
                "its signature does not verify with the key: forged or altered")))
            continue
        now = heads.get(seq)
        if now is None:
            if whole or seq in heads:
                report.add(Break(what="deleted", where=where, seq=seq, detail=(
                    "the store no longer has the fact this signature covers")))
            continue
        if now != link:
            report.add(Break(what="rewritten", where=where, seq=seq, detail=(
                "the chain up to this head is not the one that was signed: the record "
                "before it was rewritten")))
            continue
        if report.signed is None or seq > report.signed[0]:
            report.signed = (seq, str(signed_at))
    if not found:
        report.add(Break(what="rewritten", where="signatures", detail=(
            "no head is signed by this key: nothing shows the store was not rewritten")))


# ---------------------------------------------------------------- reading a store


class Reader(Protocol):
    """A store's audit chain and record, read in one snapshot (`open_reader`)."""

    def source(self, run_id: str | None = None) -> Source:
        """What `verify` reads."""

    def head(self) -> tuple[int, str] | None:
        """The store's head (seq, link) in this snapshot, or None when nothing is chained."""

    def previous_link(self, seq: int) -> str | None:
        """The link of fact `seq - 1` (`ZERO` before the first), or None if it is gone."""

    def first_since(self, since: float) -> int | None:
        """The first fact written at or after `since`, or None."""

    def facts_from(self, seq: int) -> Iterator[tuple[Any, ...]]:
        """Facts from `seq` on: seq, run, n, kind, ref, body, prev, hash, link, at."""

    def call_row(self, record_id: str) -> Sequence[Any] | None:
        """A call's row as the store holds it now (the stores' call columns), or None."""

    def run_hash(self, run_id: str, n: int) -> str | None:
        """The hash (hex) of the fact at place `n` of a run's chain, or None."""

    def signatures(self) -> list[tuple[Any, ...]]:
        """Signatures: seq, link, key id, signature hex, signed_at."""

    def add_signature(self, seq: int, link: str, key: str, signature: str) -> None:
        """Record a signature (a reader opened writable)."""

    def close(self) -> None:
        """End the snapshot (committing a signature) and close."""


def open_reader(url: str, *, writable: bool = False) -> Reader:
    """Open the chain of the store at `url` (a SQLite path or `sqlite://`, `postgresql://`).

    Read-only and in one snapshot, unless `writable` (to record a signature): then in one
    transaction that holds the store's write lock until `close`, so the head it signs is the
    head.

    Raises:
        ConfigError: a store kind without an audit chain (`memory://`).
        StoreError: the store cannot be read (or is not migrated to the chain yet).
    """
    scheme = url.partition("://")[0].lower() if "://" in url else "sqlite"
    if scheme == "sqlite":
        from handrail.store._sqlite import _AuditReader

        return _AuditReader(url.removeprefix("sqlite://"), writable=writable)
    if scheme in ("postgresql", "postgres"):
        from handrail.store._postgres import _AuditReader as _PgReader

        return _PgReader(url, writable=writable)
    raise ConfigError(f"the {scheme}:// store keeps no audit chain; verify a SQLite file or a "
                      "PostgreSQL store")


EXPORT_FORMAT = "handrail-audit"
"""The `format` of an export's first line."""


def export_lines(reader: Reader, *, since: float = 0.0) -> Iterator[str]:
    """The chain as JSON lines (docs/audit.md: the schema), from the first fact at `since`.

    A header line (`"type": "header"`), one `"type": "fact"` line per fact in store order,
    then one `"type": "signature"` line per signature of a head in the export. Hashes and
    links are hex in every version; a version 3 fact's `prev` (its run's previous hash),
    which the store does not keep, is given for the reader.
    """
    first = 1 if since <= 0 else reader.first_since(since)
    start = first if first is not None else (reader.head() or (0, ""))[0] + 1
    before = reader.previous_link(start) if start > 1 else ZERO
    yield json.dumps({
        "type": "header", "format": EXPORT_FORMAT, "version": VERSION, "from_seq": start,
        "link_before": before,
        "v": "the fact's encoding version (2 or 3)",
        "hash": "v3: sha256(prev as its 32 bytes + body), hex; v2: sha256(prev + body) as "
                "UTF-8, hex",
        "body": "JSON text; null for a call, whose body is its row in the row encoding",
        "row": "a call's 23 columns as the fact recorded them; null for a state the "
               "store no longer holds (only its hash is kept)",
        "link": "v3: sha256(link of the fact before + hash, as their 32 bytes), hex; v2: "
                "sha256(link of the fact before + hash) as UTF-8, hex",
        "signature": f"Ed25519 over '{SIGNATURE_CONTEXT} <seq> <link>' as UTF-8",
    }, separators=(",", ":"))
    last = start - 1
    tips: dict[str, str] = {}
    for seq, run, n, kind, ref, body, prev, digest, link, at in reader.facts_from(start):
        last = seq
        row: list[Any] | None = None
        version = 3 if isinstance(digest, bytes) else 2
        if version == 3:
            # Not kept: the run's previous hash (the store's is the fact before's link).
            prev = tips.get(run) if n else ZERO
            if prev is None:
                prev = reader.run_hash(run, n - 1) or ZERO
            digest, link = digest.hex(), _hex(link)
            ctx: str | bytes = bytes.fromhex(prev)
        else:
            ctx = prev
        if body is None and kind == "call":
            # The fact keeps its hash alone; the call's row is its body when it is the state
            # this fact recorded (its latest, untouched); an earlier state is not kept.
            now = reader.call_row(ref)
            if now is not None and _holds(ctx, call_body(now, version), _raw_or_none(digest)
                                          if version == 3 else digest):
                row = list(now)
        fact = {"type": "fact", "v": version, "seq": seq, "run": run, "n": n, "kind": kind,
                "ref": ref, "body": body, "prev": prev, "hash": digest, "link": link, "at": at}
        if kind == "call":
            fact["row"] = row
        yield json.dumps(fact, separators=(",", ":"))
        tips[run] = digest
    for seq, link, key, signature, signed_at in reader.signatures():
        if start <= seq <= last:
            yield json.dumps({"type": "signature", "seq": seq, "link": link, "key": key,
                              "signature": signature, "signed_at": signed_at},
                             separators=(",", ":"))


def sign(reader: Reader, private_key: Any) -> tuple[int, str, str] | None:
    """Sign the store's head and record the signature; (seq, link, key id), or None if empty.

    `reader` must be writable (`open_reader(url, writable=True)`); closing it commits.
    """
    head = reader.head()
    if head is None:
        return None
    seq, link = head
    key_id, signature = sign_head(private_key, seq, link)
    reader.add_signature(seq, link, key_id, signature)
    return seq, link, key_id
