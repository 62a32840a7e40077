"""MCP test helpers: real servers (PyPI, npm, our own fixture server), started once per module.

The npm servers are installed by `npm install --prefix .cache/npm` (scripts/test does it; so
does the `npm_bin` fixture when it is missing). When npm cannot reach its registry the npm
cases are skipped with the reason, never silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = ROOT / ".cache" / "npm"
NPM_PACKAGES = ("@modelcontextprotocol/server-filesystem",
                "@modelcontextprotocol/server-everything",
                "@modelcontextprotocol/inspector")
BIN = Path(sys.executable).parent
FIXTURE_SERVER = Path(__file__).with_name("fixture_server.py")
CHANGING_SERVER = Path(__file__).with_name("changing_server.py")
HERE = Path(__file__).parent


def python_bin(name: str) -> str:
    """A console script installed in this venv (mcp-server-time, mcp-server-git...)."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: run scripts/test (it installs .[dev])")
    return str(path)


_npm_problem: list[str] = []


def npm_bin(name: str) -> str:
    """An npm server's executable from the repo's npm cache, installing it once if needed."""
    path = NPM_PREFIX / "node_modules" / ".bin" / name
    if path.exists():
        return str(path)
    if not _npm_problem:
        npm = shutil.which("npm")
        if npm is None:
            _npm_problem.append("npm is not installed")
        else:
            done = subprocess.run([npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit",
                                   "--no-fund", *NPM_PACKAGES], capture_output=True, text=True,
                                  timeout=180, check=False)
            if done.returncode != 0:
                _npm_problem.append(f"npm install failed (registry unreachable?): "
                                    f"{done.stderr.strip()[-300:]}")
    if not path.exists():
        pytest.skip(f"npm server {name} unavailable: "
                    f"{_npm_problem[0] if _npm_problem else 'not installed'}")
    return str(path)


def node_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "")}


def text(result: Any) -> str:
    """The text of an MCP CallToolResult."""
    return "\n".join(block.text for block in result.content)


class Served:
    """A `handrail serve` process, a client session to it, and its store and logs."""

    def __init__(self, session: ClientSession, root: Path) -> None:
        self.session = session
        self.root = root
        self.store_path = root / "runs.db"
        self.launch_log = root / "launched.log"

    def launched(self) -> list[str]:
        return self.launch_log.read_text().splitlines() if self.launch_log.exists() else []

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self.session.call_tool(name, arguments)

    async def pending(self) -> list[hr.PendingItem]:
        store = hr.Store.open(str(self.store_path))
        try:
            return [p for p in await store.pending() if p.state == "open"]
        finally:
            await store.close()

    async def wait_pending(self, tool: str, known: set[str]) -> hr.PendingItem:
        """The new open approval for `tool` (the server records it before it waits)."""
        with anyio.fail_after(30):
            while True:
                for item in await self.pending():
                    if item.tool == tool and item.id not in known:
                        return item
                await anyio.sleep(0.05)

    async def cli(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "HANDRAIL_AGENT"}
        done = await anyio.run_process(
            [sys.executable, "-m", "handrail.cli", *args, "--store", str(self.store_path)],
            cwd=self.root, env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()


@contextlib.asynccontextmanager
async def serve(root: Path, *args: str, manifest: str,
                elicitation_callback: Any = None) -> AsyncIterator[Served]:
    """`handrail serve --stdio *args` in `root` (with `manifest` as its handrail.toml).

    With `elicitation_callback`, the client declares elicitation and answers forms with it.
    """
    (root / "handrail.toml").write_text(manifest)
    env = {**os.environ, "LAUNCH_LOG": str(root / "launched.log"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "handrail.cli", "serve", *args, "--stdio", "--store", str(root / "runs.db")],
        env=env, cwd=str(root))
    # The child writes its stderr straight to this file; nothing here blocks on it.
    with open(root / "serve.stderr", "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write,
                                     elicitation_callback=elicitation_callback) as session:
                await session.initialize()
                yield Served(session, root)


