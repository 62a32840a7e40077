"""MCP test helpers: real servers (PyPI, npm, our own fixture server), started once per module.

The npm servers are installed by `npm install --prefix .cache/npm` (scripts/test does it; so
does the `npm_bin` fixture when it is missing). When npm cannot reach its registry the npm
cases are skipped with the reason, never silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = ROOT / ".cache" / "npm"
NPM_PACKAGES = ("@modelcontextprotocol/server-filesystem",
                "@modelcontextprotocol/server-everything",
                "@modelcontextprotocol/inspector")
BIN = Path(sys.executable).parent
FIXTURE_SERVER = Path(__file__).with_name("fixture_server.py")


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
