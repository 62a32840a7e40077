"""Sub-agents in one process: delegation through the gate, one approver and responder for the
tree, contained policies, shared budgets, pauses anywhere resumed from the root."""

from __future__ import annotations

from pathlib import Path

import anyio
import pydantic
import pytest
from trees import (
    ROOT_POLICY,
    asking,
    echo,
    effect_tool,
    effects_of,
    note,
    three_levels,
    two_askers,
    two_children,
)

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> hr.Store:
    if request.param == "memory":
        return hr.Store.memory()
    return hr.Store.open(tmp_path / "runs.db")


async def test_a_child_runs_as_one_call_of_its_parent_and_its_output_is_the_result(
        store: hr.Store) -> None:
    @hr.tool(server="world", name="look", mutates=False)
    async def look() -> str:
        """Look around."""
        return "a tidy room"

    child = hr.Agent(Scripted([call("world/look", {}), echo]), [look], name="scout")
    root = hr.Agent(Scripted([call("agents/scout", {"task": "look around"}), echo]),
                    [child.as_tool()], name="planner", policy=ROOT_POLICY)
    result = await root.run("what is there?", store=store)
    assert result.output == "a tidy room"
    (call_record,) = await store.calls(result.run_id)
    assert call_record.tool == "agents/scout"
    assert call_record.actions == [{"act": "call", "target": "agents/scout"}]
    assert call_record.verdict is not None and call_record.verdict["effect"] == "allow"
    runs = {r.agent: r for r in await store.runs()}
    scout = runs["scout"]
    assert (scout.parent_id, scout.parent_call_id, scout.depth) == (
        result.run_id, call_record.call_id, 1)
    assert scout.task == "look around" and scout.status is hr.RunStatus.COMPLETED
    assert runs["planner"].depth == 0 and runs["planner"].parent_id is None


async def test_delegating_is_decided_by_the_parents_policy_and_the_tree_has_one_approver(
        tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    seen: list[tuple[str, tuple[str, ...]]] = []

    def approve(request: hr.Request) -> hr.Decision:
        seen.append((request.tool, request.agent_path))
        return hr.Decision.approve()

    tree = three_levels(effects)
    # Without the root's allow, the delegation itself is a mutating CALL: asked.
    tree.policy = hr.Policy.default()
    result = await tree.run("go", store=hr.Store.memory(),
                            approver=hr.CallbackApprover(approve))
    assert result.output == "effect 3 done"
    assert seen == [("agents/coder", ("planner",)),
                    ("agents/tester", ("planner", "coder")),
                    ("world/effect", ("planner", "coder", "tester"))]
    assert effects_of(effects) == ["effect 3"]


async def test_a_deferral_deep_in_the_tree_pauses_the_root_and_resumes_from_it(
        store: hr.Store, tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    paused = await three_levels(effects).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    item = await store.pending_item(paused.outcome.request_id)
    assert item.payload["agent_path"] == ["planner", "coder", "tester"]
    root = await store.run(paused.run_id)
    assert root.status is hr.RunStatus.AWAITING_APPROVAL
    assert effects_of(effects) == []

    # The item belongs to the grandchild's run; the ROOT agent resumes the whole tree.
    done = await hr.resume_with_decision(store, item.id, hr.Decision.approve(),
                                         agent=three_levels(effects))
    assert done.run_id == paused.run_id
    assert done.output == "effect 3 done"
    assert effects_of(effects) == ["effect 3"]
    runs = await store.runs()
    assert sorted((r.agent, r.depth, r.status.value) for r in runs) == [
        ("coder", 1, "completed"), ("planner", 0, "completed"), ("tester", 2, "completed")]
    with pytest.raises(hr.AlreadyDecided):
        await hr.resume_with_decision(store, item.id, hr.Decision.approve(),
                                      agent=three_levels(effects))
    assert effects_of(effects) == ["effect 3"]


async def test_a_sub_agents_item_is_not_resumed_with_the_sub_agent(tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    store = hr.Store.memory()
    paused = await three_levels(effects).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    tester = hr.Agent(Scripted([call("world/effect", {"n": 3}), echo]), [effect_tool(effects)],
                      name="tester")
    with pytest.raises(hr.ResumeRefused, match="root's agent"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=tester)
    assert (await store.pending_item(paused.outcome.request_id)).state == "open"
    assert effects_of(effects) == []


@pytest.mark.parametrize("first", ["left", "right"])
async def test_two_sub_agents_called_in_one_turn_both_defer_and_are_decided_in_any_order(
        first: str, tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    store = hr.Store.open(tmp_path / "runs.db")
    paused = await two_children(effects).run("both", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    items = {i.payload["agent_path"][-1]: i for i in await store.pending(kind="approval")}
    assert sorted(items) == ["left", "right"]
    # The root waits on the first pause in call order.
    assert paused.outcome.request_id == items["left"].id

    second = "right" if first == "left" else "left"
    middle = await hr.resume_with_decision(store, items[first].id, hr.Decision.approve(),
                                           agent=two_children(effects))
    assert isinstance(middle.outcome, hr.AwaitingApproval)
    assert middle.outcome.request_id == items[second].id
    n = {"left": 1, "right": 2}
    assert effects_of(effects) == [f"effect {n[first]}"]

    done = await hr.resume_with_decision(store, items[second].id, hr.Decision.approve(),
                                         agent=two_children(effects))
    assert done.output == "effect 1 done | effect 2 done"
    assert sorted(effects_of(effects)) == ["effect 1", "effect 2"]
    assert len(await store.runs()) == 3


async def test_a_child_cannot_write_where_the_root_may_not_even_with_its_own_allow(
        tmp_path: Path) -> None:
    written: list[str] = []

    @hr.tool(server="fs", name="put")
    async def put(path: hr.WritePath, text: str) -> str:
        """Write a file."""
        written.append(str(path))
        return "written"

    private = hr.Policy.default().layer("child").allow(hr.Act.WRITE, "private/**")
    grandchild = hr.Agent(Scripted([call("fs/put", {"path": "private/k", "text": "x"}), echo]),
                          [put], name="deep", policy=private)
    child = hr.Agent(Scripted([call("agents/deep", {"task": "write"}), echo]),
                     [grandchild.as_tool()], name="mid", policy=private)
    root_policy = ROOT_POLICY.layer("root-fs").deny(hr.Act.WRITE, "private/**")
    root = hr.Agent(Scripted([call("agents/mid", {"task": "write"}), echo]),
                    [child.as_tool()], name="root", policy=root_policy)
    result = await root.run("write the key", store=hr.Store.memory(),
                            approver=hr.ApproveAll())
    assert written == []
    assert "denied" in result.output.lower() or "policy" in result.output.lower()

    # The same grandchild alone, with its own allow, does write: the root's deny is what held.
    alone = hr.Agent(Scripted([call("fs/put", {"path": "private/k", "text": "x"}), echo]),
                     [put], name="deep", policy=private, workspace=tmp_path)
    await alone.run("write", store=hr.Store.memory(), approver=hr.ApproveAll())
    assert len(written) == 1


async def test_the_childs_allow_does_not_widen_an_ask_of_the_root() -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []

    @hr.tool(server="fs", name="put")
    async def put(path: hr.WritePath) -> str:
        """Write a file."""
        return "written"

    mine = hr.Policy.default().layer("child").allow(hr.Act.WRITE, "**")
    child = hr.Agent(Scripted([call("fs/put", {"path": "a.txt"}), echo]), [put], name="w",
                     policy=mine)
    root = hr.Agent(Scripted([call("agents/w", {"task": "write"}), echo]), [child.as_tool()],
                    name="root", policy=ROOT_POLICY)

    def record(request: hr.Request) -> hr.Decision:
        asked.append((request.target, request.agent_path))
        return hr.Decision.approve()

    result = await root.run("go", store=hr.Store.memory(), approver=hr.CallbackApprover(record))
    assert result.output == "written"
    assert asked == [("a.txt", ("root", "w"))]  # the root's default asks; the child's allow lost


async def test_remembered_rules_of_the_parent_apply_to_the_child_never_the_reverse() -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []

    @hr.tool(server="fs", name="put")
    async def put(path: hr.WritePath) -> str:
        """Write a file."""
        return f"wrote {path.name}"

    def approve_and_remember(request: hr.Request) -> hr.Decision:
        asked.append((request.target, request.agent_path))
        return hr.Decision.approve(remember=["notes/**"])

    # The child writes notes/b.txt (asked, remembered in the child), then notes/c.txt.
    child = hr.Agent(Scripted([call("fs/put", {"path": "notes/b.txt"}),
                               call("fs/put", {"path": "notes/c.txt"}), echo]),
                     [put], name="w")
    # The root writes notes/a.txt (asked, remembered in the root), delegates, then writes
    # notes/d.txt: the child's remembered rule must not have reached the root.
    root = hr.Agent(Scripted([call("fs/put", {"path": "notes/a.txt"}),
                              call("agents/w", {"task": "write"}),
                              call("fs/put", {"path": "other/d.txt"}), echo]),
                    [put, child.as_tool()], name="root", policy=ROOT_POLICY)
    result = await root.run("go", store=hr.Store.memory(),
                            approver=hr.CallbackApprover(approve_and_remember))
    # notes/** remembered by the root covers both of the child's writes: asked once, by root.
    assert asked == [("notes/a.txt", ("root",)), ("other/d.txt", ("root",))]
    assert "wrote d.txt" in result.output

    asked.clear()
    # Now only the child remembers: its rule stays in the child.
    child2 = hr.Agent(Scripted([call("fs/put", {"path": "notes/b.txt"}),
                                call("fs/put", {"path": "notes/c.txt"}), echo]),
                      [put], name="w")
    root2 = hr.Agent(Scripted([call("agents/w", {"task": "write"}),
                               call("fs/put", {"path": "notes/d.txt"}), echo]),
                     [put, child2.as_tool()], name="root", policy=ROOT_POLICY)
    await root2.run("go", store=hr.Store.memory(),
                    approver=hr.CallbackApprover(approve_and_remember))
    assert asked == [("notes/b.txt", ("root", "w")), ("notes/d.txt", ("root",))]


async def test_one_responder_answers_the_tree_and_sees_who_asks(tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    heard: list[tuple[str, tuple[str, ...]]] = []

    class Note:
        async def answer(self, question: hr.Question) -> str | None:
            heard.append((question.question, tuple(question.agent_path)))
            return "blue"

    result = await asking(effects).run("paint", store=hr.Store.memory(), responder=Note())
    assert result.output == "painted blue"
    assert heard == [("Which colour?", ("planner", "painter"))]


async def test_a_childs_question_pauses_the_root_and_an_answer_resumes_it(
        store: hr.Store, tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    paused = await asking(effects).run("paint", store=store)
    assert isinstance(paused.outcome, hr.AwaitingAnswer)
    item = await store.pending_item(paused.outcome.question_id)
    assert item.payload["agent_path"] == ["planner", "painter"]
    done = await hr.resume_with_answer(store, item.id, "red", agent=asking(effects))
    assert done.output == "painted red"
    assert effects_of(effects) == ["painted red"]


async def test_a_renamed_child_is_refused_on_resume_and_the_refusal_is_recorded(
        store: hr.Store, tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    paused = await three_levels(effects).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    renamed = three_levels(effects, tester_name="checker")
    with pytest.raises(hr.ResumeRefused, match=r"tester.*no longer among the tools"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=renamed)
    # Nothing was decided, nothing ran, and the root says why it was refused.
    assert (await store.pending_item(paused.outcome.request_id)).state == "open"
    assert effects_of(effects) == []
    root = await store.run(paused.run_id)
    assert [e["kind"] for e in root.events if e["kind"] == "resume_refused"] == [
        "resume_refused"]
    with pytest.raises(hr.ResumeRefused, match="no longer among the tools"):
        await hr.resume(store, paused.run_id, agent=renamed)
    # The tree as it was still resumes.
    done = await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                         agent=three_levels(effects))
    assert done.output == "effect 3 done"


async def test_a_child_whose_manifest_changed_is_refused_on_resume(tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    store = hr.Store.memory()
    paused = await three_levels(effects).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    tester = await _run_of(store, "tester")
    tester.manifest_digest = "sha256:another"
    await store.write(hr.store.Batch(run=tester))
    with pytest.raises(hr.ResumeRefused, match="manifest"):
        await hr.resume_with_decision(store, paused.outcome.request_id, hr.Decision.approve(),
                                      agent=three_levels(effects))
    assert effects_of(effects) == []


async def _run_of(store: hr.Store, agent: str) -> hr.RunRecord:
    (run,) = [r for r in await store.runs() if r.agent == agent]
    return run


async def test_budgets_exhausted_by_a_child_end_the_tree_failed_with_the_reason() -> None:
    @hr.tool(server="world", name="spin", mutates=False)
    async def spin() -> str:
        """Spin."""
        return "again"

    child = hr.Agent(Scripted([call("world/spin", {})] * 20), [spin], name="spinner")
    root = hr.Agent(Scripted([call("agents/spinner", {"task": "spin"}), echo]),
                    [child.as_tool()], name="root", policy=ROOT_POLICY, max_steps=5)
    store = hr.Store.memory()
    result = await root.run("go", store=store)
    assert isinstance(result.outcome, hr.Failed)
    assert "tree's step budget of 5" in result.outcome.error
    assert "root/spinner" in result.outcome.error
    spinner = await _run_of(store, "spinner")
    assert spinner.status is hr.RunStatus.FAILED and spinner.steps == 4  # 1 + 4 = 5
    assert spinner.outcome is not None and "tree's step budget" in spinner.outcome["error"]


async def test_a_childs_own_max_steps_fails_only_the_child() -> None:
    @hr.tool(server="world", name="spin", mutates=False)
    async def spin() -> str:
        """Spin."""
        return "again"

    child = hr.Agent(Scripted([call("world/spin", {})] * 20), [spin], name="spinner",
                     max_steps=2)
    root = hr.Agent(Scripted([call("agents/spinner", {"task": "spin"}), echo]),
                    [child.as_tool()], name="root", policy=ROOT_POLICY)
    result = await root.run("go", store=hr.Store.memory())
    assert "The sub-agent 'spinner' failed: the step budget of 2" in result.output


async def test_cycles_and_depth_are_refused_when_the_tree_is_built() -> None:
    a = hr.Agent(Scripted([reply("a")]), [], name="a")
    b = hr.Agent(Scripted([reply("b")]), [a.as_tool()], name="b")
    a.toolbox.add(b.as_tool())
    with pytest.raises(hr.UserError, match=r"cycle: .*a -> b -> a"):
        await a.run("go", store=hr.Store.memory())
    with pytest.raises(hr.UserError, match="cycle"):
        b.as_tool()

    level = hr.Agent(Scripted([reply("x")]), [], name="l0")
    for i in range(1, 6):  # as_tool never limits the depth: the root does, when it runs
        level = hr.Agent(Scripted([reply("x")]), [level.as_tool()], name=f"l{i}")
    with pytest.raises(hr.UserError, match="deeper than 4 levels"):
        await level.run("go", store=hr.Store.memory())
    deeper = hr.Agent(Scripted([reply("x")]), [level.as_tool()], name="l6")
    deeper.max_depth = 6
    assert (await deeper.run("go", store=hr.Store.memory())).output == "x"
    level.max_depth = 5
    assert (await level.run("go", store=hr.Store.memory())).output == "x"


async def test_a_sub_agent_works_in_its_parents_workspace(tmp_path: Path) -> None:
    child = hr.Agent(Scripted([reply("x")]), [], name="c", workspace=tmp_path)
    root = hr.Agent(Scripted([reply("y")]), [child.as_tool()], name="r")
    with pytest.raises(hr.UserError, match="parent's workspace"):
        await root.run("go", store=hr.Store.memory())


async def test_a_sub_agent_needs_a_name_and_a_typed_input_is_its_arguments() -> None:
    with pytest.raises(hr.UserError, match="needs a name"):
        hr.Agent(Scripted([reply("x")]), []).as_tool()

    class Job(pydantic.BaseModel):
        title: str
        priority: int

        @pydantic.field_validator("priority")
        @classmethod
        def positive(cls, value: int) -> int:
            if value < 1:
                raise ValueError("priority starts at 1")
            return value

    child = hr.Agent(Scripted([lambda m, t: reply(m[-1].text)]), [], name="worker")
    tool = child.as_tool(input_type=Job, description="Do a job.")
    assert tool.spec.input_schema["required"] == ["title", "priority"]
    root = hr.Agent(Scripted([call("agents/worker", {"title": "t", "priority": "high"}),
                              call("agents/worker", {"title": "t", "priority": 0}),
                              call("agents/worker", {"title": "t", "priority": 2}), echo]),
                    [tool], name="root", policy=ROOT_POLICY)
    store = hr.Store.memory()
    result = await root.run("go", store=store)
    first, second, third = await store.calls(result.run_id)
    # The schema and the model's own validator both refuse at stage 3: nothing ran.
    assert first.status is second.status is hr.CallStatus.REFUSED
    assert second.result is not None and "priority starts at 1" in str(second.result)
    assert third.status is hr.CallStatus.FINISHED
    assert '{"title":"t","priority":2}' in result.output
    assert [r.agent for r in await store.runs()].count("worker") == 1


async def test_a_cancel_mid_child_sends_its_call_to_recovery_never_re_running_it(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    effects = str(tmp_path / "effects")
    entered = anyio.Event()

    def build(block: bool) -> hr.Agent:
        @hr.tool(server="world", name="slow")
        async def slow() -> str:
            """Act, slowly."""
            note(effects, "slow")
            if block:
                entered.set()
                await anyio.sleep_forever()
            return "slow done"

        child = hr.Agent(Scripted([call("world/slow", {}), echo]), [slow], name="worker")
        return hr.Agent(Scripted([call("agents/worker", {"task": "go"}), echo]),
                        [child.as_tool()], name="root", policy=ROOT_POLICY)

    handle = build(block=True).start("go", store=store, approver=hr.ApproveAll())
    async with anyio.create_task_group() as tg:
        async def stop() -> None:
            with anyio.fail_after(30):
                await entered.wait()
            handle.cancel()
        tg.start_soon(stop)
        cancelled = await handle.result()
    assert isinstance(cancelled.outcome, hr.Cancelled)
    assert effects_of(effects) == ["slow"]

    resumed = await hr.resume(store, cancelled.run_id, agent=build(block=False),
                              approver=hr.ApproveAll())
    assert isinstance(resumed.outcome, hr.AwaitingRecovery)
    worker = await _run_of(store, "worker")
    assert resumed.outcome.call_id.startswith(worker.id + ":")
    assert effects_of(effects) == ["slow"]  # the child's call was not re-run blindly
    done = await hr.resume_with_recovery(store, resumed.outcome.call_id,
                                         hr.Recovery.completed("it did run"),
                                         agent=build(block=False))
    assert done.output == "it did run"
    assert effects_of(effects) == ["slow"]
    assert len(await store.runs()) == 2


async def test_a_run_started_with_a_parent_run_id_is_not_a_sub_agents_run(
        tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("world/effect", {"n": 7}), echo]),
                        [effect_tool(effects)], name="alone")

    store = hr.Store.open(tmp_path / "runs.db")
    other = await hr.Agent(Scripted([reply("hi")]), [], name="other").run("hi", store=store)
    paused = await build().run("go", store=store, parent_run_id=other.run_id)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    assert (await store.run(paused.run_id)).depth == 0
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=build())
    assert done.run_id == paused.run_id and done.output == "effect 7 done"


async def test_the_trees_spent_budget_is_restored_when_it_resumes(tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")

    def build() -> hr.Agent:
        @hr.tool(server="world", name="look", mutates=False)
        async def look() -> str:
            """Look."""
            return "seen"

        child = hr.Agent(Scripted([call("world/look", {}), call("world/look", {}),
                                   call("world/effect", {"n": 1}), echo]),
                         [look, effect_tool(effects)], name="worker")
        return hr.Agent(Scripted([call("agents/worker", {"task": "go"}), echo]),
                        [child.as_tool()], name="root", policy=ROOT_POLICY, max_steps=4)

    store = hr.Store.open(tmp_path / "runs.db")
    paused = await build().run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)  # 1 + 3 model turns spent
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=build())
    assert isinstance(done.outcome, hr.Failed)
    assert "tree's step budget of 4" in done.outcome.error
    assert effects_of(effects) == ["effect 1"]  # the approved call ran, then the budget held


async def test_a_typed_child_returns_its_output_as_json_and_a_denied_delegation_starts_none(
        ) -> None:
    class Verdict(pydantic.BaseModel):
        ok: bool
        note: str

    judge = hr.Agent(Scripted([call("handrail/final_result", {"ok": True, "note": "fine"})]),
                     [], name="judge", output_type=Verdict)
    root = hr.Agent(Scripted([call("agents/judge", {"task": "judge it"}), echo]),
                    [judge.as_tool()], name="root", policy=ROOT_POLICY)
    store = hr.Store.memory()
    result = await root.run("go", store=store)
    (record,) = await store.calls(result.run_id)
    assert record.result is not None and record.result["structured"] == {"ok": True,
                                                                         "note": "fine"}

    # A child that may change the world (a mutating tool): the default policy asks before
    # delegating to it, and a person's deny means no child run at all.
    writer = hr.Agent(Scripted([call("world/effect", {"n": 1}), echo]),
                      [effect_tool("/nonexistent/never-written")], name="judge")
    asking_root = hr.Agent(Scripted([call("agents/judge", {"task": "judge it"}), echo]),
                           [writer.as_tool()], name="root")
    store = hr.Store.memory()
    denied = await asking_root.run("go", store=store, approver=hr.CallbackApprover(
        lambda request: hr.Decision.deny("not now")))
    assert "not now" in denied.output
    assert [r.agent for r in await store.runs()] == ["root"]  # no child run was started


@pytest.mark.parametrize("first", ["wall", "door"])
async def test_two_read_only_sub_agents_run_concurrently_both_ask_and_are_answered_in_any_order(
        first: str, tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    store = hr.Store.open(tmp_path / "runs.db")
    tree = two_askers(effects)
    assert [t.spec.mutates for t in tree.toolbox.impls()] == [False, False]
    paused = await tree.run("paint", store=store)
    assert isinstance(paused.outcome, hr.AwaitingAnswer)
    items = {i.payload["agent_path"][-1]: i for i in await store.pending(kind="question")}
    assert sorted(items) == ["door", "wall"]
    second = "door" if first == "wall" else "wall"
    middle = await hr.resume_with_answer(store, items[first].id, "red",
                                         agent=two_askers(effects))
    assert isinstance(middle.outcome, hr.AwaitingAnswer)
    assert middle.outcome.question_id == items[second].id
    done = await hr.resume_with_answer(store, items[second].id, "blue",
                                       agent=two_askers(effects))
    colours = {first: "red", second: "blue"}
    assert done.output == f"wall {colours['wall']} | door {colours['door']}"
    assert sorted(effects_of(effects)) == sorted(f"{k} {v}" for k, v in colours.items())


async def test_the_roots_listener_hears_every_run_of_the_tree_and_one_end(
        tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    heard: list[tuple[str, str]] = []
    store = hr.Store.memory()
    result = await three_levels(effects).run(
        "go", store=store, approver=hr.ApproveAll(),
        on_event=lambda event: heard.append((event.run_id, event.kind)))
    assert result.output == "effect 3 done"
    runs = {r.agent: r.id for r in await store.runs()}
    tester_calls = [kind for run, kind in heard if run == runs["tester"]]
    assert "call_finished" in tester_calls and "model_turn" in tester_calls
    assert [run for run, kind in heard if kind in ("paused", "finished")] == [result.run_id]
    # The root's own events come in order around its children's.
    root_kinds = [kind for run, kind in heard if run == result.run_id]
    assert root_kinds[-1] == "finished" and "call_finished" in root_kinds


async def test_modified_arguments_of_a_sub_agents_call_are_checked_against_its_tool(
        tmp_path: Path) -> None:
    effects = str(tmp_path / "effects")
    store = hr.Store.memory()
    paused = await three_levels(effects).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    request_id = paused.outcome.request_id
    with pytest.raises(hr.UserError, match="do not fit world/effect"):
        await hr.resume_with_decision(store, request_id,
                                      hr.Decision.approve(modified={"n": "five"}),
                                      agent=three_levels(effects))
    assert (await store.pending_item(request_id)).state == "open"
    done = await hr.resume_with_decision(store, request_id,
                                         hr.Decision.approve(modified={"n": 5}),
                                         agent=three_levels(effects))
    assert done.output == "effect 5 done"
    assert effects_of(effects) == ["effect 5"]
