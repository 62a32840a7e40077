"""The inbox's run page shows each call's quota: its count, the limit and the window."""

from __future__ import annotations

import pytest
from inbox_support import Inbox, run_store

import handrail as hr
from handrail.models import Scripted, calls, reply


@hr.tool(server="mail", name="send")
async def send(to: str) -> str:
    """Send one email."""
    return f"sent to {to}"


def test_the_run_page_shows_the_count_limit_and_window_of_each_call(inbox: Inbox) -> None:
    policy = (hr.Policy.default().layer("app").allow(hr.Act.CALL, "mail/send")
              .limit(hr.Act.CALL, "mail/send", 1, per="1d", key="agent"))
    agent = hr.Agent(Scripted([calls([("mail/send", {"to": "a<b>"}),
                                      ("mail/send", {"to": "c"})]), reply("done")]),
                     [send], policy=policy, workspace=inbox.workspace, name="<mailer>")

    async def go(store: hr.Store) -> hr.RunResult:
        return await agent.run("mail", store=store)

    result = run_store(inbox.db, go)
    page = inbox.client.get(f"/runs/{result.run_id}").text
    assert ("quota: <span class=\"text\">limit call &#39;mail/send&#39; 1 per 1d per agent, "
            "then deny: 1 of 1 in ") in page
    assert "(agent=&lt;mailer&gt;)</span>" in page  # escaped: a name is not markup
    assert "— full, not counted" in page


def _mailer(policy: hr.Policy, inbox: Inbox, *tos: str) -> hr.Agent:
    return hr.Agent(Scripted([calls([("mail/send", {"to": to}) for to in tos]), reply("done")]),
                    [send], policy=policy, workspace=inbox.workspace, name="mailer")


def test_a_waiting_call_shows_the_count_and_window_of_its_quota_held_or_not(
        inbox: Inbox, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's "the inbox and `handrail show` show the counts": for a call that waits for
    a person (it has not started, so it has no quota entry of its own) as for one a full
    window held back."""
    from handrail.cli import main

    def limited(policy: hr.Policy) -> hr.Policy:
        return policy.limit(hr.Act.CALL, "mail/send", 3, per="1d", key="agent", then="ask")

    allowed = limited(hr.Policy.default().layer("app").allow(hr.Act.CALL, "mail/send"))
    asked = limited(hr.Policy.default().layer("app").ask(hr.Act.CALL, "mail/send"))

    async def two_sent_then_one_asked(store: hr.Store) -> hr.RunResult:
        await _mailer(allowed, inbox, "a", "b").run("mail", store=store)
        return await _mailer(asked, inbox, "c").run("mail", store=store)

    waiting = run_store(inbox.db, two_sent_then_one_asked)
    assert isinstance(waiting.outcome, hr.AwaitingApproval)
    page = inbox.client.get(f"/items/{waiting.outcome.request_id}").text
    line = ("limit call &#39;mail/send&#39; 3 per 1d per agent, then ask: 2 of 3 in ")
    assert line in page
    assert "(agent=mailer) — not counted yet: it counts when it starts" in page
    assert main(["show", waiting.run_id, "--store", str(inbox.db)]) == 0
    shown = [x.strip() for x in capsys.readouterr().out.splitlines() if "quota:" in x]
    assert len(shown) == 1 and shown[0].startswith(
        "quota: limit call 'mail/send' 3 per 1d per agent, then ask: 2 of 3 in ")

    async def the_third_sent_then_one_held(store: hr.Store) -> hr.RunResult:
        await _mailer(allowed, inbox, "d").run("mail", store=store)
        return await _mailer(allowed, inbox, "e").run("mail", store=store)

    held = run_store(inbox.db, the_third_sent_then_one_held)
    assert isinstance(held.outcome, hr.AwaitingApproval)  # the full window asks
    page = inbox.client.get(f"/items/{held.outcome.request_id}").text
    assert ("limit call &#39;mail/send&#39; 3 per 1d per agent, then ask: 3 of 3 in ") in page
    assert "(agent=mailer) — full" in page
