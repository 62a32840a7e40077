"""Tools, toolboxes and manifest text shared by the manifest tests (imported, not a conftest)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

import handrail as hr
from handrail.tools import SchemaTool


@hr.tool(server="ledger", mutates=False, idempotent=True)
async def read(account: str) -> int:
    """Read a ledger account's balance.

    Args:
        account: The account's id.
    """
    return 100


class Transfer(hr.Tool, server="ledger", name="transfer"):
    """Move money between two accounts."""

    source: str
    target: str
    amount: int = Field(gt=0)

    async def run(self, ctx: hr.CallContext) -> hr.ToolResult:
        return hr.ToolResult.json({"ok": True})


SHELL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"cmd": {"type": "string", "description": "The command line."}},
    "required": ["cmd"],
}


async def _run_shell(arguments: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
    return hr.ToolResult.json({"ran": arguments["cmd"]})


def shell_tool(schema: dict[str, Any] | None = None) -> SchemaTool:
    """An untyped tool (no Python type behind its schema), like a subprocess tool."""
    spec = hr.ToolSpec("shell/run", "Run a shell command.",
                       SHELL_SCHEMA if schema is None else schema)
    return SchemaTool(spec, _run_shell)


def make_box() -> hr.Toolbox:
    return hr.Toolbox([read, Transfer, shell_tool()])


GOOD_TOML = '''
[agent]
name = "ledger-bot"
instructions = "Pay invoices; never move more than asked."
model = "openai:gpt-4.1-mini"

[[tools]]
ref = "ledger/read"
mutates = false
idempotent = true
description = "Read a ledger account's balance."

[[tools]]
ref = "ledger/transfer"
description = "Move money between two accounts."

[[tools]]
ref = "shell/run"
description = "Run a shell command."

[tools.arguments]
type = "object"
required = ["cmd"]
properties.cmd = { type = "string", description = "The command line." }

[budgets]
max_steps = 20
max_tokens = 200_000
max_wall_seconds = 300
'''
