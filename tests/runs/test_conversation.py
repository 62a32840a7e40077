"""Conversations: a completed run continued with the next message, in one process or many."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import forks
import pytest

import handrail as hr
from handrail.models import Scripted, SystemMessage, UserMessage, call, reply

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


@hr.tool(server="ledger")
async def pay(amount: int) -> str:
    """Pay."""
    return f"paid {amount}"


def echo(messages: Any, tools: Any) -> Any:
    return reply(" | ".join(m.text for m in messages if isinstance(m, UserMessage)))


async def test_a_conversation_keeps_the_history_and_the_remembered_rules(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    agent = hr.Agent(Scripted([call("ledger/pay", {"amount": 1}), echo,
                               call("ledger/pay", {"amount": 2}), echo]), [pay])
    remember = hr.CallbackApprover(lambda request: hr.Decision.approve(remember=["ledger/pay"]))
    chat = hr.Conversation(agent, store=store)
    first = await chat.send("pay one", approver=remember)
    assert first.output == "pay one"
    assert first.remembered
    # no approver now: the remembered rule allows the second payment
    second = await chat.send("pay two")
    assert second.output == "pay one | pay two"
    assert second.run_id != first.run_id
    runs = await chat.runs()
    assert [r.id for r in runs] == [first.run_id, second.run_id]
    assert next(e for e in runs[1].events if e["kind"] == "continues")["run"] == first.run_id


async def test_the_recorded_policy_stays_the_boundary_of_a_continued_run(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    strict = hr.Policy.default().layer("no-pay").deny("call", "ledger/pay")
    first = await hr.Agent(Scripted([reply("hi")]), [pay], policy=strict).run(
        "hello", store=store)
    loose = hr.Agent(Scripted([reply("hi"), call("ledger/pay", {"amount": 1}), echo]), [pay])
    second = await loose.run("pay", store=store, continue_run=first.run_id,
                             approver=hr.ApproveAll())
    assert second.output == "hello | pay"
    (record,) = await store.calls(second.run_id)
    assert record.verdict is not None and record.verdict["effect"] == "deny"


async def test_only_a_completed_run_is_continued_and_the_error_says_the_next_step(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    agent = hr.Agent(Scripted([call("ledger/pay", {"amount": 1}), echo, echo]), [pay])
    paused = await agent.run("pay", store=store)
    with pytest.raises(hr.UserError, match=f"handrail approve {paused.outcome.request_id}"):
        await agent.run("more", store=store, continue_run=paused.run_id)
    # paused mid-conversation, decided, then continued
    done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                         hr.Decision.approve(), agent=agent)
    assert done.output == "pay"
    after = await agent.run("more", store=store, continue_run=done.run_id)
    assert after.output == "pay | more"


async def test_message_history_starts_a_run_from_given_messages() -> None:
    agent = hr.Agent(Scripted([echo, echo]), [pay], instructions="be brief")
    seen: list[Any] = []

    def spy(messages: Any, tools: Any) -> Any:
        seen.extend(messages)
        return echo(messages, tools)

    agent = hr.Agent(Scripted([spy, spy]), [pay], instructions="be brief")
    history = [UserMessage("earlier")]
    result = await agent.run("now", message_history=history)
    assert result.output == "earlier | now"
    assert isinstance(seen[0], SystemMessage)
    with pytest.raises(hr.UserError, match="not a handrail message"):
        await agent.run("now", message_history=["earlier"])
    with pytest.raises(hr.UserError, match="not both"):
        await agent.run("now", message_history=history, continue_run="x")


def test_a_three_message_conversation_across_processes_with_a_pause(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")

    def step(*args: str) -> dict[str, Any]:
        code, stdout, stderr = forks.shared().run(HERE / "conversing.py", [db, *args], {},
                                                  tmp_path, timeout=120)
        assert code == 0, stderr
        return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    one = step("send", "-", "hello")
    assert one["output"] == "hello"
    two = step("send", one["run_id"], "pay")
    assert two["outcome"] == "awaiting_approval"
    two = step("approve", two["request_id"])
    assert two["output"] == "hello | pay"
    three = step("send", two["run_id"], "bye")
    assert three["output"] == "hello | pay | bye"

    env = {**os.environ, "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "handrail.cli", "--store", db, "show",
                            three["run_id"], "--json"], capture_output=True, text=True,
                           env=env, timeout=60, check=True)
    data = json.loads(shown.stdout)
    assert data["conversation"] == [one["run_id"], two["run_id"], three["run_id"]]
    assert [c["tool"] for c in data["calls"]] == ["ledger/pay"]
    text = subprocess.run([sys.executable, "-m", "handrail.cli", "--store", db, "show",
                           two["run_id"]], capture_output=True, text=True, env=env,
                          timeout=60, check=True).stdout
    assert f"conversation: {one['run_id']} (completed) -> {two['run_id']} (this) -> " \
           f"{three['run_id']} (completed)" in text


async def test_a_branch_holds_exactly_the_runs_it_continues(tmp_path: Path) -> None:
    from handrail.runs import thread

    store = hr.Store.open(tmp_path / "runs.db")
    agent = hr.Agent(Scripted([echo] * 5), [pay])
    root = await agent.run("root", store=store)
    left = await agent.run("left", store=store, continue_run=root.run_id)
    right = await agent.run("right", store=store, continue_run=root.run_id)
    assert right.output == "root | right"  # the left branch is not in its history
    chain = await thread(store, await store.run(right.run_id))
    assert [r.id for r in chain] == [root.run_id, right.run_id]
    chain = await thread(store, await store.run(left.run_id))
    assert [r.id for r in chain][:2] == [root.run_id, left.run_id]
    await store.close()
