"""The one boundary where the `mcp` SDK's exceptions become handrail's `ToolError`s.

Every failure a call to an MCP server can end in passes through `map_mcp_error`, which decides
its disposition: did the request reach the server and could the world have changed?

| what happened                                        | error            | disposition |
|------------------------------------------------------|------------------|-------------|
| the server says unknown tool / method                 | UnknownTool      | NOT_SENT    |
| the server says invalid params / request / parse      | InvalidArguments | NOT_SENT    |
| the request timed out                                 | ToolTimeout      | IN_DOUBT    |
| the connection closed after the request was sent      | TransportError   | IN_DOUBT    |
| the connection was closed before it was sent          | TransportError   | NOT_SENT    |
| any other error response (internal error, server code)| TransportError   | IN_DOUBT    |
| a result that is not a valid CallToolResult           | InvalidOutput    | LANDED      |
| the link broke (closed/broken stream, OSError)        | TransportError   | IN_DOUBT    |
"""

from __future__ import annotations

import anyio
from pydantic import ValidationError

from handrail.errors import (
    Disposition,
    InvalidArguments,
    InvalidOutput,
    Issue,
    ToolError,
    ToolTimeout,
    TransportError,
    UnknownTool,
)

__all__ = ["NOT_SENT_CODES", "map_mcp_error", "require_sdk"]

# JSON-RPC codes (the `mcp_types` constants, spelled here so this table reads on its own).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001

NOT_SENT_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})
"""Error codes by which a server refuses a request before acting on it."""

_LINK_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                OSError)


def require_sdk() -> None:
    """Fail clearly when the `mcp` SDK (the `handrail[mcp]` extra) is not installed.

    Raises:
        ConfigError: it is not installed.
    """
    try:
        import mcp  # noqa: F401  # only whether it imports
    except ImportError as exc:
        from handrail.errors import ConfigError

        raise ConfigError("MCP needs the official SDK: pip install 'handrail[mcp]' "
                          f"({exc})") from exc


def map_mcp_error(exc: BaseException, *, tool: str, server: str, sent: bool = True,
                  stderr_tail: str = "") -> ToolError:
    """The `ToolError` a failed call to `server` ends in; see the module table.

    Args:
        exc: What the SDK raised.
        tool: The tool's id, for messages.
        server: The server's local name, for messages.
        sent: False when the request is known never to have left (the link was already down).
        stderr_tail: The last lines the server wrote to stderr, appended to link failures.

    Raises:
        TypeError: `exc` is not an error this boundary knows (a bug: nothing may go unmapped).
    """
    from mcp.shared.exceptions import MCPError

    tail = f"; its stderr ends with: {stderr_tail}" if stderr_tail else ""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, MCPError):
        code, message = exc.code, exc.message
        if code == CONNECTION_CLOSED or not sent:
            return TransportError(
                f"the connection to MCP server '{server}' closed during '{tool}'{tail}",
                disposition=Disposition.IN_DOUBT if sent else Disposition.NOT_SENT)
        if code == REQUEST_TIMEOUT:
            return ToolTimeout(f"MCP server '{server}' did not answer '{tool}' in time")
        if code == METHOD_NOT_FOUND or (code == INVALID_PARAMS
                                        and message.lower().startswith("unknown tool")):
            return UnknownTool(f"MCP server '{server}' does not know '{tool}': {message}")
        if code in NOT_SENT_CODES:
            return InvalidArguments(tool, [Issue(path="$", message=f"MCP server '{server}' "
                                                 f"refused the arguments: {message}")])
        return TransportError(f"MCP server '{server}' answered '{tool}' with error {code}: "
                              f"{message}")
    if isinstance(exc, ValidationError):
        return InvalidOutput(tool, [Issue(path="$", message=f"MCP server '{server}' sent a "
                                          f"malformed result: {exc.error_count()} problem(s), "
                                          f"first: {exc.errors()[0]['msg']}")])
    if isinstance(exc, TimeoutError):
        return ToolTimeout(f"MCP server '{server}' did not answer '{tool}' in time")
    if isinstance(exc, _LINK_ERRORS):
        return TransportError(
            f"the link to MCP server '{server}' broke during '{tool}': "
            f"{type(exc).__name__}: {exc}{tail}",
            disposition=Disposition.IN_DOUBT if sent else Disposition.NOT_SENT)
    raise TypeError(f"map_mcp_error does not know {type(exc).__name__}: {exc}") from exc
