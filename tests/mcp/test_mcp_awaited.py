"""A grant made before the MCP server lists the tool (`awaited = true`).

Not drift while the tool is missing (the server may add it later: `tools/list_changed`); a
misspelt ref without it still is; the tool, once listed, is held to the grant's pinned
arguments; and only an MCP server's tool can be awaited.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_servers import CHANGING_SERVER, text
from test_mcp_list_changed import SERVE_MANIFEST

import handrail as hr
from mcp import ClientSession, StdioServerParameters, stdio_client

pytestmark = pytest.mark.anyio

AWAITED = """
[[tools]]
ref = "fx/extra"
description = "A tool the server adds later."
awaited = true
[tools.arguments]
type = "object"
title = "extraArguments"
properties = {}

[[tools]]
ref = "fx/pinned"
description = "Added later, with other arguments than the ones reviewed."
awaited = true
[tools.arguments]
type = "object"
required = ["name"]
properties.name = { type = "string" }
"""


def _manifest(extra: str) -> hr.Manifest:
    text_ = SERVE_MANIFEST.format(python=sys.executable, server=CHANGING_SERVER)
    head, _, servers = text_.partition("[policy]")
    return hr.Manifest.from_toml(head + extra + "\n[policy]" + servers)


def _kinds(problems: list[Any]) -> dict[str, str]:
    return {p.ref: p.kind for p in problems if p.severity == "error"}


def test_an_awaited_grant_is_not_drift_but_a_misspelt_one_still_is() -> None:
    python_tools = hr.Toolbox([])
    manifest = _manifest(AWAITED)
    assert _kinds(hr.manifest.review(python_tools, manifest)).get("fx/extra") is None
    misspelt = _manifest(AWAITED.replace("awaited = true\n[tools.arguments]\ntype = \"object\"\n"
                                         "title = \"extraArguments\"", "[tools.arguments]\n"
                                         "type = \"object\"\ntitle = \"extraArguments\"", 1)
                         .replace("fx/extra", "fx/extar"))
    assert _kinds(hr.manifest.review(python_tools, misspelt))["fx/extar"] == "not_implemented"


def test_only_an_mcp_servers_tool_can_be_awaited() -> None:
    manifest = _manifest(AWAITED.replace("fx/extra", "local/later"))
    found = _kinds(hr.manifest.review(hr.Toolbox([]), manifest))
    assert found["local/later"] == "awaited_not_mcp"
    with pytest.raises(hr.ManifestDrift, match="not an MCP server"):
        hr.manifest.check_against(hr.Toolbox([]), manifest)


def test_an_awaited_grant_must_pin_the_arguments() -> None:
    with pytest.raises(hr.ManifestError, match=r"awaited = true but without \[tools.arguments\]"):
        hr.Manifest.from_toml('[[tools]]\nref = "fx/extra"\ndescription = "x"\n'
                              'awaited = true\n')
    grant = _manifest(AWAITED).grant("fx/extra")
    assert grant is not None and grant.awaited
    # Stated, it is part of the digest; unstated, old digests do not change.
    assert _manifest(AWAITED).digest != _manifest(AWAITED.replace("awaited = true\n", "", 1)
                                                  ).digest
    assert "awaited" not in hr.Manifest.from_toml(
        '[[tools]]\nref = "a/b"\ndescription = "x"\n').canonical()["tools"][0]


async def test_handrail_serve_offers_the_awaited_tool_once_listed_and_held_to_its_grant(
        tmp_path: Path) -> None:
    manifest = SERVE_MANIFEST.format(python=sys.executable, server=CHANGING_SERVER)
    head, _, servers = manifest.partition("[policy]")
    (tmp_path / "handrail.toml").write_text(head + AWAITED + "\n[policy]" + servers)
    told: list[anyio.Event] = [anyio.Event()]

    async def on_message(message: Any) -> None:
        import mcp_types as t

        if isinstance(message, t.ToolListChangedNotification):
            told[-1].set()

    params = StdioServerParameters(
        command=sys.executable, cwd=str(tmp_path), env=dict(os.environ),
        args=["-m", "handrail.cli", "serve", "--stdio", "--store", str(tmp_path / "runs.db")])
    with open(tmp_path / "serve.stderr", "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write, message_handler=on_message) as session:
            await session.initialize()
            before = {tool.name for tool in (await session.list_tools()).tools}
            assert "fx--extra" not in before and "fx--pinned" not in before
            early = await session.call_tool("fx--extra", {})
            assert early.is_error  # not listed yet: nothing to call
            assert text(await session.call_tool("fx--change_tools", {})) == "changed"
            with anyio.fail_after(30):
                await told[-1].wait()
            after = {tool.name for tool in (await session.list_tools()).tools}
            assert "fx--extra" in after and "fx--pinned" not in after
            assert text(await session.call_tool("fx--extra", {})) == "extra"
            refused = await session.call_tool("fx--pinned", {"count": 1})
            assert refused.is_error and "input schema" in text(refused)
    assert "drift" not in (tmp_path / "serve.stderr").read_text()
