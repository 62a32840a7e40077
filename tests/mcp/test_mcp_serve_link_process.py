"""`handrail serve --stdio`'s own link against the SDK's own server, over raw pipes.

Each case runs twice, with the same JSON-RPC lines: once against tests/mcp/fixture_server.py
(the official SDK's `MCPServer` over its stdio transport) and once against `handrail serve`
in front of that same server, whose `tools/call` its own link answers (`_serve_link`). What
the client sees must be the same: progress for its own token, a cancelled call never
answered, a call cut off by the end of stdin answered "Connection closed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_servers import FIXTURE_SERVER

import handrail as hr

HERE = Path(__file__).parent

MANIFEST = """
[[tools]]
ref = "fx/echo"
description = "Echo."

[[tools]]
ref = "fx/progress"
description = "Report progress."

[policy]
extends = "default"

[[policy.layers]]
name = "servers"
allow = ["exec:{python} {server}", "call:fx/*"]

[[servers]]
name = "fx"
names = "upstream"
command = "{python}"
args = ["{server}"]
"""


class _Pipes:
    """A stdio MCP server driven one JSON-RPC line at a time."""

    def __init__(self, argv: list[str], root: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        self.stderr_path = root / "server.stderr"
        self._stderr = open(self.stderr_path, "wb")  # closed in close()
        self.proc = subprocess.Popen(
            argv,
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        # Reads below block: a server that hangs is killed, so the test fails, never hangs.
        self._watchdog = threading.Timer(120, self.proc.kill)
        self._watchdog.start()
        self.seen: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def call(
        self, rid: int, name: str, arguments: dict[str, Any], token: str | None = None
    ) -> None:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if token is not None:
            params["_meta"] = {"progressToken": token}
        self.send({"id": rid, "method": "tools/call", "params": params})

    def read(self) -> dict[str, Any] | None:
        """The next line on the server's stdout (None at its end); every line is JSON-RPC."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        self.seen.append(message)
        return message

    def until(self, done: Any) -> dict[str, Any]:
        """Read until a line for which `done(line)` holds; that line."""
        while True:
            message = self.read()
            assert message is not None, (
                f"the server closed stdout: {self.stderr_path.read_text()[-2000:]}"
            )
            if done(message):
                return message

    def initialize(self) -> None:
        self.send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            }
        )
        assert "result" in self.until(lambda m: m.get("id") == 1)
        self.send({"method": "notifications/initialized"})

    def close(self) -> tuple[int, list[dict[str, Any]]]:
        """Close stdin; the exit code, and what the server wrote until its stdout ended."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rest = []
        while (message := self.read()) is not None:
            rest.append(message)
        try:
            return self.proc.wait(timeout=60), rest
        finally:
            self._watchdog.cancel()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()


def answers(messages: list[dict[str, Any]], rid: int) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("id") == rid and "method" not in m]


@pytest.fixture(params=["sdk", "serve"])
def pipes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Pipes]:
    """The SDK's own server, or `handrail serve` (its own link) in front of the same one."""
    if request.param == "sdk":
        argv = [sys.executable, str(FIXTURE_SERVER)]
    else:
        (tmp_path / "handrail.toml").write_text(
            MANIFEST.format(python=sys.executable, server=FIXTURE_SERVER)
        )
        argv = [
            sys.executable,
            "-m",
            "handrail.cli",
            "serve",
            "--stdio",
            "--store",
            str(tmp_path / "runs.db"),
        ]
    served = _Pipes(argv, tmp_path)
    try:
        served.initialize()
        yield served
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
            served.close()


def _calls_recorded(root: Path) -> list[hr.CallRecord]:
    import anyio

    async def read() -> list[hr.CallRecord]:
        store = hr.Store.open(str(root / "runs.db"))
        try:
            [run] = await store.runs()
            return await store.calls(run.id)
        finally:
            await store.close()

    return anyio.run(read)


def test_progress_reaches_the_clients_own_token(pipes: _Pipes) -> None:
    pipes.call(2, "progress", {"steps": 2}, token="tok-2")
    result = pipes.until(lambda m: m.get("id") == 2)
    assert result["result"]["content"][0]["text"] == "done"
    progress = [m["params"] for m in pipes.seen if m.get("method") == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p.get("total")) for p in progress] == [
        ("tok-2", 0, 2),
        ("tok-2", 1, 2),
    ]
    code, _ = pipes.close()
    assert code == 0


def test_a_cancelled_call_is_never_answered_and_the_next_one_is(
    pipes: _Pipes, tmp_path: Path
) -> None:
    pipes.call(2, "progress", {"steps": 1000}, token="tok-2")
    pipes.until(lambda m: m.get("method") == "notifications/progress")  # it runs
    pipes.send(
        {
            "method": "notifications/cancelled",
            "params": {"requestId": 2, "reason": "the user stopped it"},
        }
    )
    pipes.call(3, "echo", {"text": "after"})
    assert pipes.until(lambda m: m.get("id") == 3)["result"]["content"][0]["text"] == "after"
    code, _ = pipes.close()
    assert code == 0
    assert answers(pipes.seen, 2) == []  # the spec's MUST NOT, to the end of the session
    if (tmp_path / "runs.db").exists():  # handrail serve: the call is recorded, settled
        progress, echo = _calls_recorded(tmp_path)
        assert (progress.tool, progress.status.value, progress.disposition) == (
            "fx/progress",
            "in_doubt",
            "in_doubt",
        )
        assert (echo.tool, echo.status.value) == ("fx/echo", "finished")


def test_a_call_running_when_stdin_ends_is_answered_connection_closed(
    pipes: _Pipes, tmp_path: Path
) -> None:
    pipes.call(2, "progress", {"steps": 1000}, token="tok-2")
    pipes.until(lambda m: m.get("method") == "notifications/progress")  # it runs
    code, _ = pipes.close()
    assert code == 0
    assert answers(pipes.seen, 2) == [
        {"jsonrpc": "2.0", "id": 2, "error": {"code": -32000, "message": "Connection closed"}}
    ]
    if (tmp_path / "runs.db").exists():
        [progress] = _calls_recorded(tmp_path)
        assert (progress.status.value, progress.disposition) == ("in_doubt", "in_doubt")
