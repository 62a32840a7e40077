"""Trees of agents the sub-agent tests build, in-process and in other processes alike.

Each build returns a new root agent with new scripted models, as a new process would build
it. Every side effect appends a line to the EFFECTS file, so a test counts how often it ran.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, calls, reply

ROOT_POLICY = (hr.Policy.default().layer("root").allow(hr.Act.CALL, "agents/**")
               .allow(hr.Act.CALL, "fs/**"))
"""Delegating and calling `fs/*` tools are allowed (their writes are what the policy judges);
`world/effect` asks (the default for a mutating call)."""


def note(effects: str, line: str) -> None:
    """Count one side effect."""
    with open(effects, "a") as fh:
        fh.write(line + "\n")


def effects_of(effects: str) -> list[str]:
    """The side effects counted so far."""
    if not os.path.exists(effects):
        return []
    with open(effects) as fh:
        return fh.read().splitlines()


def echo(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    """Reply with every tool result seen, joined."""
    shown = [m.result.render_text() for m in messages if isinstance(m, ToolResultMessage)]
    return reply(" | ".join(shown))


def effect_tool(effects: str) -> Any:
    """`world/effect`: a mutating tool (the default policy asks) with a counted effect."""

    @hr.tool(server="world", name="effect")
    async def effect(n: int) -> str:
        """Change the world."""
        note(effects, f"effect {n}")
        return f"effect {n} done"

    return effect


def three_levels(effects: str, *, tester_name: str = "tester", workspace: str = ".",
                 ref: str | None = None) -> hr.Agent:
    """planner -> coder -> tester; the tester's `world/effect` asks (a deferral, deepest)."""
    tester = hr.Agent(Scripted([call("world/effect", {"n": 3}), echo]), [effect_tool(effects)],
                      name="tester", workspace=workspace)
    coder = hr.Agent(Scripted([call(f"agents/{tester_name}", {"task": "test it"}), echo]),
                     [tester.as_tool(name=tester_name)], name="coder", workspace=workspace)
    return hr.Agent(Scripted([call("agents/coder", {"task": "code it"}), echo]),
                    [coder.as_tool()], name="planner", policy=ROOT_POLICY,
                    workspace=workspace, ref=ref)


def two_children(effects: str) -> hr.Agent:
    """A planner calling two sub-agents in one turn; each one's write asks."""
    left = hr.Agent(Scripted([call("world/effect", {"n": 1}), echo]), [effect_tool(effects)],
                    name="left")
    right = hr.Agent(Scripted([call("world/effect", {"n": 2}), echo]), [effect_tool(effects)],
                     name="right")
    return hr.Agent(Scripted([calls([("agents/left", {"task": "one"}),
                                     ("agents/right", {"task": "two"})]), echo]),
                    [left.as_tool(), right.as_tool()], name="planner", policy=ROOT_POLICY)


def asking(effects: str) -> hr.Agent:
    """A planner whose child's tool asks a question before it acts."""

    @hr.tool(server="world", name="pick", interactions={"question"}, mutates=False)
    async def pick(ctx: hr.CallContext) -> str:
        """Ask which colour, then paint."""
        colour = await ctx.ask(hr.Question("Which colour?", choices=["red", "blue"]))
        note(effects, f"painted {colour}")
        return f"painted {colour}"

    painter = hr.Agent(Scripted([call("world/pick", {}), echo]), [pick], name="painter")
    return hr.Agent(Scripted([call("agents/painter", {"task": "paint"}), echo]),
                    [painter.as_tool()], name="planner", policy=ROOT_POLICY)


# For the CLI (`--agent trees:cli_asking`): the effects file is named by the environment.
def cli_asking(run: Any = None) -> hr.Agent:
    """`asking`, counting into $TREE_EFFECTS (a factory the CLI calls with the run)."""
    return asking(os.environ["TREE_EFFECTS"])


def worker_tree(run: Any = None) -> hr.Agent:
    """`three_levels` counting into $TREE_EFFECTS, with its ref (for `handrail worker`)."""
    return three_levels(os.environ["TREE_EFFECTS"], ref="trees:worker_tree")


def crashing(effects: str, *, die: bool = False) -> hr.Agent:
    """planner -> worker, whose `world/slow` counts its effect, then (with `die`) SIGKILLs
    its own process: a crash in the middle of the child's call."""

    @hr.tool(server="world", name="slow")
    async def slow() -> str:
        """Act, then take a long time."""
        note(effects, "slow")
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return "slow done"

    worker = hr.Agent(Scripted([call("world/slow", {}), echo]), [slow], name="worker")
    return hr.Agent(Scripted([call("agents/worker", {"task": "go"}), echo]),
                    [worker.as_tool()], name="planner", policy=ROOT_POLICY)


def two_askers(effects: str) -> hr.Agent:
    """Two read-only sub-agents in one turn (so they run concurrently); each one asks."""

    def painter(name: str) -> hr.Agent:
        @hr.tool(server="world", name="pick", interactions={"question"}, mutates=False)
        async def pick(ctx: hr.CallContext) -> str:
            """Ask which colour, then note it."""
            colour = await ctx.ask(hr.Question(f"Which colour for {name}?"))
            note(effects, f"{name} {colour}")
            return f"{name} {colour}"

        return hr.Agent(Scripted([call("world/pick", {}), echo]), [pick], name=name)

    return hr.Agent(Scripted([calls([("agents/wall", {"task": "paint"}),
                                     ("agents/door", {"task": "paint"})]), echo]),
                    [painter("wall").as_tool(), painter("door").as_tool()], name="planner",
                    policy=ROOT_POLICY)
