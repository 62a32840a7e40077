"""`handrail serve --stdio`'s own server side for `tools/call` (issue 38, the gateway hop).

In front of an upstream server, `handrail serve` cost ~3x a direct call, and half of its own
CPU was the SDK's server machinery around the gate: every line validated as a `JSONRPCMessage`
union, relayed through three memory streams (the transport's, the era replay's, the
dispatcher's), the request validated twice more (the method surface, then its params model),
a task and a cancel scope per request from the dispatcher, the OpenTelemetry middleware, and
the result dumped, validated and dumped again for the negotiated version.

This link answers the hot request itself, the way `mcp/_wire.py` speaks the client side's
`tools/call`: the transport (`mcp/_stdio.py`) hands it each line it read, bounded; it parses
the line once with `json` and takes

- a `tools/call` request of a session-era client (one that opened with the `initialize`
  handshake, once the SDK's answer to it has been written): its params are checked as the SDK
  checks them (`-32602 Invalid request parameters` otherwise), the call runs in a task of its
  own (`Gateway.serve_call`: the gate, the record, the upstream) and its answer is one line;
- `notifications/cancelled` for one of those calls: its task is cancelled, and the request is
  never answered (the spec's MUST NOT), as the SDK's dispatcher does (which also correlates
  "7" with 7: so does the link);
- the client's answer to a request this link sent it (ids `hr-s-N`: an upstream's sampling or
  form relayed during a call, `LinkRelay`).

Everything else (the handshake and its version negotiation, lists, resources, prompts, pings,
logging levels, the 2026-07-28 stateless era, a malformed envelope, a batch) goes to the SDK's
server exactly as before. A client's call is never answered twice: a request id already in
flight is refused (`-32600`; the SDK's dispatcher runs both and answers the id twice, which
its own TODO means to change), and at most `MAX_IN_FLIGHT` calls run at once (a client that
opens more is refused, `-32000`, rather than letting it hold the memory of each; the SDK sets
no bound). When stdin ends, the calls still running are cancelled (recorded in doubt, or not
sent) and each answered `-32000 Connection closed`, as the SDK's dispatcher answers its own
(tests/mcp/test_mcp_serve_link_process.py runs each case against both).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeGuard

import anyio
import anyio.abc

from handrail.mcp._json import compact_text, loads
from handrail.mcp._relay import Relay

__all__ = ["MAX_IN_FLIGHT", "LinkRelay", "ServeLink"]

MAX_IN_FLIGHT = 256
"""Calls one stdio client may have in flight through the link at once."""
_ID_PREFIX = "hr-s-"  # the ids of the requests this link sends the client (the SDK's are ints)
_WRITE_HIGH = 1 << 20  # bytes queued for stdout before a call waits for the client to read

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
CONNECTION_CLOSED = -32000

Handler = Callable[[dict[str, Any], "LinkRelay"], Awaitable[dict[str, Any]]]
"""Runs one checked `tools/call` (its params, its relay) and returns the result's wire dict."""


class InvalidParams(ValueError):
    """A `tools/call`'s params are not what the protocol says (answered -32602)."""


def check_call_params(params: Any) -> tuple[str, dict[str, Any] | None, str | int | None]:
    """A `tools/call`'s (name, arguments, progress token), checked as the SDK checks them.

    Raises:
        InvalidParams: `params` is not an object with a string `name`, `arguments` an object
            (or absent, or null), `_meta` an object whose `progressToken` is a string or an
            integer.
    """
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    name = params.get("name")
    if not isinstance(name, str):
        raise InvalidParams("name must be a string")
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidParams("arguments must be an object")
    token: str | int | None = None
    meta = params.get("_meta")
    if meta is not None:
        if not isinstance(meta, dict):
            raise InvalidParams("_meta must be an object")
        token = meta.get("progressToken")
        if token is not None and (isinstance(token, bool) or not isinstance(token, str | int)):
            raise InvalidParams("progressToken must be a string or an integer")
    return name, arguments, token


def _request_id(value: Any) -> TypeGuard[str | int]:
    """Whether `value` is a JSON-RPC request id MCP allows (a string or an integer)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _key(rid: str | int) -> str | int:
    """The id a call is known by: "7" and 7 are one id, as the SDK's dispatcher correlates them."""
    if isinstance(rid, str):
        try:
            return int(rid)
        except ValueError:
            pass
    return rid


class LinkRelay(Relay):
    """What an upstream sends during a call, relayed to the link's client for its request."""

    def __init__(self, link: ServeLink, request_id: str | int, token: str | int | None) -> None:
        self.ctx = None  # `Relay`'s fields, without its __init__'s call: one a call
        self._record = None
        self.link = link
        self.request_id = request_id
        self.token = token

    def bind(self, record: Callable[..., Awaitable[None]]) -> LinkRelay:
        """This relay, keeping its events in the client's run through `record`."""
        self._record = record
        return self

    def declares(self, capability: str) -> bool:
        """Whether the client declared `capability` in its `initialize` (it can be asked)."""
        return isinstance(self.link.client_capabilities.get(capability), dict)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """`notifications/progress` for the client's token (nothing when it gave none)."""
        if self.token is None:
            return
        params: dict[str, Any] = {"progressToken": self.token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.link.notify("notifications/progress", params)

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        """An upstream's log message, to the client (`notifications/message`)."""
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self.link.notify("notifications/message", params)

    async def sample(self, params: Any) -> Any:
        """Put an upstream's `sampling/createMessage` to the client's model; its result."""
        import mcp_types as t

        answer = await self.link.request("sampling/createMessage", _dump(params))
        return t.CreateMessageResult.model_validate(answer, by_name=False)

    async def elicit(self, params: Any) -> Any:
        """Put an upstream's form (`elicitation/create`) to the client's user; its result."""
        import mcp_types as t

        answer = await self.link.request("elicitation/create", _dump(params))
        return t.ElicitResult.model_validate(answer, by_name=False)


def _dump(params: Any) -> dict[str, Any]:
    if hasattr(params, "model_dump"):
        dumped: dict[str, Any] = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped
    return dict(params)


def _encode(message: dict[str, Any]) -> bytes:
    """One JSON-RPC message as one line (strict JSON: a NaN is refused, ValueError)."""
    return compact_text(message).encode() + b"\n"


class ServeLink:
    """The stdio server side's hot path; see the module docstring.

    Args:
        handler: Runs one call (`Gateway.serve_call`).
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.ready = False
        """Whether the handshake is done (the SDK wrote its `initialize` result)."""
        self.version: str | None = None
        """The protocol version the handshake negotiated."""
        self.client_capabilities: dict[str, Any] = {}
        """What the client declared in its `initialize`."""
        self.client_name = "mcp client"
        """The name the client gave itself in its `initialize`."""
        self._initialize_id: Any = None
        self._calls: dict[str | int, anyio.CancelScope] = {}
        self._cancelled: set[str | int] = set()
        self._asked: dict[str, Any] = {}  # our requests' ids -> their mailboxes
        self._next = 0
        self._write: Callable[[bytes], None] | None = None
        self._drain: Callable[[], Awaitable[None]] | None = None
        self._buffered: Callable[[], int] = lambda: 0
        self._tasks: anyio.abc.TaskGroup | None = None
        self._running: set[asyncio.Task[None]] = set()  # the calls' tasks (`_start`)

    def attach(self, write: Callable[[bytes], None], drain: Callable[[], Awaitable[None]],
               buffered: Callable[[], int], tasks: anyio.abc.TaskGroup) -> None:
        """Give the link the transport's writer (whole lines) and its task group.

        The calls are tasks of the loop's own (`_start`); the transport ends them with
        `shutdown` before its task group exits.
        """
        self._write, self._drain, self._buffered, self._tasks = write, drain, buffered, tasks

    # -- what the transport hands over -----------------------------------------------------

    def take(self, line: bytes) -> bool:
        """Handle `line` if it is the link's; False: the SDK's server gets it."""
        if not self.ready:
            if self._initialize_id is None and b'"initialize"' in line:
                self._saw_initialize(line)
            return False
        try:
            message = loads(line)
        except (ValueError, RecursionError):
            return False  # the SDK's path answers a Parse error
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        method = message.get("method")
        if method == "tools/call":
            rid = message.get("id")
            if not _request_id(rid):
                return False  # a notification, or a bad id: the SDK's to refuse
            self._start(rid, message.get("params"))
            return True
        if method == "notifications/cancelled":
            params = message.get("params")
            target = params.get("requestId") if isinstance(params, dict) else None
            key = _key(target) if _request_id(target) else None
            scope = self._calls.get(key) if key is not None else None
            if scope is None or key is None:
                return False  # not one of ours (the SDK's own, or none): the SDK decides
            self._cancelled.add(key)
            scope.cancel()
            return True
        if method is None:
            rid = message.get("id")
            if isinstance(rid, str) and rid.startswith(_ID_PREFIX):
                mailbox = self._asked.pop(rid, None)
                if mailbox is not None:
                    mailbox.append(message)
                    mailbox[0].set()
                return True  # an answer to one of ours (or to one given up on): never the SDK's
        return False

    def _saw_initialize(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(message, dict) or message.get("method") != "initialize":
            return
        params = message.get("params")
        if not isinstance(params, dict):
            return
        self._initialize_id = message.get("id")
        caps = params.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        info = params.get("clientInfo")
        name = info.get("name") if isinstance(info, dict) else None
        if isinstance(name, str) and name:
            self.client_name = name

    def sent(self, message: Any) -> None:
        """The SDK's server wrote `message`: its answer to `initialize` opens the link."""
        if self.ready or self._initialize_id is None:
            return
        if getattr(message, "id", None) != self._initialize_id:
            return
        result = getattr(message, "result", None)
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if isinstance(version, str):
            from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

            if version in HANDSHAKE_PROTOCOL_VERSIONS:
                self.version = version
                self.ready = True
                return
        self._initialize_id = None  # refused: a later initialize may still open it

    # -- calls -------------------------------------------------------------------------------

    def _start(self, rid: str | int, params: Any) -> None:
        key = _key(rid)
        if key in self._calls:
            self._error(rid, INVALID_REQUEST, "a request with this id is already in flight")
            return
        if len(self._calls) >= MAX_IN_FLIGHT:
            self._error(rid, CONNECTION_CLOSED,
                        f"too many calls in flight (at most {MAX_IN_FLIGHT}); try again later")
            return
        try:
            _, _, token = check_call_params(params)
        except InvalidParams:
            self._error(rid, INVALID_PARAMS, "Invalid request parameters", "")
            return
        assert self._tasks is not None
        scope = anyio.CancelScope()
        self._calls[key] = scope
        # A task of the loop's own, not the task group's: anyio's `start_soon` builds a
        # handle, a cancel scope, an event and a wrapping coroutine per task (anyio 4.14+:
        # ~11 µs a call more than this, and allocations that set the collector off; issue
        # 38). The call's own scope is anyio's; `shutdown` does what the group's exit did.
        self._running.add(asyncio.get_running_loop().create_task(
            self._call(rid, key, params, scope, LinkRelay(self, rid, token))))

    async def _call(self, rid: str | int, key: str | int, params: dict[str, Any],
                    scope: anyio.CancelScope, relay: LinkRelay) -> None:
        answered = False
        try:
            try:
                # Cancelled by the client (absorbed, never answered) or by `shutdown`.
                with scope:
                    try:
                        result = await self.handler(params, relay)
                        data = _encode({"jsonrpc": "2.0", "id": rid, "result": result})
                    except Exception:  # boundary: a failure of ours, answered as one
                        import logging

                        logging.getLogger("handrail").exception(
                            "handrail serve: a tools/call failed")
                        answered = True
                        self._error(rid, INTERNAL_ERROR, "Internal error")
                    else:
                        answered = True
                        self._put(data)
                if not answered and key not in self._cancelled:
                    self._cut_off(rid)
            except anyio.get_cancelled_exc_class():
                if not answered and key not in self._cancelled:  # cancelled from outside
                    self._cut_off(rid)
                raise
            finally:
                del self._calls[key]
                self._cancelled.discard(key)
            if self._buffered() > _WRITE_HIGH and self._drain is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    await self._drain()
        finally:
            # Its last act: it leaves `_running` itself, not by a done callback (one more
            # event-loop iteration a call). Nothing cancels the task but through its scope,
            # so this body always runs.
            self._running.discard(asyncio.current_task())

    # -- writing -----------------------------------------------------------------------------

    def _line(self, message: dict[str, Any]) -> None:
        self._put(_encode(message))

    def _put(self, data: bytes) -> None:
        if self._write is None:
            return
        try:  # not contextlib.suppress: a context manager's two calls, every answer
            self._write(data)
        except (OSError, RuntimeError):
            pass

    def _error(self, rid: str | int, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self._line({"jsonrpc": "2.0", "id": rid, "error": error})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send the client a notification (one line)."""
        self._line({"jsonrpc": "2.0", "method": method, "params": params})
        if self._buffered() > _WRITE_HIGH and self._drain is not None:
            await self._drain()

    async def send_tool_list_changed(self) -> None:
        """`notifications/tools/list_changed` (the gateway tells its clients through this)."""
        await self.notify("notifications/tools/list_changed", {})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send the client a request and wait for its answer (its result).

        Raises:
            MCPError: the client answered with an error.
        """
        from mcp.shared.exceptions import MCPError

        self._next += 1
        rid = f"{_ID_PREFIX}{self._next}"
        mailbox: list[Any] = [anyio.Event()]
        self._asked[rid] = mailbox
        try:
            self._line({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            await mailbox[0].wait()
        finally:
            if self._asked.pop(rid, None) is not None:  # given up on: the client is told
                with contextlib.suppress(Exception):  # boundary: a client gone is not told
                    self._line({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": rid}})
        answer = mailbox[1]
        error = answer.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            text = error.get("message") if isinstance(error, dict) else None
            raise MCPError(code=code if isinstance(code, int) else INTERNAL_ERROR,
                           message=str(text)[:1000] if text is not None else "error")
        result = answer.get("result")
        if not isinstance(result, dict):
            raise MCPError(code=INVALID_REQUEST, message="the client's answer had no result")
        return result

    def _cut_off(self, rid: str | int) -> None:
        # The server's shutdown (stdin ended) cut the call off: as the SDK's dispatcher does,
        # the client is told once rather than left waiting (unless it cancelled the call).
        self._error(rid, CONNECTION_CLOSED, "Connection closed")

    async def shutdown(self) -> None:
        """Cancel the calls still running and wait until each has ended (the transport's exit).

        Cancelled through their own scopes, as the task group's exit cancelled them (a
        shielded clean-up stays shielded): each is recorded as interrupted and answered
        `-32000 Connection closed`, as the SDK's dispatcher answers its requests cut off by
        the end of the connection.
        """
        for scope in self._calls.values():
            scope.cancel()
        running = list(self._running)
        if running:
            await asyncio.wait(running)

    def closed(self) -> None:
        """The client's stdin ended: requests this link sent it will not be answered."""
        for rid in list(self._asked):
            mailbox = self._asked.pop(rid)
            mailbox.append({"error": {"code": CONNECTION_CLOSED, "message": "Connection closed"}})
            mailbox[0].set()
