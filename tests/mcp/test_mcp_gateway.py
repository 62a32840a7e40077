"""The gateway in process (the SDK's in-memory client): what a client's self-description can
and cannot do, and hostile arguments."""

from __future__ import annotations

import re
import socket
from typing import Any

import anyio
import mcp_types as t
import pytest

import handrail as hr
from handrail.mcp import Gateway, serve_http
from mcp import Client

pytestmark = pytest.mark.anyio


@hr.tool(mutates=False)
async def echo(text: str) -> str:
    """Echo."""
    return text


MANIFEST = '[[tools]]\nref = "local/echo"\ndescription = "Echo the text."\nmutates = false\n'


async def test_a_clients_self_chosen_name_is_shown_only_in_plain_characters() -> None:
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([echo]), store=store,
                      manifest=hr.Manifest.from_toml(MANIFEST))
    info = t.Implementation(name="[bold red]evil\x1b[2J client", version="1")
    async with Client(gateway.server(), client_info=info) as client:
        result = await client.call_tool("echo", {"text": "hi"})
        assert result.content[0].text == "hi"  # type: ignore[union-attr]
    [run] = await store.runs()
    assert run.task == "MCP session of ?bold red?evil??2J client"


async def test_arguments_that_are_not_json_or_nest_too_deep_are_refused() -> None:
    gateway = Gateway(hr.Toolbox([echo]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(MANIFEST))
    session = await gateway.open_session("test")
    deep: dict[str, object] = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]
    result = await session.call("echo", {"text": deep})
    assert result.is_error and "nested too deeply" in result.render_text()
    nan = await session.call("echo", {"text": float("nan")})
    assert nan.is_error
    big = await session.call("echo", {"text": "x" * (2 << 20)})
    assert big.is_error and "over the limit" in big.render_text()


# -- what is committed when ---------------------------------------------------------------


class _Recording:
    """A real SQLite store that logs each write (its call statuses, waited or not) and when
    it committed, beside what the tools and the client saw."""

    def __init__(self, inner: hr.Store, log: list[str]) -> None:
        self.inner = inner
        self.log = log

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def write(self, batch: object, *, wait: bool = True) -> None:
        calls = ",".join(f"{c.tool}:{c.status.value}" for c in batch.calls)  # type: ignore[attr-defined]
        await self.inner.write(batch, wait=wait)  # type: ignore[arg-type]
        if calls:
            self.log.append(f"committed {calls}" if wait else f"queued {calls}")


@hr.tool()
async def mutate(text: str) -> str:
    """Change something."""
    order.append("mutate ran")
    return text


@hr.tool(mutates=False)
async def look(text: str) -> str:
    """Change nothing."""
    order.append("look ran")
    return text


order: list[str] = []

DURABLE = (MANIFEST + '[[tools]]\nref = "local/mutate"\ndescription = "Change."\n'
           '[[tools]]\nref = "local/look"\ndescription = "Look."\nmutates = false\n'
           '[policy]\nextends = "default"\n[[policy.layers]]\nname = "t"\n'
           'allow = ["call:local/mutate"]\n')


async def test_a_mark_before_each_effect_and_every_result_before_the_client_sees_it(
        tmp_path: object) -> None:
    from pathlib import Path

    inner = hr.Store.open(str(Path(str(tmp_path)) / "runs.db"))
    order.clear()
    store = _Recording(inner, order)
    gateway = Gateway(hr.Toolbox([echo, mutate, look]), store=store,  # type: ignore[arg-type]
                      manifest=hr.Manifest.from_toml(DURABLE))
    session = await gateway.open_session("test")
    assert (await session.call("mutate", {"text": "m"})).render_text() == "m"
    order.append("client saw mutate")
    assert (await session.call("look", {"text": "l"})).render_text() == "l"
    order.append("client saw look")
    assert order == [
        # A mutating call: its STARTED mark is committed before it runs...
        "committed local/mutate:started", "mutate ran",
        # ...and its result before the client is shown it.
        "committed local/mutate:finished", "client saw mutate",
        # A call that changes nothing owes no mark: one commit, before the client sees it.
        "look ran", "committed local/look:finished", "client saw look",
    ]
    await gateway.close()
    [run] = await inner.runs()
    assert [r.status.value for r in await inner.calls(run.id)] == ["finished", "finished"]
    assert len(await inner.messages(run.id)) == 4  # the transcript: each call and result
    await inner.close()


began = anyio.Event()


@hr.tool(mutates=False)
async def hang() -> str:
    """Wait until cancelled."""
    began.set()
    await anyio.sleep_forever()
    return "never"


async def test_a_call_the_client_cancels_is_recorded_in_doubt_not_left_started() -> None:
    global began
    began = anyio.Event()
    inner = hr.Store.memory()
    settled = anyio.Event()

    class Watched(_Recording):
        async def write(self, batch: object, *, wait: bool = True) -> None:
            await super().write(batch, wait=wait)
            if any(c.status is not hr.CallStatus.STARTED
                   for c in batch.calls):  # type: ignore[attr-defined]
                settled.set()

    manifest = MANIFEST + '[[tools]]\nref = "local/hang"\ndescription = "Hang."\nmutates = false\n'
    gateway = Gateway(hr.Toolbox([echo, hang]), store=Watched(inner, []),  # type: ignore[arg-type]
                      manifest=hr.Manifest.from_toml(manifest))
    async with Client(gateway.server(single_client=True)) as client:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await client.call_tool("hang", {})

                tg.start_soon(call)
                await began.wait()
                scope.cancel()  # the SDK tells the server: notifications/cancelled
            await settled.wait()  # the server records the call as it unwinds
        after = await client.call_tool("echo", {"text": "after"})
        assert after.content[0].text == "after"  # type: ignore[union-attr]
    [run] = await inner.runs()
    [record, _] = await inner.calls(run.id)
    assert record.tool == "local/hang"
    assert record.status is hr.CallStatus.IN_DOUBT and record.disposition == "in_doubt"
    # The call and its (interrupted) result: the transcript holds no call without a result.
    assert len(await inner.messages(run.id)) == 4


async def test_one_client_of_the_stateless_protocol_era_is_one_run() -> None:
    # The SDK's `Client` speaks 2026-07-28: every request on a connection of its own.
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([echo]), store=store,
                      manifest=hr.Manifest.from_toml(MANIFEST))
    async with Client(gateway.server(single_client=True)) as client:
        for text in ("a", "b", "c"):
            await client.call_tool("echo", {"text": text})
    [run] = await store.runs()
    assert len(await store.calls(run.id)) == 3


async def test_the_http_address_is_announced_only_once_it_accepts_connections() -> None:
    # A client that connects the moment it reads the address (as tests and scripts do) must
    # wait in the backlog, never be refused because uvicorn has not called listen() yet.
    gateway = Gateway(hr.Toolbox([echo]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(MANIFEST))
    reached: list[str] = []
    # The server is stopped once it has announced (not after a fixed time: on a loaded
    # machine it may take longer than that to start).
    stop = anyio.CancelScope()

    def announce(line: str) -> None:
        found = re.search(r"http://127\.0\.0\.1:(\d+)/mcp", line)
        if found:
            with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=10):
                reached.append(line)
            stop.cancel()

    with anyio.fail_after(30), stop:
        await serve_http(gateway, "127.0.0.1", 0, token="t" * 32, announce=announce)
    assert len(reached) == 1


async def test_a_policy_given_beside_a_manifest_is_contained_in_the_manifests() -> None:
    # The manifest's policy denies echo; a policy given beside it allows every call: the
    # manifest's deny still holds (the given policy can only tighten it), as docs/mcp.md says.
    manifest = hr.Manifest.from_toml(
        MANIFEST + '\n[policy]\nextends = "default"\n\n[[policy.layers]]\nname = "team"\n'
        'deny = ["call:local/echo"]\n')
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([echo]), store=store, manifest=manifest,
                      policy=hr.Policy.permissive())
    async with Client(gateway.server()) as client:
        result = await client.call_tool("echo", {"text": "hi"})
    assert result.is_error
    (run,) = await store.runs()
    (call,) = await store.calls(run.id)
    assert call.status is hr.CallStatus.REFUSED
    assert call.verdict is not None and call.verdict["effect"] == "deny"


async def test_a_client_leaving_while_its_call_is_in_flight_keeps_its_run_until_it_ends(
        ) -> None:
    # A DELETE (end_client) while a call still runs must not end the run under it: the
    # call's result would land in a completed run. The run ends once nothing is in flight.
    started, release = anyio.Event(), anyio.Event()

    @hr.tool(mutates=False)
    async def slow(text: str) -> str:
        """Wait, then echo."""
        started.set()
        await release.wait()
        return text

    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([slow]), store=store, manifest=hr.Manifest.from_toml(
        '[[tools]]\nref = "local/slow"\ndescription = "Slow."\nmutates = false\n'))
    async with Client(gateway.server()) as client:
        results: list[Any] = []

        async def call() -> None:
            results.append(await client.call_tool("slow", {"text": "done"}))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await started.wait()
                (key,) = list(gateway._by_client)
                await gateway.end_client(key)  # the client says goodbye mid-call
                (run,) = await store.runs()
                assert run.status is hr.RunStatus.RUNNING
                release.set()
        assert results[0].content[0].text == "done"
        await gateway.end_client(key)
    (run,) = await store.runs()
    assert run.status is hr.RunStatus.COMPLETED
    (record,) = await store.calls(run.id)
    assert record.status is hr.CallStatus.FINISHED


def test_a_stateless_client_is_known_by_its_token_never_joining_anothers_run() -> None:
    # The key of a stateless-era request (no handshake): its bearer token, the client's name
    # and version. Another token is another client, whatever name it gives; only a digest
    # is kept, never the token.
    from types import SimpleNamespace

    from handrail.mcp._gateway import client_key

    def key(token: str, name: str = "desk") -> tuple[Any, ...]:
        connection = SimpleNamespace(session_id=None, protocol_version="2026-07-28",
                                     has_standalone_channel=False)
        info = SimpleNamespace(name=name, version="1.0")
        ctx = SimpleNamespace(request=SimpleNamespace(headers={"authorization": token}),
                              session=SimpleNamespace(client_params=SimpleNamespace(
                                  client_info=info)))
        return client_key(ctx, connection)

    assert key("Bearer aaaa") == key("Bearer aaaa")
    assert key("Bearer aaaa") != key("Bearer bbbb")
    assert key("Bearer aaaa", "desk") != key("Bearer aaaa", "other")
    assert "aaaa" not in repr(key("Bearer aaaa"))


async def test_past_the_bound_a_client_with_a_call_in_flight_keeps_its_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Past MAX_SESSIONS the idlest client's run is ended to make room, but never one whose
    # call is still running: its result would land in an ended run.
    from handrail.mcp import _gateway

    started, release = anyio.Event(), anyio.Event()

    @hr.tool(mutates=False)
    async def slow(text: str) -> str:
        """Wait, then echo."""
        if text == "wait":
            started.set()
            await release.wait()
        return text

    monkeypatch.setattr(_gateway, "MAX_SESSIONS", 1)
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([slow]), store=store, manifest=hr.Manifest.from_toml(
        '[[tools]]\nref = "local/slow"\ndescription = "Slow."\nmutates = false\n'))
    server = gateway.server()
    results: list[Any] = []

    async def busy_client() -> None:
        async with Client(server, client_info=t.Implementation(name="busy", version="1")) as c:
            results.append(await c.call_tool("slow", {"text": "wait"}))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(busy_client)
            await started.wait()
            # Another client arrives: two past a bound of one, the busy one the idlest.
            async with Client(server, client_info=t.Implementation(name="new",
                                                                   version="1")) as c:
                assert (await c.call_tool("slow", {"text": "hi"})).content[0].text == "hi"  # type: ignore[union-attr]
            status = {run.task: run.status for run in await store.runs()}
            assert status["MCP session of busy"] is hr.RunStatus.RUNNING
            release.set()
    assert results[0].content[0].text == "wait"
    busy = next(r for r in await store.runs() if r.task == "MCP session of busy")
    (record,) = await store.calls(busy.id)
    assert record.status is hr.CallStatus.FINISHED


async def test_a_session_ending_while_a_call_waits_for_an_answer_leaves_its_run_waiting(
        ) -> None:
    # A call parked on a tool's question (nobody answers in the gateway): the session ends,
    # but a person's answer is still awaited, so the run is not completed.
    @hr.tool(mutates=False, interactions={"question"})
    async def ask(ctx: hr.CallContext) -> str:
        """Ask which account."""
        return str(await ctx.ask(hr.Question("Which account?")))

    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([ask]), store=store, approval_timeout=0,
                      manifest=hr.Manifest.from_toml(
                          '[[tools]]\nref = "local/ask"\ndescription = "Ask."\n'
                          'mutates = false\n'))
    async with Client(gateway.server()) as client:
        result = await client.call_tool("ask", {})
        assert result.is_error and "awaiting an answer: question" in result.content[0].text  # type: ignore[union-attr]
    await gateway.close()
    (run,) = await store.runs()
    assert run.status is hr.RunStatus.AWAITING_APPROVAL
    assert run.outcome is not None and run.outcome["kind"] == "awaiting_approval"


async def test_clients_are_shown_the_manifests_descriptions_not_the_codes() -> None:
    # The manifest is what a person reviewed: its description is what a model reads (the
    # code's docstring says only "Echo.").
    gateway = Gateway(hr.Toolbox([echo]), store=hr.Store.memory(),
                      manifest=hr.Manifest.from_toml(MANIFEST))
    async with Client(gateway.server()) as client:
        listed = {tool.name: tool.description for tool in (await client.list_tools()).tools}
    assert listed == {"echo": "Echo the text."}
