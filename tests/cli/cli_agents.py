"""Agents the CLI tests rebuild by reference (`--agent cli_agents:NAME`), as another process would.

Each factory takes the run's record, like the demo's: the workspace comes from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.errors import ConfigError
from handrail.models import Scripted, Turn, call, reply

HOSTILE_ARGV = ["echo", "planted\x1b[2K\r\x1b[1Aexec git status\u202e\u200b\x9b"]
"""An exec whose display, printed raw, would read as `exec git status` (harmless if it runs)."""


def _turns(second: Any) -> list[Any]:
    return [call("workspace/exec", {"argv": HOSTILE_ARGV}), second]


def _agent(run: hr.RunRecord, second: Any, tools: list[Any] | None = None) -> hr.Agent:
    return hr.Agent(Scripted(_turns(second), name="scripted-cli"),
                    tools if tools is not None else workspace_tools(),
                    policy=hr.Policy.default(), workspace=run.workspace or ".",
                    name="cli-test", ref="cli_agents:working")


def _no_key(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    raise ConfigError("OPENAI_API_KEY is not set: export it, or pass api_key=")


def working(run: hr.RunRecord) -> hr.Agent:
    """Continues the run to a final answer."""
    return _agent(run, reply("done \x1b[31mred\x1b[0m"))


def no_key(run: hr.RunRecord) -> hr.Agent:
    """Its model fails for want of an API key, after the approved call ran."""
    return _agent(run, _no_key)


def without_exec(run: hr.RunRecord) -> hr.Agent:
    """An agent that lost the exec tool."""
    return _agent(run, reply("x"), tools=[t for t in workspace_tools() if t.__name__ != "Exec"])


def _interrupt(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
    raise KeyboardInterrupt


def interrupted(run: hr.RunRecord) -> hr.Agent:
    """Ctrl-C arrives while its model is asked for the next turn."""
    return _agent(run, _interrupt)


class _Hang:
    """A model that announces it was asked (a marker file), then waits forever."""

    name = "scripted-cli"

    async def request(self, messages: Any, tools: Any, settings: Any = None) -> Any:
        import os

        import anyio

        await anyio.Path(os.environ["HANDRAIL_TEST_MARKER"]).write_text("asked")
        await anyio.sleep_forever()


def hang(run: hr.RunRecord) -> hr.Agent:
    """Hangs in the model turn after the approved call: for a real Ctrl-C (SIGINT)."""
    return hr.Agent(_Hang(), workspace_tools(), policy=hr.Policy.default(),  # type: ignore[arg-type]
                    workspace=run.workspace or ".", name="cli-test", ref="cli_agents:working")


def broken_factory(run: hr.RunRecord) -> hr.Agent:
    """A factory that fails (a missing setting, say)."""
    raise KeyError("WORKSPACE")
