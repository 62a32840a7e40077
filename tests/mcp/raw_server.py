"""A stdio MCP server written without the SDK: JSON-RPC lines, and misbehaviour on request.

    python raw_server.py MARKER [VERSION]

It answers `initialize` with VERSION (default: the version the client asked for), lists its
tools over two pages, and appends to MARKER what it was told (`cancelled <id>`). Its tools:

- `echo(text)`: the text back.
- `noise`: first a line that is not JSON, a JSON array, an answer to an id nobody asked,
  progress for a token nobody gave, and a malformed log message; then its result.
- `long(size)`: a result line of `size` bytes (past the client's bound).
- `bad_result`: a result that is no CallToolResult.
- `surrogate`: a structuredContent whose key is a lone surrogate (no UTF-8 can carry it).
- `bad_error`: an error response with no code.
- `refuse`: an error response, invalid params.
- `hang`: never answers (a `notifications/cancelled` for it is written to MARKER).
"""

from __future__ import annotations

import json
import sys

MARKER = sys.argv[1]
VERSION = sys.argv[2] if len(sys.argv) > 2 else None
NAMES = ["echo", "noise", "long", "bad_result", "surrogate", "bad_error", "refuse", "hang"]


def tool(name: str) -> dict[str, object]:
    return {"name": name, "description": f"The raw server's {name}.",
            "inputSchema": {"type": "object", "properties": {
                "text": {"type": "string"}, "size": {"type": "integer"}}}}


def send(*messages: object) -> None:
    sys.stdout.write("".join(json.dumps(m) + "\n" for m in messages))
    sys.stdout.flush()


def mark(line: str) -> None:
    with open(MARKER, "a") as f:
        f.write(line + "\n")


def text(rid: object, value: str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": rid,
            "result": {"content": [{"type": "text", "text": value}], "isError": False}}


def call(rid: object, name: str, args: dict[str, object]) -> None:
    if name == "echo":
        send(text(rid, str(args.get("text", ""))))
    elif name == "noise":
        sys.stdout.write("this is not JSON\n[1, 2, 3]\n\n")
        send({"jsonrpc": "2.0", "id": "hr-999999", "result": {}},
             {"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": "hr-999999", "progress": 1}},
             {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": 5}},
             text(rid, "after the noise"))
    elif name == "long":
        filler = "x" * int(args.get("size", 0))  # type: ignore[call-overload]
        send(text(rid, filler))
    elif name == "bad_result":
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list"}})
    elif name == "surrogate":  # json.dumps writes it escaped; the client's json.loads makes it
        send({"jsonrpc": "2.0", "id": rid,
              "result": {"content": [], "structuredContent": {"": {"\ud800": None}}}})
    elif name == "bad_error":
        send({"jsonrpc": "2.0", "id": rid, "error": {"message": "no code"}})
    elif name == "refuse":
        send({"jsonrpc": "2.0", "id": rid,
              "error": {"code": -32602, "message": "text must be short"}})
    elif name == "hang":
        mark(f"hanging {rid}")


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, rid = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            version = VERSION or params["protocolVersion"]
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": version, "serverInfo": {"name": "raw", "version": "1"},
                "capabilities": {"tools": {}, "logging": {}}}})
        elif method == "tools/list":
            half = len(NAMES) // 2
            if params.get("cursor") == "page2":
                send({"jsonrpc": "2.0", "id": rid,
                      "result": {"tools": [tool(n) for n in NAMES[half:]]}})
            else:
                send({"jsonrpc": "2.0", "id": rid, "result": {
                    "tools": [tool(n) for n in NAMES[:half]], "nextCursor": "page2"}})
        elif method == "tools/call":
            call(rid, params["name"], params.get("arguments") or {})
        elif method == "notifications/cancelled":
            mark(f"cancelled {params.get('requestId')}")
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
