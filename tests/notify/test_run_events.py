"""Each delivery attempt of a notification is an event of its run (`Store.run_events`).

Against the real receiver of `receiver.py` (down: nothing listens on its port; then up on the
same port), on the memory store, SQLite and PostgreSQL. The attempts are kept in the run's
append-only log, never in the run's row: the run's driver rewrites its row (and
`RunRecord.events`) whole, so an attempt recorded there while a worker drives the run would
be lost to the worker's next write. The last test makes exactly that happen: an attempt is
recorded while the run's driver is inside a tool body, holding the run it read.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import anyio
import pytest
from notify_helpers import Clock
from receiver import Receiver, free_port

import handrail as hr
from handrail.approval import WebhookNotifier
from handrail.models import Scripted, call, reply
from handrail.store import Store
from handrail.web import Dispatcher

pytestmark = pytest.mark.anyio

SECRET = "webhook-secret-for-tests-0123456789"
DELIVERY = ("notified", "notify_failed")


def _agent(root: pathlib.Path) -> hr.Agent:
    return hr.Agent(
        Scripted([call("workspace/write_file", {"path": "a.txt", "content": "hi"}),
                  reply("done")]),
        hr.builtin.workspace_tools(), workspace=root, name="notes")


def _deliveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("kind") in DELIVERY]


async def _no_wait(seconds: float) -> None:
    await anyio.lowlevel.checkpoint()


async def test_each_attempt_down_then_up_is_an_event_of_the_run(
        store: Store, tmp_path: pathlib.Path, clock: Clock) -> None:
    port = free_port()  # nothing listens here yet
    paused = await _agent(tmp_path).run("write a.txt", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    item_id = paused.outcome.request_id
    dispatcher = Dispatcher(store, WebhookNotifier(f"http://127.0.0.1:{port}/hook", SECRET),
                            attempts=2, backoff=lambda n: 10.0 * n, sleep=_no_wait)
    assert await dispatcher.deliver() == 0  # down: two tries, both failed
    with Receiver(SECRET, port=port) as receiver:
        assert await dispatcher.deliver() == 0  # not due yet: the backoff holds it
        clock.advance(21)
        assert await dispatcher.deliver() == 1
    assert len(receiver.deliveries) == 1 and receiver.deliveries[0]["item"] == item_id
    attempts = _deliveries(await store.run_events(paused.run_id))
    assert [(e["kind"], e["attempt"], e["outcome"]) for e in attempts] == [
        ("notify_failed", 1, "unreachable"), ("notify_failed", 2, "unreachable"),
        ("notified", 3, "delivered")]
    target = f"webhook http://127.0.0.1:{port}"
    assert all(e["item"] == item_id and e["to"] == target and e["event"] == "pending"
               for e in attempts)
    assert "ConnectError" in attempts[0]["error"]
    # The next try's time: backoff(1) after the first, backoff(2) (the next round) after the
    # second; a delivered try has none.
    assert attempts[0]["next_try"] == attempts[0]["at"] + 10.0
    assert attempts[1]["next_try"] == attempts[1]["at"] + 20.0
    assert "next_try" not in attempts[2]
    # The run is unaffected: its own record holds none of it, and it resumes and completes.
    assert _deliveries((await store.run(paused.run_id)).events) == []
    done = await hr.resume_with_decision(store, item_id, hr.Decision.approve(),
                                         agent=_agent(tmp_path))
    assert done.outcome == hr.Completed("done")
    assert (tmp_path / "a.txt").read_text() == "hi"
    after = await store.run_events(paused.run_id)
    assert _deliveries(after) == attempts  # the driver's writes since lost none
    own = (await store.run(paused.run_id)).events
    assert [e for e in after if e.get("kind") not in DELIVERY] == own  # and its own, in order


async def test_a_receiver_down_for_long_is_tried_ever_less_often(
        store: Store, tmp_path: pathlib.Path, clock: Clock) -> None:
    paused = await _agent(tmp_path).run("write a.txt", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    dispatcher = Dispatcher(store, WebhookNotifier(f"http://127.0.0.1:{free_port()}/h",
                                                   SECRET),
                            attempts=2, backoff=lambda n: 10.0 * n, sleep=wait)
    gaps = []
    for _ in range(3):
        assert await dispatcher.deliver() == 0
        item = await store.pending_item(paused.outcome.request_id)
        gaps.append(item.notify_after - clock.now)
        clock.advance(item.notify_after - clock.now)
    assert waits == [10.0, 10.0, 10.0]  # within a round: backoff(1), every round
    assert gaps == [20.0, 40.0, 60.0]   # between rounds: backoff of tries 2, 4, 6
    tries = _deliveries(await store.run_events(paused.run_id))
    assert [e["attempt"] for e in tries] == [1, 2, 3, 4, 5, 6]
    assert [e["next_try"] - e["at"] for e in tries] == [10.0, 20.0, 10.0, 40.0, 10.0, 60.0]


async def test_a_refusal_is_recorded_with_its_http_status(store: Store,
                                                          tmp_path: pathlib.Path) -> None:
    paused = await _agent(tmp_path).run("write a.txt", store=store)
    with Receiver(SECRET, status=503) as receiver:
        dispatcher = Dispatcher(store, WebhookNotifier(receiver.url, SECRET), attempts=1,
                                backoff=lambda n: 0.0, sleep=_no_wait)
        assert await dispatcher.deliver() == 0
        receiver.status = 200
        assert await dispatcher.deliver() == 1
    refused, delivered = _deliveries(await store.run_events(paused.run_id))
    assert (refused["outcome"], refused["status"], refused["attempt"]) == ("refused", 503, 1)
    assert (delivered["outcome"], delivered["attempt"]) == ("delivered", 2)


async def test_an_attempt_recorded_while_a_worker_drives_the_run_is_kept(
        store: Store, backend: str, tmp_path: pathlib.Path) -> None:
    """The dispatcher on a store of its own (as in another process: the inbox's), the worker
    on another, both on one file or database."""
    in_body, let_go = anyio.Event(), anyio.Event()

    @hr.tool(server="bank", mutates=True)
    async def pay(amount: int) -> str:
        """Pay an amount."""
        in_body.set()
        await let_go.wait()  # the driver holds the run it read, and writes it after
        return "paid"

    def agent() -> hr.Agent:
        return hr.Agent(Scripted([call("bank/pay", {"amount": 5}), reply("done")]),
                        hr.Toolbox([pay]), name="payer",
                        policy=hr.Policy.default().layer("money").ask("call", "bank/pay"))

    paused = await agent().run("pay 5", store=store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    item_id = paused.outcome.request_id
    resumed: list[hr.RunResult] = []

    async def resume() -> None:
        resumed.append(await hr.resume_with_decision(store, item_id, hr.Decision.approve(),
                                                     agent=agent()))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def between_tries(seconds: float) -> None:
                # Between the two tries the item is approved and a worker takes the run: the
                # second try is recorded while the worker is inside the tool body.
                tg.start_soon(resume)
                await in_body.wait()

            inbox_store = store if backend == "memory://" else Store.open(backend)
            dispatcher = Dispatcher(
                inbox_store, WebhookNotifier(f"http://127.0.0.1:{free_port()}/hook", SECRET),
                attempts=2, backoff=lambda n: 1.0, sleep=between_tries)
            try:
                assert await dispatcher.deliver() == 0
            finally:
                if inbox_store is not store:
                    await inbox_store.close()
            let_go.set()  # the worker finishes the call and the run, writing its row
    assert resumed[0].outcome == hr.Completed("done")
    events = await store.run_events(paused.run_id)
    assert [(e["kind"], e["attempt"], e["item"]) for e in _deliveries(events)] == [
        ("notify_failed", 1, item_id), ("notify_failed", 2, item_id)]
    assert [e for e in events if e.get("kind") not in DELIVERY] == (
        await store.run(paused.run_id)).events


def test_handrail_show_prints_each_attempt_under_its_call(
        backend: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    if backend == "memory://":
        pytest.skip("the CLI opens the store itself: a memory store is not shared")
    from handrail.cli import main

    port = free_port()

    async def go() -> tuple[str, str]:
        async with Store.open(backend) as store:
            paused = await _agent(tmp_path).run("write a.txt", store=store)
            assert isinstance(paused.outcome, hr.AwaitingApproval)
            dispatcher = Dispatcher(store, WebhookNotifier(f"http://127.0.0.1:{port}/h",
                                                           SECRET),
                                    attempts=1, backoff=lambda n: 0.0, sleep=_no_wait)
            assert await dispatcher.deliver() == 0
            with Receiver(SECRET, port=port):
                assert await dispatcher.deliver() == 1
            return paused.run_id, paused.outcome.request_id

    run_id, item_id = anyio.run(go)
    assert main(["show", run_id, "--store", backend]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    call_line = next(i for i, line in enumerate(lines) if line.startswith("workspace/write_file"))
    at = [i for i, line in enumerate(lines) if line.startswith(("notifying ", "notified "))]
    assert len(at) == 2 and call_line < at[0] and at[1] == at[0] + 1  # under the call
    failed, delivered = lines[at[0]], lines[at[1]]
    assert failed.startswith(f"notifying webhook http://127.0.0.1:{port} failed (try 1: ")
    assert "ConnectError" in failed and "; next try at " in failed
    assert delivered.startswith(f"notified webhook http://127.0.0.1:{port} (try 2): "
                                "delivered at ")
    assert main(["show", run_id, "--store", backend, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(e["kind"], e["item"]) for e in _deliveries(shown["events"])] == [
        ("notify_failed", item_id), ("notified", item_id)]
