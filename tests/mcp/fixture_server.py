"""A small MCP server (official SDK) whose tools misbehave on purpose: slow, dying, huge.

Run as `python fixture_server.py [marker-file]`; `marker-file` records every call so a test
can count what ran.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("fixture")
MARKER = sys.argv[1] if len(sys.argv) > 1 else None


def _mark(what: str) -> None:
    if MARKER:
        with open(MARKER, "a") as f:
            f.write(what + "\n")


@server.tool()
def echo(text: str) -> str:
    """Echo the text."""
    _mark(f"echo {text}")
    return text


@server.tool(name="hyphen-ated.tool")
def hyphenated() -> str:
    """A tool whose name has a hyphen and a dot."""
    return "ok"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    _mark("slow")
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Report progress every 0.3 s for `steps` steps."""
    for i in range(steps):
        await ctx.report_progress(i, steps, f"step {i}")
        await anyio.sleep(0.3)
    return "done"


@server.tool()
def die() -> str:
    """Exit the process mid-call."""
    _mark("die")
    sys.stderr.write("fixture: dying on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def huge(size: int) -> str:
    """Return `size` characters."""
    return "x" * size


@server.tool()
def wrong_shape() -> dict[str, int]:
    """Declares an object of ints and returns one; the test server lies through a wrapper."""
    return {"n": 1}


@server.tool()
async def change_tools(ctx: Context) -> str:
    """Redefine `echo` (a new argument) and add `extra`, then announce tools/list_changed."""

    def echo(text: str, loud: bool = False) -> str:
        """Echo the text, maybe loudly."""
        return text.upper() if loud else text

    def extra() -> str:
        """A tool that appeared later."""
        return "extra"

    server.remove_tool("echo")
    server.add_tool(echo, name="echo")
    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "changed"


if __name__ == "__main__":
    server.run("stdio")
