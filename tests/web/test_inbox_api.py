"""The inbox over HTTP (Starlette's test client): sessions, CSRF, headers, every decision."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from inbox_support import TOKEN, Inbox, login, run_store, wait_until
from starlette.testclient import TestClient

import handrail as hr
from handrail.web._app import SECURITY_HEADERS

WRITE = "workspace/write_file"


# ------------------------------------------------------------------ sessions


def test_without_a_session_pages_redirect_and_apis_answer_401(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "secret plan\n"})
    item = inbox.item_for(paused.run_id)
    anonymous = TestClient(inbox.client.app, base_url="http://127.0.0.1:8765")
    for path in ("/", f"/items/{item.id}", f"/runs/{paused.run_id}"):
        response = anonymous.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/login"
    for path in (f"/api/items/{item.id}", "/fragments/items", f"/fragments/runs/{paused.run_id}"):
        assert anonymous.get(path).status_code == 401
    response = anonymous.post(f"/items/{item.id}/approve", data={"csrf": inbox.csrf})
    assert response.status_code == 401
    login_page = anonymous.get("/login").text
    for secret in (item.id, paused.run_id, "a.txt", "secret plan"):
        assert secret not in login_page
    assert inbox.item(item.id).state == "open"


def test_the_printed_token_works_once_and_a_forged_cookie_is_nobody(inbox: Inbox) -> None:
    other = TestClient(inbox.client.app, base_url="http://127.0.0.1:8765")
    again = other.post("/login", data={"token": TOKEN, "user": "mallory"},
                       follow_redirects=False)
    assert again.status_code == 401 and "not valid" in again.text
    wrong = other.post("/login", data={"token": "guess", "user": "mallory"},
                       follow_redirects=False)
    assert wrong.status_code == 401
    other.cookies.clear()
    other.cookies.set("handrail_session", "abc.def")
    assert other.get("/", follow_redirects=False).status_code == 303
    # The team's token (from --token-file) keeps working, and names the person.
    login(other, "team-token-0123456789abcdef", "bob")
    assert "Signed in as <strong>bob</strong>" in other.get("/").text


def test_the_session_cookie_is_httponly_and_samesite_strict(inbox: Inbox) -> None:
    fresh = TestClient(inbox.client.app, base_url="http://127.0.0.1:8765")
    response = fresh.post("/login", data={"token": "team-token-0123456789abcdef",
                                          "user": "bob"}, follow_redirects=False)
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    value = fresh.cookies["handrail_session"]
    tampered = value[:-1] + ("0" if value[-1] != "0" else "1")
    fresh.cookies.clear()
    fresh.cookies.set("handrail_session", tampered)
    assert fresh.get("/", follow_redirects=False).status_code == 303


def test_every_response_carries_the_security_headers(inbox: Inbox) -> None:
    anonymous = TestClient(inbox.client.app, base_url="http://127.0.0.1:8765")
    responses = [inbox.client.get("/"), inbox.client.get("/static/inbox.js"),
                 anonymous.get("/login"), anonymous.get("/api/items/x"),
                 inbox.client.get("/items/nope")]
    for response in responses:
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value, (response.url, name)
    csp = SECURITY_HEADERS["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "http" not in csp


def test_pages_load_no_inline_script_and_nothing_from_elsewhere(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "x\n"})
    item = inbox.item_for(paused.run_id)
    for path in ("/", f"/items/{item.id}", f"/runs/{paused.run_id}", "/login"):
        html = inbox.client.get(path).text
        assert "<script>" not in html and "onclick" not in html and "style=" not in html
        assert "http://" not in html and "https://" not in html


# ---------------------------------------------------------------------- CSRF


def test_a_post_without_the_csrf_token_is_refused(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "x\n"})
    item = inbox.item_for(paused.run_id)
    assert inbox.post(f"/items/{item.id}/approve", csrf=False).status_code == 403
    wrong = inbox.client.post(f"/items/{item.id}/approve", data={"csrf": "nope"})
    assert wrong.status_code == 403
    assert inbox.item(item.id).state == "open"
    assert not (inbox.workspace / "a.txt").exists()


# ----------------------------------------------------------------- listing


def test_the_list_is_newest_first_and_filters_by_agent_tool_kind_and_age(inbox: Inbox) -> None:
    first = inbox.pause(WRITE, {"path": "one.txt", "content": "1\n"})
    second = inbox.pause("ops/pick_service", {})
    html = inbox.client.get("/").text
    assert html.index(second.run_id) < html.index(first.run_id)
    assert "2 pending" in html
    only_writes = inbox.client.get("/", params={"tool": WRITE}).text
    assert first.run_id in only_writes and second.run_id not in only_writes
    questions = inbox.client.get("/", params={"kind": "question"}).text
    assert second.run_id in questions and first.run_id not in questions
    assert "0 pending" in inbox.client.get("/", params={"agent": "someone-else"}).text
    assert "0 pending" in inbox.client.get("/", params={"age": "1h"}).text
    fragment = inbox.client.get("/fragments/items", params={"kind": "question"}).text
    assert '<option value="inbox-test">' in fragment and f'<option value="{WRITE}">' in fragment


def test_the_fragment_answers_304_until_something_changes(inbox: Inbox) -> None:
    inbox.pause(WRITE, {"path": "one.txt", "content": "1\n"})
    first = inbox.client.get("/fragments/items")
    etag = first.headers["etag"]
    assert inbox.client.get("/fragments/items", headers={"if-none-match": etag}
                            ).status_code == 304
    later = inbox.pause(WRITE, {"path": "two.txt", "content": "2\n"})
    changed = inbox.client.get("/fragments/items", headers={"if-none-match": etag})
    assert changed.status_code == 200 and later.run_id in changed.text


# --------------------------------------------------------------- approving


def test_approve_records_who_and_resumes_the_run_once(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "notes.md", "content": "# Notes\n"})
    item = inbox.item_for(paused.run_id)
    page = inbox.client.get(f"/items/{item.id}").text
    assert "d-add" in page and "+# Notes" in page  # the diff against the (absent) file
    response = inbox.post(f"/items/{item.id}/approve")
    assert response.status_code == 303
    inbox.client.get("/fragments/items")  # another tab polling must not take the message
    assert "Decided. The run continues" in inbox.client.get(f"/items/{item.id}").text
    run = inbox.finished(paused.run_id)
    assert run.status is hr.RunStatus.COMPLETED
    assert (inbox.workspace / "notes.md").read_text() == "# Notes\n"
    decided = inbox.item(item.id)
    assert decided.decided_by == "alice" and decided.decision == {
        "kind": "approve", "modified": None, "remember": []}
    calls = run_store(inbox.db, lambda s: s.calls(paused.run_id))
    assert [c.decided_by for c in calls] == ["alice"]
    again = inbox.post(f"/items/{item.id}/approve")
    assert again.status_code == 409 and "already decided by alice" in again.text
    timeline = inbox.client.get(f"/runs/{paused.run_id}").text
    assert "completed" in timeline and "decision: approve by alice" in timeline


def test_two_approvals_at_once_run_the_call_once(inbox: Inbox) -> None:
    paused = inbox.pause("log/append_line", {"path": "log.txt", "line": "once"})
    item = inbox.item_for(paused.run_id)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def approve() -> None:
        barrier.wait(timeout=10)
        statuses.append(inbox.post(f"/items/{item.id}/approve").status_code)

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [303, 409]
    inbox.finished(paused.run_id)
    assert (inbox.workspace / "log.txt").read_text() == "once\n"


def test_approve_and_remember_saves_the_shown_pattern(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "docs/a.md", "content": "a\n"})
    item = inbox.item_for(paused.run_id)
    page = inbox.client.get(f"/items/{item.id}").text
    assert "saved as: allow write <code>docs/a.md</code>" in page
    bad = inbox.post(f"/items/{item.id}/approve", {"remember": "1", "remember_pattern": "[a"})
    assert bad.status_code == 422 and "not valid" in bad.text
    assert inbox.item(item.id).state == "open"
    ok = inbox.post(f"/items/{item.id}/approve", {"remember": "1",
                                                  "remember_pattern": "docs/**"})
    assert ok.status_code == 303
    run = inbox.finished(paused.run_id)
    assert run.remembered == [{"act": "write", "pattern": "docs/**", "effect": "allow"}]


def test_edited_arguments_are_validated_then_checked_by_the_policy(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "model's\n"})
    item = inbox.item_for(paused.run_id)
    url = f"/items/{item.id}/approve-edited"
    not_json = inbox.post(url, {"arguments": "{nope"})
    assert not_json.status_code == 422 and "not JSON" in not_json.text
    wrong_type = inbox.post(url, {"arguments": '{"path": "a.txt", "content": 5}'})
    assert wrong_type.status_code == 422 and "schema" in wrong_type.text
    unknown = inbox.post(url, {"arguments": '{"path": "a.txt", "content": "x", "mode": 7}'})
    assert unknown.status_code == 422
    secret = inbox.post(url, {"arguments": '{"path": ".env", "content": "X=1"}'})
    assert secret.status_code == 422 and "policy denies" in secret.text
    outside = inbox.post(url, {"arguments": '{"path": "../escape.txt", "content": "x"}'})
    assert outside.status_code == 422 and "policy denies" in outside.text
    assert inbox.item(item.id).state == "open"
    preview = inbox.post(url, {"arguments": '{"path": "b.txt", "content": "edited\\n"}'})
    assert preview.status_code == 200
    assert "write <code>b.txt</code>" in preview.text and "+edited" in preview.text
    assert inbox.item(item.id).state == "open"  # a preview records nothing
    previewed = re.search(r'name="previewed" value="([0-9a-f]{64})"', preview.text)
    assert previewed
    swapped = inbox.post(url, {"confirm": "1", "previewed": previewed.group(1),
                               "arguments": '{"path": "c.txt", "content": "other"}'})
    assert swapped.status_code == 409 and inbox.item(item.id).state == "open"
    ok = inbox.post(url, {"confirm": "1", "previewed": previewed.group(1),
                          "arguments": '{"path": "b.txt", "content": "edited\\n"}'})
    assert ok.status_code == 303
    inbox.finished(paused.run_id)
    assert (inbox.workspace / "b.txt").read_text() == "edited\n"
    assert not (inbox.workspace / "a.txt").exists()
    assert not (inbox.workspace.parent / "escape.txt").exists()


def test_a_sub_agents_edited_arguments_are_checked_by_the_sub_agent(inbox: Inbox) -> None:
    """The item is the writer's (a sub-agent): its tool and the tree's policy check the edit,
    and approving it continues the tree from the root."""
    import json

    import inbox_agents

    task = json.dumps({"tool": WRITE, "arguments": {"path": "a.txt", "content": "model's\n"}})
    paused = run_store(inbox.db, lambda store: inbox_agents.delegating(
        workspace=str(inbox.workspace)).run(task, store=store))
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    items = run_store(inbox.db, lambda store: store.pending())
    (item,) = items
    assert item.run_id != paused.run_id  # the writer's own run, a child of the planner's
    page = inbox.client.get(f"/items/{item.id}")
    assert page.status_code == 200
    assert 'id="edited"' in page.text, re.findall(r'<p class="(?:note|error)">[^<]*', page.text)
    url = f"/items/{item.id}/approve-edited"
    wrong_type = inbox.post(url, {"arguments": '{"path": "a.txt", "content": 5}'})
    assert wrong_type.status_code == 422 and "schema" in wrong_type.text
    secret = inbox.post(url, {"arguments": '{"path": ".env", "content": "X=1"}'})
    assert secret.status_code == 422 and "policy denies" in secret.text
    preview = inbox.post(url, {"arguments": '{"path": "b.txt", "content": "edited\\n"}'})
    assert preview.status_code == 200, preview.text
    previewed = re.search(r'name="previewed" value="([0-9a-f]{64})"', preview.text)
    assert previewed
    ok = inbox.post(url, {"confirm": "1", "previewed": previewed.group(1),
                          "arguments": '{"path": "b.txt", "content": "edited\\n"}'})
    assert ok.status_code == 303
    root = inbox.finished(paused.run_id)
    assert root.status is hr.RunStatus.COMPLETED
    assert (inbox.workspace / "b.txt").read_text() == "edited\n"
    assert not (inbox.workspace / "a.txt").exists()


def test_deny_needs_a_reason_and_the_model_reads_it(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "private bytes\n"})
    item = inbox.item_for(paused.run_id)
    empty = inbox.post(f"/items/{item.id}/deny", {"reason": "  "})
    assert empty.status_code == 422 and inbox.item(item.id).state == "open"
    assert inbox.post(f"/items/{item.id}/deny", {"reason": "not on Fridays"}
                      ).status_code == 303
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and "not on Fridays" in run.outcome["output"]
    assert not (inbox.workspace / "a.txt").exists()
    decided = inbox.item(item.id)
    assert decided.decided_by == "alice"
    assert "private bytes" not in str(decided.payload)  # a denial keeps no contents


def test_a_question_is_answered_by_its_choice(inbox: Inbox) -> None:
    paused = inbox.pause("ops/pick_service", {})
    item = inbox.item_for(paused.run_id)
    page = inbox.client.get(f"/items/{item.id}").text
    assert 'value="web"' in page and 'value="api"' in page
    assert inbox.post(f"/items/{item.id}/approve").status_code == 422  # not an approval
    assert inbox.post(f"/items/{item.id}/answer", {"choice": "api"}).status_code == 303
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and "deploying api" in run.outcome["output"]
    assert inbox.item(item.id).decided_by == "alice"


def test_a_form_is_answered_with_json_that_fits_its_schema(inbox: Inbox) -> None:
    paused = inbox.pause("ops/profile", {})
    item = inbox.item_for(paused.run_id)
    page = inbox.client.get(f"/items/{item.id}").text
    assert "How old?" in page and 'id="form-answer"' in page and "data-schema=" in page
    for bad in ("seven", '{"age": "seven"}', '{"age": 7, "name": "x"}'):
        response = inbox.post(f"/items/{item.id}/answer", {"answer": bad})
        assert response.status_code == 422, bad
    assert inbox.item(item.id).state == "open"
    assert inbox.post(f"/items/{item.id}/answer", {"answer": '{"age": 7}'}).status_code == 303
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and "age 7" in run.outcome["output"]


@pytest.mark.parametrize(("choice", "lines", "expect"), [
    ("completed", "", "it happened"), ("abort", "", "may or may not"),
    ("retry", "again\n", "appended"),
])
def test_a_recovery_is_decided(inbox: Inbox, choice: str, lines: str, expect: str) -> None:
    paused = inbox.pause("log/append_line", {"path": "log.txt", "line": "again"})

    async def crash_then_resume(store: hr.Store) -> str:
        import dataclasses

        import inbox_agents

        (record,) = await store.calls(paused.run_id)
        await store.decide(record.pending_id or "", hr.Decision.approve().to_dict(), "op")
        run = await store.run(paused.run_id)
        await store.write(hr.store.Batch(
            run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
            calls=[dataclasses.replace(record, status=hr.CallStatus.STARTED,
                                       decision=hr.Decision.approve().to_dict())]))
        again = await hr.resume(store, paused.run_id,
                                agent=inbox_agents.agent(workspace=str(inbox.workspace)))
        assert isinstance(again.outcome, hr.AwaitingRecovery)
        return record.id

    record_id = run_store(inbox.db, crash_then_resume)
    page = inbox.client.get(f"/items/{record_id}").text
    assert "Retry it" in page and "Mark completed" in page
    response = inbox.post(f"/items/{record_id}/recover",
                          {"choice": choice, "observation": "it happened"})
    assert response.status_code == 303, response.text
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and expect in run.outcome["output"]
    log = inbox.workspace / "log.txt"
    assert (log.read_text() if log.exists() else "") == lines


def _in_doubt(inbox: Inbox) -> tuple[hr.RunResult, str]:
    """A run whose approved call was in flight at a crash: (its result, the recovery's id)."""
    paused = inbox.pause("log/append_line", {"path": "log.txt", "line": "again"})

    async def crash_then_resume(store: hr.Store) -> str:
        import dataclasses

        import inbox_agents

        (record,) = await store.calls(paused.run_id)
        await store.decide(record.pending_id or "", hr.Decision.approve().to_dict(), "op")
        run = await store.run(paused.run_id)
        await store.write(hr.store.Batch(
            run=dataclasses.replace(run, status=hr.RunStatus.RUNNING, owner="gone:1:x"),
            calls=[dataclasses.replace(record, status=hr.CallStatus.STARTED,
                                       decision=hr.Decision.approve().to_dict())]))
        again = await hr.resume(store, paused.run_id,
                                agent=inbox_agents.agent(workspace=str(inbox.workspace)))
        assert isinstance(again.outcome, hr.AwaitingRecovery)
        return record.id

    return paused, run_store(inbox.db, crash_then_resume)


def test_a_recovery_marked_completed_needs_what_happened(inbox: Inbox) -> None:
    paused, record_id = _in_doubt(inbox)
    url = f"/items/{record_id}/recover"
    for form, says in (({"choice": "completed", "observation": "  "}, "say what happened"),
                       ({"choice": "maybe", "observation": "x"}, "choose retry, completed"),
                       ({"choice": "completed", "observation": "x" * (64 * 1024 + 1)},
                        "longer than")):
        refused = inbox.post(url, form)
        assert refused.status_code == 422 and says in refused.text, (form["choice"], says)
    assert inbox.item(record_id).state == "open"
    assert inbox.post(url, {"choice": "completed", "observation": "it landed"}
                      ).status_code == 303
    run = inbox.finished(paused.run_id)
    assert run.outcome is not None and "it landed" in run.outcome["output"]
    assert not (inbox.workspace / "log.txt").exists()  # completed: not performed again


def test_edited_arguments_and_reasons_are_bounded_and_must_be_an_object(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "model's\n"})
    item = inbox.item_for(paused.run_id)
    url = f"/items/{item.id}/approve-edited"
    for arguments in ('["a.txt", "x"]', '"a.txt"', "null"):
        refused = inbox.post(url, {"arguments": arguments})
        assert refused.status_code == 422 and "must be a JSON object" in refused.text, arguments
    # The form itself is bounded first (1 MiB), before anything reads it.
    huge = inbox.post(url, {"arguments": '{"path": "a.txt", "content": "' + "x" * (1 << 20)})
    assert huge.status_code == 413 and "at most 1 MiB" in huge.text
    long_reason = inbox.post(f"/items/{item.id}/deny", {"reason": "no " * 30_000})
    assert long_reason.status_code == 422 and "longer than" in long_reason.text
    long_pattern = inbox.post(f"/items/{item.id}/approve",
                              {"remember": "1", "remember_pattern": "a" * (64 * 1024 + 1)})
    assert long_pattern.status_code == 422 and "longer than" in long_pattern.text
    assert inbox.item(item.id).state == "open"
    assert not (inbox.workspace / "a.txt").exists()


def test_a_decision_of_the_wrong_kind_is_refused_for_its_kind(inbox: Inbox) -> None:
    question = inbox.item_for(inbox.pause("ops/pick_service", {}).run_id)
    approval = inbox.item_for(inbox.pause(WRITE, {"path": "a.txt", "content": "x"}).run_id)
    for path, form, item, kind in (
            (f"/items/{question.id}/approve", {}, question, "approval"),
            (f"/items/{question.id}/deny", {"reason": "no"}, question, "approval"),
            (f"/items/{approval.id}/answer", {"choice": "api"}, approval, "question"),
            (f"/items/{approval.id}/recover", {"choice": "retry"}, approval, "recovery")):
        refused = inbox.post(path, form)
        assert refused.status_code == 422, (path, refused.status_code)
        assert f"is a pending {item.kind}, not a {kind}" in refused.text, (path, refused.text)
    assert inbox.item(question.id).state == "open" and inbox.item(approval.id).state == "open"


# ----------------------------------------------------------------- escaping


def test_what_a_model_wrote_is_shown_as_text(inbox: Inbox) -> None:
    hostile = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
    paused = inbox.pause(WRITE, {"path": "x<b>.html", "content": hostile})
    item = inbox.item_for(paused.run_id)
    for path in ("/", f"/items/{item.id}", f"/runs/{paused.run_id}", "/fragments/items"):
        html = inbox.client.get(path).text
        assert "<script>window" not in html and "<img src=x" not in html
        assert "<b>" not in html
    page = inbox.client.get(f"/items/{item.id}").text
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page
    assert "x&lt;b&gt;.html" in page


# -------------------------------------------------------------- the 1,000


class _CountingStore:
    """A store that counts the awaited calls the app makes on it (the page's queries)."""

    def __init__(self, store: hr.Store) -> None:
        self._store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not callable(value) or name.startswith("_"):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return value(*args, **kwargs)

        return counted


def _seed_pending(db: Path, count: int) -> None:
    async def seed(store: hr.Store) -> None:
        now = time.time()
        run = hr.RunRecord(id="bulk", task="bulk", agent="bulk-agent",
                           status=hr.RunStatus.AWAITING_APPROVAL, created_at=now,
                           outcome={"kind": "awaiting_approval", "request_id": "req-0000"})
        items = [hr.PendingItem(id=f"req-{i:04d}", kind="approval", run_id="bulk",
                                call_record=f"bulk:c{i}", agent="bulk-agent", tool=WRITE,
                                payload={"act": "write", "target": f"f{i}.txt",
                                         "arguments": {"path": f"f{i}.txt", "content": "x"}},
                                created_at=now - 1000 + i)
                 for i in range(count)]
        await store.write(hr.store.Batch(run=run, pending=items))

    run_store(db, seed)


def _first_page_calls(tmp_path: Path, count: int, page: str = "/") -> tuple[list[str], str]:
    """The store calls one request for `page` makes with `count` pending items, and its HTML."""
    import inbox_agents

    from handrail.web import create_app

    db = tmp_path / f"runs-{count}.db"
    _seed_pending(db, count)
    store = _CountingStore(hr.Store.open(db))
    app = create_app(store, agent_for=inbox_agents.by_ref,  # type: ignore[arg-type]
                     login_tokens=(TOKEN,), default_user="alice")
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        login(client)
        store.calls.clear()
        response = client.get(page)
        assert response.status_code == 200, response.text
        return list(store.calls), response.text


def test_a_thousand_pending_items_show_fifty_a_page_newest_first(inbox: Inbox) -> None:
    # The time it takes is a figure, not a promise here: benchmarks/inbox.py measures it.
    _seed_pending(inbox.db, 1000)
    html = inbox.client.get("/").text
    assert "1000 pending" in html and "page 1 of 20" in html
    shown = re.findall(r'data-id="(req-\d{4})"', html)
    assert shown == [f"req-{i:04d}" for i in range(999, 949, -1)]  # newest first, 50 a page
    last = inbox.client.get("/?page=20").text
    assert re.findall(r'data-id="(req-\d{4})"', last) == [f"req-{i:04d}"
                                                         for i in range(49, -1, -1)]
    # Out of range: clamped to the last page, never an empty page or an error.
    assert "page 20 of 20" in inbox.client.get("/?page=9999").text
    assert "page 1 of 20" in inbox.client.get("/?page=-3").text
    assert "page 1 of 20" in inbox.client.get("/?page=two").text


def test_the_first_page_asks_the_store_the_same_few_questions_for_ten_items_or_a_thousand(
        tmp_path: Path) -> None:
    few, few_html = _first_page_calls(tmp_path, 10)
    many, many_html = _first_page_calls(tmp_path, 1000)
    assert "10 pending" in few_html and "1000 pending" in many_html
    # No query per item: what a page costs does not grow with the pending list.
    assert many == few, (few, many)
    assert len(many) <= 3, many


# ------------------------------------------------------------------- misc


def test_unknown_items_and_runs_are_404(inbox: Inbox) -> None:
    assert inbox.client.get("/items/nope").status_code == 404
    assert inbox.client.get("/runs/nope").status_code == 404
    assert inbox.post("/items/nope/approve").status_code == 404


def test_without_an_agent_the_decision_is_recorded_and_the_run_waits(tmp_path: Path) -> None:
    from inbox_support import _start

    from handrail.web import create_app

    db = tmp_path / "runs.db"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    paused = run_store(db, lambda s: _start(s, workspace, WRITE, {"path": "a", "content": "b"}))
    app = create_app(hr.Store.open(db), agent_for=lambda run: None, login_tokens=(TOKEN,))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        csrf = login(client)
        (item,) = run_store(db, lambda s: s.pending())
        page = client.get(f"/items/{item.id}").text
        assert "no agent reference" in page and "Editing needs the tool" in page
        response = client.post(f"/items/{item.id}/deny", data={"csrf": csrf, "reason": "no"},
                               follow_redirects=False)
        assert response.status_code == 303
        assert "handrail resume" in client.get(f"/items/{item.id}").text
    decided = run_store(db, lambda s: s.pending_item(item.id))
    assert decided.decided_by == "alice" and "redacted" in str(decided.payload["arguments"])
    # Decided, not continued: the run is ready for `handrail resume` (or a worker).
    assert run_store(db, lambda s: s.run(paused.run_id)).status is hr.RunStatus.READY


def test_wait_until_helper_fails_loudly() -> None:
    with pytest.raises(AssertionError, match="timed out"):
        wait_until(lambda: False, "nothing", timeout=0.05)


def test_a_cross_site_post_is_refused_even_with_the_token(inbox: Inbox) -> None:
    paused = inbox.pause(WRITE, {"path": "a.txt", "content": "x\n"})
    item = inbox.item_for(paused.run_id)
    response = inbox.client.post(f"/items/{item.id}/approve", data={"csrf": inbox.csrf},
                                 headers={"sec-fetch-site": "cross-site"})
    assert response.status_code == 403
    assert inbox.item(item.id).state == "open"


def test_an_agent_that_cannot_be_rebuilt_is_explained_not_a_crash(tmp_path: Path) -> None:
    from inbox_support import _start

    from handrail.web import create_app

    db = tmp_path / "runs.db"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run_store(db, lambda s: _start(s, workspace, WRITE, {"path": "a", "content": "b"}))

    def broken(run: hr.RunRecord) -> hr.Agent:
        raise RuntimeError("the module moved")

    app = create_app(hr.Store.open(db), agent_for=broken, login_tokens=(TOKEN,))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        login(client)
        (item,) = run_store(db, lambda s: s.pending())
        page = client.get(f"/items/{item.id}")
        assert page.status_code == 200
        assert "could not be rebuilt: RuntimeError: the module moved" in page.text


# ------------------------------------------------------- a store workers serve


def _paused_on_postgres(pg_url: str, workspace: Path, name: str) -> hr.RunResult:
    from inbox_support import _start

    return run_store(pg_url,  # type: ignore[no-any-return]
                     lambda s: _start(s, workspace, WRITE, {"path": name, "content": "x\n"}))


def test_on_a_postgresql_store_a_decision_is_left_to_the_workers(
        tmp_path: Path, pg_url: str) -> None:
    """Workers (`handrail worker`) continue a PostgreSQL store's runs, on whichever machine
    is free: the inbox records the decision as `approve --no-resume` does, resumes nothing."""
    import inbox_agents

    from handrail.web import create_app

    workspace = tmp_path / "ws"
    workspace.mkdir()
    approved = _paused_on_postgres(pg_url, workspace, "a.txt")
    denied = _paused_on_postgres(pg_url, workspace, "b.txt")
    app = create_app(hr.Store.open(pg_url), agent_for=inbox_agents.agent,
                     login_tokens=(TOKEN,))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        csrf = login(client)
        items = {p.run_id: p for p in run_store(pg_url, lambda s: s.pending())}
        a, d = items[approved.run_id], items[denied.run_id]
        assert client.post(f"/items/{a.id}/approve", data={"csrf": csrf},
                           follow_redirects=False).status_code == 303
        assert "A worker (`handrail worker`) continues the run" in client.get(
            f"/items/{a.id}").text
        assert client.post(f"/items/{d.id}/deny", data={"csrf": csrf, "reason": "no"},
                           follow_redirects=False).status_code == 303
        again = client.post(f"/items/{a.id}/approve", data={"csrf": csrf},
                            follow_redirects=False)
        assert again.status_code == 409 and "already decided by alice" in again.text
        assert app.state.inbox.jobs == {}  # no resume started here, not even in the background
    for run_id in (approved.run_id, denied.run_id):
        run = run_store(pg_url, lambda s, run_id=run_id: s.run(run_id))
        assert (run.status, run.owner) == (hr.RunStatus.READY, None)  # ready for a worker
    assert run_store(pg_url, lambda s: s.pending_item(a.id)).decided_by == "alice"
    # A denial is kept without the contents it would have written, as everywhere.
    assert "redacted" in str(run_store(pg_url, lambda s: s.pending_item(d.id)).payload)
    assert not (workspace / "a.txt").exists()
    assert run_store(pg_url, lambda s: s.ready_count()) == 2


def test_resume_runs_makes_the_inbox_continue_a_postgresql_run_itself(
        tmp_path: Path, pg_url: str) -> None:
    import inbox_agents

    from handrail.web import create_app

    workspace = tmp_path / "ws"
    workspace.mkdir()
    paused = _paused_on_postgres(pg_url, workspace, "a.txt")
    app = create_app(hr.Store.open(pg_url), agent_for=inbox_agents.agent,
                     login_tokens=(TOKEN,), resume_runs=True)
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        csrf = login(client)
        (item,) = run_store(pg_url, lambda s: s.pending())
        assert client.post(f"/items/{item.id}/approve", data={"csrf": csrf},
                           follow_redirects=False).status_code == 303
        assert "The run continues" in client.get(f"/items/{item.id}").text
        wait_until(lambda: run_store(pg_url, lambda s: s.run(paused.run_id)).status
                   is hr.RunStatus.COMPLETED, "the run to complete")
    assert (workspace / "a.txt").read_text() == "x\n"


def test_a_sqlite_inbox_still_continues_runs_and_the_cli_flag_chooses() -> None:
    from handrail.cli import _inbox
    from handrail.web._inbox import served_by_workers

    assert not served_by_workers(hr.Store.open("memory://"))
    import argparse

    parser = argparse.ArgumentParser()
    _inbox.register(parser.add_subparsers())
    assert parser.parse_args(["inbox"]).resume is None
    assert parser.parse_args(["inbox", "--resume"]).resume is True
    assert parser.parse_args(["inbox", "--no-resume"]).resume is False
