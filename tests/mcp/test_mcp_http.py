"""Streamable HTTP both ways: `handrail serve --http` behind a bearer token, reached by the
official `mcp` client and by `hr.mcp.MCPToolset.http`."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from http_serving import serving_http, token_of
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from serve_tools import MANIFEST

import handrail as hr
from handrail.models import Scripted, call, reply
from mcp import ClientSession

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


class HttpServer:
    def __init__(self, url: str, token: str, root: Path) -> None:
        self.url, self.token, self.root = url, token, root

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "LAUNCH_LOG": str(root / "launched.log"),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


@contextlib.asynccontextmanager
async def serve_http(root: Path, *args: str) -> AsyncIterator[HttpServer]:
    """`handrail serve ARGS --http` in `root` (its SQLite store there), until the block ends."""
    argv = [sys.executable, "-m", "handrail.cli", "serve", *args, "--http", "127.0.0.1:0",
            "--store", str(root / "runs.db"), "--approval-timeout", "0.5"]
    async with serving_http(argv, cwd=root, env=_env(root)) as (url, said):
        yield HttpServer(url, await token_of(said), root)


@pytest.fixture(scope="module")
async def http_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HttpServer]:
    root = tmp_path_factory.mktemp("http")
    (root / "handrail.toml").write_text(MANIFEST)
    async with serve_http(root, "serve_tools:box") as server:
        yield server


async def test_without_the_bearer_token_nothing_is_reached(http_server: HttpServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx.AsyncClient() as client:
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": http_server.token}):
            response = await client.post(http_server.url, json=body, headers=headers)
            assert response.status_code == 401, headers


async def test_the_official_client_over_http_with_the_token(http_server: HttpServer) -> None:
    async with create_mcp_http_client(headers=http_server.auth) as client, \
            streamable_http_client(http_server.url, http_client=client) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {"add", "launch", "secret", "greet"}
        result = await session.call_tool("add", {"a": 20, "b": 22})
        assert not result.is_error and result.content[0].text == "42"  # type: ignore[union-attr]
        asked = await session.call_tool("launch", {"target": "x"})
        assert asked.is_error
        assert asked.content[0].text.startswith("awaiting approval: request ap-")  # type: ignore[union-attr]


async def test_an_mcp_toolset_over_http_through_an_agent(http_server: HttpServer) -> None:
    host_port = http_server.url.split("/")[2]
    with pytest.raises(hr.ConfigError, match="net"):
        async with hr.mcp.MCPToolset.http(http_server.url, name="gw",
                                          headers=http_server.auth):
            pass  # pragma: no cover
    policy = (hr.Policy.default().layer("mcp").allow("net", host_port)
              .allow("call", "gw/add"))
    async with hr.mcp.MCPToolset.http(http_server.url, name="gw", headers=http_server.auth,
                                      policy=policy) as gateway_tools:
        store = hr.Store.memory()
        agent = hr.Agent(Scripted([call("gw/add", {"a": 1, "b": 1}), reply("2")]),
                         [gateway_tools], policy=policy)
        result = await agent.run("add", store=store)
        [record] = await store.calls(result.run_id)
        assert record.result is not None and record.result["content"][0]["text"] == "2"


async def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    done = await anyio.run_process(
        [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--http",
         "0.0.0.0:0", "--no-auth", "--store", str(tmp_path / "runs.db")],
        cwd=tmp_path, env=_env(tmp_path), check=False)
    assert done.returncode == 1
    assert b"--no-auth is refused on 0.0.0.0" in done.stderr


async def test_a_short_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    (tmp_path / "token").write_text("short\n")
    (tmp_path / "token").chmod(0o600)
    done = await anyio.run_process(
        [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--http",
         "127.0.0.1:0", "--token-file", str(tmp_path / "token")],
        cwd=tmp_path, env=_env(tmp_path), check=False)
    assert done.returncode == 1 and b"shorter than 16" in done.stderr
