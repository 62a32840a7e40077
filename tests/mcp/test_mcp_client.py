"""`hr.mcp.MCPToolset` against servers we did not write (mcp-server-time) and a misbehaving one."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_servers import FIXTURE_SERVER, python_bin

import handrail as hr
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

TIME_MANIFEST = """
[[tools]]
ref = "time/get_current_time"
description = "The current time in a timezone."
mutates = false

[[tools]]
ref = "time/convert_time"
description = "Convert a time between timezones."
"""


def exec_policy(*argv: str) -> hr.Policy:
    return hr.Policy.default().layer("mcp").allow("exec", " ".join(argv))


@pytest.fixture(scope="module")
async def time_tools() -> AsyncIterator[hr.mcp.MCPToolset]:
    server = python_bin("mcp-server-time")
    manifest = hr.Manifest.from_toml(TIME_MANIFEST)
    async with hr.mcp.MCPToolset.stdio(server, name="time", policy=exec_policy(server),
                                       manifest=manifest) as tools:
        yield tools


@pytest.fixture(scope="module")
async def fixture_tools(tmp_path_factory: pytest.TempPathFactory
                        ) -> AsyncIterator[hr.mcp.MCPToolset]:
    marker = tmp_path_factory.mktemp("mcp") / "calls.log"
    argv = (sys.executable, str(FIXTURE_SERVER), str(marker))
    # Unconfined: its marker file is in /tmp, private to a confined server.
    async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="fx", policy=exec_policy(*argv),
                                       timeout=2.0, sandbox="off") as tools:
        tools.marker = marker  # type: ignore[attr-defined]
        yield tools


def agent(turns: list[Any], tools: Any, *, manifest: hr.Manifest | None = None,
          policy: hr.Policy | None = None) -> hr.Agent:
    return hr.Agent(Scripted(turns), tools, policy=policy or hr.Policy.default(),
                    manifest=manifest)


async def run_results(a: hr.Agent, task: str = "go") -> list[hr.ToolResult]:
    """Run `a` on a fresh store; the results of its calls, in order."""
    store = hr.Store.memory()
    result = await a.run(task, store=store)
    return [hr.ToolResult.from_dict(r.result) for r in await store.calls(result.run_id)
            if r.result is not None]


# -- listing --------------------------------------------------------------------------------


async def test_tools_are_listed_under_the_local_name_with_hints_recorded_not_trusted(
        time_tools: hr.mcp.MCPToolset) -> None:
    specs = {str(i.spec.id): i.spec for i in time_tools.impls()}
    assert set(specs) == {"time/get_current_time", "time/convert_time"}
    assert time_tools.server_info.name == "mcp-time"  # the server's own name is not used
    convert = specs["time/convert_time"]
    assert convert.annotations["readOnlyHint"] is True
    # The hint says read-only; the grant does not: it stays mutating.
    assert convert.mutates is True
    assert specs["time/get_current_time"].mutates is False  # the grant says mutates = false
    assert convert.output_schema is not None
    assert "timezone" in specs["time/get_current_time"].input_schema["properties"]


async def test_without_a_manifest_a_read_only_hint_does_not_make_a_tool_read_only() -> None:
    server = python_bin("mcp-server-time")
    async with hr.mcp.MCPToolset.stdio(server, name="t2", policy=exec_policy(server)) as tools:
        assert all(i.spec.mutates for i in tools.impls())
        # So the default policy asks before calling it: the run pauses, nothing is sent.
        result = await agent([call("t2/get_current_time", {"timezone": "UTC"}), reply("x")],
                             [tools]).run("time?")
        assert isinstance(result.outcome, hr.AwaitingApproval)


async def test_hyphens_and_dots_round_trip_through_the_model_name(
        fixture_tools: hr.mcp.MCPToolset) -> None:
    impl = next(i for i in fixture_tools.impls() if i.spec.id.name == "hyphen-ated.tool")
    model_name = impl.spec.id.model_name
    assert hr.ToolId.from_model_name(model_name) == impl.spec.id
    box = hr.Toolbox([fixture_tools])
    assert box.by_model_name(model_name) is impl
    [result] = await run_results(agent(
        [call("fx/hyphen-ated.tool"), reply("ok")], [fixture_tools],
        policy=hr.Policy.default().layer("t").allow("call", "fx/*")))
    assert result.render_text() == "ok"


# -- the nine stages ------------------------------------------------------------------------


async def test_a_call_passes_every_stage_and_is_recorded(time_tools: hr.mcp.MCPToolset,
                                                          tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    manifest = hr.Manifest.from_toml(TIME_MANIFEST)
    result = await agent([call("time/get_current_time", {"timezone": "UTC"}), reply("done")],
                         [time_tools], manifest=manifest).run("what time?", store=store)
    assert isinstance(result.outcome, hr.Completed)
    [record] = await store.calls(result.run_id)
    assert record.tool == "time/get_current_time"
    assert record.status is hr.CallStatus.FINISHED
    assert record.actions == [{"act": "call", "target": "time/get_current_time"}]
    assert record.verdict is not None and record.verdict["effect"] == "allow"
    structured = record.result["structured"] if record.result else None
    assert structured["timezone"] == "UTC"
    await store.close()


async def test_a_tool_the_manifest_does_not_grant_is_refused_uniformly(
        fixture_tools: hr.mcp.MCPToolset) -> None:
    manifest = hr.Manifest.from_toml('[[tools]]\nref = "fx/echo"\ndescription = "Echo."\n'
                                     'mutates = false\n')
    box2 = hr.Toolbox([i for i in fixture_tools.impls() if i.spec.id.name in ("echo", "slow")])
    with pytest.raises(hr.ManifestDrift):
        agent([reply("x")], box2, manifest=manifest)


async def test_policy_deny_returns_the_uniform_sentence_and_sends_nothing(
        fixture_tools: hr.mcp.MCPToolset) -> None:
    before = _marks(fixture_tools)
    policy = hr.Policy.default().layer("t").deny("call", "fx/echo")
    [result] = await run_results(agent([call("fx/echo", {"text": "secret"}), reply("x")],
                                       [fixture_tools], policy=policy))
    assert result.render_text() == hr.PolicyDenied.MODEL_MESSAGE
    assert _marks(fixture_tools) == before


async def test_invalid_arguments_are_refused_before_the_server_sees_them(
        fixture_tools: hr.mcp.MCPToolset) -> None:
    before = _marks(fixture_tools)
    box = hr.Toolbox([fixture_tools])
    with pytest.raises(hr.InvalidArguments) as info:
        await box.call("fx/echo", {"text": 5})
    assert info.value.disposition is hr.Disposition.NOT_SENT
    with pytest.raises(hr.InvalidArguments):
        await box.call("fx/echo", {"text": "a", "extra": 1})
    assert _marks(fixture_tools) == before


async def test_is_error_is_a_landed_error_result(time_tools: hr.mcp.MCPToolset) -> None:
    box = hr.Toolbox([time_tools])
    result = await box.call("time/get_current_time", {"timezone": "Nowhere/Never"})
    assert result.is_error
    assert "Nowhere/Never" in result.render_text()


# -- dispositions ---------------------------------------------------------------------------


def _marks(tools: hr.mcp.MCPToolset) -> list[str]:
    marker: Path = tools.marker  # type: ignore[attr-defined]
    return marker.read_text().splitlines() if marker.exists() else []


async def test_a_call_past_its_deadline_is_in_doubt(fixture_tools: hr.mcp.MCPToolset) -> None:
    box = hr.Toolbox([fixture_tools])
    with pytest.raises(hr.ToolTimeout) as info:
        await box.call("fx/slow", {"seconds": 30})
    assert info.value.disposition is hr.Disposition.IN_DOUBT
    # The session is still usable after the abandoned call.
    assert (await box.call("fx/echo", {"text": "after"})).render_text() == "after"


async def test_progress_extends_the_deadline(fixture_tools: hr.mcp.MCPToolset) -> None:
    # 10 steps of 0.3 s is 3 s, past the 2 s timeout, but each step reports progress.
    result = await hr.Toolbox([fixture_tools]).call("fx/progress", {"steps": 10})
    assert result.render_text() == "done"


async def test_a_result_over_the_size_limit_is_refused(fixture_tools: hr.mcp.MCPToolset) -> None:
    fixture_tools.max_result_bytes = 1000
    try:
        with pytest.raises(hr.InvalidOutput):
            await hr.Toolbox([fixture_tools]).call("fx/huge", {"size": 5000})
    finally:
        fixture_tools.max_result_bytes = hr.mcp._content.DEFAULT_MAX_RESULT_BYTES


async def test_a_server_that_dies_mid_call_is_in_doubt_then_restarted_once_per_run(
        tmp_path: Path) -> None:
    marker = tmp_path / "calls.log"
    argv = (sys.executable, str(FIXTURE_SERVER), str(marker))
    policy = exec_policy(*argv).layer("t").allow("call", "fx/*")
    # Its marker is in its workspace: the (confined) server and its restart can write it.
    async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="fx", policy=policy,
                                       workspace=tmp_path) as tools:
        store = hr.Store.memory()
        result = await agent([call("fx/die"), call("fx/echo", {"text": "back"}),
                              call("fx/die"), call("fx/echo", {"text": "again"}), reply("x")],
                             [tools], policy=policy).run("go", store=store)
        records = await store.calls(result.run_id)
        assert [r.disposition for r in records] == ["in_doubt", None, "in_doubt", "not_sent"]
        assert "dying on purpose" in (records[0].error or "")
        # The restart between the first death and the echo is an event of the run.
        assert [e["kind"] for e in tools.events] == ["mcp_server_restarted"]
        assert tools.events[0]["run_id"] == result.run_id
        # ...and an event of the run's own record.
        run = await store.run(result.run_id)
        assert [(e["kind"], e.get("server")) for e in run.events] == [
            ("governance", None), ("mcp_server_restarted", "fx")]  # the run's own first
        assert "dying on purpose" in run.events[1]["stderr_tail"]
        assert marker.read_text().splitlines() == ["die", "echo back", "die"]


# -- starting -------------------------------------------------------------------------------


async def test_starting_a_server_is_an_exec_action_the_policy_decides(tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    with pytest.raises(hr.ConfigError, match="exec"):
        async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="x"):
            pass  # pragma: no cover
    denied = hr.Policy.default().layer("t").deny("exec", "**")
    with pytest.raises(hr.ConfigError):
        async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="x", policy=denied):
            pass  # pragma: no cover
    assert not marker.exists()


async def test_a_server_that_fails_to_start_names_itself_and_its_stderr() -> None:
    argv = (sys.executable, "-c", "import sys; sys.stderr.write('boom: no config\\n'); "
            "sys.exit(2)")
    with pytest.raises(hr.UserError) as info:
        async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="broken",
                                           policy=exec_policy(*argv), connect_timeout=20):
            pass  # pragma: no cover
    assert "MCP server 'broken'" in str(info.value)
    assert "boom: no config" in str(info.value)


async def test_a_server_that_exits_at_once_has_its_stderr_in_the_error(tmp_path: Path) -> None:
    # The interpreter's own complaint (no such script) is the only clue an operator gets.
    argv = (sys.executable, str(tmp_path / "missing_server.py"))
    with pytest.raises(hr.UserError) as info:
        async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="gone", sandbox="off",
                                           policy=exec_policy(*argv), connect_timeout=20):
            pass  # pragma: no cover
    assert "MCP server 'gone'" in str(info.value)
    assert "can't open file" in str(info.value), str(info.value)


async def test_a_server_that_hangs_at_start_times_out() -> None:
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    with anyio.fail_after(30):
        with pytest.raises(hr.UserError, match="did not answer within 1"):
            async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="hang",
                                               policy=exec_policy(*argv), connect_timeout=1):
                pass  # pragma: no cover


async def test_an_unconnected_toolset_says_so() -> None:
    tools = hr.mcp.MCPToolset.stdio("x", name="x")
    with pytest.raises(hr.UserError, match="not connected"):
        hr.Toolbox([tools])


async def test_tools_list_changed_refuses_redefined_tools_and_offers_new_ones_next_turn(
        tmp_path: Path) -> None:
    argv = (sys.executable, str(FIXTURE_SERVER), str(tmp_path / "calls.log"))
    async with hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="fx",
                                       policy=exec_policy(*argv)) as tools:
        box = hr.Toolbox([tools])
        assert (await box.call("fx/change_tools", {})).render_text() == "changed"
        with anyio.fail_after(10):  # the notification travels after the result
            await tools.list_changed.wait()
        with pytest.raises(hr.NotGranted, match="changed the definition of 'echo'") as info:
            await box.call("fx/echo", {"text": "a"})
        assert info.value.disposition is hr.Disposition.NOT_SENT
        assert "fx/extra" not in box  # this turn's list stays as it was offered
        assert (await box.call("fx/hyphen-ated.tool", {})).render_text() == "ok"
        [event] = tools.events
        assert event["kind"] == "mcp_tools_changed"
        assert event["changed"] == ["echo"] and event["added"] == ["extra"]
        box, change = await box.refreshed()  # what the next turn does
        assert change is not None and change["added"] == ["fx/extra"]
        assert "fx/extra" in box and "fx/echo" not in box


async def test_progress_notifications_reach_on_event(fixture_tools: hr.mcp.MCPToolset) -> None:
    events: list[hr.RunEvent] = []
    policy = hr.Policy.default().layer("t").allow("call", "fx/progress")
    agent = hr.Agent(Scripted([call("fx/progress", {"steps": 3}), reply("x")]),
                     [fixture_tools], policy=policy)
    result = await agent.run("go", on_event=events.append)
    assert isinstance(result.outcome, hr.Completed)
    progress = [e.detail for e in events if e.kind == "call_progress"]
    assert [p["progress"] for p in progress] == [0, 1, 2]
    assert progress[0]["tool"] == "fx/progress" and progress[0]["message"] == "step 0"
    assert progress[0]["total"] == 3


@hr.tool(mutates=False)
async def crunch(steps: int, ctx: hr.CallContext) -> str:
    """Report progress, then finish."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps)
    return "crunched"


async def test_a_python_tool_reports_progress_through_the_same_hook() -> None:
    events: list[hr.RunEvent] = []
    agent = hr.Agent(Scripted([call("crunch", {"steps": 2}), reply("x")]), [crunch])
    await agent.run("go", on_event=events.append)
    assert [(e.detail["progress"], e.detail["total"]) for e in events
            if e.kind == "call_progress"] == [(1, 2), (2, 2)]
    # Nobody listening: nothing to call, and the tool runs the same.
    assert (await hr.Toolbox([crunch]).call("crunch", {"steps": 2})).render_text() == "crunched"
    result = await hr.Agent(Scripted([call("crunch", {"steps": 2}), reply("x")]),
                            [crunch]).run("go")
    assert isinstance(result.outcome, hr.Completed)


async def test_an_mcp_call_cut_off_mid_way_comes_back_for_recovery(
        fixture_tools: hr.mcp.MCPToolset, tmp_path: Path) -> None:
    store = hr.Store.open(str(tmp_path / "runs.db"))
    policy = hr.Policy.default().layer("t").allow("call", "fx/progress")
    agent = hr.Agent(Scripted([call("fx/progress", {"steps": 30}), reply("x")]),
                     [fixture_tools], policy=policy)
    cancel = anyio.Event()

    def on_event(event: hr.RunEvent) -> None:
        if event.kind == "call_progress":  # the server is running the call
            cancel.set()

    outcome = [await agent.run("go", store=store, cancel=cancel, on_event=on_event)]
    assert isinstance(outcome[0].outcome, hr.Cancelled)
    resumed = await hr.resume(store, outcome[0].run_id, agent=agent)
    assert isinstance(resumed.outcome, hr.AwaitingRecovery)  # not idempotent: an operator says
    await store.close()
