"""`handrail serve --stdio`'s transport: stdin and stdout read and written by the event loop.

The SDK's `stdio_server` reads each line and writes (then flushes) each message through a
worker thread: three thread round trips per call, ~300 µs of CPU and ~200 µs of wall time
per `tools/call` on the 2-core machines we measure on (benchmarks/README.md, MCP), more than
the gate and the record together. When stdin and stdout are pipes or sockets (how every MCP
client starts a stdio server), this transport hands them to asyncio instead; otherwise (a
terminal, a regular file, another event loop than asyncio) the SDK's transport serves.

It keeps the SDK transport's contract: while serving, fd 0 reads the null device and fd 1
writes to stderr, so a tool's stray `print` or a child process cannot corrupt the wire; both
are restored on exit. And it bounds what a client can make it hold: a line longer than
`MAX_MESSAGE_BYTES` is refused and skipped to its end, never buffered whole. Such a line, or
one that is not a JSON-RPC message, is answered with a JSON-RPC Parse error (id null), as
the protocol asks (the SDK's transport drops it silently).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from handrail.mcp._serve_link import ServeLink

__all__ = ["MAX_MESSAGE_BYTES", "serve_stdio_transport"]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The longest JSON-RPC message (one line) a client may send over stdio, in bytes."""


class MessageTooLong(ValueError):
    """A peer's line exceeded its bound (`MAX_MESSAGE_BYTES`); it was skipped."""

    def __init__(self, message: str, head: bytes = b"") -> None:
        super().__init__(message)
        self.head = head
        """The line's first bytes (who it answers, for a client: `mcp/_wire.py`)."""


def _pipe_like(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def fast_path_available() -> bool:
    """Whether the event loop can serve stdin and stdout (asyncio, both pipes or sockets)."""
    import asyncio

    try:
        asyncio.get_running_loop()  # none under trio
    except RuntimeError:
        return False
    return sys.platform != "win32" and _pipe_like(0) and _pipe_like(1)


def split_lines(buffer: bytearray, chunk: bytes, skipping: bool,
                limit: int = MAX_MESSAGE_BYTES) -> tuple[list[bytes | MessageTooLong], bool]:
    """Add `chunk` to `buffer`; return the complete lines (or refusals) and the skip state.

    `buffer` holds the unfinished line and never grows past `limit`: a line that would is
    reported once as `MessageTooLong`, and the rest of it is dropped up to its newline.
    """
    if not skipping and not buffer:
        # The common chunk: one whole line (a peer writes a message and its newline at
        # once), taken without the loop's copies into `buffer` (issue 38).
        end = chunk.find(b"\n")
        if end == len(chunk) - 1 and end <= limit:
            line = chunk[:end]
            return ([line] if line.strip() else []), False
    out: list[bytes | MessageTooLong] = []
    start = 0
    while True:
        end = chunk.find(b"\n", start)
        if end < 0:
            if not skipping:
                buffer += chunk[start:]
                if len(buffer) > limit:
                    out.append(MessageTooLong(
                        f"a message longer than {limit} bytes was refused", bytes(buffer[:256])))
                    buffer.clear()
                    skipping = True
            return out, skipping
        if skipping:
            skipping = False  # the long line ends here; the next one is read normally
        else:
            buffer += chunk[start:end]
            if len(buffer) > limit:
                out.append(MessageTooLong(f"a message longer than {limit} bytes was refused",
                                          bytes(buffer[:256])))
            elif buffer.strip():
                out.append(bytes(buffer))
            buffer.clear()
        start = end + 1


_BACKLOG_HIGH = 64  # lines waiting for the SDK's server: past this, stdin is not read
_BACKLOG_LOW = 16


class _Lines(asyncio.Protocol):
    """stdin's protocol: each chunk split into lines in the loop's own read callback.

    A line the link takes (a `tools/call`) starts its call right there, one event-loop
    iteration sooner than through a `StreamReader` and a reading task (the reader's future,
    then the task's wake-up: issue 38). Any other line, and every line after it until it is
    delivered, waits in `backlog` for `forward` (the SDK's server), so lines are handled in
    the order they came, as a reading loop handles them; past `_BACKLOG_HIGH` waiting lines
    stdin is not read until `forward` catches up.
    """

    def __init__(self, link: ServeLink | None) -> None:
        self.link = link
        self.backlog: collections.deque[bytes | MessageTooLong] = collections.deque()
        self.ended = False
        """stdin reached its end (or failed): `forward` ends once the backlog is delivered."""
        self._buffer = bytearray()
        self._skipping = False
        self._transport: Any = None
        self._paused = False
        self._waiter: Any = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        lines, self._skipping = split_lines(self._buffer, data, self._skipping)
        backlog, link = self.backlog, self.link
        for line in lines:
            if not backlog and link is not None and type(line) is bytes and link.take(line):
                continue
            backlog.append(line)
        if backlog:
            self._wake()
            if len(backlog) > _BACKLOG_HIGH and not self._paused:
                self._paused = True
                self._transport.pause_reading()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._wake()

    def delivered(self) -> None:
        """`forward` is done with the backlog's first line."""
        self.backlog.popleft()
        if self._paused and len(self.backlog) <= _BACKLOG_LOW and not self.ended:
            self._paused = False
            self._transport.resume_reading()

    async def wait(self) -> None:
        """Until a line waits in the backlog or stdin has ended."""
        while not self.backlog and not self.ended:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Claim:
    """fd 0 and 1 diverted (null device, stderr) while private duplicates carry the wire."""

    def __init__(self) -> None:
        self.read_fd = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
        try:
            self.write_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
        except OSError:
            os.close(self.read_fd)
            raise
        # O_NONBLOCK is a property of the shared open file: restored for whoever reads on.
        self._flags = {fd: fcntl.fcntl(fd, fcntl.F_GETFL) for fd in (self.read_fd, self.write_fd)}
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        os.dup2(2, 1)

    def release(self) -> None:
        for fd, flags in self._flags.items():
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        with contextlib.suppress(OSError):
            os.dup2(self.read_fd, 0)
        with contextlib.suppress(OSError):
            os.dup2(self.write_fd, 1)


@contextlib.asynccontextmanager
async def serve_stdio_transport(link: ServeLink | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams a low-level MCP `Server.run` takes, over this process's stdio.

    The event loop's own pipes when `fast_path_available()`, else the SDK's `stdio_server`.
    On the event loop's pipes, `link` (`mcp/_serve_link.py`) is offered each line first, and
    sees what the server writes: the lines it takes (a `tools/call`) never reach the server.
    """
    if not fast_path_available():
        from mcp.server.stdio import stdio_server

        async with stdio_server() as streams:
            yield streams
        return

    import asyncio

    import mcp_types
    from mcp.shared.message import SessionMessage

    loop = asyncio.get_running_loop()
    claim = _Claim()
    reader_file = os.fdopen(claim.read_fd, "rb", buffering=0, closefd=False)
    writer_file = os.fdopen(claim.write_fd, "wb", buffering=0, closefd=False)
    lines = _Lines(link)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: lines, reader_file)
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, writer_file)
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)

    # Plain anyio streams: the server reads a sender's context only where a stream offers
    # one (`last_context`), and a pipe's reader has none worth carrying.
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)
    adapter = mcp_types.jsonrpc_message_adapter

    def parse_error(why: str) -> None:
        # JSON-RPC 2.0: a line that is no message gets a Parse error with a null id (the
        # SDK's transport drops it, leaving a client to wait out its timeout). One whole
        # line, appended between the writer's lines, never inside one.
        body = {"jsonrpc": "2.0", "id": None,
                "error": {"code": -32700, "message": f"Parse error: {why}"}}
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(json.dumps(body).encode() + b"\n")

    async def read_lines() -> None:
        # The lines `_Lines` left for the SDK's server (and those after them), in order.
        backlog = lines.backlog
        async with inbound_send:
            while True:
                await lines.wait()
                if not backlog:
                    if link is not None:
                        link.closed()
                    return  # the client closed stdin: the session is over
                line = backlog[0]
                if isinstance(line, Exception):
                    parse_error(str(line))
                    await inbound_send.send(line)
                elif link is None or not link.take(line):
                    try:
                        message = adapter.validate_json(line, by_name=False)
                    except Exception as exc:  # boundary: whatever the client sent
                        parse_error("not a JSON-RPC message")
                        await inbound_send.send(exc)
                    else:
                        await inbound_send.send(SessionMessage(message))
                lines.delivered()  # only now may a later line be taken before the backlog

    written = anyio.Event()

    async def write_messages() -> None:
        try:
            await _write_all()
        finally:
            written.set()

    async def _write_all() -> None:
        async with outbound_receive:
            async for item in outbound_receive:
                if link is not None and not link.ready:
                    link.sent(item.message)
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    writer.write(data.encode() + b"\n")
                    await writer.drain()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client is gone; reading ends at its EOF

    try:
        async with anyio.create_task_group() as tasks:
            if link is not None:
                link.attach(writer.write, writer.drain, write_transport.get_write_buffer_size,
                            tasks)
            tasks.start_soon(read_lines)
            tasks.start_soon(write_messages)
            try:
                yield inbound, outbound
            finally:
                # What the server sent is written before the process lets go of stdout
                # (bounded: a client that stopped reading does not hold the exit).
                await outbound.aclose()
                if link is not None:  # its calls are its own tasks: cut off and answered
                    with anyio.move_on_after(15, shield=True):
                        await link.shutdown()
                with anyio.move_on_after(5, shield=True):
                    await written.wait()
                    with contextlib.suppress(OSError, RuntimeError):
                        await writer.drain()
                tasks.cancel_scope.cancel()
    finally:
        write_transport.close()
        read_transport.close()
        claim.release()
        for fd in (claim.read_fd, claim.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
