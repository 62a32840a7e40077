"""`handrail serve --http`: the gateway over streamable HTTP, behind a bearer token.

The token is compared in constant time on every request, before the MCP layer sees it; a
request without it gets 401 and reaches nothing. Binding is to the address given (loopback
unless the operator names another), and `--no-auth` is refused off loopback. On a loopback
address (`127.0.0.1`, any `127.x`, `[::1]`, `localhost`) a request must also name a loopback
`Host` and `Origin` (DNS rebinding). The token is never printed: serve says which file holds
it.
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
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`.

    The scheme's case does not matter (`bearer`, `BEARER`: RFC 9110 section 11.1); the
    token is compared in constant time.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    given = value
                    break
            scheme, _, credentials = given.strip().partition(b" ")
            if not (scheme.lower() == b"bearer"
                    and hmac.compare_digest(credentials.strip(b" "), self._expected)):
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
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name of a `Host` header (`[::1]:8765` -> `::1`, `LocalHost:80` -> `localhost`)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class LoopbackOnly:
    """ASGI middleware for a loopback bind: the `Host` and `Origin` must be loopback too.

    A page on any site can make the browser send requests to `127.0.0.1` (and to `[::1]`,
    and to every `127.x`); DNS rebinding makes them same-origin with the page. Every request
    naming another host (`Host: evil.example:8765`), or sent from a page of another origin
    (`Origin: http://evil.example`, `Origin: null`), gets 403 and reaches nothing.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = origin = None
            for name, value in scope.get("headers", ()):
                if name == b"host":
                    host = value.decode("latin-1")
                elif name == b"origin":
                    origin = value.decode("latin-1")
            bad = None
            if host is None or not _loopback(_host_name(host)):
                bad = "Host"
            elif origin is not None:
                scheme, sep, rest = origin.partition("://")
                if not sep or scheme.lower() not in ("http", "https") or \
                        not _loopback(_host_name(rest.split("/", 1)[0])):
                    bad = "Origin"
            if bad is not None:
                body = (b'{"error": "this server listens on a loopback address: a request '
                        b'must name a loopback ' + bad.encode() + b'"}')
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def serve_http(gateway: Gateway, host: str, port: int, *, token: str | None,
                     announce: Callable[[str], None], token_file: str | None = None) -> None:
    """Serve `gateway` at `http://host:port/mcp` until cancelled.

    `token_file`: where the token is, for the announcement (the token itself is never
    announced: service logs keep what a server prints). On a loopback address every request
    must name a loopback `Host` (and `Origin`, when it sends one): `LoopbackOnly`.
    """
    import uvicorn

    if token is None and not _loopback(host):
        raise UserError(f"--no-auth is refused on {host}: only a loopback address may serve "
                        "without a bearer token")
    # The SDK lets an HTTP session go after the gateway's idle time; `end_idle` (below) ends
    # the run of a client that stopped calling, of either protocol era, after the same time.
    app: Any = EndedSessions(gateway.server().streamable_http_app(
        host=host.strip("[]"), session_idle_timeout=gateway.idle_seconds), gateway)
    if token is not None:
        app = BearerAuth(app, token)
    if _loopback(host):
        app = LoopbackOnly(app)
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
        announce(f"bearer token: in {token_file} (readable only by you)" if token_file
                 else "bearer token: the one this server was given")
    else:
        announce("WARNING: --no-auth: any local process may call these tools")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    async def sweep(every: float) -> None:
        while True:
            await anyio.sleep(every)
            await gateway.end_idle()

    try:
        await gateway.expire_orphans()  # calls of a server that was killed: see its docstring
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(gateway.heartbeat)
            if gateway.idle_seconds is not None:
                tasks.start_soon(sweep, min(60.0, max(0.05, gateway.idle_seconds / 4)))
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()
    finally:
        sock.close()
        with anyio.CancelScope(shield=True):
            await gateway.close()
