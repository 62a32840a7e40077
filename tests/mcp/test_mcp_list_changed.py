"""`tools/list_changed`: an MCP server's new, removed and redefined tools, from the next turn.

The server (tests/mcp/changing_server.py, official SDK) changes its list in the middle of a
run; the next model request is offered the new tools the manifest admits, and nothing else.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_servers import CHANGING_SERVER, text

import handrail as hr
from handrail.models import Scripted, call, calls, reply
from mcp import ClientSession, StdioServerParameters, stdio_client

pytestmark = pytest.mark.anyio

MANIFEST = """
[[tools]]
ref = "fx/echo"
description = "Echo the text."

[[tools]]
ref = "fx/gone"
description = "A tool that will be removed."

[[tools]]
ref = "fx/change_tools"
description = "Change the tool list."

[[tools]]
ref = "fx/restore_gone"
description = "Put gone back."

[[tools]]
ref = "fx/extra"
description = "A tool that appeared later."

[[tools]]
ref = "fx/pinned"
description = "A tool with pinned arguments."
[tools.arguments]
type = "object"
required = ["name"]
properties.name = { type = "string" }
"""


def argv() -> tuple[str, ...]:
    return (sys.executable, str(CHANGING_SERVER))


def policy() -> hr.Policy:
    layer = hr.Policy.default().layer("t").allow("exec", " ".join(argv()))
    for name in ("echo", "gone", "change_tools", "restore_gone", "extra", "sneaky", "pinned"):
        layer = layer.allow("call", f"fx/{name}")
    return layer


@pytest.fixture
async def changing() -> AsyncIterator[hr.mcp.MCPToolset]:
    command, *args = argv()
    async with hr.mcp.MCPToolset.stdio(command, args, name="fx", policy=policy()) as tools:
        yield tools


@pytest.fixture
async def reviewed() -> AsyncIterator[hr.mcp.MCPToolset]:
    """The server's tools as the manifest admits them (a grant may wait for its tool)."""
    command, *args = argv()
    async with hr.mcp.MCPToolset.stdio(command, args, name="fx", policy=policy(),
                                       manifest=hr.Manifest.from_toml(MANIFEST)) as tools:
        yield tools


def names(tools: Any) -> set[str]:
    return {spec.id.model_name for spec in tools}


async def test_the_next_turn_is_offered_the_new_tools_the_manifest_admits(
        reviewed: hr.mcp.MCPToolset, tmp_path: Path) -> None:
    changing = reviewed
    offered: list[set[str]] = []

    def look(turn: Any) -> Any:
        def source(messages: Any, tools: Any) -> Any:
            offered.append(names(tools))
            return turn
        return source

    model = Scripted([
        look(call("fx/change_tools", {})),
        look(calls([("fx/extra", {}), ("fx/gone", {}), ("fx/sneaky", {}),
                    ("fx/echo", {"text": "a"}), ("fx/pinned", {"count": 1})])),
        look(reply("done")),
    ])
    agent = hr.Agent(model, [changing], policy=policy())
    events: list[hr.RunEvent] = []

    async def on_event(event: hr.RunEvent) -> None:
        events.append(event)
        if event.kind == "call_finished" and event.detail.get("tool") == "fx/change_tools":
            with anyio.fail_after(10):  # the notification may travel after the result
                await changing.list_changed.wait()

    store = hr.Store.open(str(tmp_path / "runs.db"))
    result = await agent.run("go", store=store, on_event=on_event)
    assert isinstance(result.outcome, hr.Completed), result.outcome
    before = {"fx--echo", "fx--gone", "fx--change_tools", "fx--restore_gone"}
    assert offered[0] == before
    # From the very next model request: the granted newcomer, not the ungranted one, not
    # the one whose schema differs from the pin, not the removed one, not the redefined one.
    assert offered[1] == {"fx--change_tools", "fx--restore_gone", "fx--extra"}
    assert offered[2] == offered[1]

    records = {r.tool or r.model_name: r for r in await store.calls(result.run_id)}
    assert hr.ToolResult.from_dict(records["fx/extra"].result).render_text() == "extra"
    for refused in ("fx--gone", "fx--sneaky", "fx--echo", "fx--pinned"):
        record = records[refused]
        assert record.status is hr.CallStatus.REFUSED, refused
        assert record.disposition == "not_sent", refused
    text = {k: hr.ToolResult.from_dict(records[k].result).render_text()
            for k in ("fx--gone", "fx--sneaky", "fx--echo", "fx--pinned")}
    assert "no longer offers 'gone'" in text["fx--gone"]
    assert "the manifest does not grant" in text["fx--sneaky"]
    assert "changed the definition of 'echo'" in text["fx--echo"]
    assert "pinned" in text["fx--pinned"] and "refused" in text["fx--pinned"]

    # Recorded with the run, and told to on_event.
    run = await store.run(result.run_id)
    [change] = [e for e in run.events if e["kind"] == "tools_changed"]
    assert change["added"] == ["fx/extra"]
    assert change["removed"] == ["fx/echo", "fx/gone"]
    assert set(change["refused"]) == {"fx/echo", "fx/gone", "fx/pinned", "fx/sneaky"}
    assert "no longer offers" in change["refused"]["fx/gone"]
    assert any(e.kind == "call_event" and e.detail.get("event") == "tools_changed"
               for e in events)
    await store.close()


async def test_a_removed_tool_that_comes_back_unchanged_is_offered_again(
        changing: hr.mcp.MCPToolset) -> None:
    old = hr.Toolbox([changing])
    assert (await old.call("fx/change_tools", {})).render_text() == "changed"
    with anyio.fail_after(10):
        await changing.list_changed.wait()
    box, change = await old.refreshed()
    assert change is not None and "fx/gone" in change["removed"]
    assert "fx/gone" not in box and box.withdrawn("fx--gone") is not None
    # A call made through a list from before the change is refused, not sent.
    with pytest.raises(hr.UnknownTool, match="no longer offers 'gone'") as info:
        await old.call("fx/gone", {})
    assert info.value.disposition is hr.Disposition.NOT_SENT
    changing.list_changed = anyio.Event()
    assert (await box.call("fx/restore_gone", {})).render_text() == "restored"
    with anyio.fail_after(10):
        await changing.list_changed.wait()
    box, change = await box.refreshed()
    assert change is not None and change["added"] == ["fx/gone"]
    assert box.withdrawn("fx--gone") is None
    assert (await box.call("fx/gone", {})).render_text() == "back again"
    same, change = await box.refreshed()
    assert change is None and same is box  # nothing new: the same toolbox


async def test_the_agents_manifest_checks_the_tools_that_appear(
        changing: hr.mcp.MCPToolset) -> None:
    granted = MANIFEST.split("[[tools]]\nref = \"fx/extra\"")[0]  # no extra, no pinned
    check = functools.partial(hr.manifest.refusals, manifest=hr.Manifest.from_toml(granted))
    box = hr.Toolbox([changing])
    assert (await box.call("fx/change_tools", {})).render_text() == "changed"
    with anyio.fail_after(10):
        await changing.list_changed.wait()
    box, change = await box.refreshed(check)
    assert change is not None
    assert change["added"] == []
    assert {"fx/extra", "fx/sneaky", "fx/pinned"} <= set(change["refused"])
    assert "not granted" in change["refused"]["fx/sneaky"]
    assert "fx/extra" not in box and "fx/sneaky" not in box
    assert "is refused" in (box.withdrawn("fx--sneaky") or "")
    changing.list_changed = anyio.Event()
    assert (await box.call("fx/restore_gone", {})).render_text() == "restored"
    with anyio.fail_after(10):
        await changing.list_changed.wait()
    box, change = await box.refreshed(check)
    assert change is not None and change["added"] == ["fx/gone"]  # granted: offered again
    assert "fx/sneaky" not in box  # still refused



async def test_an_agents_manifest_refuses_what_appears_unreviewed_in_the_run(
        changing: hr.mcp.MCPToolset) -> None:
    granted = MANIFEST.split("[[tools]]\nref = \"fx/extra\"")[0]
    offered: list[set[str]] = []

    def look(turn: Any) -> Any:
        def source(messages: Any, tools: Any) -> Any:
            offered.append(names(tools))
            return turn
        return source

    async def on_event(event: hr.RunEvent) -> None:
        if event.kind == "call_finished" and event.detail.get("tool") == "fx/change_tools":
            with anyio.fail_after(10):
                await changing.list_changed.wait()

    agent = hr.Agent(Scripted([look(call("fx/change_tools", {})),
                               look(calls([("fx/sneaky", {}), ("fx/extra", {})])),
                               reply("done")]),
                     [changing], policy=policy(), manifest=hr.Manifest.from_toml(granted))
    store = hr.Store.memory()
    result = await agent.run("go", store=store, on_event=on_event)
    assert isinstance(result.outcome, hr.Completed), result.outcome
    assert offered[1] == {"fx--change_tools", "fx--restore_gone"}
    records = {r.model_name: r for r in await store.calls(result.run_id)}
    for name in ("fx--sneaky", "fx--extra"):
        assert records[name].disposition == "not_sent"
        text = hr.ToolResult.from_dict(records[name].result).render_text()
        assert "appeared after the manifest check" in text and "not granted" in text


SERVE_MANIFEST = """
[[tools]]
ref = "fx/echo"
description = "Echo the text."

[[tools]]
ref = "fx/gone"
description = "A tool that will be removed."

[[tools]]
ref = "fx/change_tools"
description = "Change the tool list."

[[tools]]
ref = "fx/restore_gone"
description = "Put gone back."

[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{python} {server}", "call:fx/*"]

[[servers]]
name = "fx"
names = "prefixed"            # shown as models see them (issue 36: default upstream)
command = "{python}"
args = ["{server}"]
"""


async def test_handrail_serve_follows_its_upstream_and_tells_its_clients(
        tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(
        SERVE_MANIFEST.format(python=sys.executable, server=CHANGING_SERVER))
    told: list[anyio.Event] = [anyio.Event()]

    async def on_message(message: Any) -> None:
        import mcp_types as t

        if isinstance(message, t.ToolListChangedNotification):
            told[-1].set()

    params = StdioServerParameters(
        command=sys.executable, cwd=str(tmp_path), env=dict(os.environ),
        args=["-m", "handrail.cli", "serve", "--stdio", "--store", str(tmp_path / "runs.db")])

    async def listed(session: ClientSession) -> set[str]:
        return {tool.name for tool in (await session.list_tools()).tools}

    with open(tmp_path / "serve.stderr", "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write, message_handler=on_message) as session:
            init = await session.initialize()
            assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
            assert await listed(session) == {"fx--echo", "fx--gone", "fx--change_tools",
                                             "fx--restore_gone"}
            assert text(await session.call_tool("fx--change_tools", {})) == "changed"
            with anyio.fail_after(20):
                await told[-1].wait()
            # Not the removed one, not the redefined one, not the ones nobody granted.
            assert await listed(session) == {"fx--change_tools", "fx--restore_gone"}
            gone = await session.call_tool("fx--gone", {})
            assert gone.is_error and "no longer offers 'gone'" in text(gone)
            echo = await session.call_tool("fx--echo", {"text": "a"})
            assert echo.is_error and "changed the definition of 'echo'" in text(echo)
            sneaky = await session.call_tool("fx--sneaky", {})
            assert sneaky.is_error and "does not grant" in text(sneaky)

            told.append(anyio.Event())
            assert text(await session.call_tool("fx--restore_gone", {})) == "restored"
            with anyio.fail_after(20):
                await told[-1].wait()
            assert "fx--gone" in await listed(session)
            assert text(await session.call_tool("fx--gone", {})) == "back again"

    store = hr.Store.open(str(tmp_path / "runs.db"))
    try:
        [run] = await store.runs()
        changes = [e for e in run.events if e["kind"] == "tools_changed"]
        assert [c["removed"] for c in changes] == [["fx/echo", "fx/gone"], []]
        assert changes[1]["added"] == ["fx/gone"]
        records = {r.call_id: r for r in await store.calls(run.id)}
        refused = [r for r in records.values() if r.model_name == "fx--gone"
                   and r.status is hr.CallStatus.REFUSED]
        assert refused and refused[0].disposition == "not_sent"
    finally:
        await store.close()
