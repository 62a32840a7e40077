"""MCP both ways: other servers' tools through the gate, and `handrail serve` (docs/mcp.md).

Needs the `mcp` extra (`pip install 'handrail[mcp]'`). `hr.mcp` is loaded on first use.
"""

from handrail.manifest import ArgumentAction, ServerDecl
from handrail.mcp._client import MCPTool, MCPToolset
from handrail.mcp._content import from_mcp_result, to_mcp_result
from handrail.mcp._errors import map_mcp_error
from handrail.mcp._gateway import Gateway, GatewaySession
from handrail.mcp._http import serve_http
from handrail.mcp._servers import check_with_servers, connect_servers, hint_problems

__all__ = [
    "ArgumentAction",
    "Gateway",
    "GatewaySession",
    "MCPTool",
    "MCPToolset",
    "ServerDecl",
    "check_with_servers",
    "connect_servers",
    "from_mcp_result",
    "hint_problems",
    "map_mcp_error",
    "serve_http",
    "to_mcp_result",
]
