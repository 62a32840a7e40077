"""Agents for the inbox tests, importable by a server process as `inbox_agents:NAME`.

Each is a factory taking the run's record (as `handrail approve`/the inbox rebuild agents
from the `ref` a run recorded). The task text is JSON saying what the scripted model does,
so one factory serves every test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.models import Scripted, ToolResultMessage, Turn, UserMessage, call, reply
from handrail.store import RunRecord
from handrail.tools import ToolSpec


def _task(messages: Sequence[Any]) -> dict[str, Any]:
    first = next(m for m in messages if isinstance(m, UserMessage))
    data: dict[str, Any] = json.loads(first.text)
    return data


def _first(messages: Sequence[Any], tools: Sequence[ToolSpec]) -> Turn:
    task = _task(messages)
    return call(task["tool"], task["arguments"])


def _final(messages: Sequence[Any], tools: Sequence[ToolSpec]) -> Turn:
    last = next(m for m in reversed(messages) if isinstance(m, ToolResultMessage))
    text = last.result.render_text()
    if last.result.is_error:
        return reply(f"failed: {text}")
    return reply(f"done: {text}")




class AppendLine(hr.Tool, server="log", name="append_line", mutates=True):
    """Append one line to a workspace file; every execution adds one more line."""

    path: str
    """The file."""
    line: str
    """The line (no newline)."""

    def actions(self) -> list[hr.Action]:
        """Writes the file."""
        return [hr.Action(hr.Act.WRITE, self.path)]

    def run(self, ctx: hr.CallContext) -> str:
        """Append (a sync body: the tool layer runs it in a worker thread)."""
        target = Path(ctx.workspace or ".") / self.path
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(self.line + "\n")
        return f"appended to {self.path}"


@hr.tool(server="ops", name="pick_service", interactions={"question"}, mutates=False)
async def pick_service(ctx: hr.CallContext) -> str:
    """Ask which service to deploy, then say it."""
    service = await ctx.ask(hr.Question("Which service?", choices=["web", "api"]))
    return f"deploying {service}"


@hr.tool(server="ops", name="profile", interactions={"form"}, mutates=False)
async def profile(ctx: hr.CallContext) -> str:
    """Ask for a form (an age), then say it."""
    data = await ctx.elicit({"type": "object", "properties": {"age": {"type": "integer"}},
                             "required": ["age"], "additionalProperties": False}, "How old?")
    return f"age {data['age']}"


def agent(run: RunRecord | None = None, *, workspace: str | None = None) -> hr.Agent:
    """The test agent: workspace tools, append_line, pick_service; the default policy."""
    root = workspace if workspace is not None else (run.workspace if run else None)
    assert root is not None
    return hr.Agent(
        Scripted([_first, _final], name="scripted-inbox"),
        [*workspace_tools(), AppendLine, pick_service, profile],
        policy=hr.Policy.default(),
        workspace=root,
        name="inbox-test",
        ref="inbox_agents:agent",
    )


def start(store: hr.Store, workspace: str, tool: str, arguments: dict[str, Any],
          **kwargs: Any) -> hr.RunResult:
    """Run the test agent on one call (synchronously) until it pauses or ends."""
    task = json.dumps({"tool": tool, "arguments": arguments})
    return agent(workspace=workspace).run_sync(task, store=store, **kwargs)


def _delegate(messages: Sequence[Any], tools: Sequence[ToolSpec]) -> Turn:
    first = next(m for m in messages if isinstance(m, UserMessage))
    return call("agents/writer", {"task": first.text})


def delegating(run: RunRecord | None = None, *, workspace: str | None = None) -> hr.Agent:
    """A planner that hands its task to the test agent as the sub-agent `agents/writer`.

    The writer's calls are the ones that pause, so the inbox decides a child's item (its
    edited arguments checked by the writer's tool and the tree's contained policy).
    """
    root = workspace if workspace is not None else (run.workspace if run else None)
    assert root is not None
    writer = agent(workspace=root)
    return hr.Agent(
        Scripted([_delegate, _final], name="scripted-planner"),
        [writer.as_tool(name="writer")],
        policy=hr.Policy.default().layer("planner").allow(hr.Act.CALL, "agents/**"),
        workspace=root,
        name="planner",
        ref="inbox_agents:delegating",
    )


def by_ref(run: RunRecord) -> hr.Agent:
    """The agent a run's `ref` names (as `handrail inbox` rebuilds agents): the planner's tree
    for its runs (a sub-agent's run records its root's ref), the test agent otherwise."""
    return delegating(run) if run.agent_ref == "inbox_agents:delegating" else agent(run)
