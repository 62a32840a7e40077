"""The gate's per-tool plans (issue 11) never outlive the rules they were made under.

A plan keeps what a tool's CALL is decided to be under one policy, toolbox, manifest and
workspace; these tests change each of those a run can change while it runs, and fail if a
call is decided by the plan of before.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_taint import Recorder

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio


def _counting_tool() -> tuple[Any, list[int]]:
    ran: list[int] = []

    @hr.tool(server="ops", name="poke")
    async def poke(n: int) -> int:
        """Poke (changes the world: its CALL asks by default)."""
        ran.append(n)
        return n

    return poke, ran


async def test_a_remembered_rule_decides_the_next_call_of_the_same_tool() -> None:
    # The first call asks (the CALL default for a mutating tool) and the approval remembers
    # "allow call ops/poke": the second is allowed by the rule, and the approver is not
    # asked again. A plan kept from before the rule would ask again.
    poke, ran = _counting_tool()
    approver = Recorder(hr.Decision.approve(remember=["ops/poke"]))
    agent = hr.Agent(Scripted([call("ops/poke", {"n": 1}), call("ops/poke", {"n": 2}),
                               reply("done")]), [poke], policy=hr.Policy.default())
    store = hr.Store.memory()
    result = await agent.run("poke twice", store=store, approver=approver)
    assert result.output == "done"
    assert ran == [1, 2]
    assert len(approver.requests) == 1
    first, second = await store.calls(result.run_id)
    assert first.verdict is not None and first.verdict["effect"] == "ask"
    assert second.verdict is not None and second.verdict["effect"] == "allow"
    assert second.verdict["layer"] == "remembered"


async def test_a_child_under_a_contained_policy_never_uses_its_parents_plan() -> None:
    # One tool object in both toolboxes: the parent's policy allows it, the child's contained
    # policy (the parent's plus the child's own deny) refuses it. The parent's call comes
    # first, so a plan shared between them (or kept by the tool) would let the child's run.
    poke, ran = _counting_tool()
    child = hr.Agent(Scripted([call("ops/poke", {"n": 2}), reply("child done")]), [poke],
                     name="worker",
                     policy=hr.Policy.default().layer("child").deny("call", "ops/poke"))
    parent_policy = (hr.Policy.default().layer("app").allow("call", "ops/poke")
                     .allow("call", "agents/worker"))
    parent = hr.Agent(Scripted([call("ops/poke", {"n": 1}),
                                call("agents/worker", {"task": "poke"}), reply("done")]),
                      [poke, child.as_tool()], name="boss", policy=parent_policy)
    store = hr.Store.memory()
    result = await parent.run("poke, then delegate", store=store)
    assert result.output == "done"
    assert ran == [1]
    runs = {r.agent: r for r in await store.runs()}
    (child_call,) = await store.calls(runs["worker"].id)
    assert child_call.status is hr.CallStatus.REFUSED
    assert child_call.verdict is not None and child_call.verdict["effect"] == "deny"
    assert child_call.verdict["layer"] == "child"


async def test_the_planned_verdict_is_the_policys_and_each_record_has_its_own() -> None:
    # What a plan serves is what the policy decides, and a record's verdict and actions are
    # copies: the taint entry added to one call's verdict must not appear in another's.
    poke, _ = _counting_tool()
    policy = hr.Policy.default().layer("app").allow("call", "ops/poke")
    agent = hr.Agent(Scripted([call("ops/poke", {"n": 1}), call("ops/poke", {"n": 2}),
                               reply("done")]), [poke], policy=policy)
    store = hr.Store.memory()
    result = await agent.run("poke twice", store=store)
    first, second = await store.calls(result.run_id)
    expected = policy.check(hr.Action(hr.Act.CALL, "ops/poke")).to_dict()
    assert first.verdict == second.verdict == expected
    assert first.verdict is not second.verdict
    assert first.actions == second.actions == [{"act": "call", "target": "ops/poke"}]
    assert first.actions is not second.actions
    assert first.actions[0] is not second.actions[0]
