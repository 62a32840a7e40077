"""A run's status and its outcome never disagree, whatever way a resume ends.

The story (issue 10 §4): `handrail approve ID` in a shell without the model's API key
performed the approved write, printed the model error and exited 1. Afterwards `handrail
pending` said "nothing is pending" while `handrail runs` showed the run `running` with an
outcome of `awaiting_approval`. `answer --no-resume` left a similar state: the question
answered, the run still "awaiting_answer" on it. Now a decided run is READY ("decided, not yet
continued"), every way out of a runner (an error, Ctrl-C, a cancellation) leaves it READY with
the error in its events, and the store refuses a run whose status and outcome disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.errors import StoreError
from handrail.models import Scripted, Turn, call, calls, reply

pytestmark = pytest.mark.anyio

DONE: list[str] = []


@hr.tool(server="ops", name="deploy")
async def deploy(service: str) -> str:
    """Deploy a service."""
    DONE.append(service)
    return f"deployed {service}"


@hr.tool(server="ops", name="ask", interactions={"question"}, mutates=False)
async def ask(ctx: hr.CallContext) -> str:
    """Ask something."""
    return str(await ctx.ask(hr.Question("Which?")))


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> hr.Store:
    if request.param == "postgresql":
        return hr.Store.open(request.getfixturevalue("pg_url"))
    return hr.Store.memory() if request.param == "memory" else hr.Store.open(tmp_path / "r.db")


@pytest.fixture(autouse=True)
def _clear() -> None:
    DONE.clear()


def _raise(exc: BaseException) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        raise exc
    return turn


def make_agent(second: Any) -> hr.Agent:
    return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), second]),
                    [deploy, ask], policy=hr.Policy.default())


async def _check_agrees(store: hr.Store, run_id: str) -> hr.RunRecord:
    run = await store.run(run_id)
    expected = {hr.RunStatus.RUNNING: None, hr.RunStatus.READY: None}.get(
        run.status, run.status.value)
    assert (run.outcome or {}).get("kind") == expected, (run.status, run.outcome)
    return run


@pytest.mark.parametrize("failure", [
    hr.errors.ConfigError("OPENAI_API_KEY is not set"), KeyboardInterrupt(), RuntimeError("boom")])
async def test_a_resume_that_fails_after_the_decision_leaves_the_run_ready(
        store: hr.Store, failure: BaseException) -> None:
    paused = await make_agent(reply("unused")).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    with pytest.raises(type(failure)):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=make_agent(_raise(failure)))
    assert DONE == ["web"]  # the approved call ran; the model turn after it failed
    run = await _check_agrees(store, paused.run_id)
    assert run.status is hr.RunStatus.READY and run.owner is None
    assert run.events[-1]["kind"] == "interrupted"
    assert type(failure).__name__ in run.events[-1]["error"]
    assert await store.pending() == []
    done = await hr.resume(store, paused.run_id, agent=make_agent(reply("finished")))
    assert done.outcome == hr.Completed("finished") and DONE == ["web"]  # not run twice
    await _check_agrees(store, paused.run_id)


async def test_an_outside_cancellation_leaves_the_run_ready(store: hr.Store) -> None:
    started = anyio.Event()

    @hr.tool(mutates=False)
    async def hang() -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = hr.Agent(Scripted([call("hang", {}), reply("x")]), [hang])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(agent.run, "go", store=store))
            with anyio.fail_after(30):
                await started.wait()
            scope.cancel()
    (run,) = await store.runs()
    assert run.status is hr.RunStatus.READY and run.outcome is None


async def test_recording_a_decision_without_resuming_makes_the_run_ready(
        store: hr.Store) -> None:
    paused = await make_agent(reply("unused")).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    await store.decide(paused.outcome.request_id, hr.Decision.approve().to_dict(), "alice")
    run = await _check_agrees(store, paused.run_id)
    assert run.status is hr.RunStatus.READY

    asked = await hr.Agent(Scripted([call("ops/ask", {}), reply("ok")]), [ask]).run(
        "go", store=store)
    assert isinstance(asked.outcome, hr.AwaitingAnswer)
    await store.decide(asked.outcome.question_id, {"answer": "web"}, "bob")
    assert (await _check_agrees(store, asked.run_id)).status is hr.RunStatus.READY


async def test_a_run_still_waiting_on_another_item_points_at_it(store: hr.Store) -> None:
    agent = hr.Agent(Scripted([calls([("ops/deploy", {"service": "x"}),
                                      ("ops/deploy", {"service": "y"})]), reply("ok")]),
                     [deploy], policy=hr.Policy.default())
    paused = await agent.run("go", store=store)
    first, second = await store.pending()
    await store.decide(first.id, hr.Decision.approve().to_dict(), "alice")
    run = await _check_agrees(store, paused.run_id)
    assert run.status is hr.RunStatus.AWAITING_APPROVAL
    assert run.outcome == {"kind": "awaiting_approval", "request_id": second.id}


@pytest.mark.parametrize(("status", "outcome"), [
    (hr.RunStatus.RUNNING, {"kind": "awaiting_approval", "request_id": "x"}),
    (hr.RunStatus.READY, {"kind": "completed", "output": "x"}),
    (hr.RunStatus.AWAITING_APPROVAL, None),
    (hr.RunStatus.COMPLETED, {"kind": "failed", "error": "x"}),
])
async def test_the_store_refuses_a_status_and_outcome_that_disagree(
        store: hr.Store, status: hr.RunStatus, outcome: dict[str, Any] | None) -> None:
    run = hr.RunRecord(id="r", task="t", status=status, outcome=outcome, policy={})
    with pytest.raises(StoreError, match="must agree"):
        await store.write(hr.store.Batch(run=run))
    with pytest.raises(hr.NotFound):
        await store.run("r")
