"""`agent.run_stream` / `agent.iter`: the run's events as an async iterator; the printer."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

import handrail as hr
from handrail.models import Scripted, call, calls, reply

pytestmark = pytest.mark.anyio


@hr.tool(server="ledger", mutates=False)
async def balance(account: str) -> int:
    """Read a balance."""
    return {"alice": 120}[account]


@hr.tool(server="ledger")
async def transfer(amount: int) -> str:
    """Move money."""
    return f"moved {amount}"


def agent(turns: list[Any]) -> hr.Agent:
    return hr.Agent(Scripted(turns), [balance, transfer])


async def test_run_stream_yields_every_documented_event_and_then_the_result() -> None:
    seen_by_callback: list[str] = []
    a = agent([call("ledger/balance", {"account": "alice"}), reply("120")])
    async with a.run_stream("b", on_event=lambda e: seen_by_callback.append(e.kind)) as stream:
        events = [e async for e in stream]
    kinds = [e.kind for e in events]
    assert kinds == ["model_turn", "usage", "call_planned", "call_finished", "model_turn",
                     "usage", "finished"]
    assert seen_by_callback == kinds
    finished = events[3].detail
    assert finished["tool"] == "ledger/balance" and finished["verdict"] == "allow"
    assert finished["status"] == "finished" and finished["result"] == "120"
    assert isinstance(finished["duration"], float)
    assert events[2].detail == {"call_id": "call_0_0", "name": "ledger--balance",
                                "arguments": '{"account": "alice"}'}
    assert stream.result.output == "120"
    assert all(e.run_id == stream.result.run_id for e in events)
    from handrail.runs import CallFinishedDetail, CallPlannedDetail, UsageDetail

    assert set(events[1].detail) == set(UsageDetail.__annotations__)
    assert set(events[2].detail) == set(CallPlannedDetail.__annotations__)
    assert set(events[3].detail) == set(CallFinishedDetail.__annotations__)


async def test_iter_is_run_stream_and_a_pause_is_an_event() -> None:
    async with agent([call("ledger/transfer", {"amount": 1})]).iter("pay") as stream:
        events = [e async for e in stream]
    assert events[-1].kind == "paused"
    assert events[-2].detail["verdict"] == "ask"
    assert isinstance(stream.result.outcome, hr.AwaitingApproval)


async def test_result_before_the_end_is_refused_and_an_error_in_the_block_cancels(
        tmp_path: Any) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    a = agent([call("ledger/balance", {"account": "alice"})] * 50)
    with pytest.raises(RuntimeError, match="stop"):
        async with a.run_stream("b", store=store) as stream:
            with pytest.raises(hr.UserError, match="not ended"):
                _ = stream.result
            async for _event in stream:
                raise RuntimeError("stop")
    (run,) = await store.runs()
    assert run.status is hr.RunStatus.READY  # cancelled from outside: resumable


async def test_leaving_the_block_early_lets_the_run_finish() -> None:
    a = agent([calls([("ledger/balance", {"account": "alice"})] * 3), reply("done")])
    async with a.run_stream("b") as stream:
        async for _event in stream:
            break
    assert stream.result.output == "done"


async def test_the_printer_shows_calls_with_verdicts_and_escapes_what_a_model_wrote() -> None:
    out = io.StringIO()
    printer = hr.TerminalPrinter(Console(file=out, width=200, force_terminal=False))
    evil = "\x1b[2J[bold]owned[/bold]"
    result = await agent([call("ledger/balance", {"account": "alice"}),
                          call("ledger/transfer", {"amount": 2}), reply(evil)]).run(
        "b", on_event=printer, approver=hr.ApproveAll())
    assert result.output == evil
    text = out.getvalue()
    assert "allow" in text and "ledger/balance" in text
    assert "(approve)" in text and "ledger/transfer" in text and "ms" in text
    assert "\x1b" not in text
    assert "[bold]owned[/bold]" in text  # shown as written, not interpreted as markup
    assert "completed" in text


async def test_streamed_text_is_printed_as_it_comes_escaped_and_once() -> None:
    from collections.abc import AsyncIterator

    from handrail.models import (
        AssistantMessage,
        ModelResponse,
        ResponseDone,
        TextDelta,
        TextPart,
        Usage,
    )

    class Streaming:
        name = "streaming"

        async def request(self, *a: Any, **k: Any) -> ModelResponse:
            raise AssertionError("a listener is attached: the loop must stream")

        async def request_stream(self, *a: Any, **k: Any) -> AsyncIterator[Any]:
            yield TextDelta("Hello \x1b]0;pwned\x07")
            yield TextDelta("world")
            yield ResponseDone(ModelResponse(
                AssistantMessage([TextPart("Hello \x1b]0;pwned\x07world")]), Usage(1, 1), "stop"))

    out = io.StringIO()
    printer = hr.TerminalPrinter(Console(file=out, width=200, force_terminal=False))
    async with hr.Agent(Streaming(), []).run_stream("hi", on_event=printer) as stream:
        kinds = [e.kind async for e in stream]
    assert kinds[:2] == ["text_delta", "text_delta"]
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert text.count("world") == 1  # streamed, not printed again at the end of the turn
