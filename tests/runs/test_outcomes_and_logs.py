"""Outcomes that cannot be missed, and what a run logs under the `handrail` logger."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply

pytestmark = pytest.mark.anyio


@hr.tool(server="ledger", mutates=False)
async def balance(account: str) -> int:
    """Read a balance."""
    return {"alice": 120, "bob": 7}[account]


@hr.tool(server="ledger")
async def transfer(source: str, target: str, amount: int) -> str:
    """Move money."""
    return f"moved {amount}"


@hr.tool(server="ledger", interactions={"question"})
async def confirm(ctx: hr.CallContext) -> str:
    """Ask first."""
    return await ctx.ask(hr.Question("sure?"))


def agent(turns: list[Any], **kw: Any) -> hr.Agent:
    return hr.Agent(Scripted(turns), [balance, transfer, confirm], **kw)


async def test_output_of_a_completed_run_is_its_answer() -> None:
    result = await agent([reply("done")]).run("go")
    assert result.output == "done"


async def test_output_of_a_paused_run_raises_with_the_command_that_approves_it(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    result = await agent([call("ledger/transfer", {"source": "a", "target": "b", "amount": 1}),
                          reply("ok")]).run("pay", store=store)
    assert isinstance(result.outcome, hr.AwaitingApproval)
    with pytest.raises(hr.RunNotCompleted) as caught:
        _ = result.output
    request_id = result.outcome.request_id
    assert f"handrail approve {request_id}" in str(caught.value)
    assert caught.value.outcome == result.outcome
    assert caught.value.run_id == result.run_id
    assert "memory store" not in str(caught.value)


async def test_a_pause_in_a_memory_store_says_it_is_lost_and_logs_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="handrail")
    result = await agent([call("ledger/transfer", {"source": "a", "target": "b", "amount": 1}),
                          reply("ok")]).run("pay")
    with pytest.raises(hr.RunNotCompleted, match=r"memory store .*Store\.open"):
        _ = result.output
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "lost when this process exits" in warnings[0].getMessage()
    assert result.outcome.kind in warnings[0].getMessage() or "awaiting_approval" in \
        warnings[0].getMessage()


async def test_output_of_a_question_a_failure_and_a_cancel_names_the_next_step(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    asked = await agent([call("ledger/confirm"), reply("ok")],
                        ).run("c", store=store, approver=hr.ApproveAll())
    assert isinstance(asked.outcome, hr.AwaitingAnswer)
    with pytest.raises(hr.RunNotCompleted, match=f"handrail answer {asked.outcome.question_id}"):
        _ = asked.output
    failed = await agent([]).run("x", store=store)  # the script has no turn: the model fails
    with pytest.raises(hr.RunNotCompleted, match="the model failed"):
        _ = failed.output

    cancel = anyio.Event()

    def stall(messages: Any, tools: Any) -> Turn:
        cancel.set()
        return reply("never seen")

    class Slow(Scripted):
        async def request(self, *a: Any, **k: Any) -> Any:
            out = await super().request(*a, **k)
            await anyio.sleep_forever()
            return out

    cancelled = await hr.Agent(Slow([stall]), [balance]).run("c", store=store, cancel=cancel)
    with pytest.raises(hr.RunNotCompleted, match=f"handrail resume {cancelled.run_id}"):
        _ = cancelled.output


async def test_each_call_logs_one_info_line_with_verdict_decision_and_duration(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="handrail")
    await agent([call("ledger/balance", {"account": "alice"}), reply("120")]).run("b")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1, infos
    line = infos[0]
    assert "ledger/balance" in line and "verdict=allow" in line
    assert "decision=-" in line and "status=" in line and "duration=" in line
    debugs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("model request" in d for d in debugs) == 2


async def test_invalid_arguments_log_a_retry_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="handrail")
    result = await agent([call("ledger/balance", {"account": 3}), reply("ok")]).run("b")
    assert result.output == "ok"
    assert any("invalid turn 1 of 3" in r.getMessage() for r in caplog.records)


def test_a_model_written_tool_name_cannot_break_the_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="handrail")
    from handrail.models import AssistantMessage, ModelResponse, ToolCall, Usage

    class Raw(Scripted):
        async def request(self, messages: Any, *a: Any, **k: Any) -> Any:
            if any(isinstance(m, ToolResultMessage) for m in messages):
                return await super().request(messages, *a, **k)
            return ModelResponse(AssistantMessage((ToolCall("c1", "x\nFAKE line", "{}"),)),
                                 Usage(0, 0), "tool_calls", "raw")

    anyio.run(hr.Agent(Raw([reply("a"), reply("ok")]), [balance]).run, "b")
    assert any("x\\nFAKE line" in r.getMessage() for r in caplog.records)
    for r in caplog.records:
        assert "\n" not in r.getMessage()


def test_nothing_is_printed_unless_the_app_configures_logging() -> None:
    import subprocess
    import sys

    code = ("import handrail as hr\n"
            "from handrail.models import Scripted, call, reply\n"
            "@hr.tool(server='l')\n"
            "async def pay(n: int) -> str:\n"
            "    return 'ok'\n"
            "r = hr.Agent(Scripted([call('l/pay', {'n': 1})]), [pay]).run_sync('x')\n"
            "print(r.outcome.kind)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "awaiting_approval"
    assert out.stderr == ""
