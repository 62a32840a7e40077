"""Decision links: from a notification to a decision in two clicks, never on a bare GET.

A real receiver gets the notification with its approve / deny links; the link opens the
inbox's confirmation page (a GET that decides nothing); its button decides, once, naming who
decided. A forged, expired or replayed link is refused and records nothing. A four-eyes
approval through a link needs a signed-in person, and shows "1 of 2".
"""

from __future__ import annotations

import dataclasses
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import inbox_agents
import pytest
from inbox_support import TOKEN, Inbox, login, run_store, wait_until
from starlette.testclient import TestClient

import handrail as hr
from handrail.approval import DecisionLinks, WebhookNotifier
from handrail.store import Batch
from handrail.web import Dispatcher, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notify"))
from receiver import Receiver

KEY = "link-key-for-tests-0123456789abcdef"
SECRET = "webhook-secret-for-tests-0123456789"
BASE = "http://127.0.0.1:8765"
WRITE = "workspace/write_file"


class Now:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        import time

        return time.time() + self.offset


@dataclasses.dataclass
class Linked:
    inbox: Inbox
    links: DecisionLinks
    now: Now


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Linked]:
    db = tmp_path / "runs.db"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run_store(db, lambda store: store.runs())
    now = Now()
    links = DecisionLinks(KEY, base_url=BASE, clock=now)
    store = hr.Store.open(db)
    app = create_app(store, agent_for=inbox_agents.by_ref, login_tokens=(TOKEN,),
                     reusable_tokens=("team-token-0123456789abcdef",), default_user="alice",
                     links=links)
    with TestClient(app, base_url=BASE) as client:
        csrf = login(client)
        yield Linked(Inbox(client, db, workspace, csrf), links, now)


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


def _notified(inbox: Inbox, links: DecisionLinks) -> dict[str, Any]:
    """Send the store's notifications to a real receiver; the one that arrived."""
    with Receiver(SECRET) as receiver:
        async def deliver(store: hr.Store) -> int:
            return await Dispatcher(store, WebhookNotifier(receiver.url, SECRET,
                                                           name="on-call"),
                                    links=links).deliver()
        assert run_store(inbox.db, deliver) == 1
    (got,) = receiver.deliveries
    return got


def test_a_link_opens_a_confirmation_page_and_only_its_button_decides(linked: Linked) -> None:
    inbox = linked.inbox
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "hi\n"})
    got = _notified(inbox, linked.links)
    assert got["inbox_url"] == f"{BASE}/items/{paused.outcome.request_id}"
    approve = _path(got["approve_url"])
    inbox.client.cookies.clear()  # clicked in a chat: no inbox session in that browser
    page = inbox.client.get(approve)
    assert page.status_code == 200 and 'id="confirm"' in page.text
    assert "write <code>a.txt</code>" in page.text
    for _ in range(3):  # a link preview, a mail scanner: GETs decide nothing
        inbox.client.get(approve)
    assert inbox.item(paused.outcome.request_id).state == "open"
    nameless = inbox.client.post(approve, data={"name": " "})
    assert nameless.status_code == 422 and "give your name" in nameless.text
    assert inbox.item(paused.outcome.request_id).state == "open"
    done = inbox.client.post(approve, data={"name": "carol"})
    assert done.status_code == 200 and "Decided" in done.text, done.text
    item = inbox.item(paused.outcome.request_id)
    assert item.decided_by == "carol (link sent to on-call)"
    assert [n["kind"] for n in item.notes] == ["notified", "link_used"]
    inbox.finished(paused.run_id)
    assert (inbox.workspace / "a.txt").read_text() == "hi\n"
    # The same link again, and the other link of the notification: refused, nothing changes.
    again = inbox.client.post(approve, data={"name": "mallory"})
    assert again.status_code == 410 and "used already" in again.text
    deny = inbox.client.get(_path(got["deny_url"]))
    assert deny.status_code == 410 and "already decided by carol" in deny.text
    assert inbox.item(paused.outcome.request_id).decided_by == "carol (link sent to on-call)"
    # The run's page keeps what became of the item beside its call.
    login(inbox.client, token="team-token-0123456789abcdef", user="alice")
    timeline = inbox.client.get(f"/runs/{paused.run_id}").text
    assert "notified on-call (try 1): delivered at" in timeline
    assert "decision link (approve) used by carol (link sent to on-call)" in timeline
    # And the item's page lists each delivery attempt of its notification.
    item_page = inbox.client.get(f"/items/{paused.outcome.request_id}").text
    assert "<li>notified on-call (try 1): delivered at " in item_page


def test_a_forged_or_expired_link_is_refused_and_records_nothing(linked: Linked) -> None:
    inbox = linked.inbox
    paused = inbox.pause(WRITE, {"path": "b.txt", "content": "x\n"})
    rid = paused.outcome.request_id
    good = _path(linked.links.make(rid, "deny", to="ops"))
    body, mac = good.rsplit("/", 1)[1].split(".")
    forged_claim = body[:-4] + ("AAAA" if body[-4:] != "AAAA" else "BBBB")
    for forged in (f"/links/{forged_claim}.{mac}", f"/links/{body}.{mac[:-2]}xx",
                   _path(DecisionLinks("another-key-0123456789abcdef",
                                       base_url=BASE).make(rid, "approve", to="x")),
                   "/links/not-a-token", "/links/" + "a" * 5000 + ".b"):
        for method in ("get", "post"):
            response = getattr(inbox.client, method)(forged, **(
                {"data": {"name": "m", "reason": "r"}} if method == "post" else {}))
            assert response.status_code in (403, 404), (forged, response.text)
            assert "decides nothing" in response.text
    linked.now.offset = linked.links.ttl + 1
    expired = inbox.client.post(good, data={"name": "m", "reason": "late"})
    assert expired.status_code == 403 and "expired" in expired.text
    item = inbox.item(rid)
    assert item.state == "open" and item.notes == []


def test_a_deny_link_needs_a_reason_the_model_will_read(linked: Linked) -> None:
    inbox = linked.inbox
    paused = inbox.pause(WRITE, {"path": "c.txt", "content": "x\n"})
    rid = paused.outcome.request_id
    deny = _path(linked.links.make(rid, "deny", to="ops"))
    empty = inbox.client.post(deny, data={"name": "dan", "reason": ""})
    assert empty.status_code == 422 and "needs a reason" in empty.text
    # A refused press spends the link all the same: a new one is needed (it was seen).
    fresh = _path(linked.links.make(rid, "deny", to="ops"))
    done = inbox.client.post(fresh, data={"name": "dan", "reason": "not this file"})
    assert done.status_code == 200, done.text
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and "not this file" in str(run.outcome)


def test_four_eyes_through_links_needs_signed_in_people_and_shows_one_of_two(
        linked: Linked) -> None:
    inbox = linked.inbox
    paused = inbox.pause(WRITE, {"path": "d.txt", "content": "four\n"})
    rid = paused.outcome.request_id
    item = inbox.item(rid)

    async def four_eyes(store: hr.Store) -> None:
        await store.write(Batch(pending=[dataclasses.replace(item, approvals_needed=2)]))

    run_store(inbox.db, four_eyes)
    listed = inbox.client.get("/")
    assert f'id="approvals-{rid}">0 of 2<' in listed.text
    signed_in = _path(linked.links.make(rid, "approve", to="ops"))
    page = inbox.client.get(signed_in)
    assert 'id="approvals">0 of 2<' in page.text
    first = inbox.client.post(signed_in, data={"name": "ignored"})
    assert first.status_code == 200 and "Approval 1 of 2 recorded" in first.text, first.text
    assert [a["by"] for a in inbox.item(rid).approvals] == ["alice"]  # the sign-in's name
    assert 'id="approvals">1 of 2' in inbox.client.get(f"/items/{rid}").text
    assert f'id="approvals-{rid}">1 of 2<' in inbox.client.get("/").text
    # alice again, through a new link or the page: counted once.
    again = inbox.client.post(_path(linked.links.make(rid, "approve", to="ops")),
                              data={"name": "x"})
    assert "already counted (1 of 2)" in again.text
    assert not (inbox.workspace / "d.txt").exists()
    # Without a session a four-eyes link asks to sign in, and records nothing.
    inbox.client.cookies.clear()
    anonymous = inbox.client.post(_path(linked.links.make(rid, "approve", to="ops")),
                                  data={"name": "bob"})
    assert anonymous.status_code == 401 and "sign in" in anonymous.text
    assert len(inbox.item(rid).approvals) == 1
    login(inbox.client, token="team-token-0123456789abcdef", user="bob")
    # alice's link, forwarded to bob: spent, refused (one link, one decision).
    forwarded = inbox.client.post(signed_in, data={"name": "x"})
    assert forwarded.status_code == 410 and "used already" in forwarded.text
    assert len(inbox.item(rid).approvals) == 1
    second = inbox.client.post(_path(linked.links.make(rid, "approve", to="ops")),
                               data={"name": "x"})
    assert second.status_code == 200 and "Decided" in second.text, second.text
    inbox.finished(paused.run_id)
    assert (inbox.workspace / "d.txt").read_text() == "four\n"
    assert inbox.item(rid).decided_by == "alice, bob"
    wait_until(lambda: run_store(inbox.db, lambda s: s.calls(paused.run_id)), "calls")
    (record,) = run_store(inbox.db, lambda s: s.calls(paused.run_id))
    assert record.decided_by == "alice, bob"


def test_a_link_whose_inbox_takes_none_is_refused(inbox: Inbox) -> None:
    links = DecisionLinks(KEY, base_url=BASE)
    paused = inbox.pause(WRITE, {"path": "e.txt", "content": "x\n"})
    response = inbox.client.get(_path(links.make(paused.outcome.request_id, "approve",
                                                 to="ops")))
    assert response.status_code == 404 and "takes no decision links" in response.text




def test_a_link_decides_on_a_postgresql_store_and_leaves_the_run_to_a_worker(
        pg_url: str) -> None:
    """Workers continue runs on PostgreSQL: the link's decision is recorded (checked, once,
    naming who decided) and the run is left READY for `handrail worker`."""
    import time

    now = time.time()

    async def seed(store: hr.Store) -> None:
        await store.write(Batch(run=hr.RunRecord(
            id="r1", task="t", policy={"layers": []}, created_at=now,
            status=hr.RunStatus.AWAITING_APPROVAL,
            outcome={"kind": "awaiting_approval", "request_id": "a1"}), pending=[
            hr.PendingItem(id="a1", kind="approval", run_id="r1", call_record="r1:c",
                           tool="x/pay", payload={"act": "call", "target": "x/pay"},
                           created_at=now)]))

    run_store(pg_url, seed)  # type: ignore[arg-type]
    links = DecisionLinks(KEY, base_url=BASE)
    app = create_app(hr.Store.open(pg_url), agent_for=lambda run: None, links=links)
    with TestClient(app, base_url=BASE) as client:
        path = _path(links.make("a1", "approve", to="ops"))
        assert client.get(path).status_code == 200
        done = client.post(path, data={"name": "carol"})
        assert done.status_code == 200 and "Recorded" in done.text, done.text
        assert client.post(path, data={"name": "carol"}).status_code == 410
    item = run_store(pg_url, lambda s: s.pending_item("a1"))  # type: ignore[arg-type]
    assert (item.state, item.decided_by) == ("decided", "carol (link sent to ops)")
    run = run_store(pg_url, lambda s: s.run("r1"))  # type: ignore[arg-type]
    assert run.status is hr.RunStatus.READY
