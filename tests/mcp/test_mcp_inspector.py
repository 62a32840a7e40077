"""The MCP Inspector CLI (npm, not ours) against `handrail serve --stdio`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_servers import HERE, npm_bin
from serve_tools import MANIFEST

pytestmark = pytest.mark.anyio


async def inspector(root: Path, *method: str) -> Any:
    env = {**os.environ, "LAUNCH_LOG": str(root / "launched.log"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    argv = [npm_bin("mcp-inspector"), "--cli", sys.executable, "-m", "handrail.cli", "serve",
            "serve_tools:box", "--stdio", "--store", str(root / "runs.db"),
            "--approval-timeout", "0.2", *method]
    with anyio.fail_after(90):
        done = await anyio.run_process(argv, cwd=root, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    return tmp_path


async def test_inspector_lists_the_granted_tools(root: Path) -> None:
    listed = await inspector(root, "--method", "tools/list")
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == {"add", "launch", "secret", "greet"}
    assert tools["add"]["description"] == "Add two integers."


async def test_inspector_calls_through_the_gate(root: Path) -> None:
    done = await inspector(root, "--method", "tools/call", "--tool-name", "add",
                           "--tool-arg", "a=1", "--tool-arg", "b=2")
    assert done["isError"] is False and done["content"][0]["text"] == "3"
    asked = await inspector(root, "--method", "tools/call", "--tool-name", "launch",
                            "--tool-arg", "target=x")
    assert asked["isError"] is True
    assert asked["content"][0]["text"].startswith("awaiting approval: request ap-")
    assert not (root / "launched.log").exists()
    denied = await inspector(root, "--method", "tools/call", "--tool-name", "secret")
    assert denied["isError"] is True
    assert denied["content"][0]["text"] == "This action is not permitted by the operator's policy."
