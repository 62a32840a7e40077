"""The promises a run rests on, each through the public API (see issue 25's planted bugs).

Every test here names the promise it guards; `scripts/mutants` plants the bug that breaks it
and expects the test to fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import forks
import pytest

import handrail as hr
from handrail.gate import NOT_GRANTED_MESSAGE, Gate, RunScope
from handrail.manifest import Manifest
from handrail.models import Scripted, ToolCall, ToolResultMessage, Turn, call, reply
from handrail.store import Batch

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> hr.Store:
    return hr.Store.memory() if request.param == "memory" else hr.Store.open(tmp_path / "r.db")


def _echo_all(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    return reply(" | ".join(m.result.render_text() for m in messages
                            if isinstance(m, ToolResultMessage)))


# ------------------------------------------- a finished call is never re-entered on resume

SCRIPT = Path(__file__).with_name("resumable.py")


def _drive(tmp: Path, *args: str) -> dict[str, Any]:
    code, stdout, stderr = forks.shared().run(
        SCRIPT, [str(tmp / "runs.db"), str(tmp / "effects"), *args], {}, tmp, timeout=120)
    assert code == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_finished_call_beside_a_deferred_one_never_runs_again_when_another_process_resumes(
        tmp_path: Path) -> None:
    first = _drive(tmp_path, "start")
    assert first["outcome"] == "awaiting_approval", first
    assert (tmp_path / "effects").read_text().split("\n")[:-1] == ["count"]
    second = _drive(tmp_path, "decide", first["detail"]["request_id"])
    assert second["pid"] != first["pid"]
    assert second["outcome"] == "completed", second
    # Each body ran exactly once, and the model was shown the first process's result for
    # the call that finished before the pause: reused, not recomputed.
    assert sorted((tmp_path / "effects").read_text().split("\n")[:-1]) == ["count",
                                                                            "effect 1"]
    assert second["detail"]["output"] == (f"counted in {first['pid']} | "
                                          f"effect 1 in {second['pid']}")


# ------------------------------------------- the recorded policy stays the boundary

@hr.tool(server="ops", name="deploy")
async def deploy(service: str) -> str:
    """Deploy a service."""
    RAN.append(f"deploy {service}")
    return f"deployed {service}"


@hr.tool(server="ops", name="drop")
async def drop(table: str) -> str:
    """Drop a table."""
    RAN.append(f"drop {table}")
    return f"dropped {table}"


async def test_a_run_resumed_by_a_permissive_agent_still_refuses_what_its_policy_denied(
        store: hr.Store) -> None:
    recorded = hr.Policy.default().layer("app").deny(hr.Act.CALL, "ops/drop")

    def build(policy: hr.Policy) -> hr.Agent:
        return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}),
                                  call("ops/drop", {"table": "users"}), _echo_all]),
                        [deploy, drop], policy=policy)

    paused = await build(recorded).run("go", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(),
                                         agent=build(hr.Policy.permissive()))
    assert done.outcome == hr.Completed(f"deployed web | {hr.PolicyDenied.MODEL_MESSAGE}")
    assert RAN == ["deploy web"]
    drop_record = (await store.calls(paused.run_id))[-1]
    assert drop_record.status is hr.CallStatus.REFUSED
    assert drop_record.verdict is not None and drop_record.verdict["effect"] == "deny"


# ------------------------------------------- stage 2: grant, at the gate itself

@hr.tool(server="ledger", mutates=False)
async def read(account: str) -> int:
    """Read a balance."""
    RAN.append("read")
    return 1


@hr.tool(server="ledger", mutates=False)
async def wipe(account: str) -> str:
    """Wipe an account (read-only by its word, so the policy alone would allow it)."""
    RAN.append("wipe")
    return "wiped"


GRANTS_READ = """
[[tools]]
ref = "ledger/read"
mutates = false
description = "Read one account's balance."
"""


async def test_the_grant_stage_refuses_a_tool_in_the_toolbox_the_manifest_does_not_grant(
        tmp_path: Path) -> None:
    # An Agent refuses such a toolbox at construction; the gate must not rely on that (a
    # toolset may grow after the check), so drive the gate directly.
    store = hr.Store.memory()
    scope = RunScope(run_id="r1", agent="a", toolbox=hr.Toolbox([read, wipe]),
                     policy=hr.Policy.permissive(), store=store, approver=hr.ApproveAll(),
                     responder=hr.ResponderNone(), workspace=tmp_path,
                     manifest=Manifest.from_toml(GRANTS_READ))
    gate = Gate(scope)
    assert [str(s.id) for s in gate.offered()] == ["ledger/read"]
    turn = await gate.drive_turn(0, [ToolCall("c1", wipe.spec.id.model_name, '{"account": "a"}'),
                                     ToolCall("c2", read.spec.id.model_name, '{"account": "a"}')],
                                 {}, Batch())
    wiped, read_ = turn.final.calls
    assert [r.result.render_text() for r in turn.results] == [NOT_GRANTED_MESSAGE, "1"]
    assert wiped.status is hr.CallStatus.REFUSED and wiped.disposition == "not_sent"
    assert "not granted" in (wiped.error or "")
    assert read_.status is hr.CallStatus.FINISHED
    assert RAN == ["read"]


# ------------------------------------------- recovery: every choice is recorded truthfully

async def _in_doubt(store: hr.Store) -> tuple[hr.RunResult, hr.CallRecord]:
    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), _echo_all]),
                        [deploy])

    paused = await build().run("go", store=store)
    (record,) = await store.calls(paused.run_id)
    assert record.pending_id is not None
    await store.decide(record.pending_id, hr.Decision.approve().to_dict(), "operator")
    run = await store.run(paused.run_id)
    # What a process killed mid-call leaves: the call STARTED, the run RUNNING, owner gone.
    await store.write(Batch(
        run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
        calls=[dataclasses.replace(record, status=hr.CallStatus.STARTED,
                                   decision=hr.Decision.approve().to_dict())]))
    again = await hr.resume(store, paused.run_id, agent=build())
    assert again.outcome == hr.AwaitingRecovery(record.id)
    (doubt,) = await store.calls(paused.run_id)
    assert doubt.status is hr.CallStatus.IN_DOUBT
    return again, record


@pytest.mark.parametrize(("choice", "disposition", "output", "ran"), [
    (hr.Recovery.retry(), None, "deployed web", ["deploy web"]),
    (hr.Recovery.completed("saw it deployed"), "landed", "saw it deployed", []),
    (hr.Recovery.abort(), "in_doubt", "The operator aborted this call after an interruption; "
                                      "it may or may not have taken effect.", []),
])
async def test_every_recovery_choice_is_recorded_with_its_disposition(
        store: hr.Store, choice: hr.Recovery, disposition: str | None, output: str,
        ran: list[str]) -> None:
    paused, record = await _in_doubt(store)
    done = await hr.resume_with_recovery(store, record.id, choice, agent=hr.Agent(
        Scripted([call("ops/deploy", {"service": "web"}), _echo_all]), [deploy]),
        approver=hr.ApproveAll(), decided_by="alice")
    assert done.outcome == hr.Completed(output)
    assert RAN == ran
    (final,) = await store.calls(paused.run_id)
    assert final.status is hr.CallStatus.FINISHED
    assert final.disposition == disposition
    assert final.result is not None and (final.result.get("is_error", False)
                                         is (choice.kind == "abort"))
    item = await store.pending_item(record.id)
    assert (item.state, item.decided_by, item.decision) == ("decided", "alice",
                                                            choice.to_dict())


# ------------------------------------------- a live owner keeps its run

async def test_a_live_foreign_lease_refuses_take_over(store: hr.Store) -> None:
    agent = hr.Agent(Scripted([call("ops/deploy", {"service": "web"}), _echo_all]), [deploy])
    paused = await agent.run("go", store=store)
    run = await store.run(paused.run_id)
    # Another machine drives it and renewed its lease a moment ago.
    await store.write(Batch(run=dataclasses.replace(
        run, status=hr.RunStatus.RUNNING, outcome=None, owner="another-host:4242:abcd",
        lease_until=time.time() + 60)))
    with pytest.raises(hr.ResumeRefused, match="driven by another-host"):
        await hr.resume(store, paused.run_id, agent=agent, approver=hr.ApproveAll())
    assert paused.outcome is not None and isinstance(paused.outcome, hr.AwaitingApproval)
    with pytest.raises(hr.ResumeRefused):
        await hr.resume_with_decision(store, paused.outcome.request_id,
                                      hr.Decision.approve(), agent=agent)
    assert RAN == []
    # A live process of this machine keeps its run even after its lease has lapsed.
    await store.write(Batch(run=dataclasses.replace(
        run, status=hr.RunStatus.RUNNING, outcome=None,
        owner=f"{socket.gethostname()}:{os.getppid()}:x",
        lease_until=time.time() - 60)))
    with pytest.raises(hr.ResumeRefused, match="driven by"):
        await hr.resume(store, paused.run_id, agent=agent)


# ------------------------------------------- remembered rules outlive a pause

async def test_rules_an_approver_remembered_still_hold_after_the_run_is_resumed(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    (tmp_path / "ws").mkdir()

    def build() -> hr.Agent:
        return hr.Agent(Scripted([
            call("workspace/write_file", {"path": "a.md", "content": "a"}),
            call("ops/deploy", {"service": "web"}),
            call("workspace/write_file", {"path": "b.md", "content": "b"}),
            _echo_all]), [*hr.builtin.workspace_tools(), deploy], workspace=tmp_path / "ws")

    def decide(request: hr.Request) -> hr.Decision:
        if request.act is hr.Act.WRITE:
            return hr.Decision.approve(remember=["*.md"])
        return hr.Decision.defer()

    paused = await build().run("go", store=store, approver=hr.CallbackApprover(decide))
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    # Resumed with the default approver (it defers everything): b.md is allowed by the rule
    # remembered before the pause, so nothing is asked.
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=build())
    assert isinstance(done.outcome, hr.Completed), done.outcome
    assert (tmp_path / "ws" / "b.md").read_text() == "b"
    last = (await store.calls(paused.run_id))[-1]
    assert last.verdict is not None and last.verdict["layer"] == "remembered"
    await store.close()


async def test_a_turn_of_one_call_with_invalid_arguments_is_refused_before_the_body(
        tmp_path: Path) -> None:
    # The gate's fast path (issue 38) decides stages 1-2 and 5 from the tool's plan, never
    # stage 3: arguments that do not fit the schema (well-formed JSON, wrong types or a field
    # missing) are refused as InvalidArguments, returned to the model, and the body never
    # runs, exactly as on the general stages.
    scope = RunScope(run_id="r1", agent="a", toolbox=hr.Toolbox([read]),
                     policy=hr.Policy.default(), store=hr.Store.memory(),
                     approver=hr.ApproveAll(), responder=hr.ResponderNone(),
                     workspace=tmp_path, mark_reads=False)
    gate = Gate(scope)
    name = read.spec.id.model_name
    for turn_index, arguments in enumerate(['{"account": ["a"]}', "{}", '{"account": null}']):
        turn = await gate.drive_turn(turn_index, [ToolCall(f"c{turn_index}", name, arguments)],
                                     {}, Batch())
        (refused,) = turn.final.calls
        assert refused.status is hr.CallStatus.REFUSED, refused
        assert refused.disposition == hr.Disposition.NOT_SENT.value
        assert (refused.error or "").startswith("invalid arguments"), refused.error
        (result,) = turn.results
        assert result.result.is_error
        assert RAN == []
    turn = await gate.drive_turn(3, [ToolCall("c3", name, '{"account": "a"}')], {}, Batch())
    assert [r.result.render_text() for r in turn.results] == ["1"]
    assert RAN == ["read"]


async def test_a_fast_path_record_shares_nothing_with_the_next_calls(tmp_path: Path) -> None:
    # The fast path (issue 38) copies the plan's action and verdict records into each call's
    # record: what one record's reader changes (a listener, a caller of the gate) never
    # reaches the next call's record.
    scope = RunScope(run_id="r1", agent="a", toolbox=hr.Toolbox([read]),
                     policy=hr.Policy.default(), store=hr.Store.memory(),
                     approver=hr.ApproveAll(), responder=hr.ResponderNone(),
                     workspace=tmp_path, mark_reads=False)
    gate = Gate(scope)
    name = read.spec.id.model_name
    first = await gate.drive_turn(0, [ToolCall("c0", name, '{"account": "a"}')], {}, Batch())
    (record,) = first.final.calls
    assert record.actions == [{"act": "call", "target": "ledger/read"}]
    assert record.verdict is not None and record.verdict["effect"] == "allow"
    # Every field the fast path does not set is the record's default, a list its own.
    assert (record.decision, record.decided_by, record.pending_id, record.answers) == (
        None, None, None, [])
    assert (record.turn, record.index, record.tool, record.arguments) == (
        0, 0, "ledger/read", '{"account": "a"}')
    record.actions[0]["target"] = "changed"
    record.actions.append({"act": "call", "target": "more"})
    record.verdict["effect"] = "changed"
    record.answers.append({"kind": "submit"})
    second = await gate.drive_turn(1, [ToolCall("c1", name, '{"account": "b"}')], {}, Batch())
    (again,) = second.final.calls
    assert again.actions == [{"act": "call", "target": "ledger/read"}]
    assert again.verdict is not None and again.verdict["effect"] == "allow"
    assert again.answers == []


async def test_a_turn_of_one_call_to_a_tool_not_granted_is_refused(tmp_path: Path) -> None:
    # A turn of one call takes the gate's fast path when its tool's plan allows it (issue
    # 38): the grant is part of that plan, and a call to a tool the manifest does not grant
    # is refused there as on the general stages, never run.
    scope = RunScope(run_id="r1", agent="a", toolbox=hr.Toolbox([read, wipe]),
                     policy=hr.Policy.permissive(), store=hr.Store.memory(),
                     approver=hr.ApproveAll(), responder=hr.ResponderNone(),
                     workspace=tmp_path, manifest=Manifest.from_toml(GRANTS_READ),
                     mark_reads=False)
    gate = Gate(scope)
    turn = await gate.drive_turn(0, [ToolCall("c1", wipe.spec.id.model_name,
                                              '{"account": "a"}')], {}, Batch())
    (wiped,) = turn.final.calls
    assert [r.result.render_text() for r in turn.results] == [NOT_GRANTED_MESSAGE]
    assert wiped.status is hr.CallStatus.REFUSED and "not granted" in (wiped.error or "")
    assert RAN == []
    turn = await gate.drive_turn(1, [ToolCall("c2", read.spec.id.model_name,
                                              '{"account": "a"}')], {}, Batch())
    assert [r.result.render_text() for r in turn.results] == ["1"]
    assert RAN == ["read"]
