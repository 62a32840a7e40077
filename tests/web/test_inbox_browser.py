"""The inbox in a real browser: Debian's headless Chromium driven by Playwright.

One `handrail inbox` server (a subprocess, started by the CLI as a person would) and one
browser serve the whole module; each test starts its own paused run in the shared store.
Screenshots of the list and of an approval with its diff are saved in a temporary folder
(and, with `HANDRAIL_SCREENSHOTS=DIR`, copied there: docs/inbox.md shows them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("browser tests need Debian's chromium (scripts/test installs it as root with "
                "apt-get; elsewhere: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="browser tests need playwright (the dev extra)")

import inbox_agents  # noqa: E402 - imported once the skips above have had their say
from inbox_support import run_store  # noqa: E402

import handrail as hr  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
WRITE = "workspace/write_file"
TIMEOUT_MS = 15_000


@dataclass
class Server:
    """The `handrail inbox` process, its store and the workspace runs write into."""

    url: str
    db: Path
    workspace: Path
    shots: Path

    def pause(self, tool: str, arguments: dict[str, Any]) -> hr.RunResult:
        task = json.dumps({"tool": tool, "arguments": arguments})
        agent = inbox_agents.agent(workspace=str(self.workspace))
        result = run_store(self.db, lambda store: agent.run(task, store=store))
        assert isinstance(result.outcome, hr.AwaitingApproval | hr.AwaitingAnswer), result
        return result  # type: ignore[no-any-return]

    def item_of(self, run_id: str) -> hr.PendingItem:
        (item,) = [p for p in run_store(self.db, lambda s: s.pending()) if p.run_id == run_id]
        return item

    def item(self, item_id: str) -> hr.PendingItem:
        return run_store(self.db, lambda s: s.pending_item(item_id))  # type: ignore[no-any-return]

    def run(self, run_id: str) -> hr.RunRecord:
        return run_store(self.db, lambda s: s.run(run_id))  # type: ignore[no-any-return]


def _cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("HANDRAIL_STORE", None)
    env.pop("HANDRAIL_AGENT", None)
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("inbox")
    db = base / "runs.db"
    workspace = base / "ws"
    workspace.mkdir()
    run_store(db, lambda s: s.runs())
    log = open(base / "server.log", "w+", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "handrail.cli", "inbox", "--store", str(db), "--port", "0",
         "--user", "alice"],
        cwd=base, env=_cli_env(), stdout=subprocess.PIPE, stderr=log, text=True)
    # A server that never prints its URL must not hang the suite.
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            found = re.search(r"(http://\S+/login\?token=\S+)", line)
            if found:
                url = found.group(1)
                break
        watchdog.cancel()
        if url is None:
            log.seek(0)
            raise AssertionError(f"handrail inbox printed no URL: {log.read()}")
        shots = Path(os.environ.get("HANDRAIL_SCREENSHOTS") or base / "screenshots")
        shots.mkdir(parents=True, exist_ok=True)
        yield Server(url, db, workspace, shots)
    finally:
        watchdog.cancel()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
        log.close()


@pytest.fixture(scope="module")
def browser_context(server: Server) -> Iterator[Any]:
    pw = sync_api.sync_playwright().start()
    try:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage",
                                           "--disable-gpu"])
    except Exception as exc:
        pw.stop()
        pytest.skip(f"chromium at {CHROMIUM} does not start: {exc}")
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(server.url)
    page.get_by_label("Your name").fill("alice")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/$"))
    page.close()
    yield context
    context.close()
    browser.close()
    pw.stop()


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    page.close()
    assert errors == [], errors  # no script error on any page


def origin(server: Server) -> str:
    return server.url.split("/login")[0]


def expect(locator: Any) -> Any:
    return sync_api.expect(locator)


# ---------------------------------------------------------------------- tests


def test_a_deferred_run_appears_is_approved_and_completes(server: Server, page: Any) -> None:
    (server.workspace / "NOTES.md").write_text("# Notes\n\nold line\n")
    page.goto(origin(server) + "/")
    expect(page.locator("#count")).to_be_visible()
    paused = server.pause(WRITE, {"path": "NOTES.md",
                                  "content": "# Notes\n\nnew line, written once\n"})
    item = server.item_of(paused.run_id)
    link = page.locator(f"#item-{item.id}")
    expect(link).to_be_visible()  # arrived without a reload
    expect(page.locator("#live-note")).to_contain_text("1 pending")  # and was announced
    page.screenshot(path=str(server.shots / "inbox-list.png"), full_page=True)
    link.click()
    expect(page.locator(".diff .d-add", has_text="new line, written once")).to_be_visible()
    expect(page.locator(".diff .d-del", has_text="old line")).to_be_visible()
    page.screenshot(path=str(server.shots / "inbox-approval.png"), full_page=True)
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator(".flash")).to_contain_text("Decided")
    page.get_by_role("link", name="Follow the run").click()
    expect(page.locator("#run-status")).to_contain_text("completed")
    assert (server.workspace / "NOTES.md").read_text() == "# Notes\n\nnew line, written once\n"
    calls = run_store(server.db, lambda s: s.calls(paused.run_id))
    assert [(c.status.value, c.decided_by) for c in calls] == [("finished", "alice")]
    for name in ("inbox-list.png", "inbox-approval.png"):
        assert (server.shots / name).stat().st_size > 10_000


def test_an_edited_argument_that_fails_the_schema_is_refused_in_the_page(
        server: Server, page: Any) -> None:
    paused = server.pause(WRITE, {"path": "edit.txt", "content": "x"})
    item = server.item_of(paused.run_id)
    sent: list[str] = []

    def record_posts(request: Any) -> None:
        if request.method == "POST":
            sent.append(request.url)

    page.on("request", record_posts)
    page.goto(origin(server) + f"/items/{item.id}")
    page.get_by_label("Arguments (JSON").fill('{"path": 5, "content": "x", "mode": 1}')
    page.get_by_role("button", name="Check the edited call").click()
    errors = page.locator("#edit-errors")
    expect(errors).to_contain_text("path must be string")
    expect(errors).to_contain_text('unknown field "mode"')
    expect(page.locator("#edited")).to_be_focused()
    assert sent == [] and server.item(item.id).state == "open"
    page.remove_listener("request", record_posts)
    # A valid edit goes through, and the server's answer is what was shown.
    page.get_by_label("Arguments (JSON").fill('{"path": "edited.txt", "content": "edited"}')
    page.get_by_role("button", name="Check the edited call").click()
    # The server's understanding of the edit, before anything is recorded.
    expect(page.locator(".diff .d-add", has_text="edited")).to_be_visible()
    expect(page.locator("h3", has_text="write edited.txt")).to_be_visible()
    assert server.item(item.id).state == "open"
    page.get_by_role("button", name="Approve this call").click()
    expect(page.locator(".flash")).to_contain_text("Decided")
    page.goto(origin(server) + f"/runs/{paused.run_id}")
    expect(page.locator("#run-status")).to_contain_text("completed")
    assert (server.workspace / "edited.txt").read_text() == "edited"
    assert not (server.workspace / "edit.txt").exists()


def test_a_denial_reason_reaches_the_run(server: Server, page: Any) -> None:
    paused = server.pause(WRITE, {"path": "deny.txt", "content": "x"})
    item = server.item_of(paused.run_id)
    page.goto(origin(server) + f"/items/{item.id}")
    page.get_by_label("Reason (the model reads it)").fill("write to notes/ instead")
    page.get_by_role("button", name="Deny").click()
    expect(page.locator(".flash")).to_contain_text("Decided")
    page.goto(origin(server) + f"/runs/{paused.run_id}")
    expect(page.locator("#run-status")).to_contain_text("completed")
    expect(page.locator("main")).to_contain_text("write to notes/ instead")
    assert not (server.workspace / "deny.txt").exists()


def test_a_question_is_answered_with_a_choice_button(server: Server, page: Any) -> None:
    paused = server.pause("ops/pick_service", {})
    item = server.item_of(paused.run_id)
    page.goto(origin(server) + f"/items/{item.id}")
    expect(page.locator(".question")).to_have_text("Which service?")
    page.get_by_role("button", name="api").click()
    expect(page.locator(".flash")).to_contain_text("Decided")
    page.goto(origin(server) + f"/runs/{paused.run_id}")
    expect(page.locator("#run-status")).to_contain_text("completed")
    expect(page.locator("main")).to_contain_text("deploying api")
    assert server.item(item.id).decided_by == "alice"


def test_a_script_inside_a_tool_argument_is_not_executed(server: Server, page: Any) -> None:
    hostile = ('<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
               '"><svg onload="window.pwned=3">')
    paused = server.pause(WRITE, {"path": "<img src=y onerror=window.pwned=4>.txt",
                                  "content": hostile})
    item = server.item_of(paused.run_id)
    for path in ("/", f"/items/{item.id}", f"/runs/{paused.run_id}"):
        page.goto(origin(server) + path)
        expect(page.locator("main")).to_contain_text("onerror=window.pwned=4")
        assert page.evaluate("typeof window.pwned") == "undefined", path
    page.goto(origin(server) + f"/items/{item.id}")
    expect(page.locator("#arguments-shown")).to_contain_text("<script>window.pwned=1</script>")
    page.wait_for_timeout(300)  # give a wrongly inserted onerror handler the chance to run
    assert page.evaluate("typeof window.pwned") == "undefined"


def test_a_post_without_the_csrf_token_is_refused(server: Server, page: Any) -> None:
    paused = server.pause(WRITE, {"path": "csrf.txt", "content": "x"})
    item = server.item_of(paused.run_id)
    page.goto(origin(server) + f"/items/{item.id}")
    status = page.evaluate(
        """async (url) => (await fetch(url, {method: "POST", body: new URLSearchParams(
               {reason: "forged"})})).status""", f"/items/{item.id}/deny")
    assert status == 403
    assert server.item(item.id).state == "open"


def test_the_page_updates_when_another_process_decides(server: Server, page: Any) -> None:
    paused = server.pause(WRITE, {"path": "elsewhere.txt", "content": "x"})
    item = server.item_of(paused.run_id)
    list_page = page.context.new_page()
    list_page.goto(origin(server) + "/")
    expect(list_page.locator(f"#item-{item.id}")).to_be_visible()
    page.goto(origin(server) + f"/items/{item.id}")
    approve = page.get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_enabled()
    done = subprocess.run(
        [sys.executable, "-m", "handrail.cli", "deny", item.id, "--reason", "from a terminal",
         "--no-resume", "--as", "cli", "--store", str(server.db)],
        env=_cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expect(page.locator(".decided")).to_contain_text("Already decided by cli")
    expect(approve).to_be_disabled()
    expect(list_page.locator(f"#item-{item.id}")).to_have_count(0)
    list_page.close()


def test_keyboard_alone_labels_and_a_narrow_window(server: Server, page: Any) -> None:
    paused = server.pause(WRITE, {"path": "keys.txt", "content": "typed\n"})
    item = server.item_of(paused.run_id)
    page.goto(origin(server) + "/")
    link = page.locator(f"#item-{item.id}")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == f"item-{item.id}":
            break
    expect(link).to_be_focused()
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f"/items/{item.id}$"))
    unlabelled = page.evaluate("""() => [...document.querySelectorAll(
        'input:not([type=hidden]), textarea, select')].filter(
        el => !el.labels || el.labels.length === 0).map(el => el.name)""")
    assert unlabelled == []
    # 400% zoom of a 1280-pixel window is a 320-pixel one: nothing may need sideways scrolling.
    page.set_viewport_size({"width": 320, "height": 800})
    for path in ("/", f"/runs/{paused.run_id}", f"/items/{item.id}"):
        page.goto(origin(server) + path)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), path
    page.screenshot(path=str(server.shots / "inbox-narrow.png"), full_page=True)
    page.get_by_label("Reason (the model reads it)").focus()
    page.keyboard.type("not by keyboard today")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # the Deny button, reached by Tab
    expect(page.locator(".flash")).to_contain_text("Decided")
    assert server.item(item.id).decision == {"kind": "deny",
                                             "reason": "not by keyboard today"}


def test_a_thousand_pending_items_show_the_newest_fifty_on_the_first_page(
        server: Server, page: Any) -> None:
    # How long the page takes is a figure (benchmarks/inbox.py), not something asserted here.
    async def seed(store: hr.Store) -> None:
        now = time.time()
        run = hr.RunRecord(id="bulk", task="bulk", agent="bulk-agent",
                           status=hr.RunStatus.AWAITING_APPROVAL, created_at=now,
                           outcome={"kind": "awaiting_approval", "request_id": "bulk-0000"})
        items = [hr.PendingItem(id=f"bulk-{i:04d}", kind="approval", run_id="bulk",
                                call_record=f"bulk:c{i}", agent="bulk-agent", tool=WRITE,
                                payload={"act": "write", "target": f"f{i}.txt",
                                         "arguments": {"path": f"f{i}.txt", "content": "x"}},
                                created_at=now - 5000 + i)
                 for i in range(1000)]
        await store.write(hr.store.Batch(run=run, pending=items))

    run_store(server.db, seed)
    page.goto(origin(server) + "/", wait_until="load")
    expect(page.locator("#count")).to_contain_text("page 1 of")
    expect(page.locator("#item-bulk-0999")).to_be_visible()
    expect(page.locator("li.item")).to_have_count(50)
    # Fifty a page, newest first: the other tests' items (newer) first, then the newest bulk.
    ids = page.locator("li.item").evaluate_all("els => els.map(e => e.dataset.id)")
    bulk = [i for i in ids if i.startswith("bulk-")]
    assert len(ids) == 50 and ids[len(ids) - len(bulk):] == bulk, ids
    assert bulk == [f"bulk-{i:04d}" for i in range(999, 999 - len(bulk), -1)], ids


def test_several_approvals_are_decided_at_once_each_on_its_own(server: Server, page: Any
                                                               ) -> None:
    """Story: ten approvals were ten page visits. Ticked together, each is still its own
    compare-and-swap and record: one decided elsewhere meanwhile is left as it was."""
    paused = [server.pause(WRITE, {"path": f"bulk-{i}.txt", "content": f"bulk {i}\n"})
              for i in range(3)]
    items = [server.item_of(p.run_id) for p in paused]
    page.goto(origin(server) + "/")
    for item in items:
        page.locator(f"#pick-{item.id}").check()
    # The list refreshes by itself when another item arrives: the ticks survive it.
    extra = server.pause(WRITE, {"path": "bulk-extra.txt", "content": "x\n"})
    extra_item = server.item_of(extra.run_id)
    expect(page.locator(f"#item-{extra_item.id}")).to_be_visible()
    for item in items:
        expect(page.locator(f"#pick-{item.id}")).to_be_checked()
    expect(page.locator(f"#pick-{extra_item.id}")).not_to_be_checked()
    # Meanwhile someone else decides the last one (another process, the same store).
    run_store(server.db, lambda s: s.decide(items[2].id, hr.Decision.deny("no").to_dict(),
                                            "bob"))
    page.get_by_role("button", name="Approve selected").click()
    expect(page.locator("#bulk-summary")).to_contain_text("2 of 3 decided")
    expect(page.locator(f".bulk-refused[data-id='{items[2].id}']")).to_contain_text(
        "already decided by bob")
    for item in items[:2]:
        expect(page.locator(f".bulk-ok[data-id='{item.id}']")).to_be_visible()
        done = server.item(item.id)
        assert (done.state, done.decided_by) != ("open", None)
        assert done.decided_by == "alice"
    # Each approved run goes on in the server: its page says when it has completed (the
    # page follows the run by itself; the expectation waits for it, no polling here).
    for i, (item, run) in enumerate(zip(items[:2], paused[:2], strict=True)):
        page.goto(origin(server) + f"/runs/{run.run_id}")
        expect(page.locator("#run-status")).to_contain_text("completed")
        assert (server.workspace / f"bulk-{i}.txt").read_text() == f"bulk {i}\n"
        assert server.item(item.id).decided_by == "alice"
    assert server.item(items[2].id).decided_by == "bob"
    assert server.item(extra_item.id).state == "open"  # not ticked, not decided
    # Denying together needs the reason the model will read.
    page.goto(origin(server) + "/")
    page.locator(f"#pick-{extra_item.id}").check()
    page.get_by_role("button", name="Deny selected").click()
    expect(page.locator("#bulk-error")).to_contain_text("needs a reason")
    assert server.item(extra_item.id).state == "open"
    page.goto(origin(server) + "/")
    page.locator(f"#pick-{extra_item.id}").check()
    page.get_by_label("Reason to deny them (the model reads it)").fill("not today")
    page.get_by_role("button", name="Deny selected").click()
    expect(page.locator("#bulk-summary")).to_contain_text("1 of 1 decided")
    assert server.item(extra_item.id).decision == {"kind": "deny", "reason": "not today"}


def test_bulk_counts_one_approval_of_a_four_eyes_item_and_shows_one_of_two(
        server: Server, page: Any) -> None:
    """Four-eyes in the list: the badge says "0 of 2", a bulk approval counts one (each item
    still its own compare-and-swap and record), the badge follows, and the page says the
    item waits for another person while the plain one is decided."""
    plain = server.pause(WRITE, {"path": "eyes-1.txt", "content": "one\n"})
    four = server.pause(WRITE, {"path": "eyes-2.txt", "content": "two\n"})
    plain_item, four_item = server.item_of(plain.run_id), server.item_of(four.run_id)

    async def four_eyes(store: hr.Store) -> None:
        await store.write(hr.store.Batch(pending=[
            dataclasses.replace(four_item, approvals_needed=2)]))

    run_store(server.db, four_eyes)
    page.goto(origin(server) + "/")
    expect(page.locator(f"#approvals-{four_item.id}")).to_have_text("0 of 2")
    page.locator(f"#pick-{plain_item.id}").check()
    page.locator(f"#pick-{four_item.id}").check()
    page.get_by_role("button", name="Approve selected").click()
    expect(page.locator("#bulk-summary")).to_contain_text(
        "1 of 2 decided, 1 approval counted and waiting for more people")
    expect(page.locator(f".bulk-counted[data-id='{four_item.id}']")).to_contain_text(
        "Approval 1 of 2 recorded")
    expect(page.locator(f".bulk-ok[data-id='{plain_item.id}']")).to_be_visible()
    assert [a["by"] for a in server.item(four_item.id).approvals] == ["alice"]
    assert server.item(plain_item.id).decided_by == "alice"
    page.goto(origin(server) + "/")
    expect(page.locator(f"#approvals-{four_item.id}")).to_have_text("1 of 2")
    # Another person, elsewhere: the list drops it by itself.
    run_store(server.db, lambda s: s.decide(four_item.id, hr.Decision.approve().to_dict(),
                                            "bob"))
    expect(page.locator(f"#item-{four_item.id}")).to_have_count(0)
    assert server.item(four_item.id).decided_by == "alice, bob"


def test_a_program_s_exit_code_output_and_confinement_are_beside_its_call(
        server: Server, page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Story: the inbox showed an exec's call with no output, and nothing said the program ran
    unconfined (no bubblewrap, no Landlock) though its record did."""
    import handrail.sandbox._landlock

    monkeypatch.setenv("HANDRAIL_BWRAP", str(server.workspace / "no-bwrap-here"))
    monkeypatch.setattr(handrail.sandbox._landlock, "abi", lambda: 0)
    script = "printf 'out one\\nout two\\n'; printf 'bad <b>thing</b>\\n' >&2; exit 4"
    task = json.dumps({"tool": "workspace/exec", "arguments": {"argv": ["sh", "-c", script]}})
    agent = inbox_agents.agent(workspace=str(server.workspace))
    result = run_store(server.db, lambda s: agent.run(task, store=s, approver=hr.ApproveAll()))
    assert isinstance(result.outcome, hr.Completed)
    page.goto(origin(server) + f"/runs/{result.run_id}")
    call = page.locator(".call", has_text="workspace/exec")
    expect(call).to_contain_text("exit code 4")
    expect(call.locator(".sandbox-warning")).to_contain_text("UNCONFINED")
    expect(call.locator(".sandbox-warning")).to_contain_text("install bubblewrap")
    expect(call.locator(".program-stdout")).to_have_text("out one\nout two")
    expect(call.locator(".program-stderr")).to_have_text("bad <b>thing</b>")  # text, not HTML
