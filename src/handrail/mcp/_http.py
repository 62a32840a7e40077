"""`handrail serve --http`: the gateway over streamable HTTP, behind a bearer token.

The token is compared in constant time on every request, before the MCP layer sees it; a
request without it gets 401 and reaches nothing. Binding is to the address given (loopback
unless the operator names another), and `--no-auth` is refused off loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from handrail.errors import UserError

if TYPE_CHECKING:
    from handrail.mcp._gateway import Gateway

__all__ = ["BearerAuth", "serve_http"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BearerAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    given = value
                    break
            if not hmac.compare_digest(given, self._expected):
                body = b'{"error": "a bearer token is required (see handrail serve\'s output)"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class EndedSessions:
    """ASGI middleware: a client's `DELETE` of its MCP session ends the session's run.

    Without it the run of a session-era HTTP client that has left stays open until the
    server stops (or makes room for other clients).
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "DELETE":
            await self.app(scope, receive, send)
            return
        session_id = ""
        for name, value in scope.get("headers", ()):
            if name == b"mcp-session-id":
                session_id = value.decode("latin-1")
                break
        status: list[int] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        await self.app(scope, receive, watch)
        if session_id and status and status[0] < 400:  # the SDK ended that session
            await self.gateway.end_client(("session", session_id))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def serve_http(gateway: Gateway, host: str, port: int, *, token: str | None,
                     announce: Callable[[str], None]) -> None:
    """Serve `gateway` at `http://host:port/mcp` until cancelled."""
    import uvicorn

    if token is None and not _loopback(host):
        raise UserError(f"--no-auth is refused on {host}: only a loopback address may serve "
                        "without a bearer token")
    # The SDK lets an HTTP session go after the gateway's idle time; `end_idle` (below) ends
    # the run of a client that stopped calling, of either protocol era, after the same time.
    app: Any = EndedSessions(gateway.server().streamable_http_app(
        host=host, session_idle_timeout=gateway.idle_seconds), gateway)
    if token is not None:
        app = BearerAuth(app, token)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    # Listen before the address is announced: a client that connects as soon as it reads it
    # waits in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(2048)
    bound = sock.getsockname()[1]
    announce(f"serving {len(gateway.offered())} tool(s) at http://{host}:{bound}/mcp")
    if token is not None:
        announce(f"bearer token: {token}")
    else:
        announce("WARNING: --no-auth: any local process may call these tools")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    async def sweep(every: float) -> None:
        while True:
            await anyio.sleep(every)
            await gateway.end_idle()

    try:
        async with anyio.create_task_group() as tasks:
            if gateway.idle_seconds is not None:
                tasks.start_soon(sweep, min(60.0, max(0.05, gateway.idle_seconds / 4)))
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()
    finally:
        sock.close()
        with anyio.CancelScope(shield=True):
            await gateway.close()
