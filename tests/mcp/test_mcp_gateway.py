"""The gateway in process (the SDK's in-memory client): what a client's self-description can
and cannot do, and hostile arguments."""

from __future__ import annotations

import mcp_types as t
import pytest

import handrail as hr
from handrail.mcp import Gateway
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
