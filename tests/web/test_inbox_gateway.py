"""The inbox on a call an MCP client made through `handrail serve` (issue 36).

Such a call waits in its client's session (the serving process continues it once decided),
so the inbox must not offer `handrail resume ... --agent MODULE:OBJECT` nor blame "the run's
agent" for edits; and once the session's server is gone, nothing would run it: the inbox
says so and decides nothing. A diff names the file as in a repository (`b/notes.md`), not
`b//<absolute path>`.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.mcp import Gateway
from handrail.web._inbox import Inbox, Refused

pytestmark = pytest.mark.anyio


async def parked_write(tmp_path: Path, store: hr.Store) -> tuple[Gateway, hr.PendingItem]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.md").write_text("old line\n")
    gateway = Gateway(hr.Toolbox(workspace_tools()), store=store, workspace=workspace,
                      approval_timeout=0.05)
    session = await gateway.open_session("desktop")
    # An absolute path, as a desktop client's filesystem server takes them.
    result = await session.call("workspace--write_file",
                                {"path": str(workspace / "notes.md"), "content": "new line\n"})
    assert result.render_text().startswith("awaiting approval: request ")
    [item] = await store.pending()
    return gateway, item


async def test_a_live_gateway_call_is_decided_without_a_resume_and_its_diff_is_relative(
        tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    gateway, item = await parked_write(tmp_path, store)
    inbox = Inbox(store, lambda run: None)
    view = await inbox.view(item.id)
    assert view.agent_problem is not None
    assert "MCP client made through `handrail serve`" in view.agent_problem
    assert "MODULE:OBJECT" not in view.agent_problem
    [action] = view.actions
    files = [line.text for line in action.diff if line.kind == "file"]
    assert files == ["--- a/notes.md", "+++ b/notes.md"]
    with pytest.raises(Refused, match="an MCP client's call is checked by the `handrail "
                                      "serve`"):
        await inbox.check_edit(item.id, '{"path": "notes.md", "content": "x"}')
    said = await inbox.approve(item.id, "alice")
    assert "goes on by itself" in said and "resume" not in said
    # The client's same call again: performed once, as approved.
    [session] = gateway.sessions
    again = await session.call("workspace--write_file", {
        "path": str(tmp_path / "ws" / "notes.md"), "content": "new line\n"})
    assert not again.is_error, again.render_text()
    assert (tmp_path / "ws" / "notes.md").read_text() == "new line\n"
    await gateway.close()
    await store.close()


async def test_a_call_whose_server_is_gone_is_not_decided_in_the_inbox(tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    store.lease_seconds = 0.01
    _, item = await parked_write(tmp_path, store)  # its server killed: never closed
    await anyio.sleep(0.02)
    inbox = Inbox(store, lambda run: None)
    view = await inbox.view(item.id)
    assert view.agent_problem is not None
    assert "the MCP session this call belongs to has ended" in view.agent_problem
    assert "resume" not in view.agent_problem
    with pytest.raises(Refused, match="not decided: the MCP session this call belongs to "
                                      "has ended") as refused:
        await inbox.approve(item.id, "alice")
    assert refused.value.status == 409
    assert (await store.pending_item(item.id)).state == "open"
    assert (tmp_path / "ws" / "notes.md").read_text() == "old line\n"
    # The next server on the store expires it, recorded.
    successor = Gateway(hr.Toolbox(workspace_tools()), store=store, workspace=tmp_path / "ws")
    assert await successor.expire_orphans() == 1
    assert (await store.pending_item(item.id)).state == "decided"
    await store.close()
