"""The manifest's `max_tokens` and `max_wall_seconds`: for one run, and across a tree.

A model that reports what each turn cost (`Costly`), and a clock the model's turns move
(`Clock`, patched into the run loop and the tree): the budgets are checked at each turn's
boundary, never timed. A child with one read and one write tool is a mutating delegation.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from trees import ROOT_POLICY, echo, effect_tool

import handrail as hr
from handrail.manifest import Budgets
from handrail.models import ModelResponse, Scripted, Usage, call, reply

pytestmark = pytest.mark.anyio


class Clock:
    """`time`, but for a monotonic clock that moves only when a model turn says so."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.module = types.SimpleNamespace(
            **{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
        self.module.monotonic = lambda: self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from handrail.runs import _agent, _subagents

    c = Clock()
    monkeypatch.setattr(_agent, "time", c.module)
    monkeypatch.setattr(_subagents, "time", c.module)
    return c


class Costly:
    """A scripted model whose every turn costs `tokens` and takes `seconds` of the clock."""

    def __init__(self, turns: Sequence[Any], *, tokens: int = 0, seconds: float = 0.0,
                 clock: Clock | None = None, name: str = "costly") -> None:
        self.inner = Scripted(list(turns), name=name)
        self.tokens, self.seconds, self.clock = tokens, seconds, clock
        self.requests = 0

    @property
    def name(self) -> str:
        return self.inner.name

    async def request(self, messages: Sequence[Any], tools: Sequence[Any],
                      settings: Any = None) -> ModelResponse:
        self.requests += 1
        if self.clock is not None:
            self.clock.now += self.seconds
        response = await self.inner.request(messages, tools, settings)
        return dataclasses.replace(response, usage=Usage(self.tokens // 2,
                                                         self.tokens - self.tokens // 2))


@hr.tool(server="world", name="look", mutates=False)
async def look() -> str:
    """Look around."""
    return "seen"


def _budgeted(tools: list[Any], **budgets: Any) -> hr.Manifest:
    manifest = hr.Manifest.from_toolbox(hr.Toolbox(tools))
    return dataclasses.replace(manifest, budgets=Budgets(**budgets))


LOOKS = [call("world/look", {})] * 5 + [reply("done")]


async def test_a_run_stops_at_the_turn_its_tokens_reach_the_budget() -> None:
    model = Costly(LOOKS, tokens=100)
    agent = hr.Agent(model, [look], manifest=_budgeted([look], max_tokens=300))
    assert agent.max_tokens == 300
    result = await agent.run("look", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Failed), result.outcome
    assert result.outcome.error == "the token budget of 300 is exhausted"
    assert model.requests == 3  # 100, 200: under; 300: at the budget, no fourth turn


async def test_a_run_without_a_token_budget_is_not_stopped_by_its_tokens() -> None:
    model = Costly(LOOKS, tokens=10_000)
    result = await hr.Agent(model, [look], manifest=_budgeted([look])).run(
        "look", store=hr.Store.memory())
    assert result.output == "done" and model.requests == 6


async def test_a_run_stops_at_the_turn_its_wall_clock_budget_is_spent(clock: Clock) -> None:
    model = Costly(LOOKS, seconds=10, clock=clock)
    agent = hr.Agent(model, [look], manifest=_budgeted([look], max_wall_seconds=25))
    result = await agent.run("look", store=hr.Store.memory())
    assert isinstance(result.outcome, hr.Failed), result.outcome
    assert result.outcome.error == "the wall-clock budget of 25.0s is exhausted"
    assert model.requests == 3  # 10 s, 20 s: under; 30 s: spent


async def test_a_run_well_within_its_wall_clock_budget_finishes(clock: Clock) -> None:
    model = Costly(LOOKS, seconds=1, clock=clock)
    agent = hr.Agent(model, [look], manifest=_budgeted([look], max_wall_seconds=60))
    assert (await agent.run("look", store=hr.Store.memory())).output == "done"


def _tree(root_model: Any, child_model: Any, **budgets: Any) -> hr.Agent:
    child = hr.Agent(child_model, [look], name="worker")
    delegate = child.as_tool()
    # The root's manifest grants the whole tree's tools (a tree is governed by its root).
    return hr.Agent(root_model, [delegate], name="root", policy=ROOT_POLICY,
                    manifest=_budgeted([delegate, look], **budgets))


async def test_the_trees_token_budget_counts_the_childs_turns_with_the_roots() -> None:
    root_model = Costly([call("agents/worker", {"task": "look"}), echo], tokens=100)
    child_model = Costly(LOOKS, tokens=100)
    store = hr.Store.memory()
    result = await _tree(root_model, child_model, max_tokens=300).run("go", store=store)
    # The root's turn (100), then the child's: 200, 300 — the tree's budget, spent in the
    # child, whose run fails; the root's fails with it.
    assert child_model.requests == 2 and root_model.requests == 1
    assert isinstance(result.outcome, hr.Failed), result.outcome
    runs = {r.agent: r for r in await store.runs()}
    assert runs["worker"].status is hr.RunStatus.FAILED
    reason = runs["worker"].outcome["error"]
    assert reason.startswith("the tree's token budget of 300 is exhausted"), reason
    assert "the last turn by root/worker" in reason
    assert "token budget of 300" in result.outcome.error


async def test_the_trees_wall_clock_budget_runs_from_the_roots_start(clock: Clock) -> None:
    root_model = Costly([call("agents/worker", {"task": "look"}), echo], seconds=10,
                        clock=clock)
    child_model = Costly(LOOKS, seconds=10, clock=clock)
    store = hr.Store.memory()
    result = await _tree(root_model, child_model, max_wall_seconds=25).run("go", store=store)
    # 10 s (root), 20 s, 30 s (child): spent in the child's second turn.
    assert child_model.requests == 2
    runs = {r.agent: r for r in await store.runs()}
    reason = runs["worker"].outcome["error"]
    assert reason.startswith("the tree's wall-clock budget of 25.0s is exhausted"), reason
    assert isinstance(result.outcome, hr.Failed)
    assert "wall-clock budget of 25.0s" in result.outcome.error


async def test_a_child_with_one_read_and_one_write_tool_is_a_mutating_delegation(
        tmp_path: Path) -> None:
    readers = hr.Agent(Scripted([]), [look], name="reader")
    mixed = hr.Agent(Scripted([]), [look, effect_tool(str(tmp_path / "effects"))],
                     name="mixed")
    assert readers.as_tool().spec.mutates is False
    assert mixed.as_tool().spec.mutates is True
    deeper = hr.Agent(Scripted([]), [mixed.as_tool()], name="deeper")
    assert deeper.as_tool().spec.mutates is True
