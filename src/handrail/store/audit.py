"""The tamper-evident record: a hash chain over the facts a store keeps, and its verification.

Every fact that matters (a run's start, each status and outcome it takes, each state a call
record is written in — its actions, verdict, decision and who made it, digests of its
arguments and result —, each state of a pending item, its decision included) is appended to
the store's `audit` table in the transaction that writes it, as one row:

    seq   its place in the store (1, 2, 3, ...: no gaps)
    run   its run; n: its place in the run's chain (0, 1, 2, ...)
    kind  run | status | call | pending;  ref: the run, call record or item it is about
    body  the fact: compact JSON in the fixed field order of `ENCODING` below
    prev  the hash of the run's previous fact (64 zeros for its first)
    hash  sha256(prev + body), hex
    link  sha256(the previous fact's link + hash), hex: the store-wide chain (64 zeros
          before the first fact)

The run's chain says "this run's record is these facts, in this order"; the store-wide chain
(every run's head, as each fact extends it) says "the store is these runs, in this order":
a fact moved, dropped or inserted breaks both, and a run deleted whole still breaks the
store's. `verify` recomputes both, and compares every row the store holds now with the last
fact recorded about it. An Ed25519 signature over a head (`seq`, `link`), kept in
`audit_signatures`, makes a rewrite of everything up to that head detectable too: the chain
alone can be recomputed by anyone who can write the store.

The encoding is versioned (`VERSION`); this module is the reference, docs/audit.md the
description a reader without handrail follows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from handrail.errors import ConfigError

__all__ = [
    "EXPORT_FORMAT",
    "SIGNATURE_CONTEXT",
    "VERSION",
    "ZERO",
    "Break",
    "Reader",
    "Report",
    "Source",
    "call_body",
    "chain_hash",
    "export_lines",
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

VERSION = 1
"""The version of the canonical encoding; every body starts `{"v":1,`."""

ZERO = "0" * 64
"""The `prev` of a run's first fact, and the link before the store's first fact."""

SIGNATURE_CONTEXT = "handrail-audit/1 head"
"""What a signature signs: `f"{SIGNATURE_CONTEXT} {seq} {link}"`, UTF-8."""

_ENCODE_STR = json.JSONEncoder(ensure_ascii=True).encode


def chain_hash(prev: str, body: str) -> str:
    """A fact's hash: sha256 of its run's previous hash (hex) followed by its body, UTF-8."""
    return hashlib.sha256((prev + body).encode("utf-8", "surrogatepass")).hexdigest()


def link_hash(prev_link: str, fact_hash: str) -> str:
    """A fact's link in the store-wide chain: sha256 of the previous link and its hash."""
    return hashlib.sha256((prev_link + fact_hash).encode()).hexdigest()


def _q(value: str | None) -> str:
    """A string as JSON (ASCII, escapes as Python's json writes them), or null."""
    if value is None:
        return "null"
    # (Four C-level checks cost less than a regular expression's call; the hot path makes
    # a dozen of these a call record.)
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return _ENCODE_STR(value)


_NAMES: dict[str | None, str] = {}
"""`_q` of the values a few names take again and again (statuses, tools, approvers)."""


def _n(value: str | None) -> str:
    """`_q`, remembered: for columns whose values repeat (bounded)."""
    quoted = _NAMES.get(value)
    if quoted is None:
        quoted = _q(value)
        if len(_NAMES) < 4096:
            _NAMES[value] = quoted
    return quoted


def _d(text: str | None) -> str:
    """The sha256 of a stored text (UTF-8), as a JSON string, or null."""
    if text is None:
        return "null"
    return '"' + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() + '"'


def _v(text: str | None) -> str:
    """A stored JSON text as it is (it is JSON already), or null."""
    return "null" if text is None else text


def _a(text: str | None) -> str:
    """A list column that is usually empty: `[]` as it is, else the sha256 of its text."""
    return "[]" if text == "[]" else _d(text)


def _f(value: float | None) -> str:
    """A REAL column: Python's repr of the float (the shortest that reads back the same)."""
    return "null" if value is None else repr(float(value))


def _i(value: int | None) -> str:
    return "null" if value is None else str(int(value))


# The canonical encoding, version 1. Each body is one JSON object written with its fields in
# exactly this order, no spaces: a string as Python's json writes it (ASCII, \uXXXX escapes),
# a number as Python's repr of it (REAL columns as floats), a digest as the hex sha256 of the
# column's stored UTF-8 text, a JSON column (actions, verdict, decision, outcome) as its
# stored text, verbatim; `answers` as `[]` when there are none (else its digest). A verifier
# recomputes a body from the row as stored and compares the text; a reader of an export needs
# none of this: each line carries the body it hashed.
ENCODING = {
    "run": ("v", "kind", "run", "task#", "agent", "parent", "parent_call", "depth", "policy#",
            "manifest_digest", "model", "workspace", "agent_ref", "created_at"),
    "status": ("v", "kind", "run", "status", "outcome"),
    "call": ("v", "kind", "run", "id", "turn", "index", "name", "tool", "arguments#",
             "arguments_digest", "performed#", "actions", "verdict", "decision", "decided_by",
             "status", "result#", "disposition", "error#", "answers#", "pending",
             "started_at", "ended_at", "provenance#"),
    "pending": ("v", "kind", "run", "id", "item_kind", "call", "agent", "tool", "payload#",
                "created_at", "state", "decision", "decided_by", "decided_at"),
}
"""Each kind's fields, in order (`#`: the sha256 of the column's text, under the bare name)."""


def run_body(row: Sequence[Any]) -> str:
    """The `run` fact (what a run started as) of a run row in the stores' run column order.

    Those columns never change after a run is created.
    """
    return (f'{{"v":1,"kind":"run","run":{_q(row[0])},"task":{_d(row[1])},'
            f'"agent":{_q(row[2])},"parent":{_q(row[4])},"parent_call":{_q(row[21])},'
            f'"depth":{_i(row[22])},"policy":{_d(row[5])},"manifest_digest":{_q(row[6])},'
            f'"model":{_q(row[7])},"workspace":{_q(row[8])},"agent_ref":{_q(row[20])},'
            f'"created_at":{_f(row[9])}}}')


def status_body(run_id: str, status: str, outcome: str | None) -> str:
    """The `status` fact: a run's status and its outcome (the stored JSON text)."""
    return (f'{{"v":1,"kind":"status","run":{_q(run_id)},"status":{_q(status)},'
            f'"outcome":{_v(outcome)}}}')


def call_body(c: Sequence[Any]) -> str:
    """The `call` fact of a call row in the stores' call column order (23 values)."""
    return (f'{{"v":1,"kind":"call","run":{_q(c[1])},"id":{_q(c[0])},"turn":{_i(c[3])},'
            f'"index":{_i(c[4])},"name":{_n(c[5])},"tool":{_n(c[6])},'
            f'"arguments":{_d(c[7])},"arguments_digest":{_q(c[8])},"performed":{_d(c[9])},'
            f'"actions":{_v(c[10])},"verdict":{_v(c[11])},"decision":{_v(c[12])},'
            f'"decided_by":{_n(c[13])},"status":{_n(c[14])},"result":{_d(c[15])},'
            f'"disposition":{_n(c[16])},"error":{_d(c[17])},"answers":{_a(c[18])},'
            f'"pending":{_q(c[19])},"started_at":{_f(c[20])},"ended_at":{_f(c[21])},'
            f'"provenance":{_d(c[22])}}}')


def pending_body(p: Sequence[Any]) -> str:
    """The `pending` fact of a pending row in the stores' pending column order (12 values)."""
    return (f'{{"v":1,"kind":"pending","run":{_q(p[2])},"id":{_q(p[0])},'
            f'"item_kind":{_q(p[1])},"call":{_q(p[3])},"agent":{_q(p[4])},"tool":{_q(p[5])},'
            f'"payload":{_d(p[6])},"created_at":{_f(p[7])},"state":{_q(p[8])},'
            f'"decision":{_v(p[9])},"decided_by":{_q(p[10])},"decided_at":{_f(p[11])}}}')


def _prefix(kind: str, run_id: str, ref: str) -> str:
    """How a body of this kind about `ref` starts.

    The columns kind and ref are not hashed: this binds them to the body, which is.
    """
    if kind in ("run", "status"):
        return f'{{"v":1,"kind":"{kind}","run":{_q(run_id)},'
    return f'{{"v":1,"kind":"{kind}","run":{_q(run_id)},"id":{_q(ref)},'


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

Fact = tuple[int, str, int, str, str, str, str, str, str]
"""An audit row as `verify` reads it: seq, run, n, kind, ref, body, prev, hash, link."""


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


def _diff(recorded: str, now: str) -> str:
    """Which fields differ between a recorded body and the one the row gives now."""
    try:
        a, b = json.loads(recorded), json.loads(now)
    except ValueError:
        return "the row no longer encodes"
    names = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return ", ".join(names) or "its encoding"


def _check_run(run_id: str, facts: list[Fact], runs: list[Any], calls: list[Any],
               pending: list[Any], report: Report,
               links: dict[int, tuple[str, str]] | None) -> None:
    """One run: its chain, then each of its rows against the last fact about it."""
    facts.sort(key=lambda f: (f[2], f[0]))
    hashes = {f[7]: i for i, f in enumerate(facts)}
    prev, expected_n = ZERO, 0
    last: dict[tuple[str, str], Fact] = {}
    status: Fact | None = None
    for i, f in enumerate(facts):
        seq, _, n, kind, ref, body, f_prev, f_hash, _ = f
        where = f"fact #{seq} (run {run_id}, n {n})"
        if chain_hash(f_prev, body) != f_hash or not body.startswith(
                _prefix(kind, run_id, ref)):
            report.add(Break(what="edited", where=where, seq=seq,
                             detail="its content does not match its hash"))
        elif n != expected_n:
            if n > expected_n:
                report.add(Break(what="deleted", where=where, seq=seq, detail=(
                    f"the run's facts {expected_n}..{n - 1} are missing")))
            else:
                report.add(Break(what="inserted", where=where, seq=seq, detail=(
                    f"a second fact at position {n} of the run's chain")))
        elif f_prev != prev:
            j = hashes.get(f_prev)
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
        prev, expected_n = f_hash, n + 1
        if kind in ("run", "status"):
            last[(kind, run_id)] = f
            if kind == "status":
                status = f
        else:
            last[(kind, ref)] = f
    # Each row now against the last fact recorded about it.
    for row in runs:
        report.rows += 1
        start = last.pop(("run", run_id), None)
        if start is None:
            report.add(Break(what="inserted", where=f"run {run_id}",
                             detail="no fact records its start"))
        elif start[5] != run_body(row):
            report.add(Break(what="edited", where=f"run {run_id}", seq=start[0], detail=(
                f"{_diff(start[5], run_body(row))} differ from fact #{start[0]}")))
        last.pop(("status", run_id), None)
        now = status_body(run_id, row[3], row[11])
        if status is None:
            report.add(Break(what="inserted", where=f"run {run_id}",
                             detail="no fact records its status"))
        elif status[5] != now:
            report.add(Break(what="edited", where=f"run {run_id}", seq=status[0], detail=(
                f"its {_diff(status[5], now)} differ from fact #{status[0]}")))
    positions: dict[tuple[int, int], str] = {}
    moved: list[tuple[Any, Fact]] = []
    for row in calls:
        report.rows += 1
        fact = last.pop(("call", row[0]), None)
        where = f"call {row[0]}"
        if fact is None:
            report.add(Break(what="inserted", where=where,
                             detail="no fact records this call"))
            continue
        now = call_body(row)
        if fact[5] != now:
            differ = _diff(fact[5], now)
            if differ in ("turn, index", "turn", "index"):
                moved.append((row, fact))
            else:
                report.add(Break(what="edited", where=where, seq=fact[0], detail=(
                    f"its {differ} differ from fact #{fact[0]}")))
        positions[(int(row[3]), int(row[4]))] = row[0]
    for row, fact in moved:
        recorded = json.loads(fact[5])
        other = positions.get((recorded["turn"], recorded["index"]))
        report.add(Break(what="reordered", where=f"call {row[0]}", seq=fact[0], detail=(
            f"it is at turn {row[3]} index {row[4]}, fact #{fact[0]} put it at turn "
            f"{recorded['turn']} index {recorded['index']}"
            + (f" (where call {other} is now)" if other and other != row[0] else ""))))
    for row in pending:
        report.rows += 1
        fact = last.pop(("pending", row[0]), None)
        where = f"pending item {row[0]}"
        if fact is None:
            report.add(Break(what="inserted", where=where,
                             detail="no fact records this item"))
        elif fact[5] != (now := pending_body(row)):
            report.add(Break(what="edited", where=where, seq=fact[0], detail=(
                f"its {_diff(fact[5], now)} differ from fact #{fact[0]}")))
    for (kind, ref), fact in last.items():
        what = "run" if kind in ("run", "status") else "call" if kind == "call" else (
            "pending item")
        report.add(Break(what="deleted", where=f"{what} {ref}", seq=fact[0], detail=(
            f"fact #{fact[0]} records it; the store no longer holds it")))
    if links is not None:
        for f in facts:
            links[f[0]] = (f[7], f[8])


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
    one: dict[int, tuple[str, str]] | None = {} if run_id is not None else None
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
            heads[seq] = link
            before = source.previous_link(seq)
            if before is None:
                report.add(Break(what="deleted", where=f"fact #{seq}", seq=seq,
                                 detail=f"the store's fact #{seq - 1} is missing"))
            elif link_hash(before, f_hash) != link:
                report.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        if one:
            report.head = (max(one), one[max(one)][1])
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
    happened to it. Memory: a digest a call, a tip a run.
    """
    assert source.ordered_facts is not None and source.all_runs is not None
    assert source.all_calls is not None and source.all_pending is not None
    assert source.fact is not None and source.for_run is not None
    sha256 = hashlib.sha256
    wanted = {s[0] for s in signatures}
    heads: dict[int, str] = {}
    tips: dict[str, tuple[int, str]] = {}
    suspect: set[str] = set()
    starts: dict[str, tuple[int, bytes]] = {}
    statuses: dict[str, tuple[int, bytes]] = {}
    calls: dict[str, tuple[int, bytes]] = {}
    items: dict[str, tuple[int, bytes]] = {}
    last_of = {"run": starts, "status": statuses, "call": calls, "pending": items}
    prev_link, expected, before_prev = ZERO, 1, ""
    head: tuple[int, str] | None = None
    count = 0
    # The store-wide chain's breaks are listed after a broken run's own (which say better
    # what happened at the same fact: reordered, inserted).
    linked = Report()
    for seq, run, n, kind, ref, body, f_prev, f_hash, link in source.ordered_facts():
        count += 1
        if seq in wanted:
            heads[seq] = link
        if seq != expected:
            if seq > expected:
                linked.add(Break(what="deleted", where=f"fact #{seq}", seq=seq, detail=(
                    f"the store's facts #{expected}..#{seq - 1} are missing")))
            else:
                linked.add(Break(what="inserted", where=f"fact #{seq}", seq=seq,
                                 detail="a second fact with this number"))
        elif sha256((prev_link + f_hash).encode()).hexdigest() != link:
            if before_prev and link_hash(before_prev, f_hash) == link:
                linked.add(Break(what="inserted", where=f"fact #{seq - 1}", seq=seq - 1,
                                 detail="it is not in the store-wide chain: the fact after "
                                        "it follows the one before it"))
            else:
                linked.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        before_prev, prev_link, expected = prev_link, link, seq + 1
        head = (seq, link)
        tip = tips.get(run)
        data = body.encode("utf-8", "surrogatepass")
        # (The columns kind, run and ref are not hashed: a fact moved to another ref or
        # kind no longer matches the row it is compared with below; to another run, it
        # breaks that run's chain. The close look names it.)
        if (n != (0 if tip is None else tip[0] + 1)
                or f_prev != (ZERO if tip is None else tip[1])
                or sha256(f_prev.encode() + data).hexdigest() != f_hash):
            suspect.add(run)
        tips[run] = (n, f_hash)
        last = last_of.get(kind)
        if last is None:
            suspect.add(run)
        else:
            last[run if kind in ("run", "status") else ref] = (seq, sha256(data).digest())
    report.head = head
    report.facts = count

    def compare(where: str, recorded: tuple[int, bytes] | None, now: str,
                what: str) -> None:
        if recorded is None:
            report.add(Break(what="inserted", where=where, detail=f"no fact records {what}"))
            return
        if sha256(now.encode("utf-8", "surrogatepass")).digest() == recorded[1]:
            return
        fact = source.fact(recorded[0])  # type: ignore[misc]
        body = "" if fact is None else fact[5]
        differ = _diff(body, now)
        if differ in ("turn, index", "turn", "index"):
            was = json.loads(body)
            report.add(Break(what="reordered", where=where, seq=recorded[0], detail=(
                f"it is at turn {json.loads(now)['turn']} index {json.loads(now)['index']}, "
                f"fact #{recorded[0]} put it at turn {was['turn']} index {was['index']}")))
        else:
            report.add(Break(what="edited", where=where, seq=recorded[0], detail=(
                f"its {differ} differ from fact #{recorded[0]}")))

    seen_runs = set(tips)
    for row in source.all_runs():
        report.rows += 1
        rid = row[0]
        seen_runs.add(rid)
        if rid in suspect:
            continue
        compare(f"run {rid}", starts.pop(rid, None), run_body(row), "its start")
        compare(f"run {rid}", statuses.pop(rid, None), status_body(rid, row[3], row[11]),
                "its status")
    for row in source.all_calls():
        report.rows += 1
        if row[1] in suspect:
            continue
        compare(f"call {row[0]}", calls.pop(row[0], None), call_body(row), "this call")
    for row in source.all_pending():
        report.rows += 1
        if row[2] in suspect:
            continue
        compare(f"pending item {row[0]}", items.pop(row[0], None), pending_body(row),
                "this item")
    for name, last in (("run", starts), ("run", statuses), ("call", calls),
                       ("pending item", items)):
        for ref, (seq, _) in last.items():
            fact = source.fact(seq)
            if fact is not None and fact[1] in suspect:
                continue
            report.add(Break(what="deleted", where=f"{name} {ref}", seq=seq, detail=(
                f"fact #{seq} records it; the store no longer holds it")))
    report.runs = len(seen_runs)
    for rid in sorted(suspect):
        one = source.for_run(rid)
        streams = (_grouped(one.facts(), 1), _grouped(one.runs(), 0),
                   _grouped(one.calls(), 1), _grouped(one.pending(), 2))
        for _, (facts, runs, run_calls, pending) in _merge(*streams):
            rows = report.rows
            _check_run(rid, facts, runs, run_calls, pending, report, None)
            report.rows = rows  # counted in the scan already
    for found in linked.breaks:
        report.add(found)
    report.more += linked.more
    return heads


def _check_links(links: Iterable[tuple[int, str, str]], report: Report,
                 signatures: list[tuple[int, str, str, str, float]]) -> dict[int, str]:
    """The store-wide chain, in seq order; returns the links of the signed heads."""
    wanted = {s[0] for s in signatures}
    heads: dict[int, str] = {}
    prev_link, expected = ZERO, 1
    before_prev = ""
    head: tuple[int, str] | None = None
    for seq, f_hash, link in links:
        if seq in wanted:
            heads[seq] = link
        if seq != expected:
            if seq > expected:
                report.add(Break(what="deleted", where=f"fact #{seq}", seq=seq, detail=(
                    f"the store's facts #{expected}..#{seq - 1} are missing")))
            else:
                report.add(Break(what="inserted", where=f"fact #{seq}", seq=seq,
                                 detail="a second fact with this number"))
        elif link_hash(prev_link, f_hash) != link:
            if before_prev and link_hash(before_prev, f_hash) == link:
                report.add(Break(what="inserted", where=f"fact #{seq - 1}", seq=seq - 1,
                                 detail="it is not in the store-wide chain: the fact after "
                                        "it follows the one before it"))
            else:
                report.add(Break(what="edited", where=f"fact #{seq}", seq=seq, detail=(
                    "its link does not follow from the fact before it (the store-wide "
                    "chain was changed here)")))
        before_prev, prev_link, expected = prev_link, link, seq + 1
        head = (seq, link)
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
    then one `"type": "signature"` line per signature of a head in the export.
    """
    first = 1 if since <= 0 else reader.first_since(since)
    start = first if first is not None else (reader.head() or (0, ""))[0] + 1
    before = reader.previous_link(start) if start > 1 else ZERO
    yield json.dumps({
        "type": "header", "format": EXPORT_FORMAT, "version": VERSION, "from_seq": start,
        "link_before": before,
        "hash": "sha256(prev + body) as UTF-8, hex",
        "link": "sha256(link of the fact before + hash) as UTF-8, hex",
        "signature": f"Ed25519 over '{SIGNATURE_CONTEXT} <seq> <link>' as UTF-8",
    }, separators=(",", ":"))
    last = start - 1
    for seq, run, n, kind, ref, body, prev, digest, link, at in reader.facts_from(start):
        last = seq
        yield json.dumps({"type": "fact", "seq": seq, "run": run, "n": n, "kind": kind,
                          "ref": ref, "body": body, "prev": prev, "hash": digest,
                          "link": link, "at": at}, separators=(",", ":"))
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
