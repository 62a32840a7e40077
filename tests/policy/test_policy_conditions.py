"""Value conditions: `ask call "bank/transfer" when amount > 500`, decided on the arguments."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

import handrail as hr
from handrail.errors import PolicyError
from handrail.models import Scripted, calls, reply
from handrail.policy import Effect, Policy, Rule
from handrail.policy._conditions import Condition

pytestmark = pytest.mark.anyio

TRANSFER = hr.Action(hr.Act.CALL, "bank/transfer")


def _bank() -> Policy:
    return Policy().layer("app").ask(hr.Act.CALL, "bank/transfer", when="amount > 500") \
        .allow(hr.Act.CALL, "bank/transfer")


def test_a_condition_decides_on_the_argument_and_says_why() -> None:
    policy = _bank()
    big = policy.check(TRANSFER, arguments={"amount": 900})
    assert big.effect is Effect.ASK
    assert big.reason == ("rule ask call 'bank/transfer' when amount > 500 in layer 'app' "
                          "(amount 900 > 500)")
    small = policy.check(TRANSFER, arguments={"amount": 500})
    assert small.effect is Effect.ALLOW
    assert small.rule == Rule(hr.Act.CALL, "bank/transfer", Effect.ALLOW)
    assert "not met: rule ask call 'bank/transfer' when amount > 500" in small.reason
    assert "(amount 500 <= 500)" in small.reason
    assert policy.explain(TRANSFER, arguments={"amount": 501}).effect is Effect.ASK


def test_deny_first_is_unchanged_by_conditions() -> None:
    # An unconditional deny wins over a conditional allow; a conditional deny over any allow.
    policy = (Policy().layer("a").allow(hr.Act.CALL, "bank/transfer", when="amount < 10")
              .layer("b").deny(hr.Act.CALL, "bank/**"))
    assert policy.check(TRANSFER, arguments={"amount": 1}).effect is Effect.DENY
    policy = (Policy().layer("a").allow(hr.Act.CALL, "bank/**")
              .layer("b").deny(hr.Act.CALL, "bank/transfer", when="amount >= 10000"))
    v = policy.check(TRANSFER, arguments={"amount": 10000})
    assert v.effect is Effect.DENY and v.layer == "b"
    assert policy.check(TRANSFER, arguments={"amount": 9999}).effect is Effect.ALLOW
    # A matching conditional allow beats the default (a rule beats a default).
    policy = Policy().layer("a").allow(hr.Act.CALL, "bank/transfer", when="amount <= 100")
    assert policy.check(TRANSFER, arguments={"amount": 100}).effect is Effect.ALLOW
    assert policy.check(TRANSFER, arguments={"amount": 101}).effect is Effect.ASK  # default


def test_of_two_rules_of_one_effect_the_higher_one_is_named() -> None:
    policy = (Policy().layer("top").ask(hr.Act.CALL, "bank/transfer", when="amount > 5")
              .layer("low").ask(hr.Act.CALL, "bank/**"))
    assert policy.check(TRANSFER, arguments={"amount": 9}).layer == "top"
    policy = (Policy().layer("top").ask(hr.Act.CALL, "bank/**")
              .layer("low").ask(hr.Act.CALL, "bank/transfer", when="amount > 5"))
    assert policy.check(TRANSFER, arguments={"amount": 9}).layer == "top"


@pytest.mark.parametrize("arguments", [
    None, {}, {"amount": "lots"}, {"amount": None}, {"amount": [900]}, {"amount": float("nan")},
    {"amount": True}, {"amount": "9" * 100},
])
def test_an_undecidable_condition_errs_toward_the_stricter_verdict(arguments: Any) -> None:
    ask = Policy().layer("a").ask(hr.Act.CALL, "bank/transfer", when="amount > 500") \
        .allow(hr.Act.CALL, "bank/**")
    assert ask.check(TRANSFER, arguments=arguments).effect is Effect.ASK
    allow = Policy().layer("a").allow(hr.Act.CALL, "bank/transfer", when="amount < 500")
    assert allow.check(TRANSFER, arguments=arguments).effect is Effect.ASK  # the default


def test_numbers_compare_exactly_decimal_strings_included() -> None:
    policy = Policy().layer("a").deny(hr.Act.CALL, "bank/transfer", when="amount > 0.1") \
        .allow(hr.Act.CALL, "bank/**")
    assert policy.check(TRANSFER, arguments={"amount": "0.1"}).effect is Effect.ALLOW
    assert policy.check(TRANSFER, arguments={"amount": "0.10000000000000001"}).effect \
        is Effect.DENY
    assert policy.check(TRANSFER, arguments={"amount": 10**400}).effect is Effect.DENY
    assert policy.check(TRANSFER, arguments={"amount": -(10**400)}).effect is Effect.ALLOW
    v = policy.check(TRANSFER, arguments={"amount": 10**400})
    assert "more than 60 digits" in v.reason and len(v.reason) < 200


def test_strings_booleans_and_pointers() -> None:
    policy = (Policy().layer("a")
              .deny(hr.Act.CALL, "bank/transfer", when='/payee/country == "KP"')
              .ask(hr.Act.CALL, "bank/transfer", when=["urgent == true", "/to/0 != \"me\""])
              .allow(hr.Act.CALL, "bank/**"))
    check = policy.check
    assert check(TRANSFER, arguments={"payee": {"country": "KP"}}).effect is Effect.DENY
    assert check(TRANSFER, arguments={"payee": {"country": "FR"}, "urgent": False,
                                      "to": ["x"]}).effect is Effect.ALLOW
    assert check(TRANSFER, arguments={"payee": {"country": "FR"}, "urgent": True,
                                      "to": ["x"]}).effect is Effect.ASK
    assert check(TRANSFER, arguments={"payee": {"country": "FR"}, "urgent": True,
                                      "to": ["me"]}).effect is Effect.ALLOW
    escaped = Condition.parse("/a~1b/c~0d == 1")
    assert escaped.pointer == ("a/b", "c~d")
    assert escaped.holds({"a/b": {"c~d": 1}})[0] is True
    alone = Policy().layer("a").deny(hr.Act.CALL, "bank/transfer", when='/payee/country == "KP"')
    shown = alone.check(TRANSFER, arguments={"payee": {"country": "K\x1b[2J" + "x" * 99}})
    assert "\x1b" not in shown.reason and "..." in shown.reason


@pytest.mark.parametrize(("text", "message"), [
    ("amount", "cannot read the condition"),
    ("amount > ", "cannot read the condition"),
    ("amount > lots", "cannot read 'lots'"),
    ('currency > "EUR"', "compares numbers"),
    ("amount > 1e999", "out of range"),
    ("a~2 == 1", "'~' must be written"),
    ('x == "unclosed', "unclosed string"),
])
def test_a_malformed_condition_is_refused_saying_what_to_write(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy().layer("a").ask(hr.Act.CALL, "bank/transfer", when=text)


def test_a_condition_belongs_on_a_call_rule() -> None:
    with pytest.raises(PolicyError, match="goes on a call rule"):
        Rule(hr.Act.WRITE, "src/**", Effect.ASK, when="size > 5")


def test_the_toml_form_round_trips_and_enforces_alike() -> None:
    text = """
[[policy.layers]]
name = "app"
ask = [{ rule = "call:bank/transfer", when = "amount > 500" }]
allow = ["call:bank/transfer"]
"""
    policy = Policy.from_toml(text)
    assert policy == _bank()
    again = Policy.from_toml(policy.to_toml())
    assert again == policy
    assert again.check(TRANSFER, arguments={"amount": 900}).effect is Effect.ASK
    assert policy.to_dict()["layers"][0]["ask"] == [
        {"rule": "call:bank/transfer", "when": ["amount > 500"]}]
    assert Policy.from_dict(policy.to_dict()) == policy
    # A policy without conditions keeps its canonical form (and every digest hashing it).
    assert Policy.default().to_dict() == Policy.from_toml(Policy.default().to_toml()).to_dict()
    assert "when" not in Policy.default().to_toml()


def test_toml_errors_name_the_line_and_key() -> None:
    text = """[[policy.layers]]
name = "app"
ask = [{ rule = "call:bank/transfer", when = "amount >> 5" }]
"""
    with pytest.raises(PolicyError, match=r"<policy>:3: policy.layers\[0\].ask\[0\]: "):
        Policy.from_toml(text)
    with pytest.raises(PolicyError, match=r"unknown key 'whem'"):
        Policy.from_toml('[[policy.layers]]\nname = "a"\n'
                         'ask = [{ rule = "call:a/b", whem = "x > 1" }]\n')


def test_the_manifest_digest_covers_conditions() -> None:
    base = """
[agent]
name = "bank"

[[tools]]
ref = "bank/transfer"

[policy]
[[policy.layers]]
name = "app"
ask = [{ rule = "call:bank/transfer", when = "amount > LIMIT" }]
"""
    low = hr.Manifest.from_toml(base.replace("LIMIT", "500"))
    high = hr.Manifest.from_toml(base.replace("LIMIT", "5000"))
    assert low.digest != high.digest
    assert low.policy is not None
    assert low.policy.check(TRANSFER, arguments={"amount": 900}).effect is Effect.ASK
    assert hr.Manifest.from_toml(low.to_toml()).digest == low.digest


class Transfer(hr.Tool, server="bank", name="transfer"):
    """Move money."""

    target: str
    amount: Decimal = Field(gt=0)

    async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.json({"sent": str(self.amount)})


def test_a_condition_naming_an_argument_the_tool_lacks_is_refused() -> None:
    policy = Policy.default().layer("app").ask(hr.Act.CALL, "bank/transfer",
                                               when="amt > 500")
    with pytest.raises(PolicyError, match=r"reads the argument 'amt', but tool "
                                          r"'bank/transfer' has no such argument \(its "
                                          r"arguments: amount, target\)"):
        hr.Agent(Scripted([reply("x")]), [Transfer], policy=policy)
    # Rules covering no tool of the box, or naming a real argument, are fine.
    hr.Agent(Scripted([reply("x")]), [Transfer],
             policy=Policy.default().layer("app").ask(hr.Act.CALL, "bank/transfer",
                                                      when="amount > 500")
             .ask(hr.Act.CALL, "mail/send", when="size > 5"))


async def test_the_gate_asks_for_a_big_transfer_and_shows_the_approver_why(
        tmp_path: Path) -> None:
    seen: list[hr.Request] = []

    def person(request: hr.Request) -> hr.Decision:
        seen.append(request)
        return hr.Decision.deny("too much")

    policy = Policy.default().layer("app").allow(hr.Act.CALL, "bank/transfer") \
        .ask(hr.Act.CALL, "bank/transfer", when="amount > 500")
    agent = hr.Agent(Scripted([calls([
        ("bank/transfer", {"target": "a", "amount": "90.5"}),
        ("bank/transfer", {"target": "b", "amount": 900}),
    ]), reply("done")]), [Transfer], policy=policy, workspace=tmp_path)
    store = hr.Store.memory()
    await agent.run("pay", store=store, approver=hr.CallbackApprover(person))
    (request,) = seen
    assert request.arguments == {"target": "b", "amount": "900"}
    assert request.verdict_reason.endswith("(amount \"900\" > 500)")
    records = {c.call_id: c for c in await store.calls((await store.runs())[0].id)}
    first, second = sorted(records.values(), key=lambda c: c.index)
    assert first.status is hr.store.CallStatus.FINISHED and first.verdict is not None
    assert first.verdict["effect"] == "allow"
    assert second.status is hr.store.CallStatus.REFUSED and second.verdict is not None
    assert second.verdict["effect"] == "ask"
    assert "amount \"900\" > 500" in second.verdict["reason"]


# --- properties -------------------------------------------------------------------------

_OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_numbers = st.one_of(st.integers(-10**30, 10**30),
                     st.floats(allow_nan=False, allow_infinity=False, width=64))


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(sorted(_OPS)), limit=_numbers, value=_numbers,
       as_text=st.booleans())
def test_a_numeric_condition_agrees_with_exact_arithmetic(op: str, limit: int | float,
                                                          value: int | float,
                                                          as_text: bool) -> None:
    condition = Condition(("amount",), op, limit)
    given_value: Any = value
    if as_text:
        given_value = str(Decimal(value))
        if len(given_value) > 60 or "E" in given_value:
            return
    holds, why = condition.holds({"amount": given_value})
    assert holds is _OPS[op](Decimal(value), Decimal(limit))
    assert why.startswith("amount ")
    # Round trip through text: the same condition.
    assert Condition.parse(str(condition)) == condition


@settings(max_examples=200, deadline=None)
@given(effects=st.lists(st.tuples(st.sampled_from(list(Effect)), st.booleans(),
                                  st.integers(0, 10)), min_size=1, max_size=6),
       amount=st.integers(0, 10))
def test_conditions_keep_deny_first_whatever_the_order(
        effects: list[tuple[Effect, bool, int]], amount: int) -> None:
    # Each rule: (effect, conditional?, threshold): conditional rules match when
    # amount > threshold. The verdict is the strictest matching rule, else the default.
    policy = Policy().layer("l")
    matching = []
    for effect, conditional, threshold in effects:
        when = f"amount > {threshold}" if conditional else None
        policy = policy._add(hr.Act.CALL, "bank/transfer", effect, when)
        if not conditional or amount > threshold:
            matching.append(effect)
    verdict = policy.check(TRANSFER, arguments={"amount": amount})
    expected = max(matching, default=policy.default_for(hr.Act.CALL))
    assert verdict.effect is expected
    assert (verdict.rule is not None) == bool(matching)
    # An unknown amount never yields a looser verdict than a known one (the default, ask,
    # is stricter than any allow it falls back to).
    unknown = policy.check(TRANSFER, arguments={})
    assert unknown.effect >= verdict.effect


_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
              st.sampled_from(["900", "0.5", "-1e3", "1e999", "EUR", "NaN"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(sorted(_OPS)),
       literal=st.one_of(st.integers(-5, 5), st.sampled_from([0.5, "EUR", "900", True, False])),
       pointer=st.sampled_from([("amount",), ("a", "0"), ("a", "b")]), value=_values,
       wrap=st.booleans())
def test_the_fast_test_agrees_with_the_explained_one(op: str, literal: Any,
                                                    pointer: tuple[str, ...], value: Any,
                                                    wrap: bool) -> None:
    if (op in (">", ">=", "<", "<=") and not isinstance(literal, (int, float))) or \
            (isinstance(literal, bool) and op in (">", ">=", "<", "<=")):
        return
    condition = Condition(pointer, op, literal)
    arguments: Any = {pointer[0]: value} if wrap else value
    holds, why = condition.holds(arguments)
    assert condition.test(arguments) is holds
    assert condition.why(arguments) == (holds, why)  # the specialised explanation: the same
    assert len(why) < 200 and why.isprintable()


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(st.tuples(st.sampled_from(list(Effect)),
                                st.lists(st.tuples(st.sampled_from(["amount", "/a/0", "n"]),
                                                   st.sampled_from(sorted(_OPS)),
                                                   st.sampled_from([0, 5, 2.5, -1])),
                                         max_size=2)),
                      min_size=1, max_size=6),
       arguments=st.dictionaries(st.sampled_from(["amount", "a", "n"]), _values, max_size=3))
def test_the_compiled_scan_decides_as_the_rules_read_one_by_one(
        rules: list[tuple[Effect, list[tuple[str, str, int | float]]]],
        arguments: dict[str, Any]) -> None:
    _scan_decides_as_read_one_by_one(rules, arguments)


_plain = st.one_of(st.integers(-3, 8), st.sampled_from([2.5, -1.0, 5.0, 0.0, 2 ** 201]))


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(st.tuples(st.sampled_from(list(Effect)),
                                st.lists(st.tuples(st.sampled_from(["amount", "n"]),
                                                   st.sampled_from(sorted(_OPS)),
                                                   st.sampled_from([0, 5, 2.5, -1])),
                                         max_size=3)),
                      min_size=1, max_size=6),
       amount=_plain, n=_plain)
def test_the_compiled_scan_of_plain_numbers_decides_as_the_rules_read_one_by_one(
        rules: list[tuple[Effect, list[tuple[str, str, int | float]]]],
        amount: int | float, n: int | float) -> None:
    """Every condition on a top-level number, every value a number: the scan's plain path
    (beside rules without conditions, which decide the verdict the scan must beat)."""
    _scan_decides_as_read_one_by_one(rules, {"amount": amount, "n": n})


def _scan_decides_as_read_one_by_one(
        rules: list[tuple[Effect, list[tuple[str, str, int | float]]]],
        arguments: dict[str, Any]) -> None:
    from handrail.policy._policy import _explain, _matches

    policy = Policy().layer("l")
    built = []
    for effect, conditions in rules:
        when = [f"{p} {op} {v}" for p, op, v in conditions]
        policy = policy._add(hr.Act.CALL, "bank/transfer", effect, when or None)
        built.append(Rule(hr.Act.CALL, "bank/transfer", effect, when=when))
    matching = [r.effect for r in built if not r.when or _matches(r, arguments)]
    verdict = policy.check(TRANSFER, arguments=arguments)
    assert verdict.effect is max(matching, default=policy.default_for(hr.Act.CALL))
    if matching:
        first = next(r for r in built if (not r.when or _matches(r, arguments))
                     and r.effect is verdict.effect)
        assert verdict.rule == first
    # The explanation the compiled scan builds is the one `_explain` reads rule by rule.
    if verdict.rule is not None and verdict.rule.when:
        assert verdict.reason.endswith(f" ({_explain(verdict.rule, arguments)})")
    if "; not met: " in verdict.reason:
        unmet = verdict.reason.split("; not met: ", 1)[1]
        assert any(unmet.endswith(f" ({_explain(r, arguments)})") for r in built
                   if r.when and not _matches(r, arguments))
