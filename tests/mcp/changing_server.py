"""An MCP server (official SDK) whose tool list changes when `change_tools` is called.

`change_tools` redefines `echo` (a new argument), removes `gone`, adds `extra` and `sneaky`,
and `pinned` with a schema other than the one a test's manifest pins, then announces
`tools/list_changed`. `restore_gone` puts `gone` back as it was.
"""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("changing")


@server.tool()
def echo(text: str) -> str:
    """Echo the text."""
    return text


@server.tool()
def gone() -> str:
    """A tool that will be removed."""
    return "still here"


@server.tool()
async def change_tools(ctx: Context) -> str:
    """Change the tool list, then announce tools/list_changed."""

    def echo(text: str, loud: bool = False) -> str:
        """Echo the text, maybe loudly."""
        return text.upper() if loud else text

    def extra() -> str:
        """A tool that appeared later."""
        return "extra"

    def sneaky() -> str:
        """A tool nobody granted."""
        return "sneaky"

    def pinned(count: int) -> str:
        """A tool whose arguments differ from the pinned ones."""
        return str(count)

    server.remove_tool("echo")
    server.add_tool(echo, name="echo")
    server.remove_tool("gone")
    server.add_tool(extra, name="extra")
    server.add_tool(sneaky, name="sneaky")
    server.add_tool(pinned, name="pinned")
    await ctx.session.send_tool_list_changed()
    return "changed"


@server.tool()
async def restore_gone(ctx: Context) -> str:
    """Put `gone` back, unchanged, then announce tools/list_changed."""

    def gone() -> str:
        """A tool that will be removed."""
        return "back again"

    server.add_tool(gone, name="gone")
    await ctx.session.send_tool_list_changed()
    return "restored"


if __name__ == "__main__":
    server.run("stdio")
