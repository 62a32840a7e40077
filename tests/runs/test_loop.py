"""The agent loop through the gate: every stage, in one process."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, calls, reply

pytestmark = pytest.mark.anyio


@hr.tool(server="ledger", mutates=False)
async def balance(account: str) -> int:
    """Read a balance."""
    return {"alice": 120, "bob": 7}[account]


EXECUTED: list[dict[str, Any]] = []


@hr.tool(server="ledger", name="transfer")
async def transfer(source: str, target: str, amount: int) -> str:
    """Move money."""
    EXECUTED.append({"source": source, "target": target, "amount": amount})
    return f"moved {amount}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    EXECUTED.clear()


def results(messages: Sequence[Any]) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


def last_results(into: list[list[ToolResultMessage]]) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        into.append(results(messages))
        return reply("done")

    return turn


def agent(turns: list[Any], *, policy: hr.Policy | None = None, tools: Any = None,
          **kw: Any) -> hr.Agent:
    return hr.Agent(Scripted(turns), tools if tools is not None else [balance, transfer],
                    policy=policy or hr.Policy.default(), **kw)


async def test_a_completed_run_records_every_call_with_its_verdict() -> None:
    store = hr.Store.memory()
    result = await agent([call("ledger/balance", {"account": "alice"}), reply("120")]).run(
        "balance?", store=store)
    assert result.outcome == hr.Completed("120")
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.FINISHED
    assert record.verdict is not None and record.verdict["effect"] == "allow"
    assert record.result is not None and record.result["structured"] == 120
    assert record.arguments_digest is not None and record.arguments_digest.startswith("sha256:")
    run = await store.run(result.run_id)
    assert run.status is hr.RunStatus.COMPLETED and run.policy is not None


async def test_unknown_tool_invalid_arguments_and_deny_reach_the_model_not_the_body() -> None:
    seen: list[list[ToolResultMessage]] = []
    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ledger/transfer")
    result = await agent([
        calls([("ledger/balanse", {"account": "a"}),
               ("ledger/balance", {"account": 5, "extra": 1}),
               ("ledger/transfer", {"source": "a", "target": "b", "amount": 1})]),
        last_results(seen),
    ], policy=policy).run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    unknown, invalid, denied = seen[0]
    assert "no tool named 'ledger--balanse'" in unknown.result.render_text()
    assert "ledger--balance" in unknown.result.render_text()
    assert "$.account" in invalid.result.render_text()
    assert "$.extra" in invalid.result.render_text()
    assert denied.result.render_text() == hr.PolicyDenied.MODEL_MESSAGE
    assert "transfer" not in denied.result.render_text()
    assert all(r.result.is_error for r in seen[0])
    assert EXECUTED == []


async def test_the_stored_results_are_the_results_the_model_is_shown() -> None:
    """Issue 11: a result's stored message shares its dict with the call's record (one
    `to_dict` a call); what is stored must still be exactly what the model saw."""
    from handrail.models import dump_messages

    @hr.tool(server="ledger", mutates=False)
    async def broken(account: str) -> int:
        """Fail."""
        raise hr.ToolError("the ledger is closed")

    shown: list[list[dict[str, Any]]] = []

    def final(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        shown.append(dump_messages(messages))
        return reply("done")

    store = hr.Store.memory()
    result = await agent([
        calls([("ledger/balance", {"account": "alice"}), ("ledger/nope", {}),
               ("ledger/balance", {"account": 5}), ("ledger/broken", {"account": "a"})]),
        call("ledger/balance", {"account": "bob"}), final,
    ], tools=[balance, transfer, broken]).run("go", store=store)
    assert isinstance(result.outcome, hr.Completed)
    stored = await store.messages(result.run_id)
    stored_results = [m for m in stored if m["kind"] == "tool_result"]
    assert stored_results == [m for m in shown[0] if m["kind"] == "tool_result"]
    assert len(stored_results) == 5
    records = {r.call_id: r.result for r in await store.calls(result.run_id)}
    assert all(m["result"] == records[m["call_id"]] for m in stored_results)


async def test_a_mutating_call_starts_with_its_turn_counted_in_the_stored_run() -> None:
    """The run committed with a call's STARTED mark holds the turn that asked for it: its
    step, and times from after the model answered (issue 11: the update made when the
    model's turn is counted is the one the turn's first write takes)."""
    store = hr.Store.memory()
    asked: list[float] = []
    seen: list[hr.RunRecord] = []

    @hr.tool(server="ledger", name="note")
    async def note(text: str) -> str:
        """Write a note."""
        (run,) = await store.runs()
        seen.append(run)
        return "noted"

    def asking(i: int) -> Any:
        def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
            asked.append(time.time())
            return call("ledger/note", {"text": str(i)})
        return turn

    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "ledger/note")
    result = await agent([asking(0), asking(1), asking(2), reply("done")],
                         tools=[note], policy=policy).run("notes", store=store)
    assert isinstance(result.outcome, hr.Completed)
    assert [r.steps for r in seen] == [1, 2, 3]
    for run, at in zip(seen, asked, strict=True):
        assert run.updated_at >= at and run.lease_until > at


async def test_policy_denial_records_the_rule_for_the_operator() -> None:
    store = hr.Store.memory()
    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ledger/*")
    result = await agent([call("ledger/balance", {"account": "a"}), reply("x")],
                         policy=policy).run("go", store=store)
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED and record.disposition == "not_sent"
    assert record.verdict is not None and record.verdict["layer"] == "app"
    assert record.verdict["rule"]["pattern"] == "ledger/*"


async def test_parallel_calls_return_in_call_order_with_one_result_each() -> None:
    seen: list[list[ToolResultMessage]] = []
    result = await agent([
        calls([("ledger/balance", {"account": "bob"}), ("ledger/nope", {}),
               ("ledger/balance", {"account": "alice"})]),
        last_results(seen),
    ]).run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    assert [r.call_id for r in seen[0]] == ["call_0_0", "call_0_1", "call_0_2"]
    assert [r.result.structured for r in seen[0]] == [7, None, 120]


async def test_parallel_calls_really_run_concurrently() -> None:
    started = anyio.Event()
    both = {"n": 0}

    @hr.tool(mutates=False)
    async def meet() -> str:
        both["n"] += 1
        if both["n"] == 2:
            started.set()
        with anyio.fail_after(5):
            await started.wait()
        return "met"

    result = await agent([calls([("meet", {}), ("meet", {})]), reply("ok")],
                         tools=[meet]).run("go", store=hr.Store.memory())
    assert result.outcome == hr.Completed("ok")


async def test_ask_goes_to_the_approver_and_approve_all_runs_it() -> None:
    requests: list[hr.Request] = []

    async def approve(request: hr.Request) -> hr.Decision:
        requests.append(request)
        return hr.Decision.approve()

    result = await agent([call("ledger/transfer", {"source": "a", "target": "b", "amount": 3}),
                          reply("ok")]).run("go", store=hr.Store.memory(),
                                            approver=hr.CallbackApprover(approve))
    assert result.outcome == hr.Completed("ok")
    assert EXECUTED == [{"source": "a", "target": "b", "amount": 3}]
    (request,) = requests
    assert (request.act, request.target, request.tool) == (hr.Act.CALL, "ledger/transfer",
                                                           "ledger/transfer")
    assert request.arguments == {"source": "a", "target": "b", "amount": 3}
    assert request.call_id == "call_0_0"


async def test_a_denied_action_never_reaches_the_approver() -> None:
    asked: list[hr.Request] = []
    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ledger/transfer")
    await agent([call("ledger/transfer", {"source": "a", "target": "b", "amount": 3}),
                 reply("ok")], policy=policy).run(
        "go", store=hr.Store.memory(),
        approver=hr.CallbackApprover(lambda r: asked.append(r) or hr.Decision.approve()))
    assert asked == [] and EXECUTED == []


async def test_approver_denial_reaches_the_model_with_its_reason() -> None:
    seen: list[list[ToolResultMessage]] = []
    await agent([call("ledger/transfer", {"source": "a", "target": "b", "amount": 3}),
                 last_results(seen)]).run(
        "go", store=hr.Store.memory(),
        approver=hr.CallbackApprover(lambda r: hr.Decision.deny("too much money")))
    (denied,) = seen[0]
    assert denied.result.is_error and "too much money" in denied.result.render_text()
    assert EXECUTED == []


async def test_a_modified_approval_is_revalidated_and_rechecked() -> None:
    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ledger/transfer/mallory")

    class Transfer(hr.Tool, server="ledger", name="transfer"):
        """Move money."""

        source: str
        target: str
        amount: int

        def actions(self) -> list[hr.Action]:
            return [hr.Action(hr.Act.CALL, f"ledger/transfer/{self.target}")]

        async def run(self, ctx: hr.CallContext) -> str:
            EXECUTED.append(self.model_dump())
            return "ok"

    def tool_run(modified: dict[str, Any]) -> Any:
        seen: list[list[ToolResultMessage]] = []
        return seen, agent(
            [call("ledger/transfer", {"source": "a", "target": "b", "amount": 3}),
             last_results(seen)], policy=policy, tools=[Transfer],
        ).run("go", store=hr.Store.memory(),
              approver=hr.CallbackApprover(lambda r: hr.Decision.approve(modified=modified)))

    seen, run = tool_run({"source": "a", "target": "b", "amount": 1})
    await run
    assert EXECUTED == [{"source": "a", "target": "b", "amount": 1}]
    EXECUTED.clear()
    seen, run = tool_run({"source": "a", "target": "mallory", "amount": 3})
    await run
    assert EXECUTED == [] and seen[0][0].result.render_text() == hr.PolicyDenied.MODEL_MESSAGE
    seen, run = tool_run({"source": "a", "target": "b", "amount": "lots"})
    await run
    assert EXECUTED == [] and "$.amount" in seen[0][0].result.render_text()


async def test_remembered_rules_are_run_scoped_and_never_beat_a_deny(tmp_path: Path) -> None:
    box = hr.Toolbox(hr.builtin.workspace_tools())
    policy = hr.Policy.default().layer("app").deny(hr.Act.WRITE, "secret.md")
    asked: list[str] = []

    def decide(request: hr.Request) -> hr.Decision:
        asked.append(request.target)
        return hr.Decision.approve(remember=["*.md"])

    result = await hr.Agent(Scripted([
        call("workspace/write_file", {"path": "a.md", "content": "A"}),
        call("workspace/write_file", {"path": "b.md", "content": "B"}),
        call("workspace/write_file", {"path": "secret.md", "content": "S"}),
        reply("ok"),
    ]), box, policy=policy, workspace=tmp_path).run("go", store=hr.Store.memory(),
                                                    approver=hr.CallbackApprover(decide))
    assert asked == ["a.md"]
    assert (tmp_path / "b.md").read_text() == "B"
    assert not (tmp_path / "secret.md").exists()
    assert [r.pattern for r in result.remembered] == ["*.md"]


async def test_the_step_budget_fails_the_run_clearly() -> None:
    result = await agent([call("ledger/balance", {"account": "a"})] * 5,
                         max_steps=2).run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Failed) and "step budget of 2" in result.outcome.error


async def test_running_out_of_scripted_turns_fails_the_run_not_the_process() -> None:
    result = await agent([call("ledger/balance", {"account": "a"})]).run(
        "go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Failed) and "ran out of turns" in result.outcome.error


async def test_a_tool_failure_is_model_visible_and_recorded_as_landed() -> None:
    @hr.tool(mutates=False)
    async def boom() -> str:
        raise RuntimeError("disk on fire")

    store = hr.Store.memory()
    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("boom", {}), last_results(seen)], tools=[boom]).run(
        "go", store=store)
    assert "disk on fire" in seen[0][0].result.render_text() and seen[0][0].result.is_error
    (record,) = await store.calls(result.run_id)
    assert record.disposition == "landed"


async def test_a_question_is_answered_by_the_responder() -> None:
    @hr.tool(interactions={"question"}, mutates=False)
    async def pick(ctx: hr.CallContext) -> str:
        return await ctx.ask(hr.Question("which?", choices=["a", "b"]))

    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("pick", {}), last_results(seen)], tools=[pick]).run(
        "go", store=hr.Store.memory(), responder=hr.FixedResponder("b"))
    assert isinstance(result.outcome, hr.Completed)
    assert seen[0][0].result.render_text() == "b"


async def test_bad_input_to_the_agent_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(hr.UserError, match="not a directory"):
        agent([], workspace=tmp_path / "missing")
    with pytest.raises(hr.UserError, match="max_steps"):
        agent([], max_steps=0)
    with pytest.raises(hr.UserError, match="non-empty task"):
        await agent([]).run("  ")
    with pytest.raises(hr.UserError, match="model"):
        hr.Agent(object(), [])  # type: ignore[arg-type]


async def test_cancel_event_ends_the_run_as_cancelled_and_resume_continues_it() -> None:
    gate = anyio.Event()
    cancel = anyio.Event()

    @hr.tool(mutates=False, idempotent=True)
    async def slow() -> str:
        cancel.set()
        await gate.wait()
        return "slow done"

    store = hr.Store.memory()
    turns = [call("slow", {}), reply("finished")]
    result = await agent(turns, tools=[slow]).run("go", store=store, cancel=cancel)
    assert result.outcome == hr.Cancelled("cancelled by the caller")
    assert (await store.run(result.run_id)).status is hr.RunStatus.CANCELLED
    gate.set()
    resumed = await hr.resume(store, result.run_id, agent=agent(turns, tools=[slow]))
    assert resumed.outcome == hr.Completed("finished")
    assert resumed.run_id == result.run_id


def test_run_sync_works_from_sync_code() -> None:
    result = agent([call("ledger/balance", {"account": "bob"}), reply("7")]).run_sync(
        "go", store=hr.Store.memory())
    assert result.output == "7"


async def test_usage_is_recorded_per_model_call_and_summed_on_the_run() -> None:
    from handrail.models import AssistantMessage, ModelResponse, TextPart, ToolCall, Usage

    class Counting:
        name = "counting"

        async def request(self, messages: Any, tools: Any, settings: Any = None
                          ) -> ModelResponse:
            n = sum(isinstance(m, AssistantMessage) for m in messages)
            if n == 0:
                msg = AssistantMessage([ToolCall("c1", "ledger--balance", '{"account": "bob"}')])
            else:
                msg = AssistantMessage([TextPart("7")])
            return ModelResponse(msg, Usage(10 + n, 2 + n), "stop", "m-1")

    store = hr.Store.memory()
    result = await hr.Agent(Counting(), [balance]).run("go", store=store)
    assert result.usage == Usage(21, 5, 2)
    stored = [m for m in await store.messages(result.run_id) if m["kind"] == "assistant"]
    assert [m["usage"] for m in stored] == [{"input_tokens": 10, "output_tokens": 2},
                                            {"input_tokens": 11, "output_tokens": 3}]
    # The extra keys do not stop the history from loading for a resume.
    from handrail.models import load_messages

    assert isinstance(load_messages(await store.messages(result.run_id))[-1], AssistantMessage)


async def test_invalid_arguments_go_back_to_the_model_within_a_budget() -> None:
    bad = call("ledger/balance", '{"account": ')  # not even JSON
    recovered = await agent([bad, bad, call("ledger/balance", {"account": "bob"}), reply("7")],
                            max_invalid_turns=2).run("go", store=hr.Store.memory())
    assert recovered.outcome == hr.Completed("7")
    looping = await agent([bad] * 6, max_invalid_turns=2).run("go", store=hr.Store.memory())
    assert isinstance(looping.outcome, hr.Failed)
    assert "invalid tool arguments 3 turns in a row" in looping.outcome.error


async def test_a_streaming_model_reports_text_deltas_and_calls_as_events() -> None:
    from collections.abc import AsyncIterator

    from handrail.models import (
        AssistantMessage,
        ModelResponse,
        ResponseDone,
        TextDelta,
        TextPart,
        ToolCall,
        ToolCallStart,
        Usage,
    )

    class Streaming:
        name = "streaming"

        async def request(self, messages: Any, tools: Any, settings: Any = None
                          ) -> ModelResponse:
            raise AssertionError("a listener is attached: the loop must stream")

        async def request_stream(self, messages: Any, tools: Any, settings: Any = None
                                 ) -> AsyncIterator[Any]:
            if any(isinstance(m, ToolResultMessage) for m in messages):
                yield TextDelta("Bob has ")
                yield TextDelta("7.")
                yield ResponseDone(ModelResponse(AssistantMessage([TextPart("Bob has 7.")]),
                                                 Usage(1, 1), "stop"))
                return
            yield ToolCallStart("c1", "ledger--balance")
            yield ResponseDone(ModelResponse(
                AssistantMessage([ToolCall("c1", "ledger--balance", '{"account": "bob"}')]),
                Usage(1, 1), "tool_calls"))

    events: list[hr.RunEvent] = []
    result = await hr.Agent(Streaming(), [balance]).run("go", store=hr.Store.memory(),
                                                        on_event=events.append)
    assert result.output == "Bob has 7."
    kinds = [e.kind for e in events]
    assert kinds.index("call_started") < kinds.index("call_finished") < kinds.index("text_delta")
    assert "".join(e.detail["text"] for e in events if e.kind == "text_delta") == "Bob has 7."
    assert kinds[-1] == "finished"


async def test_a_search_of_a_directory_honours_deny_rules_for_each_file(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "plan.txt").write_text("TOKEN=hidden\n")
    (tmp_path / "notes.txt").write_text("TOKEN=public\n")
    policy = hr.Policy.default().layer("app").deny(hr.Act.READ, "private/**")
    seen: list[list[ToolResultMessage]] = []
    result = await hr.Agent(
        Scripted([call("workspace/search", {"pattern": "TOKEN"}), last_results(seen)]),
        hr.builtin.workspace_tools(), policy=policy, workspace=tmp_path,
    ).run("go", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Completed)
    text = seen[0][0].result.render_text()
    assert "public" in text and "hidden" not in text
    assert seen[0][0].result.structured["files_refused_by_policy"] == 1


async def test_outside_a_run_the_context_permits_everything() -> None:
    ctx = hr.CallContext(call_id="c", tool_id=hr.ToolId("local", "x"))
    assert ctx.permits(hr.Action(hr.Act.READ, ".env"))


async def test_a_refused_write_leaves_no_file_contents_in_its_record(tmp_path: Path) -> None:
    secret = "super-secret-contents-1234"
    store = hr.Store.open(tmp_path / "runs.db")
    policy = hr.Policy.default().layer("app").deny(hr.Act.WRITE, "locked/**")
    result = await hr.Agent(
        Scripted([call("workspace/write_file", {"path": "locked/a.txt", "content": secret}),
                  reply("ok")]),
        hr.builtin.workspace_tools(), policy=policy, workspace=tmp_path,
    ).run("go", store=store)
    (record,) = await store.calls(result.run_id)
    await store.close()
    assert record.status is hr.CallStatus.REFUSED
    assert record.arguments_digest is not None
    assert record.actions[0]["content_bytes"] == len(secret)
    import sqlite3

    db = sqlite3.connect(tmp_path / "runs.db")
    rows = db.execute("SELECT * FROM calls").fetchall()
    db.close()
    assert secret not in repr(rows)


async def test_the_lease_is_renewed_while_a_long_call_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started, renewed, release = anyio.Event(), anyio.Event(), anyio.Event()
    store = hr.Store.open(tmp_path / "runs.db")
    store.lease_seconds = 0.3
    write = store.write

    async def observed(batch: hr.store.Batch, *, wait: bool = True) -> None:
        await write(batch, wait=wait)
        # A write of the run alone, while the call runs, is the heartbeat's renewal.
        if started.is_set() and batch.run is not None and not batch.calls \
                and not batch.messages:
            renewed.set()

    monkeypatch.setattr(store, "write", observed)

    @hr.tool(mutates=False)
    async def slow() -> str:
        started.set()
        await release.wait()
        return "done"

    leases: list[float] = []

    async def watch() -> None:
        with anyio.fail_after(20):
            await started.wait()
            (run,) = await store.runs()
            leases.append(run.lease_until)
            await renewed.wait()
        await store.flush()
        leases.append((await store.run(run.id)).lease_until)
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        result = await agent([call("slow", {}), reply("ok")], tools=[slow]).run(
            "go", store=store)
    assert result.outcome == hr.Completed("ok")
    assert leases[1] > leases[0]  # renewed while the call ran, not only at its end
    await store.close()


async def test_an_approved_call_keeps_its_ask_verdict_beside_the_decision(tmp_path: Path
                                                                         ) -> None:
    store = hr.Store.memory()
    result = await hr.Agent(Scripted([
        call("workspace/write_file", {"path": "a.md", "content": "A"}),
        call("workspace/write_file", {"path": "b.md", "content": "B"}), reply("ok"),
    ]), hr.builtin.workspace_tools(), workspace=tmp_path).run(
        "go", store=store,
        approver=hr.CallbackApprover(lambda r: hr.Decision.approve(remember=["*.md"])))
    first, second = await store.calls(result.run_id)
    assert first.verdict is not None and first.verdict["effect"] == "ask"
    assert first.decision is not None and first.decision["kind"] == "approve"
    assert second.verdict is not None and second.verdict["layer"] == "remembered"
    assert second.decision is None


async def test_a_broken_actions_method_refuses_the_call_never_allows_it() -> None:
    ran: list[str] = []

    class Odd(hr.Tool, server="ops", name="odd", mutates=False):
        """A tool whose actions() fails."""

        def actions(self) -> list[hr.Action]:
            raise RuntimeError("cannot tell")

        async def run(self, ctx: hr.CallContext) -> str:
            ran.append("ran")
            return "ran"

    store = hr.Store.memory()
    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("ops/odd", {}), last_results(seen)], tools=[Odd]).run(
        "go", store=store)
    assert ran == [] and seen[0][0].result.is_error
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.CallStatus.REFUSED and "cannot tell" in (record.error or "")


async def test_a_timeout_reaches_the_model_as_in_doubt() -> None:
    @hr.tool(mutates=False, timeout=0.05)
    async def hang() -> str:
        await anyio.sleep_forever()
        return "never"

    store = hr.Store.memory()
    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("hang", {}), last_results(seen)], tools=[hang]).run(
        "go", store=store)
    assert "may have partly taken effect" in seen[0][0].result.render_text()
    (record,) = await store.calls(result.run_id)
    assert record.disposition == "in_doubt"


async def test_a_form_is_answered_through_the_responder_as_json() -> None:
    @hr.tool(interactions={"form"}, mutates=False)
    async def profile(ctx: hr.CallContext) -> str:
        data = await ctx.elicit({"type": "object", "properties": {"age": {"type": "integer"}},
                                 "required": ["age"]}, "How old?")
        return f"age {data['age']}"

    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("profile", {}), last_results(seen)], tools=[profile]).run(
        "go", store=hr.Store.memory(), responder=hr.FixedResponder('{"age": 42}'))
    assert isinstance(result.outcome, hr.Completed)
    assert seen[0][0].result.render_text() == "age 42"


async def test_a_form_answer_that_does_not_fit_is_a_decline_not_a_crash() -> None:
    @hr.tool(interactions={"form"}, mutates=False)
    async def profile(ctx: hr.CallContext) -> str:
        try:
            data = await ctx.elicit({"type": "object",
                                     "properties": {"age": {"type": "integer"}},
                                     "required": ["age"]}, "How old?")
        except hr.InteractionDeclined as exc:
            return f"no age: {exc.reason}"
        return f"age {data['age']}"

    seen: list[list[ToolResultMessage]] = []
    result = await agent([call("profile", {}), last_results(seen)], tools=[profile]).run(
        "go", store=hr.Store.memory(), responder=hr.FixedResponder("forty-two"))
    assert isinstance(result.outcome, hr.Completed)
    assert seen[0][0].result.render_text().startswith("no age:")


async def test_a_lone_plain_tool_that_delegated_pauses_its_turn_on_the_delegates_item() -> None:
    """Issue 38: the fast path's own body (no context, one call) takes a delegate's pause as
    `_execute` does: the call stays STARTED, the run waits on the delegate's item."""
    from handrail.gate import DelegatedPause, PausedOnQuestion

    @hr.tool(mutates=False, idempotent=True)
    async def delegate(n: int) -> int:
        """Hand the work to a run that waits for a person."""
        raise DelegatedPause(PausedOnQuestion("q-delegated"))

    store = hr.Store.memory()
    agent = hr.Agent(Scripted([call("delegate", {"n": 1}), reply("done")]), [delegate],
                     policy=hr.Policy.default())
    result = await agent.run("go", store=store)
    assert result.outcome == hr.AwaitingAnswer("q-delegated")
    (record,) = await store.calls(result.run_id)
    assert record.status is hr.store.CallStatus.STARTED and record.result is None
