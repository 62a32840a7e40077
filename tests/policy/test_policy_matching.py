"""Matching is linear-time, agrees with a naive reference, and targets are length-capped."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.policy import Effect, Layer, Policy, Rule
from handrail.policy._paths import PATH_MAX
from handrail.policy._patterns import (
    _SEP,
    Compiled,
    _Class,
    _Lit,
    _One,
    _Star,
    compile_pattern,
)
from handrail.policy._targets import CALL_MAX, EXEC_MAX, NET_MAX

R, W, X, N, C = hr.Act.READ, hr.Act.WRITE, hr.Act.EXEC, hr.Act.NET, hr.Act.CALL


def only(act: hr.Act, pattern: str) -> Policy:
    return Policy((Layer("l", (Rule(act, pattern, Effect.DENY),)),),
                  dict.fromkeys(["read", "write", "exec", "net", "call", "call_read_only"],
                                Effect.ALLOW))


def reference(c: Compiled) -> re.Pattern[str]:
    """The obvious backtracking translation (the implementation before the linear one)."""
    sep = _SEP[c.act]
    char_sep = None if c.act is hr.Act.EXEC else sep
    any_char = f"[^{re.escape(char_sep)}]" if char_sep else "."

    def cls(t: _Class) -> str:
        body = "".join(re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}"
                       for lo, hi in t.items)
        if t.negated:
            return f"[^{body}{re.escape(char_sep) if char_sep else ''}]"
        return f"(?:(?!{re.escape(char_sep)})[{body}])" if char_sep else f"[{body}]"

    def seg(tokens: tuple[object, ...]) -> str:
        out = []
        for t in tokens:
            if isinstance(t, _Lit):
                out.append(re.escape(t.text))
            elif isinstance(t, _Star):
                out.append(f"{any_char}*")
            elif isinstance(t, _One):
                out.append(any_char)
            else:
                assert isinstance(t, _Class)
                out.append(cls(t))
        return "".join(out)

    esep = re.escape(sep) if sep else ""
    out: list[str] = []
    segs = c.segments
    last = len(segs) - 1
    for i, s in enumerate(segs):
        if s is None:
            if i == last:
                out.append(".*" if i == 0 else f"(?:{esep}.*)?")
            else:
                out.append(f"(?:.*{esep})?" if i == 0 else f"{esep}(?:.*{esep})?")
        else:
            if i > 0 and segs[i - 1] is not None:
                out.append(esep)
            out.append(seg(s))
    if c.extends and segs[-1] is not None:
        out.append(f"(?:{esep}.*)?")
    return re.compile("".join(out), re.DOTALL)


def linear_matches(act: hr.Act, pattern: str, target: str) -> bool:
    """Through the real index, with the basename rule of path patterns applied."""
    from handrail.policy._patterns import Index, prepare

    c = compile_pattern(act, pattern)
    cand = target.rpartition("/")[2] if c.basename else target
    index = Index([(0, c)], folded=False, segmented=not c.basename)
    return index.first(prepare([cand], act, segmented=not c.basename)) == 0


def reference_matches(act: hr.Act, pattern: str, target: str) -> bool:
    c = compile_pattern(act, pattern)
    cand = target.rpartition("/")[2] if c.basename else target
    return reference(c).fullmatch(cand) is not None


# HR_MATCH_EXAMPLES=30000 for a deeper search (the default keeps the suite quick).
EXAMPLES = int(os.environ.get("HR_MATCH_EXAMPLES", "700"))

# Small alphabets make agreement interesting: many near-misses, many matches.
_PATH_ATOMS = ["a", "b", "ab", "*", "?", "[ab]", "[!a]", "/", "**"]
_PATH_CHARS = "ab/."


@st.composite
def path_pattern(draw: st.DrawFn) -> str:
    segs = draw(st.lists(
        st.one_of(st.just("**"),
                  st.lists(st.sampled_from(["a", "b", "ab", "*", "?", "[ab]", "[!a]"]),
                           min_size=1, max_size=5).map("".join)),
        min_size=1, max_size=5))
    return "/".join(segs)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(path_pattern(), st.text(alphabet="ab/", min_size=1, max_size=14))
def test_path_matcher_agrees_with_the_reference(pattern: str, target: str) -> None:
    try:
        compile_pattern(R, pattern)
    except hr.PolicyError:
        return
    if "//" in target or target.startswith("/") or target.endswith("/"):
        return  # never a canonical target
    assert linear_matches(R, pattern, target) == reference_matches(R, pattern, target)
    assert linear_matches(C, pattern, target) == reference_matches(C, pattern, target) \
        if "/" in pattern or pattern in ("*", "**") else True


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.one_of(st.just("**"),
                          st.lists(st.sampled_from(["a", "b", "ab", "*", "?", "[ab]", "[!a]"]),
                                   min_size=1, max_size=4).map("".join)),
                min_size=1, max_size=4).map(" ".join),
       st.lists(st.text(alphabet="ab /", min_size=1, max_size=4).filter(lambda w: " " not in w),
                min_size=1, max_size=5))
def test_exec_matcher_agrees_with_the_reference(pattern: str, argv: list[str]) -> None:
    try:
        compile_pattern(X, pattern)
    except hr.PolicyError:
        return
    joined = " ".join(argv)
    assert linear_matches(X, pattern, joined) == reference_matches(X, pattern, joined)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "ab", "*", "?", ".", "-"]), min_size=1,
                max_size=6).map("".join),
       st.text(alphabet="ab.-", min_size=1, max_size=12))
def test_net_matcher_agrees_with_the_reference(pattern: str, target: str) -> None:
    try:
        c = compile_pattern(N, pattern)
    except hr.PolicyError:
        return
    if len(c.segments[0] or ()) == 1 and isinstance((c.segments[0] or ())[0], _Lit):
        return  # a literal host is canonicalised first; compared elsewhere
    assert linear_matches(N, pattern, target) == reference_matches(N, pattern, target)


# -- time: nothing a model chooses makes matching slow ----------------------------------------

ADVERSARIAL = [
    "*credentials*.json", "*a*a*a*a*a*a*b", "*a*a*a*a*a*a*a*a*a*a*a*a*", "a*a*a*a*a*a*a*a?b",
    "*[a]*[a]*[a]*[a]*[a]*c", "**/*a*a*a*a*/**/*a*b", "**/a/**/a/**/a/**/a/**/b",
    "**/*a*/**/*a*/**/*a*/**/c", "?*?*?*?*?*?*?*b", "**/a*a*a*a*a*a*a*.json",
    "a/**/a/**/a/**/a/**/a/**/a/**/a/**/c", "*a*?*a*?*a*?*a*?*x",
]


def _adversarial_patterns() -> list[str]:
    out = list(ADVERSARIAL)
    for k in range(2, 40):
        out.append("*" + "a*" * k + "b")
        out.append("/".join(["**", "*" + "a*" * (k % 7 + 1)] * (k % 5 + 1)) + "/b")
    return out


def _adversarial_targets() -> list[str]:
    cap = PATH_MAX
    return [
        "a" * cap,
        ("a" * 60 + "/") * (cap // 61),
        "a/" * (cap // 2 - 1) + "a",
        ("credentials" * 372)[:cap],
    ]


@pytest.mark.parametrize("pattern", _adversarial_patterns())
def test_path_matching_time_is_bounded(tmp_path: Path, pattern: str) -> None:
    policy = only(R, pattern)
    for target in _adversarial_targets():
        start = time.perf_counter()
        # The matcher alone: canonicalisation of a 4 KB path is a separate, bounded cost.
        for act in (R, X):
            linear_matches(act, pattern.replace("/", " ") if act is X else pattern,
                           target.replace("/", " ") if act is X else target)
        elapsed = time.perf_counter() - start
        # A backtracking matcher took seconds to hours here; linear takes well under 10 ms.
        assert elapsed < 0.5, f"{pattern!r} took {elapsed:.2f}s on a {len(target)}-char target"
    assert policy.check(hr.Action(R, "x.json"), workspace=tmp_path).effect in tuple(Effect)


def test_net_matching_time_is_bounded() -> None:
    for pattern in ["*a*a*a*a*a*a*a*a*b", "?*?*?*?*?*?*b", "*-*-*-*-*-*-*.example"]:
        start = time.perf_counter()
        linear_matches(N, pattern, "a" * NET_MAX)
        linear_matches(N, pattern, "-" * NET_MAX)
        assert time.perf_counter() - start < 0.5


def test_the_issue_reproduction_is_refused_by_length_before_any_matching(tmp_path: Path) -> None:
    # 8 s before: '*credentials*.json' against a 300 KB path. Now refused by length at once
    # (the confinement layer, before any rule's pattern), and the longest accepted path is
    # matched in linear time. How long it takes is a figure (benchmarks/policy.py), not
    # asserted here (issue 35: no timed tests).
    policy = Policy.default().layer("x").deny(R, "*credentials*.json")
    v = policy.check(hr.Action(R, "credentials" * 30000), workspace=tmp_path)
    assert v.effect is Effect.DENY and v.layer == "confinement"
    assert "PATH_MAX" in v.reason


# -- caps ------------------------------------------------------------------------------------

def test_a_path_longer_than_path_max_is_refused_with_a_reason(tmp_path: Path) -> None:
    policy = Policy.permissive()
    ok = "a/" * 100 + "b"
    assert policy.check(hr.Action(R, ok), workspace=tmp_path).effect is Effect.ALLOW
    for target in ("a" * (PATH_MAX + 1), "é" * (PATH_MAX // 2 + 1)):
        v = policy.check(hr.Action(W, target), workspace=tmp_path)
        assert v.effect is Effect.DENY and v.layer == "confinement"
        assert "PATH_MAX" in v.reason


@pytest.mark.parametrize(("act", "target", "limit"), [
    (X, ("echo", "a" * EXEC_MAX), EXEC_MAX),
    (N, "a" * (NET_MAX + 1), NET_MAX),
    (C, "s/" + "a" * CALL_MAX, CALL_MAX),
])
def test_exec_net_call_targets_are_capped(
    tmp_path: Path, act: hr.Act, target: str | tuple[str, ...], limit: int
) -> None:
    v = Policy.permissive().check(hr.Action(act, target), workspace=tmp_path)
    assert v.effect is Effect.DENY and v.layer == "confinement"
    assert f"at most {limit}" in v.reason
    assert len(v.target) < 2 * limit + 100


# -- EXEC: '*' runs to the end of the command (issue 10 §3) ---------------------------------

def test_exec_star_covers_the_rest_of_the_argv(tmp_path: Path) -> None:
    policy = Policy.permissive().layer("x").deny(X, "git push*")
    for argv in [("git", "push", "origin", "main"), ("git", "push"), ("/usr/bin/git", "push", "-f"),
                 ("git", "pushy")]:
        assert policy.check(hr.Action(X, argv), workspace=tmp_path).effect is Effect.DENY, argv
    assert policy.check(hr.Action(X, ("git", "pull")), workspace=tmp_path).effect is Effect.ALLOW
    rm = Policy.permissive().layer("x").deny(X, "rm -rf *")
    assert rm.check(hr.Action(X, ("rm", "-rf", "a", "/b c")), workspace=tmp_path).effect \
        is Effect.DENY


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                        min_size=1, max_size=6), min_size=1, max_size=5),
       st.integers(min_value=1, max_value=40))
def test_exec_prefix_star_matches_every_extension(argv: list[str], cut: int) -> None:
    joined = " ".join(argv)
    prefix = joined[:cut]
    if prefix.startswith(" ") or "  " in prefix:
        return  # not a valid pattern (an empty word)
    escaped = re.sub(r"([*?\[\\])", r"\\\1", prefix)
    if prefix.endswith(" "):
        pattern = escaped + "*"
    else:
        pattern = escaped + "*"
    try:
        compile_pattern(X, pattern)
    except hr.PolicyError:
        return
    assert linear_matches(X, pattern, joined)


def test_a_thousand_adversarial_rules_against_the_longest_targets(tmp_path: Path) -> None:
    import random

    rng = random.Random(9)
    atoms = ["a", "*", "?", "[a]", "aa", "b"]
    patterns: set[str] = set()
    while len(patterns) < 1000:
        segs = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.3:
                segs.append("**")
            else:
                segs.append("".join(rng.choice(atoms) for _ in range(rng.randint(2, 9))))
        pattern = "/".join(segs)
        try:
            compile_pattern(R, pattern)
        except hr.PolicyError:
            continue
        patterns.add(pattern)
    layer = Layer("adversarial", tuple(Rule(R, p, Effect.DENY) for p in sorted(patterns)))
    policy = Policy((layer,), {"read": Effect.ALLOW})
    (tmp_path / "d").mkdir()
    targets = ["a" * 255, "d/" + "a" * 250 + "c",
               "/".join(["a" * 40] * 90)[:PATH_MAX], "/".join(["a"] * 1000) + "/c"]
    start = time.perf_counter()
    for target in targets:
        policy.check(hr.Action(R, target), workspace=tmp_path)
    elapsed = time.perf_counter() - start
    assert elapsed < 20, f"{elapsed:.1f}s for {len(targets)} checks against 1000 rules"
