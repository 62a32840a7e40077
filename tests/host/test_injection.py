"""Injected tools: one object declares (`tools()`) and routes (`route()`), behind the gate."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, Turn, call, reply

pytestmark = pytest.mark.anyio

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}


def allow_local() -> hr.Policy:
    return hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/*")


class Host:
    """Declares `local/echo` (or what `offer` says) and routes it, counting calls."""

    def __init__(self, offer: Sequence[hr.InjectedTool] | None = None) -> None:
        self.offer = list(offer) if offer is not None else [
            hr.InjectedTool("echo", SCHEMA, "Echo the text.")]
        self.routed: list[hr.RoutedCall] = []
        self.reads = 0

    def tools(self) -> list[hr.InjectedTool]:
        self.reads += 1
        return list(self.offer)

    async def route(self, c: hr.RoutedCall) -> hr.RoutedCapture | None:
        self.routed.append(c)
        return hr.RoutedCapture(stdout=f"routed:{c.input['text']}".encode(), stderr=b"",
                                exit_code=0)


def texts(result_messages: Sequence[Any]) -> list[str]:
    return [m.result.render_text() for m in result_messages]


async def run(agent: hr.Agent, store: hr.Store | None = None, **kw: Any) -> hr.RunResult:
    with anyio.fail_after(60):
        return await agent.run("go", store=store, **kw)


async def tool_results(store: hr.Store, run_id: str) -> list[str]:
    return [
        "".join(i.get("text", "") for i in (c.result or {}).get("content", []))
        for c in await store.calls(run_id)
    ]


async def test_an_agent_that_registers_nothing_calls_an_injected_tool(workspace: Path) -> None:
    host = Host()
    seen: list[list[str]] = []

    def first(messages: Sequence[Any], tools: Sequence[hr.ToolSpec]) -> Turn:
        seen.append([str(t.id) for t in tools])
        return call("local/echo", {"text": "hi"})

    agent = hr.Agent(Scripted([first, reply("done")]), injection=host, policy=allow_local(),
                     workspace=workspace, name="a1")
    store = hr.Store.memory()
    result = await run(agent, store)
    assert isinstance(result.outcome, hr.Completed)
    assert seen == [["local/echo"]]
    assert [c.input for c in host.routed] == [{"text": "hi"}]
    c = host.routed[0]
    assert (c.tool_id, c.agent, c.run_id, c.workspace) == ("local/echo", "a1", result.run_id,
                                                           workspace)
    (text,) = await tool_results(store, result.run_id)
    assert text == "Exit code: 0\nrouted:hi"
    (record,) = await store.calls(result.run_id)
    assert record.result is not None
    assert record.result["metadata"]["handrail.source"] == "injected"


async def test_routed_calls_pass_validation_and_policy_before_the_router(workspace: Path) -> None:
    host = Host()
    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "local/echo")
    agent = hr.Agent(Scripted([call("local/echo", {"text": 3}), call("local/echo", {"text": "x"}),
                               reply("done")]),
                     injection=host, policy=policy, workspace=workspace, max_invalid_turns=5)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert isinstance(result.outcome, hr.Completed)
    assert host.routed == []  # invalid, then denied: the router saw neither
    statuses = [c.status for c in await store.calls(result.run_id)]
    assert statuses == [hr.CallStatus.REFUSED, hr.CallStatus.REFUSED]


async def test_tools_are_read_every_turn_and_a_removed_tool_is_unknown(workspace: Path) -> None:
    host = Host()
    offers: list[list[str]] = []

    def turn(n: int) -> Any:
        def make(messages: Sequence[Any], tools: Sequence[hr.ToolSpec]) -> Turn:
            offers.append(sorted(str(t.id) for t in tools))
            if n == 0:
                host.offer = [*host.offer, hr.InjectedTool("second", SCHEMA, "Two.")]
                return call("local/echo", {"text": "a"})
            if n == 1:
                host.offer = [t for t in host.offer if t.name != "echo"]
                return call("local/second", {"text": "b"})
            if n == 2:
                return call("local/echo", {"text": "c"})  # removed: unknown
            return reply("done")
        return make

    agent = hr.Agent(Scripted([turn(i) for i in range(4)]), injection=host,
                     policy=allow_local(), workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert isinstance(result.outcome, hr.Completed)
    assert offers == [["local/echo"], ["local/echo", "local/second"], ["local/second"],
                      ["local/second"]]
    assert host.reads == 4  # once per turn, no more
    assert [c.input["text"] for c in host.routed] == ["a", "b"]
    last = (await store.calls(result.run_id))[-1]
    assert last.status is hr.CallStatus.REFUSED and last.error == "unknown tool"


@hr.tool(server="local", name="echo")
def registered_echo(text: str) -> str:
    """The registered echo."""
    return f"registered:{text}"


async def test_an_injected_id_shadows_a_registered_tool(workspace: Path) -> None:
    host = Host([hr.InjectedTool("echo", {**SCHEMA, "properties": {
        "text": {"type": "string", "maxLength": 3}}}, "Injected echo.")])
    offered: list[hr.ToolSpec] = []

    def first(messages: Sequence[Any], tools: Sequence[hr.ToolSpec]) -> Turn:
        offered.extend(tools)
        return call("local/echo", {"text": "abcd"})  # too long for the injected schema

    agent = hr.Agent(Scripted([first, call("local/echo", {"text": "ab"}), reply("done")]),
                     [registered_echo], injection=host, policy=allow_local(),
                     workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert [t.description for t in offered] == ["Injected echo."]
    refused, routed = await store.calls(result.run_id)
    assert refused.status is hr.CallStatus.REFUSED and refused.error == "invalid arguments"
    assert [c.input for c in host.routed] == [{"text": "ab"}]
    assert routed.result is not None
    assert routed.result["metadata"]["handrail.source"] == "injected"


class Declining(Host):
    async def route(self, c: hr.RoutedCall) -> hr.RoutedCapture | None:
        self.routed.append(c)
        return None


async def test_a_router_declining_falls_through_to_the_registered_tool(workspace: Path) -> None:
    host = Declining()
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     [registered_echo], injection=host, policy=allow_local(),
                     workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert len(host.routed) == 1
    (record,) = await store.calls(result.run_id)
    assert record.result is not None
    assert await tool_results(store, result.run_id) == ["registered:x"]
    assert record.result["metadata"]["handrail.source"] == "registered"


async def test_a_router_declining_with_no_registered_tool_is_no_such_tool(
        workspace: Path) -> None:
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     injection=Declining(), policy=allow_local(), workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    (text,) = await tool_results(store, result.run_id)
    assert "There is no tool named 'local_echo'" in text or "no tool named" in text


class Hanging(Host):
    def __init__(self, *, sync: bool) -> None:
        super().__init__([hr.InjectedTool("echo", SCHEMA, "Hangs.", timeout=0.5)])
        self.sync = sync
        self.stopped = threading.Event()

    def route(self, c: hr.RoutedCall) -> Any:  # type: ignore[override]
        self.routed.append(c)
        if self.sync:
            # A sync router runs in a worker thread; it watches `stop`.
            if c.stop.wait_blocking(30):
                self.stopped.set()
            return hr.RoutedCapture(stdout=b"late")

        async def hang() -> hr.RoutedCapture:
            # An async router is cancelled directly (and `stop` is set as well).
            try:
                await anyio.sleep_forever()
            finally:
                self.stopped.set()
            raise AssertionError("unreachable")

        return hang()


@pytest.mark.parametrize("sync", [True, False])
async def test_a_hanging_router_is_bounded_by_the_deadline_and_the_run_goes_on(
        workspace: Path, sync: bool) -> None:
    host = Hanging(sync=sync)
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     injection=host, policy=allow_local(), workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert isinstance(result.outcome, hr.Completed)
    (record,) = await store.calls(result.run_id)
    assert record.disposition == "in_doubt"
    assert record.result is not None and record.result["is_error"]
    assert await anyio.to_thread.run_sync(host.stopped.wait, 30)
    assert host.routed[0].stop.is_set()


class Raising(Host):
    def route(self, c: hr.RoutedCall) -> hr.RoutedCapture | None:  # type: ignore[override]
        raise RuntimeError("endpoint exploded")


async def test_a_raising_router_is_an_in_doubt_error_result(workspace: Path) -> None:
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     injection=Raising(), policy=allow_local(), workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert isinstance(result.outcome, hr.Completed)
    (record,) = await store.calls(result.run_id)
    assert record.disposition == "in_doubt"
    (text,) = await tool_results(store, result.run_id)
    assert "endpoint exploded" in text and "may have partly taken effect" in text


async def test_cancelling_the_run_sets_stop(workspace: Path) -> None:
    started = anyio.Event()
    stopped = anyio.Event()

    class Waits(Host):
        async def route(self, c: hr.RoutedCall) -> hr.RoutedCapture | None:
            started.set()
            try:
                await c.stop.wait()
            finally:
                if c.stop.is_set():
                    stopped.set()
            return None

    cancel = anyio.Event()
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     injection=Waits(), policy=allow_local(), workspace=workspace)
    async with anyio.create_task_group() as tg:
        out: list[hr.RunResult] = []

        async def go() -> None:
            out.append(await run(agent, cancel=cancel))

        tg.start_soon(go)
        with anyio.fail_after(30):
            await started.wait()
        cancel.set()
    assert isinstance(out[0].outcome, hr.Cancelled)
    assert stopped.is_set()


async def test_the_injection_supplies_actions_for_the_policy(workspace: Path) -> None:
    tool = hr.InjectedTool("put", SCHEMA, "Write.",
                           actions=lambda i: [hr.Action(hr.Act.WRITE, "notes/" + i["text"])])
    host = Host([tool])
    policy = hr.Policy.default().layer("app").allow(hr.Act.WRITE, "notes/**")
    agent = hr.Agent(Scripted([call("local/put", {"text": "a.txt"}),
                               call("local/put", {"text": "../../etc/x"}), reply("done")]),
                     injection=host, policy=policy, workspace=workspace)
    store = hr.Store.memory()
    await run(agent, store)
    assert [c.input["text"] for c in host.routed] == ["a.txt"]


def test_one_host_serves_several_agents(workspace: Path) -> None:
    host = Host()
    for name in ("one", "two"):
        agent = hr.Agent(Scripted([call("local/echo", {"text": name}), reply("done")]),
                         injection=host, policy=allow_local(), workspace=workspace, name=name)
        assert isinstance(agent.run_sync("go").outcome, hr.Completed)
    assert [(c.agent, c.input["text"]) for c in host.routed] == [("one", "one"), ("two", "two")]


def test_a_malformed_tools_list_is_a_clear_error(workspace: Path) -> None:
    class Bad(Host):
        def tools(self) -> list[hr.InjectedTool]:
            return [hr.InjectedTool("echo", SCHEMA), hr.InjectedTool("echo", SCHEMA)]

    agent = hr.Agent(Scripted([reply("done")]), injection=Bad(), workspace=workspace)
    with pytest.raises(hr.UserError, match="'local/echo' twice"):
        agent.run_sync("go")


async def test_falling_through_never_carries_a_call_past_the_registered_tools_policy(
        workspace: Path) -> None:
    ran: list[str] = []

    @hr.tool(server="local", name="echo")
    def write_note(text: hr.WritePath) -> str:
        """Writes a file (its action is WRITE text)."""
        ran.append(str(text))
        return "written"

    # The injected `local/echo` is allowed as `call local/echo`; the registered tool of that
    # id writes, and the policy asks for writes: declining must not run it unasked.
    policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/echo")
    agent = hr.Agent(Scripted([call("local/echo", {"text": "a.txt"}), reply("done")]),
                     [write_note], injection=Declining(), policy=policy, workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert ran == []
    (text,) = await tool_results(store, result.run_id)
    assert "policy does not allow outright" in text


async def test_with_a_manifest_only_granted_injected_tools_are_offered_and_callable(
        workspace: Path) -> None:
    host = Host([hr.InjectedTool("echo", SCHEMA, "Echo."), hr.InjectedTool("other", SCHEMA)])
    manifest = hr.Manifest.from_toml(
        '[[tools]]\nref = "local/echo"\ndescription = "Echo."\n'
        '[tools.arguments]\ntype = "object"\nrequired = ["text"]\n'
        '[tools.arguments.properties.text]\ntype = "string"\n')
    offers: list[list[str]] = []

    def first(messages: Sequence[Any], tools: Sequence[hr.ToolSpec]) -> Turn:
        offers.append([str(t.id) for t in tools])
        return Turn(tool_calls=(("local/other", {"text": "x"}), ("local/echo", {"text": "y"})))

    agent = hr.Agent(Scripted([first, reply("done")]), injection=host, manifest=manifest,
                     policy=allow_local(), workspace=workspace)
    store = hr.Store.memory()
    result = await run(agent, store)
    assert offers == [["local/echo"]]
    assert [c.input["text"] for c in host.routed] == ["y"]
    refused = (await store.calls(result.run_id))[0]
    assert refused.status is hr.CallStatus.REFUSED
    assert refused.error == "tool 'local/other' is not granted by the manifest"


async def test_a_paused_call_of_a_tool_removed_since_is_refused_not_routed(
        workspace: Path) -> None:
    host = Host()
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([call("local/echo", {"text": "x"}), reply("done")]),
                     injection=host, workspace=workspace)  # the default policy asks
    paused = await run(agent, store)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    host.offer = []  # the host dropped the tool while the call waited for a person
    with anyio.fail_after(60):
        done = await hr.resume_with_decision(store, paused.outcome.request_id,
                                             hr.Decision.approve(), agent=agent)
    assert isinstance(done.outcome, hr.Completed)
    assert host.routed == []
    (record,) = await store.calls(done.run_id)
    assert record.status is hr.CallStatus.REFUSED


def test_a_routed_call_can_be_built_outside_an_event_loop() -> None:
    c = hr.RoutedCall(id="c", tool_id="local/echo", input={}, workspace=None, agent=None,
                      run_id=None)
    assert not c.stop.is_set()
    c.stop.set()
    assert c.stop.wait_blocking(0) and anyio.run(c.stop.wait) is None
