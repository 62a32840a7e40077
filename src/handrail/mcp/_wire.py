"""A stdio MCP server's link, with `tools/call` spoken by handrail itself (issue 38).

The SDK's `ClientSession.call_tool` costs more than a trivial tool call's whole gate: a
pydantic request model dumped, every line of the server's validated as a `JSONRPCMessage`
union in the transport, two memory-stream hops each way, a task per request. An agent's MCP
call spent ~2x the SDK's own `call_tool` in instructions, half of it there.

This module spawns the server (as the SDK's `stdio_client` does: its default environment, a
new session so the whole tree can be stopped, stderr to the toolset's file) and reads its
stdout in the event loop's pipe callback. Every line is split under a bound (`limit`: a
server's output is hostile input, and a longer line is refused, never held whole) and parsed
once with `json`; then:

- a response to a `tools/call` this link sent (ids `hr-N`: the SDK numbers its own) goes
  straight to that call's mailbox, and so does a `notifications/progress` for its token, and
  a log message while it is the one call in flight (relayed by the call before its result);
- everything else (the handshake, `tools/list`, resources and prompts, the server's requests
  — ping, forms, sampling, roots — and notifications: list changes, log messages) is handed
  to an SDK `ClientSession` over memory streams, which speaks the rest of the protocol as
  before (version negotiation, capabilities, result validation). What the session writes is
  written to the server's stdin, one line per message.

A call's result is validated by its caller against the negotiated version's schema, as the
session would (`check_call_result`). A server that exits or closes stdout fails every call in
flight as a closed connection: the request was sent, so the call is in doubt. A call its
caller abandons (deadline, cancellation) is cancelled at the server
(`notifications/cancelled`). Used only under asyncio on POSIX (the loop's pipe protocol);
elsewhere, and for HTTP, the toolset drives the SDK's transports as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import IO, Any

import anyio

from handrail.mcp._json import compact_ascii, loads
from handrail.mcp._stdio import MessageTooLong, split_lines

__all__ = ["ID_PREFIX", "Wire", "check_call_result", "lean_available", "open_wire"]

ID_PREFIX = "hr-"
"""The ids of the requests this link sends itself (strings: the SDK's are integers)."""
_BACKLOG_HIGH = 256  # lines waiting for the SDK session: past this, stdout is not read
_BACKLOG_LOW = 64
_WRITE_HIGH = 1 << 20  # bytes queued for stdin before a writer waits
_EXIT_GRACE = 2.0  # seconds a server has to exit after its stdin closes (then SIGTERM...)
_KILL_GRACE = 2.0  # ...and after SIGTERM (then SIGKILL), as the SDK's transport


def lean_available() -> bool:
    """Whether this link can serve: an asyncio event loop, on POSIX."""
    if sys.platform == "win32":
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio
        return False
    return True


class _Pipes(asyncio.SubprocessProtocol):
    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.wire._received(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.wire._ended()
        elif fd == 0:
            self.wire.stdin_lost = True

    def pause_writing(self) -> None:
        self.wire._writable = anyio.Event()

    def resume_writing(self) -> None:
        self.wire._writable.set()

    def process_exited(self) -> None:
        self.wire._exited.set()


class _Stdout(asyncio.Protocol):
    """The server's stdout pipe, read straight into the link (`Wire._received`).

    The subprocess transport's own pipe protocol hands each chunk on with `call_soon`: one
    event-loop iteration more for every answer (issue 38). This one takes the chunk in the
    read callback itself; the end of the pipe still goes through the subprocess transport
    (`inner`), which then tells `_Pipes` (after any chunk: it is scheduled, they are not).
    """

    def __init__(self, wire: Wire, inner: Any) -> None:
        self.wire = wire
        self.inner = inner

    def connection_made(self, transport: Any) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.wire._received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)


class Wire:
    """One stdio server's link: the SDK session's streams, and `tools/call` of its own."""

    def __init__(self, limit: int) -> None:
        from mcp.shared.message import SessionMessage

        self.limit = limit
        """The longest line (one JSON-RPC message) read from the server, in bytes."""
        self.closed = False
        """The server's stdout ended (it exited, or closed it): nothing more will be read."""
        self.stdin_lost = False
        self.version: str | None = None
        """The protocol version the handshake agreed (set by the toolset)."""
        from handrail.mcp._client import _Sweep

        self.deadlines = _Sweep()
        """The one timer of the deadlines of this link's calls (`_client._Deadline`)."""
        self._buffer = bytearray()
        self._skipping = False
        self._calls: dict[str, Any] = {}  # id -> the call's mailbox (`_client._Mailbox`)
        self._count = 0
        # Lines for the session, and (after them) items for calls: (mailbox, item).
        self._backlog: collections.deque[bytes | Exception | tuple[Any, tuple[str, Any]]] = \
            collections.deque()
        self._ready = anyio.Event()
        self._writable = anyio.Event()
        self._writable.set()
        self._exited = anyio.Event()
        self._paused = False
        self._session_gone = False
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: Any = None
        self._stdout: Any = None
        self.read_send, self.read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.write, self._write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    # -- reading (the loop's pipe callback: no awaits) ------------------------------------

    def _received(self, data: bytes) -> None:
        lines, self._skipping = split_lines(self._buffer, data, self._skipping, self.limit)
        for line in lines:
            self._dispatch(line)

    def _dispatch(self, line: bytes | MessageTooLong) -> None:
        if isinstance(line, MessageTooLong):
            owner = _owner(line.head)
            mail = self._calls.pop(owner, None) if owner is not None else None
            if mail is not None:
                self._deliver(mail, ("too_long", str(line)))
                return
            self._pass(line)
            return
        try:
            message = loads(line)
        except ValueError:
            self._pass(line)  # the session parses it again, and reports it
            return
        if not isinstance(message, dict):
            self._pass(line)
            return
        if "method" not in message:
            rid = message.get("id")
            if isinstance(rid, str) and rid.startswith(ID_PREFIX):
                mail = self._calls.pop(rid, None)
                if mail is None:
                    return  # the answer to a call given up on (cancelled): nobody waits
                if "error" in message:
                    self._deliver(mail, ("error", message["error"]))
                elif "result" in message:
                    self._deliver(mail, ("result", message["result"]))
                else:
                    self._deliver(mail, ("error", None))
                return
        elif message["method"] == "notifications/progress":
            params = message.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            if isinstance(token, str) and token.startswith(ID_PREFIX):
                mail = self._calls.get(token)
                if mail is not None:
                    self._deliver(mail, ("progress", params))
                return
        elif message["method"] == "notifications/message" and self._calls:
            # A log message during a call is the call's (as the toolset's `_on_log` has it:
            # with one call in flight; with several, nothing says whose it is). In its
            # mailbox it is relayed before the result, in the order the server wrote them.
            if len(self._calls) == 1:
                for mail in self._calls.values():
                    self._deliver(mail, ("log", message.get("params")))
            return
        self._pass(line)

    def _deliver(self, mail: Any, item: tuple[str, Any]) -> None:
        """Hand a call its item, after what came before it for the session.

        In the server's order: a log message (or a form) the server sent before its result
        reaches the session before the result reaches the call, as over the SDK's transport.
        """
        if self._backlog and not self._session_gone:
            self._backlog.append((mail, item))
            return
        _put(mail, item)

    def _pass(self, item: bytes | Exception) -> None:
        """A line for the SDK session (through `_forward`); stdout paused past a backlog."""
        if self._session_gone:
            return  # nobody reads the session's lines any more
        self._backlog.append(item)
        self._ready.set()
        if len(self._backlog) > _BACKLOG_HIGH and not self._paused and self._stdout is not None:
            self._paused = True
            self._stdout.pause_reading()

    def _ended(self) -> None:
        """The server's stdout closed: every call in flight was sent and will never be answered."""
        self.closed = True
        calls, self._calls = self._calls, {}
        for mail in calls.values():
            self._deliver(mail, ("gone", None))
        self._ready.set()

    async def _forward(self) -> None:
        """The lines that are not this link's own, validated and handed to the session."""
        from mcp.shared.message import SessionMessage
        from mcp_types import jsonrpc_message_adapter

        async with self.read_send:
            while True:
                while not self._backlog:
                    if self.closed:
                        return  # the session sees its read stream end: the link is down
                    self._ready = anyio.Event()
                    if not self._backlog and not self.closed:
                        await self._ready.wait()
                item = self._backlog.popleft()
                if self._paused and len(self._backlog) < _BACKLOG_LOW and \
                        self._stdout is not None:
                    self._paused = False
                    self._stdout.resume_reading()
                message: SessionMessage | Exception
                if isinstance(item, tuple):
                    _put(*item)
                    continue
                if isinstance(item, Exception):
                    message = item
                else:
                    try:
                        message = SessionMessage(jsonrpc_message_adapter.validate_json(
                            item, by_name=False))
                    except ValueError as exc:  # the session reports it (message_handler)
                        message = exc
                try:
                    await self.read_send.send(message)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
        # The session stopped reading: the calls still get what was theirs.
        self._session_gone = True
        while self._backlog:
            left = self._backlog.popleft()
            if isinstance(left, tuple):
                _put(*left)
        if self._paused and self._stdout is not None:
            self._paused = False
            self._stdout.resume_reading()

    # -- writing --------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self.closed or self.stdin_lost or self._stdin is None or self._stdin.is_closing():
            raise anyio.ClosedResourceError
        self._stdin.write(data)

    async def _drain(self) -> None:
        if self._stdin is not None and self._stdin.get_write_buffer_size() > _WRITE_HIGH:
            await self._writable.wait()

    async def _write_session(self) -> None:
        """What the SDK session sends, one line a message."""
        async with self._write_receive:
            async for item in self._write_receive:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    self._send(data.encode() + b"\n")
                    await self._drain()
                except (anyio.ClosedResourceError, OSError):
                    # The server may still be alive: end the session's reading, so a
                    # request of its does not wait forever.
                    await self.read_send.aclose()
                    return

    # -- calls ----------------------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any], mail: Any) -> str:
        """Send a request whose answer (and progress) goes to `mail`; its id.

        Raises:
            anyio.ClosedResourceError: the link is down; nothing was sent.
        """
        if self.closed:
            raise anyio.ClosedResourceError
        self._count += 1
        rid = f"{ID_PREFIX}{self._count}"
        params = {**params, "_meta": {"progressToken": rid}}
        data = compact_ascii({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        self._send(data.encode() + b"\n")
        self._calls[rid] = mail
        try:
            await self._drain()
        except BaseException:  # cancelled while stdin was full: its caller never gets the id
            if self.forget(rid):
                self.cancel(rid, "the caller stopped waiting")
            raise
        return rid

    def forget(self, rid: str) -> bool:
        """Stop waiting for `rid`'s answer; whether it was still unanswered."""
        return self._calls.pop(rid, None) is not None

    def cancel(self, rid: str, reason: str) -> None:
        """Tell the server to stop `rid` (`notifications/cancelled`), when the link is up."""
        body = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": rid, "reason": reason}}
        with contextlib.suppress(anyio.ClosedResourceError, OSError, RuntimeError):
            self._send(json.dumps(body, separators=(",", ":")).encode() + b"\n")

    # -- the process ----------------------------------------------------------------------

    async def _stop(self) -> None:
        """Close stdin, give the server its grace, then stop its tree (SIGTERM, SIGKILL)."""
        transport = self._transport
        if transport is None:
            return
        with contextlib.suppress(Exception):  # boundary: a pipe already gone
            if self._stdin is not None:
                self._stdin.close()
        with anyio.move_on_after(_EXIT_GRACE):
            await self._exited.wait()
        pid = transport.get_pid()
        for sig, grace in ((signal.SIGTERM, _KILL_GRACE), (signal.SIGKILL, _KILL_GRACE)):
            if self._exited.is_set():
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # its own session: the server and what it started
            with anyio.move_on_after(grace):
                await self._exited.wait()
        transport.close()


def _put(mail: Any, item: tuple[str, Any]) -> None:
    try:  # not contextlib.suppress: a context manager's two calls, every answer
        mail.put(item)
    except anyio.ClosedResourceError:
        pass  # the call is gone


def _owner(head: bytes) -> str | None:
    """The id of this link's call that an over-long line answers, from the line's start."""
    import re

    found = re.match(rb'\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*"(' +
                     ID_PREFIX.encode() + rb'\d{1,18})"', head)
    if found is None:
        found = re.match(rb'\s*\{\s*"id"\s*:\s*"(' + ID_PREFIX.encode() + rb'\d{1,18})"', head)
    return found.group(1).decode() if found is not None else None


@contextlib.asynccontextmanager
async def open_wire(argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str,
                    errlog: IO[bytes], limit: int) -> AsyncIterator[Wire]:
    """Start the server and serve its link until the block ends (then stop the server).

    Raises:
        OSError: the program cannot be started.
    """
    from mcp.client.stdio import get_default_environment

    loop = asyncio.get_running_loop()
    wire = Wire(limit)
    transport, _ = await loop.subprocess_exec(
        lambda: _Pipes(wire), *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=errlog, cwd=cwd, env=get_default_environment() | dict(env or {}),
        start_new_session=True)
    wire._transport = transport
    wire._stdin = transport.get_pipe_transport(0)
    wire._stdout = stdout = transport.get_pipe_transport(1)
    # No await since the transport was connected: the chunks it held back until then have
    # been handed on already (its `_connect_pipes` scheduled them before our wake-up), so
    # from here every chunk comes straight, in order.
    if stdout is not None:
        stdout.set_protocol(_Stdout(wire, stdout.get_protocol()))
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wire._forward)
            tasks.start_soon(wire._write_session)
            try:
                yield wire
            finally:
                # Bounded, and whatever cancels the caller: a server is never left running.
                with anyio.CancelScope(shield=True):
                    wire.write.close()
                    await wire._stop()
                tasks.cancel_scope.cancel()
    finally:
        if not transport.is_closing():
            transport.close()
        wire.read.close()


@functools.cache
def _later_fields(method: str, version: str) -> frozenset[str]:
    """Result keys a revision newer than `version` declares for `method` and it does not.

    The SDK session drops them before validating (a later revision's constraints must not
    apply to fields outside the negotiated contract); so does `check_call_result`.
    """
    from mcp_types import methods
    from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

    def fields(target: Any) -> set[str]:
        members = getattr(target, "__args__", (target,))
        out: set[str] = set()
        for model in members:
            for name, info in getattr(model, "model_fields", {}).items():
                out.add(info.alias or name)
        return out

    current = methods.SERVER_RESULTS.get((method, version))
    if current is None or version not in KNOWN_PROTOCOL_VERSIONS:
        return frozenset()
    later: set[str] = set()
    for revision in KNOWN_PROTOCOL_VERSIONS[KNOWN_PROTOCOL_VERSIONS.index(version) + 1:]:
        row = methods.SERVER_RESULTS.get((method, revision))
        if row is not None:
            later |= fields(row)
    return frozenset(later - fields(current))


def check_call_result(raw: Any, version: str | None) -> Any:
    """A `tools/call` result as the SDK session would return it: validated, typed.

    Raises:
        pydantic.ValidationError: it is no valid `CallToolResult` at `version`.
    """
    import mcp_types as t
    from mcp_types import methods

    if not isinstance(raw, dict):
        return t.CallToolResult.model_validate(raw, by_name=False)  # raises
    version = version or "2025-11-25"
    ttl = raw.get("ttlMs")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
        raw["ttlMs"] = 0
    with contextlib.suppress(KeyError):  # a version with no row for the method
        methods.validate_server_result("tools/call", version, raw)
    foreign = _later_fields("tools/call", version)
    if not foreign.isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return t.CallToolResult.model_validate(raw, by_name=False)
