"""Fixtures for the workspace tools: a toolbox and a caller bound to a `tmp_path` workspace."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.builtin import workspace_tools

Call = Callable[..., Awaitable[hr.ToolResult]]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret the tools must never reach."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("TOP SECRET\n")
    return out


@pytest.fixture
def box() -> hr.Toolbox:
    return hr.Toolbox(workspace_tools())


@pytest.fixture
def call(box: hr.Toolbox, workspace: Path) -> Call:
    """`await call("read_file", path="a.txt")`: one call through a handler in the workspace."""

    async def run(name: str, **arguments: Any) -> hr.ToolResult:
        handler = box.handler(f"workspace/{name}", workspace=workspace)
        try:
            out = await handler.step(hr.Invoke("call-1", arguments))
        except hr.ToolError as exc:
            # A path refused when it is bound (outside the workspace): not sent, and the gate
            # shows the model this text as an error result.
            assert exc.disposition is hr.Disposition.NOT_SENT
            return hr.ToolResult.error(str(exc))
        assert isinstance(out, hr.Finished)
        return out.result

    return run
