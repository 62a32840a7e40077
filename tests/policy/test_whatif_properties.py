"""Properties of `replay` and `suggest_from` over random records and random policies (issue 39).

A record is made the way the gate makes one: each call's verdict is the recorded policy's
`check` of its action, and an ask is approved or denied at random. Then:

- replaying it against any proposed policy reports exactly the calls whose effect that
  policy's `check` changes;
- the suggested policy allows every action the record let through, and lets through nothing
  the record refused (by a rule or a person) and never let through.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handrail as hr
from handrail.store import CallRecord, CallStatus, RunRecord

WS = os.path.realpath(tempfile.gettempdir())
"""A workspace root: the paths below need not exist (nothing is a link)."""

PATHS = ("x.py", "y.md", ".env", "a/x.py", "a/y.md", "a/z.py", "a/w.py", "a/b/x.py",
         "a/b/q.txt", "c/x.py", "c/y.md", "c/z.md")
NETS = ("h1.example:443", "h2.example", "10.0.0.1:80", "api.example.com:443")
CALLS = ("s/t", "s/u", "m/v", "s/t/deep")
PATTERNS = {
    hr.Act.READ: ("a/**", "a/*", "*.py", "/x.py", "c/**", "**", "a/b/**", "*.md"),
    hr.Act.WRITE: ("a/**", "a/*", "*.py", "/x.py", "c/**", "**", "a/b/**", "*.md"),
    hr.Act.NET: ("h1.example", "*.example", "10.0.0.0/8", "api.example.com:443", "private"),
    hr.Act.CALL: ("s/t", "s/*", "m/**", "s/**"),
}
EFFECTS = (hr.Effect.ALLOW, hr.Effect.ASK, hr.Effect.DENY)


@st.composite
def policies(draw: st.DrawFn) -> hr.Policy:
    rules = draw(st.lists(st.tuples(st.sampled_from(list(PATTERNS)), st.integers(0, 7),
                                    st.sampled_from(EFFECTS)), max_size=8))
    defaults = {k: draw(st.sampled_from(EFFECTS)) for k in ("read", "write", "net", "call")}
    layer = hr.Layer("app", tuple(
        hr.Rule(act, PATTERNS[act][i % len(PATTERNS[act])], effect)
        for act, i, effect in rules))
    return hr.Policy((layer,), defaults)


@st.composite
def actions(draw: st.DrawFn) -> hr.Action:
    act = draw(st.sampled_from(list(PATTERNS)))
    pool = PATHS if act in (hr.Act.READ, hr.Act.WRITE) else NETS if act is hr.Act.NET else CALLS
    return hr.Action(act, draw(st.sampled_from(pool)))


def record(policy: hr.Policy, acts: list[hr.Action], approvals: list[bool],
           ) -> list[tuple[RunRecord, list[CallRecord]]]:
    run = RunRecord(id="r", task="t", agent="a", workspace=WS, policy=policy.to_dict())
    calls = []
    for i, (action, approve) in enumerate(zip(acts, approvals, strict=True)):
        verdict = policy.check(action, workspace=WS)
        decision = None
        if verdict.effect is hr.Effect.ASK:
            decision = {"kind": "approve" if approve else "deny"}
        status = (CallStatus.REFUSED if verdict.effect is hr.Effect.DENY or decision == {
            "kind": "deny"} else CallStatus.FINISHED)
        calls.append(CallRecord(
            id=f"r:c{i}", run_id="r", call_id=f"c{i}", turn=i, index=0, model_name="s/t",
            tool="s/t", actions=[{"act": action.act.value, "target": action.target}],
            verdict=verdict.to_dict(), decision=decision, status=status))
    return [(run, calls)]


def let_through(call: CallRecord) -> bool:
    assert call.verdict is not None
    effect = call.verdict["effect"]
    return effect == "allow" or (effect == "ask" and call.decision == {"kind": "approve"})


history_args = st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.lists(actions(), min_size=n, max_size=n), st.lists(st.booleans(), min_size=n,
                                                          max_size=n)))


@pytest.mark.timeout(300)  # under load, 100 examples take more than the default
@settings(max_examples=100, deadline=None)
@given(policies(), policies(), history_args)
def test_replay_reports_exactly_what_check_changes(recorded: hr.Policy, proposed: hr.Policy,
                                                   made: tuple[list[hr.Action], list[bool]],
                                                   ) -> None:
    acts, approvals = made
    history = record(recorded, acts, approvals)
    report = hr.policy.replay(history, proposed)
    expected = {}
    for call, action in zip(history[0][1], acts, strict=True):
        after = proposed.check(action, workspace=WS).effect
        if after.value != call.verdict["effect"]:  # type: ignore[index]
            expected[call.call_id] = after
    assert {f.call_id: f.after for f in report.flips} == expected
    for flip in report.flips:
        call = next(c for c in history[0][1] if c.call_id == flip.call_id)
        approved = call.decision == {"kind": "approve"}
        refused = not let_through(call)
        assert flip.gating == ((approved and flip.after is hr.Effect.DENY)
                               or (refused and flip.after is hr.Effect.ALLOW))


@pytest.mark.timeout(300)  # under load, 100 examples take more than the default
@settings(max_examples=100, deadline=None)
@given(policies(), history_args)
def test_suggest_allows_what_was_let_through_and_nothing_refused(
        recorded: hr.Policy, made: tuple[list[hr.Action], list[bool]]) -> None:
    acts, approvals = made
    history = record(recorded, acts, approvals)
    calls = history[0][1]
    if not any(let_through(c) for c in calls):
        return
    suggestion = hr.policy.suggest_from(history)
    policy = hr.Policy.from_toml(suggestion.to_toml())
    assert policy == suggestion.policy
    allowed = {(a.act, a.target) for a, c in zip(acts, calls, strict=True) if let_through(c)}
    for act, target in allowed:
        verdict = policy.check(hr.Action(act, target), workspace=WS)
        if verdict.layer == "secrets":
            # The secrets layer is always kept: a record that read a secret under a policy
            # without it is named among the conflicts, never silently allowed.
            assert any(f" {act.value} {target} " in c for c in suggestion.conflicts)
            continue
        assert verdict.effect is hr.Effect.ALLOW
    for action, call in zip(acts, calls, strict=True):
        if (action.act, action.target) not in allowed:
            assert policy.check(action, workspace=WS).effect is not hr.Effect.ALLOW, (
                action, call.verdict, suggestion.generalised)
    # The replay of the record against it denies nothing approved (but a secret), and allows
    # nothing refused but what was let through another time (a person denied it once and
    # approved it once: the replay says so).
    for flip in hr.policy.replay(history, policy).gating:
        if flip.after is hr.Effect.DENY:
            assert flip.reason_after.endswith("in layer 'secrets'")
        else:
            assert (hr.Act(flip.act), flip.target) in allowed


def _one(verdict: dict[str, object], actions: list[dict[str, object]],
         decision: dict[str, object] | None = None) -> list[tuple[RunRecord, list[CallRecord]]]:
    run = RunRecord(id="r", task="t", agent="a", workspace=WS)
    return [(run, [CallRecord(id="r:c", run_id="r", call_id="c", turn=0, index=0,
                              model_name="s/t", tool="s/t", actions=actions, verdict=verdict,
                              decision=decision)])]


def test_a_tainted_call_stays_asked_when_the_rules_would_allow_it() -> None:
    history = _one({"effect": "ask", "rule": None, "layer": "taint", "target": "x.py",
                    "reason": "taint: path came from web/fetch",
                    "taint": [{"argument": "path", "value": "x.py"}]},
                   [{"act": "write", "target": "x.py"}], {"kind": "approve"})
    allowing = hr.Policy().layer("app").allow(hr.Act.WRITE, "x.py")
    assert hr.policy.replay(history, allowing).flips == ()
    [flip] = hr.policy.replay(history, allowing.with_taint("deny")).flips
    assert (flip.change, flip.gating) == ("ask -> deny", True)
    assert flip.reason_after.startswith("taint")


def test_a_folder_holding_a_refusal_is_not_generalised() -> None:
    allowed = [("a/x.py", "allow"), ("a/y.py", "allow"), ("a/z.py", "allow"), ("c/1", "allow"),
               ("c/2", "allow"), ("c/3", "allow")]
    run = RunRecord(id="r", task="t", agent="a", workspace=WS)
    calls = [CallRecord(id=f"r:{i}", run_id="r", call_id=str(i), turn=i, index=0,
                        model_name="s/t", tool="s/t", actions=[{"act": "write", "target": t}],
                        verdict={"effect": e, "target": t, "reason": "default for write"})
             for i, (t, e) in enumerate(allowed)]
    calls.append(CallRecord(id="r:x", run_id="r", call_id="x", turn=9, index=0,
                            model_name="s/t", tool="s/t",
                            actions=[{"act": "write", "target": "a/secret.py"}],
                            verdict={"effect": "ask", "target": "a/secret.py", "reason": "d"},
                            decision={"kind": "deny"}))
    suggestion = hr.policy.suggest_from([(run, calls)])
    assert suggestion.generalised == ("write:c/*",)
    policy = suggestion.policy
    assert policy.check_canonical_path(hr.Act.WRITE, "a/secret.py").effect is hr.Effect.DENY
    assert policy.check_canonical_path(hr.Act.WRITE, "a/new.py").effect is hr.Effect.ASK
    assert policy.check_canonical_path(hr.Act.WRITE, "c/4").effect is hr.Effect.ALLOW
    assert policy.check_canonical_path(hr.Act.WRITE, "c/d/4").effect is hr.Effect.ASK
    # The root is never generalised, however many top-level files were written.
    top = [CallRecord(id=f"r:t{i}", run_id="r", call_id=f"t{i}", turn=i, index=0,
                      model_name="s/t", tool="s/t", actions=[{"act": "write", "target": f"f{i}"}],
                      verdict={"effect": "allow", "target": f"f{i}", "reason": "r"})
           for i in range(5)]
    top_policy = hr.policy.suggest_from([(run, top)]).policy
    assert top_policy.check_canonical_path(hr.Act.WRITE, "f9").effect is hr.Effect.ASK
    assert top_policy.check_canonical_path(hr.Act.WRITE, "d/f0").effect is hr.Effect.ASK


def test_a_recorded_target_with_glob_characters_is_allowed_literally() -> None:
    history = _one({"effect": "allow", "target": "a/[x]*?.py", "reason": "r"},
                   [{"act": "write", "target": "a/[x]*?.py"}])
    policy = hr.Policy.from_toml(hr.policy.suggest_from(history).to_toml())
    assert policy.check_canonical_path(hr.Act.WRITE, "a/[x]*?.py").effect is hr.Effect.ALLOW
    for other in ("a/x1.py", "a/x12.py", "a/[x]ab.py"):
        assert policy.check_canonical_path(hr.Act.WRITE, other).effect is hr.Effect.ASK


def test_denying_what_a_person_denied_never_refuses_what_was_approved() -> None:
    """A CALL pattern covers longer targets: a denied `s/t` must not deny an approved
    `s/t/deep` (found by the property above)."""
    run = RunRecord(id="r", task="t", agent="a", workspace=WS)
    calls = [CallRecord(id=f"r:{i}", run_id="r", call_id=str(i), turn=i, index=0,
                        model_name="s/t", tool="s/t", actions=[{"act": "call", "target": t}],
                        verdict={"effect": "ask", "target": t, "reason": "default for call"},
                        decision={"kind": kind})
             for i, (t, kind) in enumerate([("s/t", "deny"), ("s/t/deep", "approve"),
                                            ("s/u/deep", "deny")])]
    policy = hr.policy.suggest_from([(run, calls)]).policy
    assert policy.check(hr.Action(hr.Act.CALL, "s/t/deep")).effect is hr.Effect.ALLOW
    assert policy.check(hr.Action(hr.Act.CALL, "s/t")).effect is hr.Effect.ASK
    assert policy.check(hr.Action(hr.Act.CALL, "s/u/deep")).effect is hr.Effect.DENY


def test_a_top_level_file_is_allowed_there_only() -> None:
    history = _one({"effect": "allow", "target": "README.md", "reason": "default for read"},
                   [{"act": "read", "target": "README.md"}])
    policy = hr.policy.suggest_from(history).policy
    assert policy.check_canonical_path(hr.Act.READ, "README.md").effect is hr.Effect.ALLOW
    assert policy.check_canonical_path(hr.Act.READ, "docs/README.md").effect is hr.Effect.ASK
