"""A stdio server's own link (mcp/_wire.py): a server written without the SDK, misbehaving.

The toolset speaks `tools/call` itself over stdio and leaves the rest of the protocol to the
SDK's session over the same link; what the server writes is hostile input.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.mcp._stdio import MAX_MESSAGE_BYTES

pytestmark = pytest.mark.anyio

RAW_SERVER = Path(__file__).with_name("raw_server.py")


def _toolset(marker: Path, *extra: str, timeout: float = 30.0) -> hr.mcp.MCPToolset:
    argv = (sys.executable, str(RAW_SERVER), str(marker), *extra)
    policy = hr.Policy.default().layer("mcp").allow("exec", " ".join(argv))
    # Unconfined: its marker file is in /tmp, private to a confined server.
    return hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name="raw", policy=policy,
                                   timeout=timeout, sandbox="off", max_result_bytes=1000)


@pytest.fixture(scope="module")
async def raw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[hr.mcp.MCPToolset]:
    marker = tmp_path_factory.mktemp("raw") / "told.log"
    async with _toolset(marker, timeout=1.0) as tools:
        tools.marker = marker  # type: ignore[attr-defined]
        yield tools


def _told(tools: hr.mcp.MCPToolset) -> list[str]:
    marker: Path = tools.marker  # type: ignore[attr-defined]
    return marker.read_text().splitlines()


async def _call(tools: hr.mcp.MCPToolset, name: str, **arguments: object) -> hr.ToolResult:
    return await hr.Toolbox([tools]).call(f"raw/{name}", dict(arguments))


async def test_the_own_link_serves_and_the_sdk_session_listed_every_page(
        raw: hr.mcp.MCPToolset) -> None:
    assert raw._wire is not None and raw._wire.version is not None
    assert {impl.remote_name for impl in raw.impls()} == {
        "echo", "noise", "long", "bad_result", "surrogate", "bad_error", "refuse", "hang"}
    assert (await _call(raw, "echo", text="hello")).render_text() == "hello"


async def test_lines_that_answer_nothing_of_ours_do_not_disturb_the_call(
        raw: hr.mcp.MCPToolset) -> None:
    assert (await _call(raw, "noise")).render_text() == "after the noise"
    assert (await _call(raw, "echo", text="still")).render_text() == "still"


async def test_a_line_past_the_bound_is_refused_as_the_calls_output_not_held(
        raw: hr.mcp.MCPToolset) -> None:
    assert raw._wire is not None
    with pytest.raises(hr.InvalidOutput, match="longer than") as info:
        await _call(raw, "long", size=raw._wire.limit + 10)
    assert info.value.disposition is hr.Disposition.LANDED
    assert raw._wire.limit >= MAX_MESSAGE_BYTES
    assert (await _call(raw, "echo", text="after")).render_text() == "after"


async def test_a_malformed_result_is_invalid_output_that_landed(raw: hr.mcp.MCPToolset) -> None:
    with pytest.raises(hr.InvalidOutput) as info:
        await _call(raw, "bad_result")
    assert info.value.disposition is hr.Disposition.LANDED


async def test_a_result_no_utf_8_can_carry_is_invalid_output_that_landed(
        raw: hr.mcp.MCPToolset) -> None:
    # A lone surrogate in a structuredContent key: the SDK's check of the result raises
    # UnicodeEncodeError, not a ValidationError. It is the server's malformed output all the
    # same (the tool ran), never an unmapped exception out of the call.
    with pytest.raises(hr.InvalidOutput) as info:
        await _call(raw, "surrogate")
    assert info.value.disposition is hr.Disposition.LANDED
    assert (await _call(raw, "echo", text="after")).render_text() == "after"


async def test_error_responses_keep_their_meaning(raw: hr.mcp.MCPToolset) -> None:
    with pytest.raises(hr.TransportError) as malformed:
        await _call(raw, "bad_error")
    assert malformed.value.disposition is hr.Disposition.IN_DOUBT
    with pytest.raises(hr.InvalidArguments, match="text must be short") as refused:
        await _call(raw, "refuse")
    assert refused.value.disposition is hr.Disposition.NOT_SENT


async def test_a_call_past_its_deadline_is_cancelled_at_the_server(
        raw: hr.mcp.MCPToolset) -> None:
    # A deadline that never fires fails here, bounded, rather than at the test's timeout.
    with pytest.raises(hr.ToolTimeout) as info, anyio.fail_after(60):
        await _call(raw, "hang")
    assert info.value.disposition is hr.Disposition.IN_DOUBT
    # The server reads in order: once the echo is answered, the cancellation was read.
    assert (await _call(raw, "echo", text="next")).render_text() == "next"
    told = _told(raw)
    hanging = [line.split()[1] for line in told if line.startswith("hanging ")]
    assert hanging and f"cancelled {hanging[-1]}" in told


@pytest.mark.parametrize("swept", [False, True])
async def test_a_calls_deadline_puts_a_timeout_in_its_mailbox_and_a_moved_one_waits(
        swept: bool) -> None:
    """The own link's deadline (`_Deadline`): a timer on the loop (its own, or the link's
    one `_Sweep`), no scope entered."""
    from handrail.mcp._client import _Deadline, _Mailbox, _Sweep

    sweep = _Sweep() if swept else None
    mail = _Mailbox()
    _Deadline(anyio.current_time(), mail, sweep)  # due now: the loop's next turn puts it
    with anyio.fail_after(5):  # a bound for the test that fails, never a clock to wait on
        assert await mail.get() == ("timeout", None)
    later = _Mailbox()
    moved = _Deadline(anyio.current_time(), later, sweep)
    moved.deadline = float("inf")  # a person is asked: the server is not being slow
    later.put(("result", "first"))
    moved.deadline = anyio.current_time()  # and restarted (progress, or the answer came)
    with anyio.fail_after(5):
        assert await later.get() == ("result", "first")
        assert await later.get() == ("timeout", None)


async def test_the_links_deadlines_share_one_timer_and_each_times_out_on_its_own() -> None:
    """`_Sweep`: one timer for every call of a link, armed at the earliest deadline."""
    from handrail.mcp._client import _Deadline, _Mailbox, _Sweep

    sweep = _Sweep()
    now = anyio.current_time()
    far, finished, due = _Mailbox(), _Mailbox(), _Mailbox()
    _Deadline(now + 3600, far, sweep)
    over = _Deadline(now, finished, sweep)
    _Deadline(now, due, sweep)
    over.cancel()  # its call ended before the deadline: never told
    with anyio.fail_after(5):
        assert await due.get() == ("timeout", None)
    await anyio.lowlevel.checkpoint()
    assert finished.close() == [] and far.close() == []
    assert sweep._at == now + 3600  # armed again, for the one left


async def test_the_handshake_takes_the_version_the_server_chose(tmp_path: Path) -> None:
    async with _toolset(tmp_path / "told.log", "2025-06-18") as tools:
        assert tools._wire is not None and tools._wire.version == "2025-06-18"
        assert (await _call(tools, "echo", text="old")).render_text() == "old"


async def test_a_server_speaking_an_unknown_version_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(hr.UserError, match="failed to start"):
        async with _toolset(tmp_path / "told.log", "1999-01-01"):
            pass


async def test_where_the_own_link_does_not_apply_the_sdks_transport_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows, trio: the toolset drives the SDK's stdio transport and session, as before.
    monkeypatch.setattr("handrail.mcp._client._own_link", lambda: False)
    async with _toolset(tmp_path / "told.log", timeout=1.0) as tools:
        assert tools._wire is None
        assert (await _call(tools, "echo", text="sdk")).render_text() == "sdk"
        with pytest.raises(hr.InvalidArguments, match="text must be short"):
            await _call(tools, "refuse")
        with pytest.raises(hr.ToolTimeout):
            await _call(tools, "hang")
        assert (await _call(tools, "echo", text="on")).render_text() == "on"
