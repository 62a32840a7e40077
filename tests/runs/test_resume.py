"""Pause and resume, exactly once: approvals, questions, recoveries, refusals."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply

pytestmark = pytest.mark.anyio

DONE: list[str] = []


@hr.tool(server="ops", name="deploy")
async def deploy(service: str) -> str:
    """Deploy a service."""
    DONE.append(service)
    return f"deployed {service}"


@hr.tool(server="ops", name="ask_then_deploy", interactions={"question"})
async def ask_then_deploy(ctx: hr.CallContext) -> str:
    """Ask which service, then deploy it."""
    service = await ctx.ask(hr.Question("Which service?", choices=["web", "api"]))
    region = await ctx.ask(hr.Question("Which region?"))
    DONE.append(f"{service}@{region}")
    return f"deployed {service} in {region}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    DONE.clear()


def _echo_last(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    last = [m for m in messages if isinstance(m, ToolResultMessage)][-1]
    return reply(f"result: {last.result.render_text()}")


def make_agent(policy: hr.Policy | None = None, turns: list[Any] | None = None) -> hr.Agent:
    # A new Scripted each time, as a new process would build it.
    turns = turns or [call("ops/deploy", {"service": "web"}), _echo_last]
    return hr.Agent(Scripted(turns), [deploy, ask_then_deploy],
                    policy=policy or hr.Policy.default())


async def _deferred(store: hr.Store) -> hr.RunResult:
    result = await make_agent().run("deploy web", store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    return result


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> hr.Store:
    return hr.Store.memory() if request.param == "memory" else hr.Store.open(tmp_path / "r.db")


async def test_defer_persists_the_exact_request_and_resume_performs_it_once(
        store: hr.Store) -> None:
    paused = await _deferred(store)
    assert DONE == []
    outcome = paused.outcome
    assert isinstance(outcome, hr.AwaitingApproval)
    (item,) = await store.pending(kind="approval")
    assert item.id == outcome.request_id and item.tool == "ops/deploy"
    request = hr.Request.from_dict(item.payload)
    assert (request.act, request.target, request.arguments) == (
        hr.Act.CALL, "ops/deploy", {"service": "web"})
    assert (await store.run(paused.run_id)).status is hr.RunStatus.AWAITING_APPROVAL

    done = await hr.resume_with_decision(store, outcome.request_id, hr.Decision.approve(),
                                         agent=make_agent())
    assert done.outcome == hr.Completed("result: deployed web")
    assert done.run_id == paused.run_id
    assert DONE == ["web"]
    with pytest.raises(hr.AlreadyDecided):
        await hr.resume_with_decision(store, outcome.request_id, hr.Decision.approve(),
                                      agent=make_agent())
    with pytest.raises(hr.ResumeRefused, match="completed"):
        await hr.resume(store, paused.run_id, agent=make_agent())
    assert DONE == ["web"]
    (record,) = await store.calls(paused.run_id)
    assert record.status is hr.CallStatus.FINISHED and record.decided_by == "operator"
    assert await store.pending() == []


async def test_a_deny_decision_reaches_the_model(store: hr.Store) -> None:
    paused = await _deferred(store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.deny("freeze week"), agent=make_agent())
    assert done.outcome == hr.Completed(
        "result: The operator denied this call: freeze week")
    assert DONE == []


async def test_a_deny_added_while_paused_wins_on_resume(store: hr.Store) -> None:
    paused = await _deferred(store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    stricter = hr.Policy.default().layer("freeze").deny(hr.Act.CALL, "ops/*")
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=make_agent(stricter))
    assert done.outcome == hr.Completed(f"result: {hr.PolicyDenied.MODEL_MESSAGE}")
    assert DONE == []


async def test_containing_a_permissive_policy_keeps_the_recorded_deny(store: hr.Store) -> None:
    # The resume itself is tested end to end in test_promises.py (a permissive agent resumes
    # a run and is still refused); this checks the recorded policy round-trips with its deny.
    locked = hr.Policy.default().layer("lock").deny(hr.Act.CALL, "ops/deploy")
    result = await make_agent(locked, [call("ops/deploy", {"service": "a"}),
                                       call("ops/deploy", {"service": "b"}),
                                       _echo_last]).run("go", store=store,
                                                        approver=hr.DenyAll())
    assert isinstance(result.outcome, hr.Completed)
    recorded = hr.Policy.from_dict((await store.run(result.run_id)).policy or {})
    widened = recorded.contain(hr.Policy.permissive())
    assert widened.check(hr.Action(hr.Act.CALL, "ops/deploy")).effect is hr.Effect.DENY


async def test_a_modified_approval_on_resume_cannot_cross_a_deny(store: hr.Store) -> None:
    class Deploy(hr.Tool, server="ops", name="deploy"):
        """Deploy."""

        service: str

        def actions(self) -> list[hr.Action]:
            return [hr.Action(hr.Act.CALL, f"ops/deploy/{self.service}")]

        async def run(self, ctx: hr.CallContext) -> str:
            DONE.append(self.service)
            return "ok"

    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ops/deploy/prod")

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), _echo_last]),
                        [Deploy], policy=policy)

    paused = await build().run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    done = await hr.resume_with_decision(
        store, paused.outcome.request_id, hr.Decision.approve(modified={"service": "prod"}),
        agent=build())
    assert done.outcome == hr.Completed(f"result: {hr.PolicyDenied.MODEL_MESSAGE}")
    assert DONE == []


async def test_questions_pause_and_the_tool_is_rerun_with_recorded_answers(
        store: hr.Store) -> None:
    turns: list[Any] = [call("ops/ask_then_deploy", {}), _echo_last]
    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "ops/ask_then_deploy")

    def build() -> hr.Agent:
        return make_agent(policy, turns)

    first = await build().run("go", store=store)
    assert isinstance(first.outcome, hr.AwaitingAnswer)
    (item,) = await store.pending(kind="question")
    assert item.payload["question"] == "Which service?"
    second = await hr.resume_with_answer(store, first.outcome.question_id, "api", agent=build())
    assert isinstance(second.outcome, hr.AwaitingAnswer)
    assert (await store.pending(kind="question"))[0].payload["question"] == "Which region?"
    with pytest.raises(hr.AlreadyDecided):
        await hr.resume_with_answer(store, first.outcome.question_id, "web", agent=build())
    done = await hr.resume_with_answer(store, second.outcome.question_id, "eu", agent=build())
    assert done.outcome == hr.Completed("result: deployed api in eu")
    assert DONE == ["api@eu"]
    (record,) = await store.calls(first.run_id)
    assert [a["value"] for a in record.answers] == ["api", "eu"]


async def test_an_answer_authorises_nothing(store: hr.Store) -> None:
    # The tool asks and is answered; the resumed call still passes the policy of the moment:
    # a deny added while it waited refuses it, whatever the answer said.
    turns: list[Any] = [call("ops/ask_then_deploy", {}), _echo_last]
    allowed = hr.Policy.default().layer("app").allow(hr.Act.CALL, "ops/ask_then_deploy")
    first = await make_agent(allowed, turns).run("go", store=store)
    assert isinstance(first.outcome, hr.AwaitingAnswer)
    frozen = allowed.layer("freeze").deny(hr.Act.CALL, "ops/*")
    done = await hr.resume_with_answer(store, first.outcome.question_id, "api",
                                       agent=make_agent(frozen, turns))
    assert done.outcome == hr.Completed(f"result: {hr.PolicyDenied.MODEL_MESSAGE}")
    assert DONE == []
    (record,) = await store.calls(first.run_id)
    assert record.status is hr.CallStatus.REFUSED


async def test_an_answer_does_not_stand_in_for_an_approval(store: hr.Store) -> None:
    # An ask added while the tool waited for its answer is put to the approver (the default
    # one defers): the answer alone never lets the call run.
    turns: list[Any] = [call("ops/ask_then_deploy", {}), _echo_last]
    allowed = hr.Policy.default().layer("app").allow(hr.Act.CALL, "ops/ask_then_deploy")
    first = await make_agent(allowed, turns).run("go", store=store)
    assert isinstance(first.outcome, hr.AwaitingAnswer)
    review = allowed.layer("review").ask(hr.Act.CALL, "ops/*")
    second = await hr.resume_with_answer(store, first.outcome.question_id, "api",
                                         agent=make_agent(review, turns))
    assert isinstance(second.outcome, hr.AwaitingApproval), second.outcome
    assert DONE == []
    third = await hr.resume_with_decision(store, second.outcome.request_id,
                                          hr.Decision.approve(), agent=make_agent(review, turns))
    # Approved, the tool runs from its start with the recorded answer and asks its next one.
    assert isinstance(third.outcome, hr.AwaitingAnswer), third.outcome
    done = await hr.resume_with_answer(store, third.outcome.question_id, "eu",
                                       agent=make_agent(review, turns))
    assert done.outcome == hr.Completed("result: deployed api in eu")
    assert DONE == ["api@eu"]


async def test_a_run_without_a_recorded_policy_is_refused(store: hr.Store) -> None:
    # A run written by something that recorded no policy (a policy is immutable once a run
    # exists, so this can only be a run created that way).
    legacy = hr.RunRecord(id="legacy", task="t", status=hr.RunStatus.AWAITING_APPROVAL,
                          policy=None, created_at=1.0,
                          outcome={"kind": "awaiting_approval", "request_id": "x"})
    await store.write(hr.store.Batch(run=legacy))
    with pytest.raises(hr.ResumeRefused, match="no recorded policy"):
        await hr.resume(store, "legacy", agent=make_agent())
    assert DONE == []


async def _crash_mid_call(store: hr.Store, paused: hr.RunResult) -> hr.CallRecord:
    """What a process killed after approving and starting the call leaves behind."""
    (record,) = await store.calls(paused.run_id)
    if record.pending_id:
        await store.decide(record.pending_id, hr.Decision.approve().to_dict(), "operator")
    run = await store.run(paused.run_id)
    started = dataclasses.replace(record, status=hr.CallStatus.STARTED,
                                  decision=hr.Decision.approve().to_dict())
    await store.write(hr.store.Batch(
        run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
        calls=[started]))
    return started


async def test_a_call_in_flight_at_a_crash_comes_back_in_doubt(store: hr.Store) -> None:
    paused = await _deferred(store)
    # Simulate a crash after the approval, mid-call: the record says STARTED, no result.
    record = await _crash_mid_call(store, paused)
    again = await hr.resume(store, paused.run_id, agent=make_agent())
    assert again.outcome == hr.AwaitingRecovery(record.id)
    assert [p.kind for p in await store.pending()] == ["recovery"]
    done = await hr.resume_with_recovery(store, record.id,
                                         hr.Recovery.completed("it was deployed"),
                                         agent=make_agent())
    assert done.outcome == hr.Completed("result: it was deployed")
    assert DONE == []


@pytest.mark.parametrize("choice", ["retry", "abort"])
async def test_recovery_retry_runs_once_and_abort_tells_the_model(store: hr.Store,
                                                                  choice: str) -> None:
    paused = await _deferred(store)
    record = await _crash_mid_call(store, paused)
    await hr.resume(store, paused.run_id, agent=make_agent())
    recovery = hr.Recovery.retry() if choice == "retry" else hr.Recovery.abort()
    done = await hr.resume_with_recovery(store, record.id, recovery, agent=make_agent())
    assert isinstance(done.outcome, hr.Completed)
    if choice == "retry":
        assert DONE == ["web"] and done.outcome.output == "result: deployed web"
    else:
        assert DONE == [] and "may or may not" in done.outcome.output


async def test_an_idempotent_call_in_flight_is_retried_without_asking(store: hr.Store) -> None:
    @hr.tool(server="ops", name="deploy", idempotent=True)
    async def deploy_again(service: str) -> str:
        DONE.append(service)
        return "ok"

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), _echo_last]),
                        [deploy_again], policy=hr.Policy.default())

    paused = await build().run("go", store=store)
    await _crash_mid_call(store, paused)
    done = await hr.resume(store, paused.run_id, agent=build())
    assert done.outcome == hr.Completed("result: ok") and DONE == ["web"]


async def test_wrong_kinds_of_ids_are_clear_errors(store: hr.Store) -> None:
    paused = await _deferred(store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    with pytest.raises(hr.UserError, match="an approval, not a question: use `handrail approve"):
        await hr.resume_with_answer(store, paused.outcome.request_id, "x", agent=make_agent())
    with pytest.raises(hr.UserError, match="deferring again"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.defer(),
                                      agent=make_agent())
    with pytest.raises(hr.NotFound):
        await hr.resume_with_decision(store, "ap-nope", hr.Decision.approve(),
                                      agent=make_agent())


async def test_a_denied_write_keeps_no_bytes_in_its_request_or_record(tmp_path: Path) -> None:
    secret = "the-bytes-that-were-never-written"
    store = hr.Store.open(tmp_path / "runs.db")

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("workspace/write_file",
                                       {"path": "notes.md", "content": secret}), _echo_last]),
                        hr.builtin.workspace_tools(), workspace=tmp_path)

    paused = await build().run("write", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    (item,) = await store.pending()
    assert hr.Request.from_dict(item.payload).content == secret.encode()  # shown to the human
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.deny("not now"), agent=build())
    assert isinstance(done.outcome, hr.Completed) and "not now" in done.outcome.output
    decided = await store.pending_item(paused.outcome.request_id)
    assert decided.payload["content_bytes"] == len(secret)
    await store.close()
    import sqlite3

    db = sqlite3.connect(tmp_path / "runs.db")
    dump = repr(db.execute("SELECT * FROM pending").fetchall()) + repr(
        db.execute("SELECT * FROM calls").fetchall())
    db.close()
    assert secret not in dump
    assert not (tmp_path / "notes.md").exists()


async def test_resume_with_an_approver_puts_the_open_request_to_it(store: hr.Store) -> None:
    paused = await _deferred(store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    shown: list[hr.Request] = []

    def decide(request: hr.Request) -> hr.Decision:
        shown.append(request)
        return hr.Decision.approve()

    # An approver that defers again leaves it pending, nothing decided.
    again = await hr.resume(store, paused.run_id, agent=make_agent(),
                            approver=hr.CallbackApprover(lambda r: hr.Decision.defer()))
    assert again.outcome == paused.outcome
    assert [p.state for p in await store.pending()] == ["open"]
    done = await hr.resume(store, paused.run_id, agent=make_agent(),
                           approver=hr.CallbackApprover(decide))
    assert done.outcome == hr.Completed("result: deployed web") and DONE == ["web"]
    assert shown[0].id == paused.outcome.request_id  # the exact persisted request
    item = await store.pending_item(paused.outcome.request_id)
    assert item.state == "decided" and item.decision == {"kind": "approve", "modified": None,
                                                         "remember": []}
    with pytest.raises(hr.AlreadyDecided):
        await hr.resume_with_decision(store, item.id, hr.Decision.deny("late"),
                                      agent=make_agent())


async def test_a_run_whose_runner_died_in_this_process_can_be_resumed_here(
        store: hr.Store) -> None:
    @hr.tool(server="ops", name="deploy", mutates=False)
    async def broken(service: str) -> str:
        raise KeyboardInterrupt  # not a tool failure: it tears the runner down

    def build(tool: Any) -> hr.Agent:
        return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), _echo_last]), [tool])

    with pytest.raises(KeyboardInterrupt):
        await build(broken).run("go", store=store)
    (run,) = await store.runs()
    assert run.status is hr.RunStatus.READY and run.outcome is None  # nobody drives it
    assert run.events[-1]["kind"] == "interrupted"
    done = await hr.resume(store, run.id, agent=build(deploy),
                           approver=hr.ApproveAll())
    assert isinstance(done.outcome, hr.AwaitingRecovery)  # the call was in flight


async def test_a_paused_form_is_answered_with_json_text_later(store: hr.Store) -> None:
    @hr.tool(server="ops", name="profile", interactions={"form"}, mutates=False)
    async def profile(ctx: hr.CallContext) -> str:
        try:
            data = await ctx.elicit({"type": "object",
                                     "properties": {"age": {"type": "integer"}},
                                     "required": ["age"]}, "How old?")
        except hr.InteractionDeclined as exc:
            return f"declined: {exc.reason}"
        return f"age {data['age']}"

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("ops/profile", {}), _echo_last]), [profile])

    for text, expected in (('{"age": 7}', "result: age 7"), ("seven", "result: declined")):
        paused = await build().run("go", store=store)
        assert isinstance(paused.outcome, hr.AwaitingAnswer)
        done = await hr.resume_with_answer(store, paused.outcome.question_id, text,
                                           agent=build())
        assert isinstance(done.outcome, hr.Completed)
        assert done.outcome.output.startswith(expected)


async def test_a_denial_keeps_no_bytes_even_when_the_run_cannot_continue_now(
        tmp_path: Path) -> None:
    import time

    secret = "bytes that were never written"
    store = hr.Store.open(tmp_path / "runs.db")

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("workspace/write_file",
                                       {"path": "notes.md", "content": secret}), _echo_last]),
                        hr.builtin.workspace_tools(), workspace=tmp_path)

    paused = await build().run("write", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    run = await store.run(paused.run_id)
    # Another machine holds the run right now: the run cannot continue here.
    await store.write(hr.store.Batch(run=dataclasses.replace(
        run, status=hr.RunStatus.RUNNING, outcome=None, owner="elsewhere:1:x",
        lease_until=time.time() + 60)))
    with pytest.raises(hr.ResumeRefused):
        await hr.resume_with_decision(store, paused.outcome.request_id,
                                      hr.Decision.deny("not now"), agent=build())
    item = await store.pending_item(paused.outcome.request_id)
    if item.state == "decided":  # a recorded denial never keeps the bytes it refused
        assert secret not in repr(item.payload)
    else:  # still pending: the exact request is kept for whoever decides it
        assert hr.Request.from_dict(item.payload).content == secret.encode()
    await store.close()
    assert not (tmp_path / "notes.md").exists()
