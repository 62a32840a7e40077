"""Rules, patterns and evaluation: deny-first, explanations, defaults, merge and contain."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.errors import PolicyError, UserError
from handrail.policy import Effect, Layer, Policy, Rule, Verdict

R, W, X, N, C = hr.Act.READ, hr.Act.WRITE, hr.Act.EXEC, hr.Act.NET, hr.Act.CALL


def verdict(policy: Policy, act: hr.Act, target: str | tuple[str, ...], ws: Path,
            mutates: bool = True) -> Verdict:
    return policy.check(hr.Action(act, target), workspace=ws, mutates=mutates)


def only(act: hr.Act, pattern: str, effect: Effect = Effect.DENY) -> Policy:
    return Policy((Layer("l", (Rule(act, pattern, effect),)),),
                  dict.fromkeys(["read", "write", "exec", "net", "call", "call_read_only"],
                                Effect.ALLOW))


def matches(act: hr.Act, pattern: str, target: str | tuple[str, ...], ws: Path) -> bool:
    return verdict(only(act, pattern), act, target, ws).effect is Effect.DENY


# -- effects -------------------------------------------------------------------------------

def test_effects_are_ordered() -> None:
    assert Effect.ALLOW < Effect.ASK < Effect.DENY
    assert max([Effect.ASK, Effect.DENY, Effect.ALLOW]) is Effect.DENY
    assert Effect.parse("ask") is Effect.ASK
    with pytest.raises(PolicyError, match="unknown effect"):
        Effect.parse("maybe")


# -- patterns ------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "target", "expected"), [
    ("*.py", "a.py", True),
    ("*.py", "src/deep/a.py", True),  # no '/': basename at any depth
    (".env", "a/b/.env", True),
    (".env", "a/b/.env.local", False),
    (".env.*", "a/.env.local", True),
    ("src/*.py", "src/a.py", True),
    ("src/*.py", "src/x/a.py", False),  # '*' stays in one segment
    ("src/**", "src/x/y/a.py", True),
    ("src/**", "src", True),  # the directory itself
    ("src/**", "srcx/a", False),
    ("src/**/a.py", "src/a.py", True),
    ("src/**/a.py", "src/x/y/a.py", True),
    ("**/a.py", "x/y/a.py", True),
    ("**/cache/*", "a/b/cache/f", True),
    ("**/cache/*", "a/b/cache/f/g", False),
    ("**/.git/config", "sub/.git/config", True),
    ("/top.txt", "top.txt", True),
    ("/top.txt", "a/top.txt", False),  # leading '/' anchors at the root
    ("a?.txt", "ab.txt", True),
    ("a?.txt", "a/.txt", False),
    ("[ab].txt", "b.txt", True),
    ("[!ab].txt", "c.txt", True),
    ("[!ab].txt", "a.txt", False),
    ("[a-c]x", "bx", True),
    (r"\*.txt", "*.txt", True),
    (r"\*.txt", "a.txt", False),
    ("**", "anything/at/all", True),
    ("*", "deep/file", True),
    (".", ".", True),
    ("café.txt", "café.txt", True),
])
def test_path_patterns(tmp_path: Path, pattern: str, target: str, expected: bool) -> None:
    assert matches(R, pattern, target, tmp_path) is expected


@pytest.mark.parametrize(("pattern", "argv", "expected"), [
    ("git", ("git", "status"), True),  # the program name
    ("git", ("/usr/bin/git", "push"), True),  # its basename, wherever it lives
    ("/opt/elsewhere/git", ("git", "push"), False),  # an absolute program pins it
    ("/usr/bin/git", ("/usr/bin/git",), True),
    ("git status", ("git", "status"), True),
    ("git status", ("git", "status", "-s"), False),
    ("git *", ("git", "push"), True),
    ("git *", ("git", "push", "origin"), True),  # EXEC: "*" runs across words
    ("git **", ("git", "push", "origin", "main"), True),
    ("git **", ("git",), True),
    ("rm -rf **", ("/bin/rm", "-rf", "/"), True),
    ("** --force **", ("git", "push", "--force", "x"), True),
    ("git add src/*", ("git", "add", "src/a.py"), True),
])
def test_exec_patterns(tmp_path: Path, pattern: str, argv: tuple[str, ...], expected: bool) -> None:
    assert matches(X, pattern, argv, tmp_path) is expected


@pytest.mark.parametrize(("pattern", "target", "expected"), [
    ("example.com", "example.com:443", True),  # host alone
    ("example.com:443", "example.com:443", True),
    ("example.com:443", "example.com:80", False),
    ("*.example.com", "a.b.example.com", True),
    ("*.example.com", "example.com", False),
    ("*.example.com", "evilexample.com", False),
    ("example.com", "EXAMPLE.COM.", True),  # case and trailing dot
    ("127.0.0.1", "127.1", True),  # resolver spellings of the same address
    ("127.0.0.1", "0x7f000001", True),
    ("127.0.0.1", "2130706433:22", True),
    ("10.0.0.1", "::ffff:10.0.0.1", True),
    ("[::1]:443", "[0:0::1]:443", True),
    ("::1", "[::1]:8080", True),
    ("*:443", "x.org:443", True),
    ("bücher.de", "xn--bcher-kva.de", False),  # never reached: refused at build time
])
def test_net_patterns(tmp_path: Path, pattern: str, target: str, expected: bool) -> None:
    if not pattern.isascii():
        with pytest.raises(PolicyError, match="ASCII"):
            Rule(N, pattern, Effect.DENY)
        assert matches(N, "xn--bcher-kva.de", "BÜCHER.de", tmp_path)
        return
    assert matches(N, pattern, target, tmp_path) is expected


@pytest.mark.parametrize(("pattern", "target", "expected"), [
    ("ledger/transfer", "ledger/transfer", True),
    ("ledger/transfer", "ledger/transfer/acct-42", True),  # a tool rule covers its details
    ("ledger/transfer", "ledger/transfers", False),
    ("ledger/*", "ledger/transfer/acct-42", True),
    ("ledger/transfer/*", "ledger/transfer", False),
    ("*/transfer", "bank/transfer", True),
    ("**", "a/b", True),
])
def test_call_patterns(tmp_path: Path, pattern: str, target: str, expected: bool) -> None:
    assert matches(C, pattern, target, tmp_path) is expected


@pytest.mark.parametrize(("act", "pattern", "message"), [
    (R, "", "empty pattern"),
    (R, "a**", "whole segment"),
    (R, "a/***/b", "whole segment"),
    (R, "src/", "empty"),
    (R, "a//b", "empty"),
    (R, "../x", "'..' segment"),
    (R, "a/./b", "'.' segment"),
    (R, "[abc", "never closed"),
    (R, "[z-a]", "reversed"),
    (R, "x\\", "trailing"),
    (R, "/", "names nothing"),
    (R, "a\x00", "NUL"),
    (R, "a\udc80", "UTF-8"),
    (C, "transfer", "server/name"),
    (X, "git  status", "empty"),
    (X, " git", "empty"),
    (N, "http://example.com", "host"),
    (N, "exa mple.com", "host"),
    (N, "256.1.1.1.1.1:99999", "port"),
])
def test_malformed_patterns_fail_when_built(act: hr.Act, pattern: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Rule(act, pattern, Effect.DENY)


def test_rule_validates_act_and_effect() -> None:
    assert Rule("write", "src/**", "allow") == Rule(W, "src/**", Effect.ALLOW)
    with pytest.raises(PolicyError, match="unknown act 'wirte'"):
        Rule("wirte", "x", "allow")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="unknown effect"):
        Rule(W, "x", "permit")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="no act"):
        Rule.parse("src/**", Effect.ALLOW)
    assert Rule.parse("net:host:443", "allow") == Rule(N, "host:443", Effect.ALLOW)


# -- evaluation ----------------------------------------------------------------------------

def test_deny_first_across_all_layers_whatever_the_order(tmp_path: Path) -> None:
    specific_allow = Policy().layer("top").allow(W, "src/secrets/key.txt")
    broad_deny = Policy().layer("bottom").deny(W, "src/**")
    for policy in (specific_allow.merge(broad_deny), broad_deny.merge(specific_allow)):
        v = verdict(policy, W, "src/secrets/key.txt", tmp_path)
        assert v.effect is Effect.DENY
        assert v.layer == "bottom" and v.rule == Rule(W, "src/**", Effect.DENY)
        assert v.reason == "rule deny write 'src/**' in layer 'bottom'"


def test_ask_beats_allow_and_allow_beats_default(tmp_path: Path) -> None:
    policy = (Policy().layer("a").allow(W, "src/**").layer("b").ask(W, "src/*.cfg"))
    assert verdict(policy, W, "src/x.cfg", tmp_path).effect is Effect.ASK
    assert verdict(policy, W, "src/x.py", tmp_path).effect is Effect.ALLOW
    v = verdict(policy, W, "other.py", tmp_path)
    assert (v.effect, v.rule, v.layer, v.reason) == (Effect.ASK, None, None, "default for write")


def test_the_first_matching_rule_explains(tmp_path: Path) -> None:
    policy = (Policy().layer("one").deny(R, "*.key").layer("two").deny(R, "secret/**")
              .deny(R, "secret/a.key"))
    assert verdict(policy, R, "secret/a.key", tmp_path).layer == "one"
    swapped = Policy().layer("two").deny(R, "secret/**").merge(
        Policy().layer("one").deny(R, "*.key"))
    assert verdict(swapped, R, "secret/a.key", tmp_path).rule == Rule(R, "secret/**", "deny")


def test_deny_and_ask_ignore_letter_case_but_allow_does_not(tmp_path: Path) -> None:
    policy = Policy.default().layer("app").allow(R, "docs/**").ask(W, "Makefile")
    assert verdict(policy, R, "a/.ENV", tmp_path).effect is Effect.DENY
    assert verdict(policy, R, "KEYS/ID_RSA", tmp_path).effect is Effect.DENY
    assert verdict(policy, W, "makefile", tmp_path).effect is Effect.ASK
    strict = Policy().with_defaults(read="deny").layer("a").allow(R, "docs/**")
    assert verdict(strict, R, "DOCS/x", tmp_path).effect is Effect.DENY
    assert verdict(strict, R, "docs/x", tmp_path).effect is Effect.ALLOW


def test_deny_matches_any_unicode_normalisation(tmp_path: Path) -> None:
    nfc, nfd = "caf\u00e9.txt", "cafe\u0301.txt"
    for pattern, target in ((nfc, nfd), (nfd, nfc), (nfc.upper(), nfd)):
        assert matches(R, pattern, target, tmp_path), (pattern, target)
    # A negated class cannot be over-approximated by folding: the exact pass still denies.
    assert matches(R, "[!a].txt", "A.txt", tmp_path)


def test_default_policy(tmp_path: Path) -> None:
    policy = Policy.default()
    assert verdict(policy, R, "src/x.py", tmp_path).effect is Effect.ALLOW
    assert verdict(policy, W, "src/x.py", tmp_path).effect is Effect.ASK
    assert verdict(policy, X, ("ls",), tmp_path).effect is Effect.ASK
    assert verdict(policy, N, "example.com:443", tmp_path).effect is Effect.DENY
    assert verdict(policy, C, "ledger/read", tmp_path, mutates=False).effect is Effect.ALLOW
    v = verdict(policy, C, "ledger/pay", tmp_path)
    assert (v.effect, v.rule, v.layer) == (Effect.ASK, None, None)
    for secret in (".env", "a/.env.prod", "k/server.pem", "x.key", "id_rsa", "h/id_ed25519",
                   ".netrc", ".git/config", "vendor/lib/.git/config"):
        for act in (R, W):
            v = verdict(policy, act, secret, tmp_path)
            assert (v.effect, v.layer) == (Effect.DENY, "secrets"), secret
    assert verdict(policy, R, ".git/HEAD", tmp_path).effect is Effect.ALLOW


def test_permissive_allows_and_says_so(tmp_path: Path) -> None:
    policy = Policy.permissive()
    for act, target in ((R, ".env"), (W, "x"), (X, ("rm", "-rf", "x")), (N, "x.org:1"),
                        (C, "a/b")):
        v = verdict(policy, act, target, tmp_path)
        assert v.effect is Effect.ALLOW
        assert v.layer is not None and "tests only" in v.layer


def test_check_and_explain_are_one_function() -> None:
    assert Policy.check is Policy.explain


def test_every_verdict_names_what_decided_it(tmp_path: Path) -> None:
    # `explain` is `check` (above), so the explanation is whatever each verdict carries:
    # the deciding rule, its layer, the canonical target and a reason naming both.
    policy = Policy.default().layer("x").allow(C, "a/*").deny(C, "a/b")
    denied = policy.explain(hr.Action(C, "a/b"))
    assert (denied.effect, denied.rule, denied.layer, denied.target) == (
        Effect.DENY, Rule(C, "a/b", Effect.DENY), "x", "a/b")
    assert "a/b" in denied.reason and "'x'" in denied.reason
    allowed = policy.explain(hr.Action(C, "a/c"))
    assert (allowed.effect, allowed.rule, allowed.layer) == (
        Effect.ALLOW, Rule(C, "a/*", Effect.ALLOW), "x")
    assert "a/*" in allowed.reason
    fallback = policy.explain(hr.Action(C, "z/z"), mutates=False)
    assert (fallback.effect, fallback.rule, fallback.layer) == (Effect.ALLOW, None, None)
    assert fallback.reason == "default for call (the tool declares mutates=False)"
    outside = policy.explain(hr.Action(R, "../x"), workspace=tmp_path)
    assert (outside.effect, outside.rule, outside.layer) == (Effect.DENY, None, "confinement")
    assert "outside the workspace" in outside.reason


def test_check_all_is_the_strictest_first(tmp_path: Path) -> None:
    policy = Policy().layer("a").allow(W, "src/**").ask(W, "src/*.cfg").deny(W, "src/*.key")
    acts = [hr.Action(W, "src/a.py"), hr.Action(W, "src/b.cfg"), hr.Action(W, "src/c.cfg")]
    assert policy.check_all(acts, workspace=tmp_path).target == "src/b.cfg"
    acts.append(hr.Action(W, "src/d.key"))
    assert policy.check_all(acts, workspace=tmp_path).effect is Effect.DENY
    with pytest.raises(UserError):
        policy.check_all([], workspace=tmp_path)


def test_uncanonical_non_path_targets_are_denied(tmp_path: Path) -> None:
    policy = Policy.permissive()
    for act, target in ((X, ()), (X, ("",)), (X, ("ls", "a\x00")), (N, "http://x.org/"),
                        (N, "host:99999"), (N, ""), (C, ""), (C, "a/\x00")):
        v = verdict(policy, act, target, tmp_path)
        assert (v.effect, v.layer) == (Effect.DENY, "confinement"), (act, target)


def test_verdict_round_trips() -> None:
    v = Policy.default().check(hr.Action(R, ".env"))
    assert Verdict.from_dict(v.to_dict()) == v
    with pytest.raises(Exception):  # noqa: B017 - frozen
        v.effect = Effect.ALLOW  # type: ignore[misc]


# -- builder, merge, contain ----------------------------------------------------------------

def test_builder_returns_new_policies() -> None:
    base = Policy.default()
    built = base.layer("app").allow(W, "src/**")
    assert len(base.layers) == 1 and len(built.layers) == 2
    assert built.layer("app").deny(W, "x").layers[1].rules[0] == Rule(W, "x", "deny")
    with pytest.raises(PolicyError, match=r"\.layer\(name\)"):
        Policy.default().allow(W, "src/**")
    with pytest.raises(PolicyError, match="reserved"):
        Policy().layer("confinement")


def test_merge_takes_stricter_defaults() -> None:
    a = Policy().with_defaults(net="allow", write="deny").layer("a").allow(R, "x")
    b = Policy().with_defaults(net="ask", write="allow").layer("b").deny(R, "y")
    m = a.merge(b)
    assert [layer.name for layer in m.layers] == ["a", "b"]
    assert m.defaults["net"] is Effect.ASK and m.defaults["write"] is Effect.DENY


def test_contain_never_gains_an_allow(tmp_path: Path) -> None:
    root = Policy.default().layer("root").allow(W, "src/**")
    child = (Policy().with_defaults(net="allow", write="allow").layer("child")
             .allow(W, "**").allow(N, "*").deny(W, "src/gen/**").ask(R, "*.md"))
    contained = root.contain(child)
    assert verdict(contained, W, "docs/x", tmp_path).effect is Effect.ASK
    assert verdict(contained, N, "x.org", tmp_path).effect is Effect.DENY
    assert verdict(contained, W, "src/gen/a", tmp_path).effect is Effect.DENY
    assert verdict(contained, R, "a.md", tmp_path).effect is Effect.ASK
    assert verdict(contained, W, "src/a", tmp_path).effect is Effect.ALLOW


@settings(max_examples=100, deadline=None)
@given(rules=st.lists(st.tuples(st.sampled_from([R, W]), st.sampled_from(
    ["**", "src/**", "*.py", "a", "src/a.py", ".env"]), st.sampled_from(list(Effect))),
    max_size=6), child_default=st.sampled_from(list(Effect)))
def test_contain_property(rules: list[tuple[hr.Act, str, Effect]],
                          child_default: Effect) -> None:
    root = Policy.default().layer("r").allow(W, "src/*.py")
    child = Policy(
        (Layer("c", tuple(Rule(a, p, e) for a, p, e in rules)),),
        dict.fromkeys(["read", "write"], child_default),
    )
    contained = root.contain(child)
    for target in ("src/a.py", "a", ".env", "src/b/c.txt", "x.py"):
        for act in (R, W):
            before = root.check(hr.Action(act, target)).effect
            after = contained.check(hr.Action(act, target)).effect
            assert after >= before, (act, target)


def test_remembered_layer_never_beats_a_deny(tmp_path: Path) -> None:
    policy = Policy.default()
    run = policy.with_layer_on_top("remembered", [Rule(R, "**", Effect.ALLOW)])
    assert run.layers[0].name == "remembered"
    assert verdict(run, R, ".env", tmp_path).effect is Effect.DENY
    assert verdict(run, R, "x", tmp_path).layer == "remembered"


def test_many_rules_compile_and_choose_the_first(tmp_path: Path) -> None:
    layers = [Layer(f"l{i}", (Rule(W, f"src/m{i}/**", Effect.DENY),
                              Rule(W, f"*.e{i}", Effect.ASK),
                              Rule(W, f"**/c{i}/*.txt", Effect.DENY))) for i in range(300)]
    policy = Policy(tuple(layers))
    assert verdict(policy, W, "src/m7/x/y", tmp_path).layer == "l7"
    assert verdict(policy, W, "a/b.e299", tmp_path).layer == "l299"
    assert verdict(policy, W, "q/c42/a.txt", tmp_path).layer == "l42"
    assert verdict(policy, W, "src/m3/c1/a.txt", tmp_path).layer == "l1"
    assert verdict(policy, W, "src/m3x", tmp_path).rule is None
