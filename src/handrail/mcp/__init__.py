"""MCP both ways: other servers' tools through the gate, and `handrail serve` (docs/mcp.md).

Needs the `mcp` extra (`pip install 'handrail[mcp]'`). `hr.mcp` is loaded on first use.
"""

from handrail.manifest._servers import ArgumentAction, ServerDecl
from handrail.mcp._client import MCPTool, MCPToolset
from handrail.mcp._content import from_mcp_result, to_mcp_result
from handrail.mcp._errors import map_mcp_error
from handrail.mcp._gateway import Gateway, GatewaySession
from handrail.mcp._servers import connect_servers, hint_problems

__all__ = [
    "ArgumentAction",
    "Gateway",
    "GatewaySession",
    "MCPTool",
    "MCPToolset",
    "ServerDecl",
    "connect_servers",
    "from_mcp_result",
    "hint_problems",
    "map_mcp_error",
    "to_mcp_result",
]
