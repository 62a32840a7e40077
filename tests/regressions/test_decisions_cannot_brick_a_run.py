"""A decision that cannot be applied is refused whole: nothing recorded, the run still paused.

The story (issue 9 §3): `handrail approve ID --remember 'a**'` recorded the approval, then
failed on the malformed pattern while applying it. The run stayed `running` with nothing
pending, every resume failed on the same pattern, and a second approve said "already
decided": the run was bricked. Likewise `recover --retry` with an agent that no longer had
the call's tool recorded the in-doubt call as "refused, not sent" — a lie about a call that may
have acted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

DONE: list[str] = []


@hr.tool(server="ops", name="deploy")
async def deploy(service: str) -> str:
    """Deploy a service."""
    DONE.append(service)
    return f"deployed {service}"


@hr.tool(server="ops", name="other", mutates=False)
async def other() -> str:
    """Not deploy."""
    return "other"


def make_agent(tools: list[object] | None = None) -> hr.Agent:
    return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), reply("done")]),
                    tools if tools is not None else [deploy], policy=hr.Policy.default())


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> hr.Store:
    return hr.Store.memory() if request.param == "memory" else hr.Store.open(tmp_path / "r.db")


@pytest.fixture(autouse=True)
def _clear() -> None:
    DONE.clear()


async def _paused(store: hr.Store) -> tuple[hr.RunResult, str]:
    paused = await make_agent().run("deploy web", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    return paused, paused.outcome.request_id


@pytest.mark.parametrize("decision", [
    hr.Decision.approve(remember=["a**"]),
    hr.Decision.approve(remember=["ops"]),  # CALL patterns name server/name
    hr.Decision.approve(modified={"service": 7}),  # not the tool's schema
    hr.Decision.approve(modified={"nope": "x"}),
])
async def test_a_decision_that_cannot_be_applied_is_not_recorded(
        store: hr.Store, decision: hr.Decision) -> None:
    paused, request_id = await _paused(store)
    with pytest.raises(hr.UserError, match=r"cannot be applied|do not fit"):
        await hr.resume_with_decision(store, request_id, decision, agent=make_agent())
    item = await store.pending_item(request_id)
    assert item.state == "open" and item.decision is None
    run = await store.run(paused.run_id)
    assert run.status is hr.RunStatus.AWAITING_APPROVAL
    assert run.outcome == {"kind": "awaiting_approval", "request_id": request_id}
    assert DONE == []
    # The person can still decide, and the run continues.
    done = await hr.resume_with_decision(store, request_id, hr.Decision.approve(),
                                         agent=make_agent())
    assert done.outcome == hr.Completed("done") and DONE == ["web"]


async def test_a_bad_remember_pattern_from_a_resuming_approver_is_never_recorded(
        store: hr.Store) -> None:
    paused, request_id = await _paused(store)
    bad = hr.CallbackApprover(lambda r: hr.Decision.approve(remember=["a**"]))
    with pytest.raises(hr.UserError, match="cannot be applied"):
        await hr.resume(store, paused.run_id, agent=make_agent(), approver=bad)
    assert (await store.pending_item(request_id)).state == "open"
    assert (await store.run(paused.run_id)).status is hr.RunStatus.READY
    done = await hr.resume(store, paused.run_id, agent=make_agent(), approver=hr.ApproveAll())
    assert done.outcome == hr.Completed("done") and DONE == ["web"]


async def _in_doubt(store: hr.Store) -> tuple[hr.RunResult, str]:
    paused, request_id = await _paused(store)
    await store.decide(request_id, hr.Decision.approve().to_dict(), "operator")
    (record,) = await store.calls(paused.run_id)
    run = await store.run(paused.run_id)
    # What a process killed after starting the approved call leaves behind.
    await store.write(hr.store.Batch(
        run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
        calls=[dataclasses.replace(record, status=hr.CallStatus.STARTED,
                                   decision=hr.Decision.approve().to_dict())]))
    again = await hr.resume(store, paused.run_id, agent=make_agent())
    assert again.outcome == hr.AwaitingRecovery(record.id)
    return paused, record.id


async def test_retrying_with_an_agent_without_the_tool_keeps_the_call_in_doubt(
        store: hr.Store) -> None:
    paused, call_id = await _in_doubt(store)
    with pytest.raises(hr.UserError, match="stays in doubt"):
        await hr.resume_with_recovery(store, call_id, hr.Recovery.retry(),
                                      agent=make_agent([other]))
    assert (await store.pending_item(call_id)).state == "open"
    assert (await store.call(call_id)).status is hr.CallStatus.IN_DOUBT
    assert (await store.run(paused.run_id)).status is hr.RunStatus.AWAITING_RECOVERY


async def test_a_retry_recorded_without_an_agent_is_asked_again_when_the_tool_is_gone(
        store: hr.Store) -> None:
    paused, call_id = await _in_doubt(store)
    await store.decide(call_id, hr.Recovery.retry().to_dict(), "operator")  # --no-resume
    assert (await store.run(paused.run_id)).status is hr.RunStatus.READY
    again = await hr.resume(store, paused.run_id, agent=make_agent([other]))
    assert again.outcome == hr.AwaitingRecovery(call_id)
    record = await store.call(call_id)
    assert record.status is hr.CallStatus.IN_DOUBT and record.disposition != "not_sent"
    item = await store.pending_item(call_id)
    assert item.state == "open" and item.payload.get("tool_missing") is True
    # Decided another way, it no longer needs the tool.
    done = await hr.resume_with_recovery(store, call_id, hr.Recovery.completed("it ran"),
                                         agent=make_agent([other]))
    assert done.outcome == hr.Completed("done")
    assert (await store.call(call_id)).disposition == "landed"
