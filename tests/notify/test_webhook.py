"""Notifications out, against a real HTTP receiver on 127.0.0.1 that verifies signatures.

A run pauses on an approval (its pending item is the outbox's entry); a `Dispatcher` sends
it, signed, retried with backoff when the receiver is down, each attempt recorded with the
item; the run never waits for any of it. Backoff and the clock are injected: nothing sleeps.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import anyio
import pytest
from notify_helpers import Clock
from receiver import Receiver, free_port, post

import handrail as hr
from handrail.approval import Notification, WebhookNotifier, WebhookVerifier, sign
from handrail.errors import SignatureInvalid
from handrail.models import Scripted, call, reply
from handrail.store import Batch, PendingItem, RunRecord, RunStatus, Store
from handrail.web import Dispatcher

pytestmark = pytest.mark.anyio

SECRET = "webhook-secret-for-tests-0123456789"


def _agent(root: pathlib.Path, policy: hr.Policy | None = None) -> hr.Agent:
    return hr.Agent(
        Scripted([call("workspace/write_file", {"path": "a.txt", "content": "hi"}),
                  reply("done")]),
        hr.builtin.workspace_tools(), workspace=root, name="notes",
        **({"policy": policy} if policy is not None else {}))


async def _no_wait(seconds: float) -> None:
    await anyio.lowlevel.checkpoint()


async def test_a_paused_approval_is_posted_signed_with_what_a_person_needs(
        store: Store, tmp_path: pathlib.Path) -> None:
    result = await _agent(tmp_path).run("write a.txt", store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    with Receiver(SECRET) as receiver:
        dispatcher = Dispatcher(store, WebhookNotifier(receiver.url, SECRET),
                                inbox_url="https://inbox.example")
        assert await dispatcher.deliver() == 1
        assert await dispatcher.deliver() == 0  # notified once, not at every round
    (got,) = receiver.deliveries
    item_id = result.outcome.request_id
    assert got["type"] == "handrail.pending" and got["item"] == item_id
    assert got["run"] == result.run_id and got["kind"] == "approval"
    assert got["tool"] == "workspace/write_file" and got["summary"] == "write a.txt"
    assert "default" in got["reason"] or "rule" in got["reason"]  # the policy's reason
    assert got["inbox_url"] == f"https://inbox.example/items/{item_id}"
    assert receiver.refused == []
    item = await store.pending_item(item_id)
    assert item.notified == 1
    assert [(n["kind"], n["attempt"]) for n in item.notes] == [("notified", 1)]
    assert item.notes[0]["to"] == f"webhook http://127.0.0.1:{receiver.port}"


async def test_a_receiver_that_is_down_loses_nothing_and_the_run_never_waits(
        store: Store, tmp_path: pathlib.Path, clock: Clock) -> None:
    port = free_port()  # nothing listens here yet
    waits: list[float] = []
    run_paused = anyio.Event()

    async def wait_for_the_run(seconds: float) -> None:
        waits.append(seconds)
        await run_paused.wait()  # the dispatcher is mid-retry while the run goes on

    url = f"http://127.0.0.1:{port}/hook"
    dispatcher = Dispatcher(store, WebhookNotifier(url, SECRET), attempts=3,
                            backoff=lambda n: 10.0 * n, sleep=wait_for_the_run)
    outcome: list[Any] = []

    async def run() -> None:
        result = await _agent(tmp_path).run("write a.txt", store=store)
        outcome.append(result.outcome)
        run_paused.set()

    with anyio.fail_after(60):
        # The item is written first (another run paused earlier), so the dispatcher has it
        # to retry while this run goes on.
        await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                              created_at=clock.now), pending=[
            PendingItem(id="first", kind="question", run_id="r0", call_record="r0:c",
                        payload={"question": "which one?"}, created_at=clock.now)]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.deliver)
            tg.start_soon(run)
    assert isinstance(outcome[0], hr.AwaitingApproval)  # the run paused as it always does
    assert waits == [10.0, 20.0]  # backoff between the three tries
    first = await store.pending_item("first")
    assert [(n["kind"], n["attempt"]) for n in first.notes] == [
        ("notify_failed", 1), ("notify_failed", 2), ("notify_failed", 3)]
    assert "ConnectError" in first.notes[0]["error"]
    assert first.notified == 0 and first.notify_after == clock.now + 30.0  # still owed
    # Up again, on the same port: the next round delivers both, nothing lost.
    with Receiver(SECRET, port=port) as receiver:
        clock.advance(31)
        dispatcher.sleep = _no_wait
        assert await dispatcher.deliver() == 2
    assert sorted(d["item"] for d in receiver.deliveries) == sorted(
        ["first", outcome[0].request_id])
    assert (await store.pending_item("first")).notified == 1


async def test_a_receiver_answering_503_is_retried_and_each_attempt_recorded(
        store: Store, clock: Clock) -> None:
    await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                          created_at=clock.now), pending=[
        PendingItem(id="q1", kind="question", run_id="r0", call_record="r0:c",
                    payload={"question": "which one?"}, created_at=clock.now)]))
    with Receiver(SECRET, status=503) as receiver:
        dispatcher = Dispatcher(store, WebhookNotifier(receiver.url, SECRET), attempts=2,
                                backoff=lambda n: 0.0, sleep=_no_wait)
        assert await dispatcher.deliver() == 0
        receiver.status = 200
        assert await dispatcher.deliver() == 1  # backoff 0: owed again at once
    item = await store.pending_item("q1")
    assert [n["kind"] for n in item.notes] == ["notify_failed", "notify_failed", "notified"]
    assert "503" in item.notes[0]["error"]
    assert len(receiver.raw) == 3 and len(receiver.deliveries) == 1
    # Every try of one notification carries the same delivery id (a receiver dedupes on it).
    assert {h["Handrail-Delivery"] for _, h in receiver.raw} == {"q1:1"}


async def test_a_forged_a_stale_and_a_replayed_delivery_are_refused(store: Store,
                                                                   clock: Clock) -> None:
    await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                          created_at=clock.now), pending=[
        PendingItem(id="q1", kind="question", run_id="r0", call_record="r0:c",
                    payload={"question": "which one?"}, created_at=clock.now)]))
    with Receiver(SECRET) as receiver:
        forged = Dispatcher(store, WebhookNotifier(receiver.url, "another-secret-0123456789"),
                            attempts=1, backoff=lambda n: 0.0)
        assert await forged.deliver() == 0
        assert "does not match" in receiver.refused[-1]
        stale = Dispatcher(store, WebhookNotifier(receiver.url, SECRET,
                                                  clock=lambda: 1_000_000.0),
                           attempts=1, backoff=lambda n: 0.0)
        assert await stale.deliver() == 0
        assert "off the clock" in receiver.refused[-1]
        good = Dispatcher(store, WebhookNotifier(receiver.url, SECRET))
        assert await good.deliver() == 1
        body, headers = receiver.raw[-1]
        assert post(receiver.url, body, headers) == 401  # the same delivery, again
        assert "replay" in receiver.refused[-1]
        tampered = body.replace(b"which one?", b"approve all")
        assert post(receiver.url, tampered, headers) == 401
        assert "does not match" in receiver.refused[-1]
    assert len(receiver.deliveries) == 1


def test_verify_refuses_what_it_must_and_takes_a_rotated_secret() -> None:
    body = b'{"x":1}'
    verifier = WebhookVerifier(SECRET, clock=lambda: 1000.0)
    header = sign(SECRET, body, timestamp=1000)
    assert verifier.verify(body, {"handrail-signature": header,
                                  "handrail-delivery": "d1"}) == {"x": 1}
    for bad in (None, "", "v1=abc", f"t=1000,v1={'0' * 64}", "t=x" * 200):
        with pytest.raises(SignatureInvalid):
            hr.approval.verify_signature(SECRET, body, bad, now=1000.0)
    rotated = header + "," + sign("old-secret-0123456789abc", body, timestamp=1000).split(",")[1]
    assert hr.approval.verify_signature(SECRET, body, rotated, now=1000.0) == 1000
    with pytest.raises(SignatureInvalid, match="Handrail-Delivery"):
        verifier.verify(body, {"Handrail-Signature": header})  # no delivery id
    with pytest.raises(hr.UserError, match="16 bytes"):
        WebhookVerifier("short")


async def test_the_chat_shape_is_text_and_blocks_with_model_text_escaped(store: Store,
                                                                        clock: Clock) -> None:
    hostile = "<!channel> <https://evil.example|click> & \x1b[31mred"
    await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                          created_at=clock.now), pending=[
        PendingItem(id="a1", kind="approval", run_id="r0", call_record="r0:c", tool="x/y",
                    payload={"act": "call", "target": hostile, "verdict_reason": "rule ask",
                             "taint": [{"pointer": "/to", "value": "evil@example.com",
                                        "source_call": "c1", "source_tool": "mail/read"}]},
                    created_at=clock.now, approvals_needed=2, deadline=clock.now + 1800,
                    on_expiry={"kind": "deny", "reason": "expired after 30m"})]))
    with Receiver(SECRET) as receiver:
        dispatcher = Dispatcher(store, WebhookNotifier(receiver.url, SECRET, shape="chat"),
                                inbox_url="https://inbox.example")
        assert await dispatcher.deliver() == 1
    (got,) = receiver.deliveries
    assert set(got) == {"text", "blocks"}
    section = got["blocks"][0]["text"]["text"]
    assert "<!channel>" not in section and "&lt;!channel&gt;" in section
    assert "<https://evil" not in section and "\x1b" not in json.dumps(got)
    assert "evil@example.com" in section and "mail/read" in section  # the taint line
    assert "Approvals: 0 of 2" in section and "Deny by default" in section
    (button,) = got["blocks"][1]["elements"]
    assert button["url"] == "https://inbox.example/items/a1"


async def test_a_question_and_a_recovery_are_notified_too(store: Store, clock: Clock) -> None:
    await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                          created_at=clock.now), pending=[
        PendingItem(id="q1", kind="question", run_id="r0", call_record="r0:c", tool="x/ask",
                    payload={"question": "which file?", "context": "two match"},
                    created_at=clock.now),
        PendingItem(id="r0:c2", kind="recovery", run_id="r0", call_record="r0:c2",
                    tool="x/pay", payload={"tool": "x/pay"}, created_at=clock.now + 1)]))
    with Receiver(SECRET) as receiver:
        assert await Dispatcher(store, WebhookNotifier(receiver.url, SECRET)).deliver() == 2
    by_kind = {d["kind"]: d for d in receiver.deliveries}
    assert by_kind["question"]["summary"] == "which file?"
    assert by_kind["question"]["reason"] == "two match"
    assert "in doubt" in by_kind["recovery"]["summary"]


async def test_escalation_notifies_a_second_target_before_the_default_applies(
        store: Store, clock: Clock) -> None:
    policy = hr.Policy.default().layer("money").ask("call", "ledger/*", expires="30m",
                                                    escalate="10m")
    rule = policy.layers[-1].rules[0]
    assert rule.terms is not None
    await store.write(Batch(run=RunRecord(id="r0", task="t", policy={"layers": []},
                                          status=RunStatus.AWAITING_APPROVAL,
                                          outcome={"kind": "awaiting_approval",
                                                   "request_id": "a1"},
                                          created_at=clock.now), pending=[
        PendingItem(id="a1", kind="approval", run_id="r0", call_record="r0:c",
                    payload={"act": "call", "target": "ledger/pay"}, created_at=clock.now,
                    **rule.terms.item_fields(clock.now))]))
    with Receiver(SECRET) as first, Receiver(SECRET) as second:
        dispatcher = Dispatcher(store, WebhookNotifier(first.url, SECRET, name="on-call"),
                                escalate_to=WebhookNotifier(second.url, SECRET, name="lead"))
        assert await dispatcher.deliver() == 1
        clock.advance(9 * 60)
        assert await dispatcher.deliver() == 0  # not yet
        clock.advance(60)
        assert await dispatcher.deliver() == 1
        assert await dispatcher.deliver() == 0  # escalated once
        clock.advance(20 * 60)
        assert await dispatcher.deliver() == 0  # the deadline: the default, no more notes
    assert [d["type"] for d in first.deliveries] == ["handrail.pending"]
    assert [d["type"] for d in second.deliveries] == ["handrail.escalation"]
    item = await store.pending_item("a1")
    assert [(n["kind"], n.get("to")) for n in item.notes] == [
        ("notified", "on-call"), ("notified", "lead"), ("expired", None)]
    assert (item.decided_by, item.decision) == ("expiry", {"kind": "deny",
                                                           "reason": "expired after 30m"})


def test_a_notification_bounds_what_a_model_wrote() -> None:
    note = Notification(id="x:1", event="pending", item_id="x", item_kind="approval",
                        run_id="r", agent=None, agent_path=(), tool="t", summary="s" * 10,
                        reason="r")
    assert note.to_json()["type"] == "handrail.pending"
    from handrail.web import notification_of

    huge = PendingItem(id="a", kind="approval", run_id="r", call_record="r:c",
                       payload={"act": "write", "target": "x" * 100_000,
                                "verdict_reason": "\u202e" + "y" * 100_000,
                                "taint": [{"pointer": "/p", "value": "v"}] * 1000})
    made = notification_of(huge, event="pending")
    assert len(made.summary) <= 501 and len(made.reason) <= 2001
    assert "\u202e" not in made.reason and len(made.taint) == 20
