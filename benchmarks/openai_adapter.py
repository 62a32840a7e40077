"""The OpenAI adapter's own cost per model call, against a chat-completions server on loopback.

A local server (its own process, canned answers, HTTP/1.1 keep-alive) answers N
tool-call turns and then a final text. `OpenAIChat` is driven through those N+1 request/response
cycles with a growing history, as an agent loop would. The baseline sends the same bytes with
a bare `httpx.AsyncClient` and decodes the answer, so the difference is the adapter's own work:
converting messages and tools, encoding, parsing the response into a `ModelResponse`.

    .venv/bin/python benchmarks/openai_adapter.py

`measure(n)` (median µs per adapter call) is what benchmarks/agent_loop.py imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import statistics
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import anyio
import httpx

from handrail.models import OpenAIChat, SystemMessage, ToolResultMessage, UserMessage
from handrail.tools import ToolResult, ToolSpec

TOOL = ToolSpec(
    "local/lookup",
    "Look a key up in the table.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
     "additionalProperties": False},
)
PROMPT = [SystemMessage("You look things up."), UserMessage("Look up every key, one by one.")]


def _answer(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(payload)).encode() + b"\r\n\r\n" + payload)


def _tool_turn(i: int) -> bytes:
    return _answer({
        "id": f"chatcmpl-{i}", "object": "chat.completion", "model": "bench-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{i}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": f"k{i}"})}}]}}],
        "usage": {"prompt_tokens": 50 + i, "completion_tokens": 12, "total_tokens": 62 + i},
    })


FINAL = _answer({
    "id": "chatcmpl-final", "object": "chat.completion", "model": "bench-model",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "All keys looked up."}}],
    "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105},
})


class _Server:
    """Answers the first `n` requests with a tool call each, then a final text."""

    def __init__(self, n: int) -> None:
        self.answers = [_tool_turn(i) for i in range(n)]
        self.count = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                answer = self.answers[self.count] if self.count < len(self.answers) else FINAL
                # After the final answer the script starts over, so one server serves
                # several whole runs (a warm-up and the timed one).
                self.count = 0 if answer is FINAL else self.count + 1
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _serve_forever(n: int, port_out: Connection) -> None:
    server = _Server(n)

    async def run() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port_out.send(listener.sockets[0].getsockname()[1])
        await listener.serve_forever()

    asyncio.run(run())


@contextlib.contextmanager
def _serving(n: int) -> Iterator[int]:
    """A server process on loopback (its own interpreter: it takes no time from the client)."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(
        target=_serve_forever, args=(n, sender), daemon=True
    )
    process.start()
    try:
        if not receiver.poll(10):
            raise RuntimeError("the benchmark server did not start")
        yield int(receiver.recv())
    finally:
        process.terminate()
        process.join(5)


async def _adapter_calls(url: str, n: int) -> list[float]:
    times: list[float] = []
    async with OpenAIChat("bench-model", base_url=url, api_key="sk-bench") as model:
        messages: list[Any] = list(PROMPT)
        for _ in range(n + 1):
            start = time.perf_counter_ns()
            response = await model.request(messages, [TOOL])
            times.append((time.perf_counter_ns() - start) / 1000)
            messages.append(response.message)
            for call in response.message.tool_calls:
                messages.append(ToolResultMessage(call.id, call.name, ToolResult.text("42")))
        assert response.message.text == "All keys looked up.", "the loop did not finish"
        assert len(messages) == 2 * n + 3
    return times


async def _raw_calls(url: str, n: int) -> list[float]:
    # The same wire bytes, prepared in advance: what any client pays for the HTTP round trip.
    bodies: list[bytes] = []
    parser = OpenAIChat("bench-model", base_url=url, api_key="sk-bench")
    messages: list[Any] = list(PROMPT)
    for i in range(n + 1):
        bodies.append(parser._body(messages, [TOOL], None, stream=False))
        if i < n:
            turn = json.loads(_tool_turn(i).partition(b"\r\n\r\n")[2])
            parsed = parser._parse(turn).message
            messages.append(parsed)
            for call in parsed.tool_calls:
                messages.append(ToolResultMessage(call.id, call.name, ToolResult.text("42")))
    times: list[float] = []
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    async with httpx.AsyncClient() as client:
        for body in bodies:
            start = time.perf_counter_ns()
            response = await client.post(f"{url}/chat/completions", content=body, headers=headers)
            response.json()
            times.append((time.perf_counter_ns() - start) / 1000)
    return times


def measure(n: int) -> float:
    """Median µs per `OpenAIChat.request` over N tool-call turns and a final answer."""
    with _serving(n) as port:
        return statistics.median(anyio.run(_adapter_calls, f"http://127.0.0.1:{port}/v1", n))


def measure_raw(n: int) -> float:
    """Median µs per bare httpx round trip of the same bodies (the baseline)."""
    with _serving(n) as port:
        return statistics.median(anyio.run(_raw_calls, f"http://127.0.0.1:{port}/v1", n))


def measure_cpu(n: int) -> float:
    """Median µs of the adapter's own work per call, without I/O: encode the body, parse the answer.

    Insensitive to the scheduler noise of a loaded machine, unlike the round trips.
    """
    model = OpenAIChat("bench-model", base_url="http://127.0.0.1:1/v1", api_key="sk-bench")
    answers = [json.loads(_tool_turn(i).partition(b"\r\n\r\n")[2]) for i in range(n)]
    answers.append(json.loads(FINAL.partition(b"\r\n\r\n")[2]))
    messages: list[Any] = list(PROMPT)
    times: list[float] = []
    for answer in answers:
        start = time.perf_counter_ns()
        model._body(messages, [TOOL], None, stream=False)
        response = model._parse(answer)
        times.append((time.perf_counter_ns() - start) / 1000)
        messages.append(response.message)
        for call in response.message.tool_calls:
            messages.append(ToolResultMessage(call.id, call.name, ToolResult.text("42")))
    return statistics.median(times)


def main() -> None:
    measure(20)  # warm up: imports, SSL context, first connections
    rows = []
    for n in (100, 1000):
        adapter = statistics.median(measure(n) for _ in range(3))
        raw = statistics.median(measure_raw(n) for _ in range(3))
        cpu = statistics.median(measure_cpu(n) for _ in range(3))
        rows.append((n, adapter, raw, cpu))
    print(f"{'N':>6} | {'OpenAIChat µs/call':>18} | {'bare httpx µs/call':>18} | "
          f"{'ratio':>5} | {'adapter CPU µs/call':>19}")
    print("-" * 80)
    for n, adapter, raw, cpu in rows:
        print(f"{n:>6} | {adapter:>18.0f} | {raw:>18.0f} | {adapter / raw:>5.2f} | {cpu:>19.0f}")
    print("medians of 3 repeats of the median per call; loopback server in its own process; "
          "history grows to 2N+3 messages; CPU = encode body + parse answer, no I/O")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
