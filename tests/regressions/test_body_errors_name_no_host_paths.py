"""Exceptions from a tool body reach the model without host paths (issue 10 §5).

The story: a body's `OSError` reached the model as "No such file or directory:
'/home/someone/projects/ws/notes/x.txt'", telling it where the workspace lives on the host and
what lies around it. Now a path under the workspace is shown workspace-relative, and any other
absolute path as a placeholder; the call's record keeps the full text for the operator.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply
from handrail.tools._paths import OUTSIDE_PLACEHOLDER, scrub_host_paths

pytestmark = pytest.mark.anyio


@hr.tool(server="t", mutates=False)
def open_note(path: hr.ReadPath) -> str:
    """Open a note that is not there."""
    return path.read_text()


@hr.tool(server="t", mutates=False)
def peek() -> str:
    """Open a file outside the workspace."""
    return Path("/nonexistent-handrail-dir/shadow").read_text()


async def model_text(workspace: Path, tool_id: str, arguments: dict[str, Any]) -> str:
    seen: list[ToolResultMessage] = []

    def answer(messages: Sequence[Any], offered: Sequence[Any]) -> Turn:
        seen.extend(m for m in messages if isinstance(m, ToolResultMessage))
        return reply("done")

    agent = hr.Agent(Scripted([call(tool_id, arguments), answer]), [open_note, peek],
                     policy=hr.Policy.permissive(), workspace=workspace)
    with anyio.fail_after(30):
        await agent.run("go", store=hr.Store.memory())
    (message,) = seen
    assert message.result.is_error
    return "".join(getattr(c, "text", "") for c in message.result.content)


async def test_a_path_inside_the_workspace_is_shown_relative(tmp_path: Path) -> None:
    real = os.path.realpath(tmp_path)  # noqa: ASYNC240 - a test's setup, not a call's work
    text = await model_text(tmp_path, "t/open_note", {"path": "notes/missing.txt"})
    assert "'notes/missing.txt'" in text
    assert str(tmp_path) not in text and real not in text


async def test_a_path_outside_the_workspace_is_a_placeholder(tmp_path: Path) -> None:
    text = await model_text(tmp_path, "t/peek", {})
    assert "nonexistent-handrail-dir" not in text
    assert OUTSIDE_PLACEHOLDER in text


def test_urls_relative_paths_and_punctuation_are_kept() -> None:
    ws = "/srv/ws"
    assert scrub_host_paths("see https://example.com/a/b and a/b or ./c", ws) == \
        "see https://example.com/a/b and a/b or ./c"
    assert scrub_host_paths("failed: /srv/ws/src/app.py.", ws) == "failed: src/app.py."
    assert scrub_host_paths("moved /srv/ws/a to /etc/x", ws) == \
        f"moved a to {OUTSIDE_PLACEHOLDER}"
    assert scrub_host_paths("/srv/wsx/secret", ws) == OUTSIDE_PLACEHOLDER
