"""`hr.InboxApprover`: a long-lived process waits in-process for the inbox's decision."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import inbox_agents
import pytest
from inbox_support import Inbox, run_store, wait_until

import handrail as hr

pytestmark = pytest.mark.anyio

WRITE = "workspace/write_file"


async def _wait_for_item(store: hr.Store) -> hr.PendingItem:
    with anyio.fail_after(20):
        while True:
            items = await store.pending()
            if items:
                return items[0]
            await anyio.sleep(0.02)


async def test_a_decision_unblocks_the_waiting_run_without_a_resume(tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    approver = hr.InboxApprover(store, timeout=30, poll_interval=0.02)
    agent = inbox_agents.agent(workspace=str(tmp_path))
    results: list[hr.RunResult] = []

    async def drive() -> None:
        task = '{"tool": "workspace/write_file", "arguments": {"path": "a.txt", "content": "A"}}'
        results.append(await agent.run(task, store=store, approver=approver))

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        item = await _wait_for_item(store)
        assert item.kind == "approval" and item.payload["target"] == "a.txt"
        assert (await store.run(item.run_id)).status is hr.RunStatus.RUNNING
        await store.decide(item.id, hr.Decision.approve().to_dict(), "alice")
    (result,) = results
    assert isinstance(result.outcome, hr.Completed)
    assert (tmp_path / "a.txt").read_text() == "A"
    assert (await store.pending_item(item.id)).decided_by == "alice"
    await store.close()


async def test_a_denial_reaches_the_model(tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    approver = hr.InboxApprover(store, timeout=30, poll_interval=0.02)
    agent = inbox_agents.agent(workspace=str(tmp_path))
    results: list[hr.RunResult] = []

    async def drive() -> None:
        task = '{"tool": "workspace/write_file", "arguments": {"path": "a.txt", "content": "A"}}'
        results.append(await agent.run(task, store=store, approver=approver))

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        item = await _wait_for_item(store)
        await store.decide(item.id, hr.Decision.deny("use b.txt").to_dict(), "alice")
    assert isinstance(results[0].outcome, hr.Completed)
    assert "use b.txt" in results[0].outcome.output
    assert not (tmp_path / "a.txt").exists()
    await store.close()


async def test_after_the_timeout_the_run_pauses_under_the_same_request(tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    agent = inbox_agents.agent(workspace=str(tmp_path))
    task = '{"tool": "workspace/write_file", "arguments": {"path": "a.txt", "content": "A"}}'
    paused = await agent.run(task, store=store, approver=hr.InboxApprover(store, timeout=0))
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    item = await store.pending_item(paused.outcome.request_id)
    assert item.state == "open"  # published afresh by the pause, decidable as usual
    done = await hr.resume_with_decision(store, item.id, hr.Decision.approve(), agent=agent,
                                         decided_by="bob")
    assert isinstance(done.outcome, hr.Completed)
    assert (tmp_path / "a.txt").read_text() == "A"
    await store.close()


async def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    with pytest.raises(hr.UserError, match="timeout"):
        hr.InboxApprover(store, timeout=-1)
    with pytest.raises(hr.UserError, match="poll_interval"):
        hr.InboxApprover(store, poll_interval=0)
    with pytest.raises(hr.UserError, match=r"hr\.Store"):
        hr.InboxApprover("runs.db")  # type: ignore[arg-type]
    await store.close()


def test_the_inbox_page_decides_for_a_waiting_process(inbox: Inbox) -> None:
    """Deciding in the page while the run's own process waits: it continues there, once."""
    results: list[hr.RunResult] = []

    def drive() -> None:
        async def go(store: hr.Store) -> None:
            agent = inbox_agents.agent(workspace=str(inbox.workspace))
            task = '{"tool": "log/append_line", "arguments": {"path": "l.txt", "line": "x"}}'
            results.append(await agent.run(task, store=store, approver=hr.InboxApprover(
                store, timeout=30, poll_interval=0.02)))

        run_store(inbox.db, go)

    thread = threading.Thread(target=drive)
    thread.start()
    items = wait_until(lambda: run_store(inbox.db, lambda s: s.pending()), "the request")
    response = inbox.post(f"/items/{items[0].id}/approve")
    assert response.status_code == 303
    thread.join(timeout=30)
    assert isinstance(results[0].outcome, hr.Completed)
    assert (inbox.workspace / "l.txt").read_text() == "x\n"
    run = inbox.client.get(f"/runs/{results[0].run_id}").text
    assert "not continued here" in run or "completed" in run


async def test_a_decision_made_just_as_the_wait_times_out_is_the_one_used(
        tmp_path: Path) -> None:
    """The timeout is settled by compare-and-swap: a person who decided first wins."""
    store = hr.Store.open(tmp_path / "runs.db")

    raced: list[str] = []

    class Racing(type(store)):  # type: ignore[misc]
        async def decide(self, item_id: str, decision: dict[str, object], decided_by: str,
                         **kwargs: object) -> hr.PendingItem:
            if decision.get("kind") == "defer":  # the approver gives up: alice got there first
                raced.append(item_id)
                await super().decide(item_id, hr.Decision.approve().to_dict(), "alice")
            item: hr.PendingItem = await super().decide(item_id, decision, decided_by,
                                                        **kwargs)
            return item

    store.__class__ = Racing
    agent = inbox_agents.agent(workspace=str(tmp_path))
    task = '{"tool": "workspace/write_file", "arguments": {"path": "a.txt", "content": "A"}}'
    result = await agent.run(task, store=store, approver=hr.InboxApprover(store, timeout=0))
    assert isinstance(result.outcome, hr.Completed)
    assert (tmp_path / "a.txt").read_text() == "A"
    (item_id,) = raced
    item = await store.pending_item(item_id)
    assert item.decided_by == "alice" and item.decision is not None
    assert item.decision["kind"] == "approve"
    assert await store.pending() == []
    await store.close()
