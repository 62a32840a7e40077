"""`handrail serve --stdio`'s own `tools/call` link (handrail.mcp._serve_link), in process.

The link is driven as the transport drives it: each line the client wrote is offered to
`take`, and what the link writes (whole lines, synchronously) is read back. The handler is the
gateway's place (`Gateway.serve_call`); here a stand-in whose calls wait until released, so a
call's life (running, cancelled, cut off) is decided by the test, never by a clock. The same
cases against a real `handrail serve` and the SDK's own server are in
test_mcp_serve_link_process.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import mcp_types as t
import pytest
from mcp.shared.exceptions import MCPError

from handrail.mcp._serve_link import MAX_IN_FLIGHT, LinkRelay, ServeLink

pytestmark = pytest.mark.anyio


class _Stand:
    """The gateway's place: a call of `hang` waits for `release`; others answer at once."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.started: dict[Any, anyio.Event] = {}
        self.cancelled: dict[Any, anyio.Event] = {}
        self.ran: list[Any] = []
        self.relays: dict[Any, LinkRelay] = {}

    def started_event(self, key: Any) -> anyio.Event:
        return self.started.setdefault(key, anyio.Event())

    def cancelled_event(self, key: Any) -> anyio.Event:
        return self.cancelled.setdefault(key, anyio.Event())

    async def __call__(self, params: dict[str, Any], relay: LinkRelay) -> dict[str, Any]:
        name = params["name"]
        key = (params.get("arguments") or {}).get("key", name)
        self.ran.append(key)
        self.relays[key] = relay
        self.started_event(key).set()
        if name == "fail":
            raise RuntimeError("the gateway failed")
        if name == "hang":
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled_event(key).set()
                raise
        return {"content": [{"type": "text", "text": f"done {key}"}], "isError": False}


async def _waited(event: anyio.Event) -> None:
    with anyio.fail_after(5):  # a bound for a test that fails, never a clock to wait on
        await event.wait()


class _Wire:
    """A link attached to a list of written lines, in a task group, past the handshake."""

    def __init__(self, link: ServeLink, stand: _Stand) -> None:
        self.link = link
        self.stand = stand
        self.written: list[dict[str, Any]] = []
        self._wrote = anyio.Event()

    def write(self, data: bytes) -> None:
        assert data.endswith(b"\n") and data.count(b"\n") == 1  # one whole line
        self.written.append(json.loads(data))
        self._wrote.set()
        self._wrote = anyio.Event()

    async def until(self, done: Callable[[], object]) -> None:
        """Wait until `done()` holds, re-checked at each line written."""
        with anyio.fail_after(5):
            while not done():
                await self._wrote.wait()

    def take(self, message: dict[str, Any]) -> bool:
        return self.link.take(json.dumps(message).encode())

    def call(self, rid: Any, name: str, arguments: Any = None, **params: Any) -> bool:
        body: dict[str, Any] = {"name": name, **params}
        if arguments is not None:
            body["arguments"] = arguments
        return self.take({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": body})

    def cancel(self, rid: Any) -> bool:
        return self.take(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": rid, "reason": "the user stopped it"},
            }
        )

    def answers(self, rid: Any) -> list[dict[str, Any]]:
        return [m for m in self.written if m.get("id") == rid and "method" not in m]


@pytest.fixture
async def wire() -> AsyncIterator[_Wire]:
    stand = _Stand()
    link = ServeLink(stand)
    async with anyio.create_task_group() as tasks:
        w = _Wire(link, stand)

        async def drain() -> None:
            pass

        link.attach(w.write, drain, lambda: 0, tasks)
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "in-process", "version": "0"},
            },
        }
        assert not w.take(initialize)  # the SDK's server answers the handshake
        link.sent(t.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
        assert link.ready and link.version == "2025-11-25"
        yield w
        stand.release.set()
        await link.shutdown()  # the calls are the link's own tasks


async def test_a_call_is_answered_once_with_its_result(wire: _Wire) -> None:
    assert wire.call(2, "echo", {"key": "a"})
    await wire.until(lambda: wire.answers(2))
    assert wire.answers(2) == [
        {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"content": [{"type": "text", "text": "done a"}], "isError": False},
        }
    ]


async def test_a_finished_calls_task_is_let_go(wire: _Wire) -> None:
    # The task leaves the link's set itself (no done callback): none is held once answered,
    # nor once cancelled.
    assert wire.call(2, "echo", {"key": "a"}) and wire.call(3, "hang", {"key": "b"})
    await wire.until(lambda: wire.answers(2))
    await _waited(wire.stand.started_event("b"))
    assert wire.cancel(3)
    await _waited(wire.stand.cancelled_event("b"))
    with anyio.fail_after(5):
        while wire.link._running:
            await anyio.lowlevel.checkpoint()
    assert not wire.link._calls


async def test_a_cancelled_call_is_cancelled_and_never_answered(wire: _Wire) -> None:
    assert wire.call(7, "hang", {"key": "h"})
    await _waited(wire.stand.started_event("h"))
    assert wire.cancel(7)  # the link's own call: never the SDK's to see
    await _waited(wire.stand.cancelled_event("h"))  # the call itself was cancelled
    # Its id is free again once it ended, and a later call is answered; 7's never.
    assert wire.call(7, "echo", {"key": "again"})
    await wire.until(lambda: wire.answers(7))
    assert [a.get("result", a.get("error")) for a in wire.answers(7)] == [
        {"content": [{"type": "text", "text": "done again"}], "isError": False}
    ]


async def test_a_cancel_of_a_request_that_is_not_the_links_goes_to_the_sdk(wire: _Wire) -> None:
    assert not wire.cancel(99)  # none in flight: the SDK's server decides (it ignores it)
    assert not wire.take(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "not an object"}
    )
    assert wire.written == []


async def test_a_cancel_naming_the_id_as_a_string_cancels_it_as_the_sdk_does(wire: _Wire) -> None:
    # The SDK correlates "7" and 7 (coerce_request_id): a client echoing ids as text works.
    assert wire.call(8, "hang", {"key": "s"})
    await _waited(wire.stand.started_event("s"))
    assert wire.cancel("8")
    await _waited(wire.stand.cancelled_event("s"))
    assert wire.answers(8) == []


async def test_a_request_id_already_in_flight_is_refused_and_the_first_answered_once(
    wire: _Wire,
) -> None:
    assert wire.call(3, "hang", {"key": "first"})
    await _waited(wire.stand.started_event("first"))
    assert wire.call(3, "echo", {"key": "second"})  # written at once: no task, no wait
    [refused] = wire.answers(3)
    assert refused["error"]["code"] == -32600 and "already in flight" in refused["error"]["message"]
    assert wire.stand.ran == ["first"]  # the second never ran
    wire.stand.release.set()
    await wire.until(lambda: len(wire.answers(3)) >= 2)
    assert wire.answers(3)[1]["result"]["content"][0]["text"] == "done first"


async def test_past_max_in_flight_a_call_is_refused_and_the_others_run_on(wire: _Wire) -> None:
    for rid in range(MAX_IN_FLIGHT):
        assert wire.call(100 + rid, "hang", {"key": rid})
    await _waited(wire.stand.started_event(MAX_IN_FLIGHT - 1))
    assert wire.written == []
    assert wire.call(99, "echo", {"key": "one too many"})
    [refused] = wire.answers(99)
    assert refused["error"]["code"] == -32000 and "too many calls" in refused["error"]["message"]
    assert "one too many" not in wire.stand.ran
    wire.stand.release.set()
    await wire.until(lambda: len(wire.written) >= MAX_IN_FLIGHT + 1)
    assert all("result" in m for m in wire.written[1:])
    # Room again: the next call runs.
    assert wire.call(98, "echo", {"key": "room"})
    await _waited(wire.stand.started_event("room"))


@pytest.mark.parametrize(
    "params",
    [
        {"arguments": {}},  # no name
        {"name": 3, "arguments": {}},  # a name that is no string
        {"name": "echo", "arguments": [1, 2]},  # arguments not an object
        {"name": "echo", "arguments": "a=1"},
        {"name": "echo", "_meta": "token"},  # _meta not an object
        {"name": "echo", "_meta": {"progressToken": True}},  # a token neither string nor int
        {"name": "echo", "_meta": {"progressToken": 1.5}},
        "echo",  # params not an object
    ],
    ids=[
        "no-name",
        "name-int",
        "args-list",
        "args-str",
        "meta-str",
        "token-bool",
        "token-float",
        "params-str",
    ],
)
async def test_bad_params_are_invalid_params_and_nothing_runs(wire: _Wire, params: Any) -> None:
    assert wire.take({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params})
    [refused] = wire.answers(5)  # written at once
    assert refused["error"] == {"code": -32602, "message": "Invalid request parameters", "data": ""}
    assert wire.stand.ran == []


async def test_what_is_not_a_tools_call_request_is_the_sdks(wire: _Wire) -> None:
    for message in [
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo"}},  # no id
        {"jsonrpc": "2.0", "id": True, "method": "tools/call", "params": {"name": "echo"}},
        {"jsonrpc": "2.0", "id": 1.5, "method": "tools/call", "params": {"name": "echo"}},
        {"jsonrpc": "1.0", "id": 4, "method": "tools/call", "params": {"name": "echo"}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
        [{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "echo"}}],
    ]:
        assert not wire.take(message)  # type: ignore[arg-type]
    assert not wire.link.take(b"{not json")
    assert wire.stand.ran == [] and wire.written == []


async def test_a_failure_of_the_gateway_is_an_internal_error(wire: _Wire) -> None:
    assert wire.call(6, "fail", {"key": "f"})
    await wire.until(lambda: wire.answers(6))
    [failed] = wire.answers(6)
    assert failed["error"] == {"code": -32603, "message": "Internal error"}


async def test_a_call_cut_off_by_the_servers_shutdown_is_answered_connection_closed() -> None:
    stand = _Stand()
    link = ServeLink(stand)
    written: list[dict[str, Any]] = []

    async def drain() -> None:
        pass

    def call(rid: int, key: str) -> bool:
        return link.take(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "method": "tools/call",
                    "params": {"name": "hang", "arguments": {"key": key}},
                }
            ).encode()
        )

    async with anyio.create_task_group() as tasks:
        link.attach(lambda data: written.append(json.loads(data)), drain, lambda: 0, tasks)
        link.ready = True
        for rid, key in ((11, "cut"), (12, "cancelled first")):
            assert call(rid, key)
            await _waited(stand.started_event(key))
        # 12 the client cancelled; it is still unwinding when the server stops. 13 was
        # read just before stdin ended: its task has not run yet.
        assert link.take(
            json.dumps(
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 12}}
            ).encode()
        )
        assert call(13, "not yet started")
        with anyio.fail_after(5):
            await link.shutdown()  # as the transport does when stdin ends
    assert stand.cancelled_event("cut").is_set()
    # As the SDK's dispatcher does: the client is not left waiting, told once; a request
    # it cancelled is never answered (the spec's MUST NOT).
    assert sorted(written, key=lambda m: m["id"]) == [
        {"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "Connection closed"}}
        for rid in (11, 13)
    ]


async def test_progress_goes_to_the_clients_token_and_nowhere_without_one(wire: _Wire) -> None:
    assert wire.call(20, "hang", {"key": "with"}, _meta={"progressToken": "tok-20"})
    assert wire.call(21, "hang", {"key": "without"})
    await _waited(wire.stand.started_event("without"))
    await wire.stand.relays["with"].progress(1, 4, "one of four")
    await wire.stand.relays["without"].progress(1, None, None)
    await wire.stand.relays["with"].progress(2.5, None, None)
    assert wire.written == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progressToken": "tok-20",
                "progress": 1,
                "total": 4,
                "message": "one of four",
            },
        },
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "tok-20", "progress": 2.5},
        },
    ]


async def test_a_request_to_the_client_gets_its_answer_or_connection_closed_at_eof(
    wire: _Wire,
) -> None:
    assert wire.call(30, "hang", {"key": "x"})
    await _waited(wire.stand.started_event("x"))
    relay = wire.stand.relays["x"]
    assert relay.declares("sampling") and not relay.declares("elicitation")
    answers: list[Any] = []
    answered = anyio.Event()

    async def ask() -> None:
        try:
            answers.append(await wire.link.request("sampling/createMessage", {"n": 1}))
        except MCPError as exc:
            answers.append(exc)
        answered.set()

    with anyio.fail_after(5):  # the unanswered one must end at the end of stdin
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            tasks.start_soon(ask)
            await wire.until(lambda: len([m for m in wire.written if m.get("method")]) >= 2)
            first, second = (m["id"] for m in wire.written if m.get("method"))
            assert wire.take({"jsonrpc": "2.0", "id": first, "result": {"ok": True}})
            await _waited(answered)
            wire.link.closed()  # stdin ended: the other is not answered
    assert answers[0] == {"ok": True}
    assert isinstance(answers[1], MCPError) and answers[1].error.code == -32000
    assert second != first
