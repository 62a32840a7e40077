"""Equal policies share one compiled form (issue 11: every run builds its effective policy
anew, and compiling the default one costs ~1 ms); a policy that differs in anything the
decision reads never gets another's."""

from __future__ import annotations

import handrail as hr
from handrail.policy import Act, Action, Effect


def _checked(policy: hr.Policy, action: Action) -> hr.Verdict:
    return policy.check(action, workspace="/tmp")


def test_equal_policies_share_their_compiled_form() -> None:
    first = hr.Policy.default().layer("app").allow("call", "ops/*")
    second = hr.Policy.default().layer("app").allow("call", "ops/*")
    assert first is not second and first == second
    action = Action(Act.CALL, "ops/poke")
    assert _checked(first, action) == _checked(second, action)
    assert first._compiled is second._compiled  # type: ignore[attr-defined]


def test_a_policy_that_differs_is_decided_by_its_own_rules() -> None:
    action = Action(Act.CALL, "ops/poke")
    allowing = hr.Policy.default().layer("app").allow("call", "ops/*")
    assert _checked(allowing, action).effect is Effect.ALLOW
    # The same layer names, another rule; then another effect; then other defaults and taint.
    denying = hr.Policy.default().layer("app").deny("call", "ops/*")
    asking = hr.Policy.default().layer("app").ask("call", "ops/*")
    other_defaults = hr.Policy.default().with_defaults(call="deny")
    assert _checked(denying, action).effect is Effect.DENY
    assert _checked(asking, action).effect is Effect.ASK
    assert _checked(other_defaults, action).effect is Effect.DENY
    assert _checked(allowing, action).effect is Effect.ALLOW
    renamed = hr.Policy.default().layer("other").allow("call", "ops/*")
    verdict = _checked(renamed, action)
    assert verdict.effect is Effect.ALLOW and verdict.layer == "other"


def test_the_kept_compiled_forms_are_bounded() -> None:
    from handrail.policy import _policy

    for i in range(_policy._COMPILED_KEPT + 10):
        policy = hr.Policy.default().layer("app").allow("call", f"ops/t{i}")
        assert _checked(policy, Action(Act.CALL, f"ops/t{i}")).effect is Effect.ALLOW
    assert len(_policy._COMPILED) <= _policy._COMPILED_KEPT
