"""MCP both ways: other servers' tools through the gate, and `handrail serve` (docs/mcp.md).

Needs the `mcp` extra (`pip install 'handrail[mcp]'`). `hr.mcp` is loaded on first use.
"""

from handrail.manifest._servers import ArgumentAction, ServerDecl
from handrail.mcp._client import MCPTool, MCPToolset
from handrail.mcp._content import from_mcp_result, to_mcp_result
from handrail.mcp._errors import map_mcp_error

__all__ = [
    "ArgumentAction",
    "MCPTool",
    "MCPToolset",
    "ServerDecl",
    "from_mcp_result",
    "map_mcp_error",
    "to_mcp_result",
]
