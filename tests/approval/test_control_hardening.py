"""Issue 33: a tool control can only make things stricter, and every failure refuses.

The story, from a hostile probe of `approval/_control.py`:

- an async control that blocked past its `timeout` still had its late `pass` used;
- a Python control that mutated its query (`q["input"]["amount"] = 999999`) changed the
  record, the approval request and, after approval, what ran;
- `{"decision": "refuse", "decision": "pass"}` passed (the last key won);
- a control raising `SystemExit`, `KeyboardInterrupt` or `CancelledError` took the whole run
  down instead of refusing the call.
"""

from __future__ import annotations

import asyncio
import stat
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.approval import CallableControl, adjudicate
from handrail.models import Scripted, call, reply

pytestmark = pytest.mark.anyio

QUERY: dict[str, Any] = {"id": "c1", "run_id": "r1", "agent": "a", "tool": "ledger/transfer",
                         "input": {"source": "alice", "target": "bob", "amount": 5},
                         "actions": [{"act": "call", "target": "ledger/transfer"}]}
EXECUTED: list[dict[str, Any]] = []


@hr.tool(server="ledger", name="transfer")
async def transfer(source: str, target: str, amount: int) -> str:
    """Move money."""
    EXECUTED.append({"source": source, "target": target, "amount": amount})
    return f"moved {amount}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    EXECUTED.clear()


# ------------------------------------------------------------- the deadline is final


async def test_a_late_pass_after_the_deadline_refuses() -> None:
    async def stubborn(query: dict[str, Any]) -> dict[str, Any]:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass  # swallows the timeout's cancellation, then answers anyway
        return {"decision": "pass", "reason": "late"}

    verdict = await adjudicate(CallableControl(stubborn, timeout=0.2), QUERY)
    assert verdict.decision == "refuse" and verdict.failed
    assert "timed out after 0.2s" in verdict.reason


async def test_a_control_blocking_the_loop_past_its_deadline_refuses() -> None:
    async def blocking(query: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.4)  # never awaits: the deadline cannot cancel it  # noqa: ASYNC251
        return {"decision": "pass", "reason": "late"}

    verdict = await adjudicate(CallableControl(blocking, timeout=0.1), QUERY)
    assert verdict.decision == "refuse" and "timed out" in verdict.reason


# ------------------------------------------------------------- the query is a copy


def mutating(query: dict[str, Any]) -> dict[str, Any]:
    query["input"]["amount"] = 999999
    query["actions"].clear()
    query["tool"] = "ledger/other"
    return {"decision": "pass", "reason": "changed it"}


async def test_a_control_that_mutates_its_query_changes_nothing() -> None:
    query = {**QUERY, "input": dict(QUERY["input"]), "actions": list(QUERY["actions"])}
    before = repr(query)
    verdict = await adjudicate(CallableControl(mutating), query)
    assert verdict.decision == "pass"
    assert repr(query) == before


@pytest.mark.parametrize("ask", [False, True], ids=["allowed", "approved"])
async def test_what_runs_is_what_the_model_asked_not_what_the_control_wrote(
        ask: bool) -> None:
    policy = hr.Policy.default().layer("app")
    policy = (policy.ask if ask else policy.allow)("call", "ledger/*")
    store = hr.Store.memory()
    move = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 5})
    agent = hr.Agent(Scripted([move, reply("done")]), [transfer], policy=policy,
                     control=mutating)
    result = await agent.run("pay", store=store, approver=hr.ApproveAll())
    assert result.outcome == hr.Completed("done")
    assert EXECUTED == [{"source": "alice", "target": "bob", "amount": 5}]
    (record,) = await store.calls(result.run_id)
    assert "999999" not in repr(record)


# ------------------------------------------------------------- duplicate keys refuse


def script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("answer", [
    '{"decision": "refuse", "decision": "pass"}',
    '{"decision": "pass", "reason": "a", "reason": "b"}',
])
async def test_an_answer_with_a_duplicate_key_refuses(tmp_path: Path, answer: str) -> None:
    control = hr.CommandControl([str(script(tmp_path / "c.sh",
                                            f"#!/bin/sh\ncat >/dev/null\necho '{answer}'\n"))])
    verdict = await adjudicate(control, QUERY)
    assert verdict.decision == "refuse" and verdict.failed
    assert "duplicate key" in verdict.reason


# ------------------------------------------- SystemExit and kin refuse, not crash


def _raiser(exc: BaseException, *, is_async: bool) -> Any:
    if is_async:
        async def control(query: dict[str, Any]) -> Any:
            raise exc
    else:
        def control(query: dict[str, Any]) -> Any:
            raise exc
    return control


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(),
                                 asyncio.CancelledError()],
                         ids=["SystemExit", "KeyboardInterrupt", "CancelledError"])
async def test_a_control_raising_a_base_exception_refuses_the_call(
        exc: BaseException, is_async: bool) -> None:
    verdict = await adjudicate(CallableControl(_raiser(exc, is_async=is_async)), QUERY)
    assert verdict.decision == "refuse" and verdict.failed
    assert type(exc).__name__ in verdict.reason


async def test_a_run_survives_a_control_raising_systemexit() -> None:
    store = hr.Store.memory()
    move = call("ledger/transfer", {"source": "alice", "target": "bob", "amount": 5})
    agent = hr.Agent(Scripted([move, reply("done")]), [transfer],
                     policy=hr.Policy.default().layer("app").allow("call", "ledger/*"),
                     control=_raiser(SystemExit(0), is_async=False))
    result = await agent.run("pay", store=store)
    assert result.outcome == hr.Completed("done")
    assert EXECUTED == []
    (record,) = await store.calls(result.run_id)
    assert record.verdict is not None and record.verdict["control"]["decision"] == "refuse"


async def test_an_outside_cancel_still_cancels() -> None:
    started = anyio.Event()
    answered: list[Any] = []

    async def waits(query: dict[str, Any]) -> Any:
        started.set()
        await anyio.sleep_forever()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async def ask() -> None:
                answered.append(await adjudicate(CallableControl(waits, timeout=60), QUERY))

            tg.start_soon(ask)
            await started.wait()
            tg.cancel_scope.cancel()
    assert answered == []  # cancelled, not turned into a refusal
    assert tg.cancel_scope.cancelled_caught


@pytest.mark.skipif(sys.platform == "win32", reason="asyncio task cancel")
async def test_an_asyncio_cancel_of_the_task_still_cancels() -> None:
    started = asyncio.Event()

    async def waits(query: dict[str, Any]) -> Any:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.ensure_future(adjudicate(CallableControl(waits, timeout=60), QUERY))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
