r"""Rule patterns: parse and validate a glob for one act, and compile many into one index.

Syntax (the same for every act; what a *segment* is depends on the act):

- `*` matches any run of characters within one segment, `?` exactly one character of a
  segment, `[abc]` / `[a-z]` / `[!abc]` one character of a set (never the separator);
- `**` as a whole segment matches across segments, including none: `a/**/b` matches `a/b`
  and `a/x/y/b`; a trailing `/**` also matches the directory itself (`src/**` covers `src`);
- `\` makes the next character literal (`\*`, `\[`).

Segments: READ/WRITE and CALL targets are split on `/`, EXEC argv (joined with spaces) on ` `,
NET hosts are not split (`*` and `**` both match any run, `[` is literal so IPv6 reads
naturally). In EXEC, `*` and `?` are not held to a word: `git push*` means "and whatever
follows", as every user writes it; a whole-word `**` still also matches no words at all.

Matching is linear in the target's length for every pattern (see `_regex`), so a model that
chooses a long target cannot choose how long the policy works.

Anything that would silently never match is an error when the rule is built: an empty
pattern, `**` glued to other characters, an unclosed `[`, an empty segment (`a//b`, `src/`),
a `.` or `..` segment in a path pattern, a CALL pattern without `server/`.

Compilation (`Index`) keeps check time flat in the number of rules: exact patterns go to a
dict, `dir/**` patterns to a dict probed with each segment-prefix of the target, `*.ext` in
an unsegmented domain to per-length suffix dicts, and only the rest to regular expressions,
bucketed by their leading literal segments so a check runs only the few that could apply.
Every index answers with the smallest rule id that matches, so explanations are stable.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from handrail.errors import PolicyError
from handrail.tools import Act

__all__ = ["Compiled", "Index", "Prepared", "compile_pattern", "fold", "prepare"]

# Separator per act; None for NET, whose targets are not split into segments.
_SEP: dict[Act, str | None] = {
    Act.READ: "/",
    Act.WRITE: "/",
    Act.CALL: "/",
    Act.EXEC: " ",
    Act.NET: None,
}
_SEP_BY_VALUE: dict[str, str | None] = {act.value: sep for act, sep in _SEP.items()}


def fold(text: str) -> str:
    """The case-folded form deny and ask rules are matched in."""
    return text.lower() if text.isascii() else text.casefold()


@dataclass(frozen=True, slots=True)
class _Lit:
    text: str


@dataclass(frozen=True, slots=True)
class _Star:
    pass


@dataclass(frozen=True, slots=True)
class _One:
    pass


@dataclass(frozen=True, slots=True)
class _Class:
    negated: bool
    items: tuple[tuple[str, str], ...]
    """Inclusive (low, high) ranges; a single character is (c, c)."""


_Token = _Lit | _Star | _One | _Class
_Segment = tuple[_Token, ...] | None  # None is `**`


@dataclass(frozen=True, slots=True)
class Compiled:
    """One validated pattern, ready to be indexed."""

    act: Act
    """The act whose targets it matches."""
    segments: tuple[_Segment, ...]
    """Parsed segments; None stands for `**`."""
    basename: bool
    """A path pattern without `/`: matched against the last segment of the target."""
    extends: bool
    """Also matches any target that extends a match by more segments (CALL)."""
    has_negated_class: bool
    """Contains `[!...]`, which case folding cannot over-approximate (see Index)."""
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    """A NET rule naming a CIDR block (`10.0.0.0/8`): matched by address, not as a glob."""


def _parse_segment(seg: str, *, where: str, classes: bool) -> tuple[_Token, ...]:
    tokens: list[_Token] = []
    lit: list[str] = []

    def flush() -> None:
        if lit:
            tokens.append(_Lit("".join(lit)))
            lit.clear()

    i, n = 0, len(seg)
    while i < n:
        c = seg[i]
        if c == "*":
            if i + 1 < n and seg[i + 1] == "*":
                raise PolicyError(
                    f"{where}: '**' must be a whole segment (like 'a/**/b'); "
                    "use '*' within a segment"
                )
            flush()
            tokens.append(_Star())
        elif c == "?":
            flush()
            tokens.append(_One())
        elif c == "\\":
            if i + 1 >= n:
                raise PolicyError(f"{where}: a trailing '\\' escapes nothing")
            i += 1
            lit.append(seg[i])
        elif c == "[" and classes:
            flush()
            cls, i = _parse_class(seg, i, where=where)
            tokens.append(cls)
            continue
        else:
            lit.append(c)
        i += 1
    flush()
    return tuple(tokens)


def _parse_class(seg: str, start: int, *, where: str) -> tuple[_Class, int]:
    i = start + 1
    n = len(seg)
    negated = i < n and seg[i] in "!^"
    if negated:
        i += 1
    chars: list[str] = []
    first = True
    while i < n and (seg[i] != "]" or first):
        c = seg[i]
        if c == "\\":
            if i + 1 >= n:
                break
            i += 1
            c = seg[i]
        chars.append(c)
        first = False
        i += 1
    if i >= n:
        raise PolicyError(f"{where}: '[' at position {start} is never closed (write '\\[' for a "
                          "literal bracket)")
    items: list[tuple[str, str]] = []
    j = 0
    while j < len(chars):
        if j + 2 < len(chars) and chars[j + 1] == "-":
            lo, hi = chars[j], chars[j + 2]
            if lo > hi:
                raise PolicyError(f"{where}: the range '{lo}-{hi}' is reversed")
            items.append((lo, hi))
            j += 3
        else:
            items.append((chars[j], chars[j]))
            j += 1
    return _Class(negated, tuple(items)), i + 1


@functools.lru_cache(maxsize=65536)
def compile_pattern(act: Act, pattern: str) -> Compiled:
    """Parse and validate `pattern` for `act`.

    Raises:
        PolicyError: the pattern is malformed; the message says what and how to fix it.
    """
    where = f"pattern {pattern!r} for {act.value}"
    if not isinstance(pattern, str):
        raise PolicyError(f"a pattern must be a string, not {type(pattern).__name__}")
    if not pattern:
        raise PolicyError(f"an empty pattern for {act.value} would match nothing")
    if "\x00" in pattern:
        raise PolicyError(f"{where}: contains a NUL byte")
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise PolicyError(f"{where}: is not valid UTF-8 (lone surrogate)") from None
    sep = _SEP[act]
    basename = False
    extends = False
    if act is Act.NET:
        return _compile_net(pattern, where)
    assert sep is not None
    body = pattern
    if act in (Act.READ, Act.WRITE):
        if body == ".":
            return Compiled(act, ((_Lit("."),),), False, False, False)
        if body.startswith("/"):
            # Anchored at the workspace root, as in .gitignore: '/.env' is only the top one.
            body = body[1:]
            if not body:
                raise PolicyError(f"{where}: '/' alone names nothing; write '**' for everything")
        elif "/" not in body:
            basename = True
    elif act is Act.CALL:
        extends = True
        if "/" not in body and body not in ("*", "**"):
            raise PolicyError(
                f"{where}: a CALL pattern names 'server/name' (or more), so {pattern!r} "
                f"would match nothing — did you mean '*/{pattern}' or '{pattern}/*'?"
            )
    raw_segments = body.split(sep)
    segments: list[_Segment] = []
    for k, seg in enumerate(raw_segments):
        if not seg:
            what = "space" if sep == " " else "'/'"
            raise PolicyError(
                f"{where}: segment {k + 1} is empty (a doubled, leading or trailing {what}); "
                + ("write 'dir/**' for everything under a directory" if sep == "/" else
                   "separate argv words with exactly one space")
            )
        if act in (Act.READ, Act.WRITE) and seg in (".", ".."):
            raise PolicyError(
                f"{where}: a '{seg}' segment never matches — targets are canonical "
                "workspace-relative paths (no '.', no '..')"
            )
        if seg == "**":
            if segments and segments[-1] is None:
                continue  # '**/**' is '**'
            segments.append(None)
        else:
            segments.append(_parse_segment(seg, where=where, classes=True))
    if segments == [None]:
        basename = False
    elif act in (Act.READ, Act.WRITE) and len(segments) == 2 and segments[0] is None:
        # '**/name' is 'name' at any depth: file it with the basename patterns.
        basename = True
        segments = segments[1:]
    neg = any(isinstance(t, _Class) and t.negated for s in segments if s for t in s)
    return Compiled(act, tuple(segments), basename, extends, neg)


def _compile_net(pattern: str, where: str) -> Compiled:
    from handrail.policy._targets import NET_CLASSES, canonical_net
    from handrail.tools import UncanonicalTarget

    if not pattern.isascii():
        raise PolicyError(f"{where}: write the host in its ASCII form (IDNA, 'xn--...')")
    if "/" in pattern and not any(c.isspace() or c in "@*?" for c in pattern):
        try:
            network = ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            raise PolicyError(f"{where}: not a CIDR block like '10.0.0.0/8' or 'fc00::/7'; a "
                              "NET pattern is 'host', 'host:port' or a CIDR block") from None
        return Compiled(Act.NET, (), False, False, False, network)
    if any(c.isspace() or c in "/@" for c in pattern):
        raise PolicyError(f"{where}: a NET pattern is 'host' or 'host:port', nothing more")
    text = pattern.replace("**", "*")  # hosts have no segments: '**' and '*' are the same
    if not any(c in text for c in "*?\\"):
        keyword, colon, port = text.lower().partition(":")
        if keyword in NET_CLASSES:
            if colon and not (port.isascii() and port.isdigit() and int(port) <= 65535):
                raise PolicyError(f"{where}: the port {port!r} is not a number from 0 to 65535")
            return Compiled(Act.NET, ((_Lit(text.lower()),),), False, False, False)
        try:
            candidates = canonical_net(text)
        except UncanonicalTarget as exc:
            raise PolicyError(f"{where}: {exc}") from None
        text = candidates[0]
        if "loopback" in candidates:
            # A rule naming one spelling of this machine names them all (see canonical_net).
            text = next((c for c in candidates if c.startswith("loopback:")), "loopback")
        return Compiled(Act.NET, ((_Lit(text),),), False, False, False)
    tokens = _parse_segment(text.lower(), where=where, classes=False)
    return Compiled(Act.NET, (tokens,), False, False, False)


def _class_regex(cls: _Class, sep: str | None, *, folded: bool) -> str:
    body = "".join(
        re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in cls.items
    )
    if cls.negated:
        body = f"^{body}{re.escape(sep) if sep else ''}"
        out = f"[{body}]"
    else:
        # Dropping the separator from a positive set keeps '[/]' from crossing segments.
        out = f"(?:(?!{re.escape(sep)})[{body}])" if sep else f"[{body}]"
    return f"(?i:{out})" if folded else out


@dataclass(frozen=True, slots=True)
class _Gap:
    """`**` before more pattern: nothing, or any run ending with the separator."""


def _flat(c: Compiled) -> tuple[list[_Token | _Gap], bool]:
    """The pattern as one token stream over the whole target, and whether it ends open.

    Separators become literals; a middle or leading `**` is a `_Gap`; a trailing `**` (or a
    CALL pattern's implicit extension) is reported as the open end.
    """
    sep = _SEP[c.act] or ""
    toks: list[_Token | _Gap] = []
    segs = c.segments
    last = len(segs) - 1
    open_end = c.extends and segs[-1] is not None
    for i, seg in enumerate(segs):
        if seg is None:
            if i == last:
                open_end = True
            else:
                if i > 0:
                    toks.append(_Lit(sep))
                toks.append(_Gap())
        else:
            if i > 0 and segs[i - 1] is not None:
                toks.append(_Lit(sep))
            toks.extend(seg)
    return toks, open_end


def _regex(c: Compiled, *, folded: bool) -> str:
    """A regular expression matching the pattern in time linear in the target's length.

    A glob is fixed-length pieces separated by gaps that match "anything" of some kind. When
    every gap's set of possible ends only shrinks as its start moves right, placing each piece
    but the last at its leftmost possible position is always right (a later placement only
    leaves a subset of the choices open). So each gap-and-piece is an atomic group with a lazy
    gap: found once, never revisited, and backtracking never multiplies across gaps (which is
    what made `*a*b*` against a long target polynomial). The last piece is anchored at the
    end by `fullmatch`.

    Path-like targets (READ/WRITE/CALL) apply this twice: within a segment (pieces between
    `*`, which cannot leave the segment), and over segments (blocks of whole segments between
    `**`); each segment is an atomic group ending at a separator. EXEC and NET targets are
    not split for `*`, so their pattern is one sequence of pieces.
    """
    if c.act in (Act.EXEC, Act.NET):
        return _flat_regex(c, folded=folded)
    sep = _SEP[c.act]
    assert sep is not None
    esep = re.escape(sep)
    any_char = f"[^{esep}]"

    def piece(tokens: Sequence[_Token]) -> str:
        return _piece_regex(tokens, any_char, sep, folded=folded)

    def seg_regex(tokens: tuple[_Token, ...]) -> str:
        pieces: list[list[_Token]] = [[]]
        for t in tokens:
            if isinstance(t, _Star):
                pieces.append([])
            else:
                pieces[-1].append(t)
        if len(pieces) == 1:
            # Fixed length; the boundary keeps an atomic block from settling on a prefix.
            return f"{piece(pieces[0])}(?={esep}|\\Z)"
        middle = "".join(f"(?>{any_char}*?{piece(p)})" for p in pieces[1:-1])
        body = f"{piece(pieces[0])}{middle}{any_char}*{piece(pieces[-1])}"
        return f"(?>{body}(?={esep}|\\Z))"

    blocks: list[list[tuple[_Token, ...]]] = [[]]
    for seg in c.segments:
        if seg is None:
            blocks.append([])
        else:
            blocks[-1].append(seg)
    open_end = c.extends and c.segments[-1] is not None
    if len(blocks) > 1 and not blocks[-1]:
        open_end = True  # a trailing '**'
        blocks.pop()
    if blocks == [[]]:
        return ".*"

    def block_regex(block: list[tuple[_Token, ...]]) -> str:
        return esep.join(seg_regex(s) for s in block)

    out = [block_regex(blocks[0])]
    for j, block in enumerate(blocks[1:]):
        lead = esep if blocks[0] or j > 0 else ""
        if j == len(blocks) - 2 and not open_end:
            out.append(f"{lead}(?:.*{esep})?{block_regex(block)}")
        else:
            out.append(f"(?>{lead}(?:.*?{esep})??{block_regex(block)})")
    if open_end:
        out.append(f"(?:{esep}.*)?")
    return "".join(out)


def _piece_regex(
    tokens: Sequence[_Token | _Gap], any_char: str, sep: str | None, *, folded: bool
) -> str:
    parts: list[str] = []
    for t in tokens:
        if isinstance(t, _Lit):
            parts.append(re.escape(fold(t.text) if folded else t.text))
        elif isinstance(t, _One):
            parts.append(any_char)
        else:
            assert isinstance(t, _Class)
            parts.append(_class_regex(t, sep, folded=folded))
    return "".join(parts)


def _flat_regex(c: Compiled, *, folded: bool) -> str:
    """EXEC and NET: `*` and `?` cross words, a whole-word `**` is "any words, or none"."""
    sep = _SEP[c.act]
    esep = re.escape(sep) if sep else ""
    toks, open_end = _flat(c)
    if not toks and open_end:
        return ".*"
    # Split into piece0 (gaps piece)*. Adjacent gaps ('** *x') are one gap.
    pieces: list[list[_Token | _Gap]] = [[]]
    gaps: list[list[_Star | _Gap]] = []
    for t in toks:
        if isinstance(t, (_Star, _Gap)):
            if gaps and not pieces[-1]:
                gaps[-1].append(t)
            else:
                gaps.append([t])
                pieces.append([])
        else:
            pieces[-1].append(t)

    def gap_regex(gap: list[_Star | _Gap], *, lazy: bool) -> str:
        q = "?" if lazy else ""
        return "".join(f".*{q}" if isinstance(g, _Star) else f"(?:.*{q}{esep})?{q}"
                       for g in gap)

    end_guard = f"(?={esep}|\\Z)" if sep else ""
    out = [_piece_regex(pieces[0], ".", None, folded=folded)]
    for j, gap in enumerate(gaps):
        body = _piece_regex(pieces[j + 1], ".", None, folded=folded)
        if j == len(gaps) - 1 and not open_end:
            out.append(gap_regex(gap, lazy=False) + body)
        else:
            guard = end_guard if j == len(gaps) - 1 else ""
            out.append(f"(?>{gap_regex(gap, lazy=True)}{body}{guard})")
    if open_end:
        if not gaps:
            out.append(end_guard)
        out.append(f"(?:{esep}.*)?")
    return "".join(out)


def _literal(seg: _Segment) -> str | None:
    if seg is None:
        return None
    if len(seg) == 1 and isinstance(seg[0], _Lit):
        return seg[0].text
    if not seg:
        return ""
    return None


@dataclass(slots=True)
class _Bucket:
    """Rules sharing a literal head, matched by one alternation of their expressions.

    The alternation is built and compiled when a target first reaches the bucket, not when
    the policy is compiled: Python's `re` compiler costs ~1 ms a pattern here, so a policy
    of 10,000 rules spent ~1.5 s compiling buckets most checks never reach.
    """

    patterns: list[Compiled]
    ids: list[int]
    folded: bool
    regex: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        regex = self.regex
        if regex is None:
            # Two threads may both compile it; either result is the same expression.
            alternation = "|".join(f"({_regex(c, folded=self.folded)})" for c in self.patterns)
            regex = self.regex = re.compile(alternation, re.DOTALL)
        return regex


class Index:
    """Many patterns of one act (and one effect), answering "which rule matches first?".

    Built once per policy; `first` costs a handful of dict probes plus the few regular
    expressions whose literal prefix the target shares, whatever the number of rules.
    """

    __slots__ = ("_anywhere", "_exact", "_folded", "_heads", "_prefix", "_suffix", "_wild")

    def __init__(
        self, entries: Iterable[tuple[int, Compiled]], *, folded: bool, segmented: bool
    ) -> None:
        """Index `entries` (rule id, pattern).

        Args:
            entries: the patterns, each with the id `first` reports.
            folded: match in case-folded form (targets must be passed folded).
            segmented: targets are split on the act's separator (False for a basename or a
                host), enabling the segment-prefix buckets.
        """
        self._folded = folded
        self._exact: dict[str, int] = {}
        self._prefix: dict[str, int] = {}
        self._suffix: dict[int, dict[str, int]] = {}
        buckets: dict[str, _Bucket] = {}
        sep: str | None = None
        for rid, c in sorted(entries, key=lambda e: e[0]):
            sep = _SEP[c.act]
            key = self._place(rid, c, sep if segmented else None)
            if key is None:
                continue
            bucket = buckets.setdefault(key, _Bucket([], [], folded))
            bucket.patterns.append(c)
            bucket.ids.append(rid)
        self._wild = buckets.pop("", None)
        # NUL never occurs in a canonical target, so it safely tags the "anywhere" keys.
        self._anywhere = {k[1:]: b for k, b in buckets.items() if k.startswith("\x00")}
        heads: dict[str, tuple[int | None, _Bucket | None]] = {
            k: (None, b) for k, b in buckets.items() if not k.startswith("\x00")
        }
        for k, rid in self._prefix.items():
            heads[k] = (rid, heads.get(k, (None, None))[1])
        self._heads = heads

    def _key(self, text: str) -> str:
        return fold(text) if self._folded else text

    def _place(self, rid: int, c: Compiled, sep: str | None) -> str | None:
        """File `c` under a fast structure; return its regex bucket key, or None if placed."""
        segs = c.segments
        lits = [_literal(s) for s in segs]
        if all(x is not None for x in lits):
            # Several segments only occur in a segmented domain; join with the act's separator.
            text = (_SEP[c.act] or "").join(x for x in lits if x is not None)
            target = self._prefix if c.extends else self._exact
            target.setdefault(self._key(text), rid)
            return None
        if (
            sep is not None
            and len(segs) >= 2
            and segs[-1] is None
            and all(x is not None for x in lits[:-1])
        ):
            text = sep.join(x for x in lits[:-1] if x is not None)
            self._prefix.setdefault(self._key(text), rid)
            return None
        if sep is None and len(segs) == 1 and segs[0] is not None:
            toks = segs[0]
            if len(toks) == 2 and isinstance(toks[0], _Star) and isinstance(toks[1], _Lit):
                suffix = self._key(toks[1].text)
                self._suffix.setdefault(len(suffix), {}).setdefault(suffix, rid)
                return None
        if sep is None:
            return ""
        if segs[0] is None and len(segs) >= 2 and lits[1] is not None:
            # '**/node_modules/**': any candidate with that segment somewhere may match.
            return "\x00" + self._key(lits[1])
        lead: list[str] = []
        for x in lits:
            if x is None:
                break
            lead.append(x)
        # The last segment never serves as a bucket key on its own when it is the whole
        # pattern: that case was an exact literal above.
        return self._key(sep.join(lead)) if lead else ""

    def first(self, candidates: Sequence[Prepared]) -> int | None:
        """The smallest rule id matching any of `candidates` (see `prepare`)."""
        best: int | None = None
        exact, suffix, heads, anywhere, wild = (
            self._exact, self._suffix, self._heads, self._anywhere, self._wild,
        )
        for cand, cand_heads, parts in candidates:
            hit = exact.get(cand)
            if hit is not None and (best is None or hit < best):
                best = hit
            if suffix:
                n = len(cand)
                for length, table in suffix.items():
                    if length <= n:
                        hit = table.get(cand[n - length:])
                        if hit is not None and (best is None or hit < best):
                            best = hit
            if heads:
                for head in cand_heads:
                    entry = heads.get(head)
                    if entry is not None:
                        hit, bucket = entry
                        if bucket is not None:
                            found = _run(bucket, cand)
                            if found is not None and (hit is None or found < hit):
                                hit = found
                        if hit is not None and (best is None or hit < best):
                            best = hit
            if anywhere:
                for part in parts:
                    bucket = anywhere.get(part)
                    if bucket is not None:
                        hit = _run(bucket, cand)
                        if hit is not None and (best is None or hit < best):
                            best = hit
            if wild is not None:
                hit = _run(wild, cand)
                if hit is not None and (best is None or hit < best):
                    best = hit
        return best


Prepared = tuple[str, tuple[str, ...], frozenset[str]]
"""A candidate with its segment-prefixes and its set of segments, computed once per check."""


def prepare(candidates: Iterable[str], act: Act, *, segmented: bool) -> tuple[Prepared, ...]:
    """Split each candidate once, for every index of the act to probe."""
    if not candidates:
        return ()
    # Keyed by the act's string: an Enum's __hash__ runs in Python, on every check.
    sep = _SEP_BY_VALUE[act._value_] if segmented else None
    out: list[Prepared] = []
    for cand in candidates:
        if sep is None:
            out.append((cand, (cand,), frozenset()))
            continue
        parts = cand.split(sep)
        heads: list[str] = []
        at = -1
        for part in parts:
            at += len(part) + 1
            heads.append(cand[:at])
        out.append((cand, tuple(heads), frozenset(parts)))
    return tuple(out)


def _run(bucket: _Bucket, text: str) -> int | None:
    m = (bucket.regex or bucket.compiled()).fullmatch(text)
    if m is None:
        return None
    index = m.lastindex
    assert index is not None
    return bucket.ids[index - 1]
