"""Issue 23: a stdio MCP server runs in the sandbox derived from its toolset's policy.

The server is this file run as a program (`python test_mcp_sandbox.py`, the official SDK):
its tools read, write and connect where they are told, and say what happened inside the
server. Under the default policy (secrets denied, NET not allowed) reading `.env`, writing
outside the workspace or into `.git/`, and reaching a local TCP server all fail inside the
server, while the workspace's ordinary files work; every call's record says how the server
was confined; `required` where nothing can confine it refuses to start it.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.models import Scripted, call, reply
from handrail.sandbox import _landlock, find_bwrap

SERVER_NAME = "sb"

pytestmark = pytest.mark.anyio

needs_bwrap = pytest.mark.skipif(find_bwrap()[0] is None,
                                 reason=f"no working bubblewrap here: {find_bwrap()[1]}")

SECRET = "API_KEY=must-not-leak"
ARGV = (sys.executable, str(Path(__file__).resolve()))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".env").write_text(SECRET)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "src" / "app.txt").write_text("ordinary\n")
    return root.resolve()


def policy() -> hr.Policy:
    """The default policy (secrets, .git/ write-protected, NET asks) plus this server."""
    return (hr.Policy.default().layer("mcp").allow("exec", " ".join(ARGV))
            .allow(hr.Act.CALL, f"{SERVER_NAME}/*"))


def toolset(ws: Path, **options: Any) -> hr.mcp.MCPToolset:
    return hr.mcp.MCPToolset.stdio(ARGV[0], ARGV[1:], name=SERVER_NAME, policy=policy(),
                                   workspace=ws, **options)


def said(result: hr.ToolResult) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the host's loopback; its port."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield int(sock.getsockname()[1])


@needs_bwrap
async def test_a_stdio_server_is_confined_by_its_policy(ws: Path, listener: int) -> None:
    async with toolset(ws) as tools:
        box = hr.Toolbox([tools])

        async def ask(tool: str, **arguments: Any) -> str:
            result = await box.call(f"{SERVER_NAME}/{tool}", arguments)
            assert result.metadata["handrail.sandbox"]["mechanism"] == "bwrap"
            return said(result)

        # Ordinary workspace files: read and written normally, relative or absolute.
        assert await ask("read", path="src/app.txt") == "read: ordinary\n"
        assert await ask("write", path=str(ws / "src" / "new.txt"), text="made") == "written"
        assert (ws / "src" / "new.txt").read_text() == "made"
        # What the policy denies fails inside the server.
        assert await ask("read", path=".env") == "failed: PermissionError"
        assert await ask("read", path=str(ws / ".env")) == "failed: PermissionError"
        assert (await ask("write", path="../outside.txt", text="x")).startswith("failed")
        assert not (ws.parent / "outside.txt").exists()
        assert (await ask("write", path=".git/config", text="x")).startswith("failed")
        assert (ws / ".git" / "config").read_text() == "[core]\n"
        assert (await ask("connect", port=listener)).startswith("failed")
    assert tools.confinement is not None
    assert tools.confinement["network"] == "none"
    assert ".env" in tools.confinement["hidden"]


@needs_bwrap
async def test_each_call_record_says_how_the_server_was_confined(tmp_path: Path,
                                                                 ws: Path) -> None:
    records = tmp_path / "records"
    async with toolset(ws) as tools:
        agent = hr.Agent(Scripted([call(f"{SERVER_NAME}/read", {"path": ".env"}),
                                   reply("done")]),
                         [tools], policy=policy(), workspace=ws, records_dir=records)
        async with hr.Store.open(tmp_path / "runs.db") as store:
            done = await agent.run("peek", store=store)
            assert done.outcome == hr.Completed("done")
            (record,) = await store.calls(done.run_id)
    assert record.result is not None
    assert SECRET not in json.dumps(record.result)
    confinement = record.result["metadata"]["handrail.sandbox"]
    assert confinement["mode"] == "auto" and confinement["mechanism"] == "bwrap"
    assert ".env" in confinement["hidden"]


async def test_off_is_explicit_and_recorded(ws: Path) -> None:
    async with toolset(ws, sandbox="off") as tools:
        result = await hr.Toolbox([tools]).call(f"{SERVER_NAME}/read", {"path": ".env"})
    assert said(result) == f"read: {SECRET}"  # unconfined: exactly what "off" means
    assert result.metadata["handrail.sandbox"]["mechanism"] == "none"
    assert result.metadata["handrail.sandbox"]["mode"] == "off"


async def test_required_without_any_mechanism_refuses_to_start_the_server(
        tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDRAIL_BWRAP", str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(_landlock, "abi", lambda: 0)
    marker = ws / "started"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    tools = hr.mcp.MCPToolset.stdio(argv[0], argv[1:], name=SERVER_NAME, workspace=ws,
                                    policy=hr.Policy.default().layer("mcp").allow(
                                        "exec", " ".join(argv)), sandbox="required")
    with pytest.raises(hr.UserError) as caught:
        async with tools:
            pass
    assert not marker.exists()
    message = str(caught.value)
    assert f"MCP server '{SERVER_NAME}'" in message and "sandbox='required'" in message
    assert "bubblewrap not found" in message and "nothing was started" in message


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(hr.UserError, match="sandbox must be one of"):
        hr.mcp.MCPToolset.stdio("x", name="x", sandbox="sometimes")


def _serve() -> None:
    """The server the tests above run: this file as a program."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("sandboxed")

    @server.tool()
    def read(path: str) -> str:
        """Read a file."""
        try:
            with open(path, encoding="utf-8") as f:
                return "read: " + f.read()
        except OSError as exc:
            return f"failed: {type(exc).__name__}"

    @server.tool()
    def write(path: str, text: str) -> str:
        """Write (append to) a file."""
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
            return "written"
        except OSError as exc:
            return f"failed: {type(exc).__name__}"

    @server.tool()
    def connect(port: int) -> str:
        """Connect to 127.0.0.1:port."""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                return "connected"
        except OSError as exc:
            return f"failed: {type(exc).__name__}"

    server.run("stdio")


if __name__ == "__main__":
    _serve()
