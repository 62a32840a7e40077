"""`Agent(output_type=...)`: a typed final output, validated, retried, stored, resumed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import forks
import pydantic
import pytest
from typing_extensions import TypedDict

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, UserMessage, call, calls, reply

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


class Count(pydantic.BaseModel):
    count: int
    note: str = ""


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(TypedDict):
    left: str
    right: str


@hr.tool(server="ledger", mutates=False)
async def balance(account: str) -> int:
    """Read a balance."""
    return {"alice": 120}[account]


def agent(turns: list[Any], output_type: Any, **kw: Any) -> hr.Agent:
    return hr.Agent(Scripted(turns), [balance], output_type=output_type, **kw)


@pytest.mark.parametrize(("output_type", "arguments", "expected"), [
    (Count, {"count": 2}, Count(count=2)),
    (Point, {"x": 1, "y": 2}, Point(1, 2)),
    (Pair, {"left": "a", "right": "b"}, {"left": "a", "right": "b"}),
    (int, {"result": 41}, 41),
    (list[int], {"result": [1, 2]}, [1, 2]),
])
async def test_the_final_result_tool_gives_a_typed_output(output_type: Any, arguments: Any,
                                                         expected: Any) -> None:
    seen: list[list[str]] = []

    def final(messages: Any, tools: Any) -> Any:
        seen.append([t.id.model_name for t in tools])
        return call("handrail/final_result", arguments)

    result = await agent([call("ledger/balance", {"account": "alice"}), final],
                         output_type).run("count")
    assert result.output == expected
    assert type(result.output) is type(expected)
    assert "handrail--final_result" in seen[0]


async def test_a_final_text_reply_that_is_valid_json_for_the_type_is_the_output() -> None:
    result = await agent([reply('{"count": 1}')], Count).run("count")
    assert result.output == Count(count=1)


async def test_an_invalid_output_is_returned_to_the_model_and_fixed() -> None:
    shown: list[Any] = []

    def fixed(messages: Any, tools: Any) -> Any:
        shown.append(messages[-1])
        return call("handrail/final_result", {"count": 3})

    def fixed_text(messages: Any, tools: Any) -> Any:
        shown.append(messages[-1])
        return reply('{"count": 4}')

    result = await agent([call("handrail/final_result", {"count": "many"}), fixed],
                         Count).run("count")
    assert result.output == Count(count=3)
    assert isinstance(shown[0], ToolResultMessage) and shown[0].result.is_error
    assert "count" in shown[0].result.render_text()

    result = await agent([reply("three, I think"), fixed_text], Count).run("count")
    assert result.output == Count(count=4)
    assert isinstance(shown[1], UserMessage) and "handrail--final_result" in shown[1].text


async def test_invalid_outputs_are_bounded_by_the_invalid_turns_budget() -> None:
    result = await agent([reply("no")] * 5, Count, max_invalid_turns=2).run("count")
    assert isinstance(result.outcome, hr.Failed)
    assert "invalid final output 3 turns in a row" in result.outcome.error
    with pytest.raises(hr.RunNotCompleted, match="invalid final output"):
        _ = result.output


async def test_an_oversized_output_is_refused_before_it_is_parsed() -> None:
    big = json.dumps({"count": 1, "note": "x" * 5000})
    result = await agent([reply(big), reply('{"count": 1}')], Count,
                         max_argument_bytes=1000).run("count")
    assert result.output == Count(count=1)


async def test_other_calls_of_the_final_turn_are_not_executed_and_still_answered(
        tmp_path: Path) -> None:
    store = hr.Store.open(tmp_path / "runs.db")
    result = await agent([calls([("ledger/balance", {"account": "alice"}),
                                 ("handrail/final_result", {"count": 1})])],
                         Count).run("count", store=store)
    assert result.output == Count(count=1)
    assert await store.calls(result.run_id) == []
    stored = await store.messages(result.run_id)
    answered = {m["call_id"] for m in stored if m["kind"] == "tool_result"}
    assert answered == {"call_0_0", "call_0_1"}
    run = await store.run(result.run_id)
    assert run.outcome == {"kind": "completed", "output": {"count": 1, "note": ""}}


def test_a_type_pydantic_cannot_validate_is_refused_when_the_agent_is_built() -> None:
    with pytest.raises(hr.UserError, match="output_type"):
        agent([], object())


def test_a_typed_output_survives_a_pause_and_a_resume_in_another_process(
        tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")

    def run(*args: str) -> dict[str, Any]:
        code, stdout, stderr = forks.shared().run(HERE / "typed_output.py", [db, *args], {},
                                                  tmp_path, timeout=120)
        assert code == 0, stderr
        return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    first = run("start")
    assert first["outcome"] == "awaiting_approval"
    second = run("decide", first["request_id"])
    assert second == {"run_id": first["run_id"], "outcome": "completed",
                      "request_id": None, "type": "Invoice",
                      "value": {"payee": "bob", "amount": 7}}
