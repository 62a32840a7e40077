"""`handrail serve --http`: clients are told when the tool list changes (both protocol eras),
and a stateless-era client's calls belong to one run per client, not one per call."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as t
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import listen
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_servers import CHANGING_SERVER, text
from serve_tools import MANIFEST
from test_mcp_http import HttpServer
from test_mcp_http import serve_http as serve_http_in
from test_mcp_list_changed import SERVE_MANIFEST

import handrail as hr
from mcp import ClientSession

pytestmark = pytest.mark.anyio



class Http(HttpServer):
    @contextlib.asynccontextmanager
    async def client(self, *, name: str = "tester", modern: bool = False,
                     headers: dict[str, str] | None = None,
                     on_message: Any = None) -> AsyncIterator[ClientSession]:
        """The official client: `initialize` (session era) or `discover` (stateless era)."""
        all_headers = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        async with create_mcp_http_client(headers=all_headers) as http, \
                streamable_http_client(self.url, http_client=http) as streams, \
                ClientSession(streams[0], streams[1], message_handler=on_message,
                              client_info=t.Implementation(name=name, version="1")) as session:
            if modern:
                await session.discover()
            else:
                await session.initialize()
            yield session

    async def runs(self) -> list[hr.RunRecord]:
        store = hr.Store.open(str(self.root / "runs.db"))
        try:
            return list(await store.runs())
        finally:
            await store.close()

    async def calls(self, run_id: str) -> list[hr.CallRecord]:
        store = hr.Store.open(str(self.root / "runs.db"))
        try:
            return list(await store.calls(run_id))
        finally:
            await store.close()


@contextlib.asynccontextmanager
async def serve_http(root: Path, *args: str) -> AsyncIterator[Http]:
    async with serve_http_in(root, *args) as server:
        yield Http(server.url, server.token, root)


@pytest.fixture
async def changing(tmp_path: Path) -> AsyncIterator[Http]:
    """`handrail serve --http` fronting tests/mcp/changing_server.py."""
    (tmp_path / "handrail.toml").write_text(
        SERVE_MANIFEST.format(python=sys.executable, server=CHANGING_SERVER))
    async with serve_http(tmp_path) as http:
        yield http


async def listed(session: ClientSession) -> set[str]:
    return {tool.name for tool in (await session.list_tools()).tools}


async def test_a_session_era_client_over_http_is_told_and_lists_again(changing: Http) -> None:
    told = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, t.ToolListChangedNotification):
            told.set()

    async with changing.client(on_message=on_message) as session:
        init = session.initialize_result
        assert init is not None and init.capabilities.tools is not None
        assert init.capabilities.tools.list_changed
        assert await listed(session) == {"fx--echo", "fx--gone", "fx--change_tools",
                                         "fx--restore_gone"}
        assert text(await session.call_tool("fx--change_tools", {})) == "changed"
        with anyio.fail_after(30):
            await told.wait()
        assert await listed(session) == {"fx--change_tools", "fx--restore_gone"}


async def test_a_stateless_era_client_over_http_hears_it_on_its_listen_stream(
        changing: Http) -> None:
    async with changing.client(modern=True) as session:
        assert session.protocol_version == "2026-07-28"
        assert "fx--gone" in await listed(session)
        async with listen(session, tools_list_changed=True) as subscription:
            assert text(await session.call_tool("fx--change_tools", {})) == "changed"
            with anyio.fail_after(30):
                event = await subscription.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
        assert await listed(session) == {"fx--change_tools", "fx--restore_gone"}


async def test_a_stateless_client_is_one_run_per_client_not_per_call(tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    async with serve_http(tmp_path, "serve_tools:box") as http:
        async with http.client(name="alpha", modern=True) as session:
            for i in range(3):
                result = await session.call_tool("add", {"a": i, "b": 1})
                assert not result.is_error, result
        # The same client program again (same token, name and version): the same run.
        async with http.client(name="alpha", modern=True) as session:
            assert text(await session.call_tool("add", {"a": 10, "b": 1})) == "11"
        # Another client program: a run of its own.
        async with http.client(name="beta", modern=True) as session:
            assert text(await session.call_tool("add", {"a": 20, "b": 1})) == "21"
        # A stateless client naming its session: that session is its run.
        async with http.client(name="alpha", modern=True,
                               headers={"Mcp-Session-Id": "alpha-2"}) as session:
            assert text(await session.call_tool("add", {"a": 30, "b": 1})) == "31"
            assert text(await session.call_tool("add", {"a": 31, "b": 1})) == "32"
        # A session-era client: its handshake's session is its run.
        async with http.client(name="alpha") as session:
            assert text(await session.call_tool("add", {"a": 40, "b": 1})) == "41"
        # A session-era client that leaves (its DELETE) ends its run at once.
        async with http.client(name="leaver") as session:
            assert text(await session.call_tool("add", {"a": 50, "b": 1})) == "51"
        with anyio.fail_after(30):
            while True:
                status = {r.task: r.status for r in await http.runs()}
                if status["MCP session of leaver"] is hr.RunStatus.COMPLETED:
                    break
                await anyio.sleep(0.05)
        # A stateless client never says goodbye: its run stays open.
        assert status["MCP session of beta"] is hr.RunStatus.RUNNING
        runs = await http.runs()
        by_task: dict[str, list[int]] = {}
        for run in runs:
            by_task.setdefault(run.task, []).append(len(await http.calls(run.id)))
    assert sorted(by_task["MCP session of alpha"]) == [1, 2, 4]
    assert by_task["MCP session of beta"] == [1]


async def test_past_the_bound_the_idlest_clients_run_is_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stateless client never says goodbye: the runs a server keeps open are bounded."""
    from handrail.mcp import Gateway, _gateway
    from mcp import Client

    @hr.tool(mutates=False)
    async def echo(text: str) -> str:
        """Echo."""
        return text

    monkeypatch.setattr(_gateway, "MAX_SESSIONS", 2)
    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([echo]), store=store, manifest=hr.Manifest.from_toml(
        '[[tools]]\nref = "local/echo"\ndescription = "Echo."\nmutates = false\n'))
    server = gateway.server()
    for name in ("first", "second", "third"):
        async with Client(server, client_info=t.Implementation(name=name, version="1")) as c:
            assert (await c.call_tool("echo", {"text": name})).content[0].text == name  # type: ignore[union-attr]
    status = {run.task: run.status for run in await store.runs()}
    assert status == {"MCP session of first": hr.RunStatus.COMPLETED,
                      "MCP session of second": hr.RunStatus.RUNNING,
                      "MCP session of third": hr.RunStatus.RUNNING}
    assert len(gateway.sessions) == 2


async def test_an_in_process_client_of_either_era_is_one_run() -> None:
    """The stateless era makes each request on a connection of its own: still one run."""
    from handrail.mcp import Gateway
    from mcp import Client

    @hr.tool(mutates=False)
    async def echo(text: str) -> str:
        """Echo."""
        return text

    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([echo]), store=store, manifest=hr.Manifest.from_toml(
        '[[tools]]\nref = "local/echo"\ndescription = "Echo."\nmutates = false\n'))
    server = gateway.server()
    for mode in ("2026-07-28", "legacy"):
        async with Client(server, mode=mode,
                          client_info=t.Implementation(name=mode[:6], version="1")) as client:
            for word in ("a", "b", "c"):
                result = await client.call_tool("echo", {"text": word})
                assert result.content[0].text == word  # type: ignore[union-attr]
    runs = {run.task: run for run in await store.runs()}
    assert set(runs) == {"MCP session of 2026-0", "MCP session of legacy"}
    for run in runs.values():
        assert len(await store.calls(run.id)) == 3


def _echo_gateway(store: hr.Store, **options: Any) -> Any:
    from handrail.mcp import Gateway

    @hr.tool(mutates=False)
    async def echo(text: str) -> str:
        """Echo."""
        return text

    return Gateway(hr.Toolbox([echo]), store=store, manifest=hr.Manifest.from_toml(
        '[[tools]]\nref = "local/echo"\ndescription = "Echo."\nmutates = false\n'), **options)


async def test_a_client_idle_past_the_limit_has_its_run_ended_and_starts_anew() -> None:
    """No goodbye (the SDK let the session go, or a stateless client stopped): the run ends."""
    import time

    from mcp import Client

    store = hr.Store.memory()
    gateway = _echo_gateway(store, idle_seconds=60)
    server = gateway.server()
    async with Client(server, client_info=t.Implementation(name="quiet", version="1")) as c:
        await c.call_tool("echo", {"text": "a"})
        assert await gateway.end_idle(now=time.monotonic() + 30) == 0  # not idle long enough
        assert await gateway.end_idle(now=time.monotonic() + 61) == 1
        [run] = await store.runs()
        assert run.status is hr.RunStatus.COMPLETED and run.owner is None
        assert run.outcome == {"output": "the MCP client was idle for 60 s", "kind": "completed"}
        await c.call_tool("echo", {"text": "b"})  # back again: a new run
    runs = {run.id: run.status for run in await store.runs()}
    assert sorted(s.value for s in runs.values()) == ["completed", "running"]
    assert len(gateway.sessions) == 1


async def test_a_call_in_flight_keeps_its_run_however_long_it_takes() -> None:
    import time

    from handrail.mcp import Gateway
    from mcp import Client

    started, release = anyio.Event(), anyio.Event()

    @hr.tool(mutates=False)
    async def slow(text: str) -> str:
        """Slow."""
        started.set()
        await release.wait()
        return text

    store = hr.Store.memory()
    gateway = Gateway(hr.Toolbox([slow]), store=store, idle_seconds=60,
                      manifest=hr.Manifest.from_toml('[[tools]]\nref = "local/slow"\n'
                                                     'description = "Slow."\nmutates = false\n'))
    async with Client(gateway.server()) as c, anyio.create_task_group() as tasks:
        tasks.start_soon(c.call_tool, "slow", {"text": "x"})
        await started.wait()
        assert await gateway.end_idle(now=time.monotonic() + 3600) == 0  # busy
        release.set()
    assert await gateway.end_idle(now=time.monotonic() + 30) == 0
    [run] = await store.runs()
    assert run.status is hr.RunStatus.RUNNING


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "60", True])
def test_the_idle_limit_is_a_positive_number_of_seconds(bad: Any) -> None:
    with pytest.raises(hr.UserError, match="idle_seconds must be a positive number"):
        _echo_gateway(hr.Store.memory(), idle_seconds=bad)
    assert _echo_gateway(hr.Store.memory(), idle_seconds=None).idle_seconds is None


async def test_serve_http_ends_an_idle_session_era_clients_run_by_itself(tmp_path: Path) -> None:
    """`handrail serve --http --idle-timeout`: the run ends without a DELETE or a new client."""
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    async with serve_http(tmp_path, "serve_tools:box", "--idle-timeout", "0.3") as http:
        async with http.client(name="sleepy") as session:
            await session.call_tool("add", {"a": 1, "b": 2})
            with anyio.fail_after(60):
                while (await http.runs())[0].status is not hr.RunStatus.COMPLETED:  # noqa: ASYNC110 - another process
                    await anyio.sleep(0.1)
        [run] = await http.runs()
        assert run.outcome is not None and "idle for 0.3 s" in run.outcome["output"]


def test_serve_takes_an_idle_timeout_only_for_http(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "handrail.toml").write_text(MANIFEST)
    base = [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--store", "memory"]
    env = {**__import__("os").environ,
           "PYTHONPATH": str(Path(__file__).parent)}
    stdio = subprocess.run([*base, "--idle-timeout", "5"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert stdio.returncode == 1
    assert "--idle-timeout is for --http clients" in stdio.stderr
    negative = subprocess.run([*base, "--http", "127.0.0.1:0", "--idle-timeout", "-1"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert negative.returncode == 2
    assert "takes a number of seconds (0: never), got '-1'" in negative.stderr
