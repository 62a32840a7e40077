"""A local HTTP server for provider tests: answers requests from a list, keeps every request.

Plain `asyncio.start_server` on 127.0.0.1 with a free port, speaking just enough HTTP/1.1
(keep-alive, Content-Length bodies) for httpx. Replies can also misbehave on purpose: hang,
break a chunked body, or close before the end of a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

WIRE = pathlib.Path(__file__).parent.parent / "fixtures" / "wire"


def load_wire(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((WIRE / f"{name}.json").read_text())
    return data


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """bytes/str sent as is; anything else as JSON."""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    mode: Literal["normal", "hang", "broken_chunked", "early_eof"] = "normal"
    """hang: never answer; broken_chunked: half the body then close mid-chunk;
    early_eof: half the body, no length, then a clean close."""

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


def replies_from_wire(wire: dict[str, Any]) -> list[Reply]:
    return [
        Reply(i["response"]["status"], i["response"]["body"], i["response"]["content_type"])
        for i in wire["interactions"]
    ]


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    """When the request arrived (monotonic seconds): the gaps show how long a client waited."""

    def json(self) -> Any:
        return json.loads(self.body)


class ModelServer:
    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[Received] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._stop = asyncio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._stop.set()
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(Received(method, path, headers, body))
                if not self.replies:
                    reply = Reply(599, {"error": {"message": "test server: no reply left"}})
                else:
                    reply = self.replies.pop(0)
                if not await self._send(writer, reply):
                    return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        """Send `reply`; False when the connection must end."""
        if reply.mode == "hang":
            await self._stop.wait()
            return False
        payload = reply.payload()
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        status = f"HTTP/1.1 {reply.status} X\r\ncontent-type: {reply.content_type}\r\n{extra}"
        if reply.mode == "broken_chunked":
            half = payload[: len(payload) // 2]
            writer.write(f"{status}transfer-encoding: chunked\r\n\r\n".encode())
            writer.write(f"{len(payload):x}\r\n".encode() + half)
            await writer.drain()
            return False
        if reply.mode == "early_eof":
            writer.write(f"{status}connection: close\r\n\r\n".encode())
            writer.write(payload[: len(payload) // 2])
            await writer.drain()
            return False
        writer.write(f"{status}content-length: {len(payload)}\r\n\r\n".encode() + payload)
        await writer.drain()
        return True


@contextlib.asynccontextmanager
async def serve(replies: Sequence[Reply]) -> AsyncIterator[ModelServer]:
    server = ModelServer(replies)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
