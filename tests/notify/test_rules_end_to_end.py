"""A rule's terms, through a real run: `ask ... approvals = 2, expires = "30m"`.

The policy gives the pending item its terms; the run stays paused until two distinct people
approved (the same person twice counts once), and a run whose item expired continues with
the default, recorded as decided by "expiry".
"""

from __future__ import annotations

import pathlib
import time

import pytest

import handrail as hr
from handrail.models import Scripted, call, reply
from handrail.policy import AskTerms

pytestmark = pytest.mark.anyio


@pytest.fixture
def real_clock(store: hr.Store) -> None:
    store.clock = time.time  # the gate dates items by the real clock

TOML = """
[policy]
extends = "default"

[[policy.layers]]
name = "team"
ask = [{ rule = "write:*.txt", approvals = 2, expires = "30m", escalate = "10m" }]
"""


def _agent(root: pathlib.Path) -> hr.Agent:
    return hr.Agent(
        Scripted([call("workspace/write_file", {"path": "a.txt", "content": "hi"}),
                  reply("done")]),
        hr.builtin.workspace_tools(), workspace=root, name="notes",
        policy=hr.Policy.from_toml(TOML))


@pytest.mark.usefixtures("real_clock")
async def test_a_rule_s_terms_reach_the_item_and_two_people_must_approve(
        store: hr.Store, tmp_path: pathlib.Path) -> None:
    agent = _agent(tmp_path)
    before = time.time()
    result = await agent.run("write a.txt", store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    rid = result.outcome.request_id
    item = await store.pending_item(rid)
    assert item.approvals_needed == 2
    assert item.deadline is not None and before + 1800 <= item.deadline <= time.time() + 1800
    assert item.escalate_at == pytest.approx(item.deadline - 1200)
    assert item.on_expiry == {"kind": "deny", "reason": "expired after 30m"}
    assert item.payload["terms"] == {"approvals": 2, "expires": "30m", "escalate": "10m"}

    one = await hr.resume_with_decision(store, rid, hr.Decision.approve(), agent=agent,
                                        decided_by="alice")
    assert one.outcome == hr.AwaitingApproval(rid)  # 1 of 2: still waiting
    again = await hr.resume_with_decision(store, rid, hr.Decision.approve(), agent=agent,
                                          decided_by="Alice")
    assert again.outcome == hr.AwaitingApproval(rid)  # the same person counts once
    assert not (tmp_path / "a.txt").exists()
    done = await hr.resume_with_decision(store, rid, hr.Decision.approve(), agent=agent,
                                         decided_by="bob")
    assert done.outcome == hr.Completed("done")
    assert (tmp_path / "a.txt").read_text() == "hi"
    (record,) = await store.calls(result.run_id)
    assert record.decided_by == "alice, bob"


@pytest.mark.usefixtures("real_clock")
async def test_a_run_resumed_after_the_deadline_continues_with_the_default(
        store: hr.Store, tmp_path: pathlib.Path) -> None:
    agent = _agent(tmp_path)
    result = await agent.run("write a.txt", store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    store.clock = lambda: time.time() + 1801
    resumed = await hr.resume(store, result.run_id, agent=agent)
    assert resumed.outcome == hr.Completed("done")
    assert not (tmp_path / "a.txt").exists()
    (record,) = await store.calls(result.run_id)
    assert record.decided_by == "expiry"
    assert record.result is not None and "expired after 30m" in str(record.result)


@pytest.mark.usefixtures("real_clock")
async def test_an_approver_that_defers_may_give_a_deadline(store: hr.Store,
                                                           tmp_path: pathlib.Path) -> None:
    agent = hr.Agent(
        Scripted([call("workspace/write_file", {"path": "a.txt", "content": "hi"}),
                  reply("done")]),
        hr.builtin.workspace_tools(), workspace=tmp_path, name="notes")
    approver = hr.CallbackApprover(lambda request: hr.Decision.defer(expires="5m"))
    result = await agent.run("write a.txt", store=store, approver=approver)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    item = await store.pending_item(result.outcome.request_id)
    assert item.on_expiry == {"kind": "deny", "reason": "expired after 5m"}
    assert item.deadline is not None and item.deadline - item.created_at == pytest.approx(300)


def test_terms_are_checked_and_round_trip() -> None:
    policy = hr.Policy.from_toml(TOML)
    assert hr.Policy.from_dict(policy.to_dict()) == policy
    rule = policy.layers[-1].rules[0]
    assert rule.terms == AskTerms(approvals=2, expires=1800, escalate=600)
    assert hr.Rule.from_dict(rule.to_dict()) == rule
    for bad, words in (({"approvals": 0}, "1 to 10"), ({"approvals": 11}, "1 to 10"),
                       ({"expires": "soon"}, "not a duration"),
                       ({"expires": "30m", "escalate": "1h"}, "before"),
                       ({"default": "approve"}, "needs expires"),
                       ({"default": "maybe", "expires": "1m"}, "deny' or 'approve"),
                       ({"expires": "91d"}, "90 days"), ({"colour": 1}, "unknown")):
        with pytest.raises(hr.PolicyError, match=words):
            AskTerms.from_dict(bad)
    with pytest.raises(hr.PolicyError, match="ask rule"):
        hr.Rule("write", "*.txt", "allow", AskTerms(approvals=2))
    with pytest.raises(hr.PolicyError, match=r"layers\[0\]\.ask\[0\]: approvals is a whole"):
        hr.Policy.from_toml('[[policy.layers]]\nname = "a"\n'
                            'ask = [{ rule = "write:*", approvals = "two" }]')
    with pytest.raises(hr.PolicyError, match=r"layers\[0\]\.ask\[1\]: an ask with options"):
        hr.Policy.from_toml('[[policy.layers]]\nname = "a"\n'
                            'ask = ["write:x", { approvals = 2 }]')
    # Several rules asking about one request: the strictest of each term.
    assert AskTerms.strictest([AskTerms(approvals=2, expires=3600),
                               AskTerms(expires=600, default="approve"), None]) == AskTerms(
        approvals=2, expires=600)
