"""The inbox's run page shows each call's quota: its count, the limit and the window."""

from __future__ import annotations

import handrail as hr
from conftest import Inbox, run_store
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
