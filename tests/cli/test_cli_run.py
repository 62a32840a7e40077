"""`handrail run MODULE:OBJECT "task"`: an agent run live in a terminal (a pseudo-terminal)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

AGENT = textwrap.dedent('''
    import handrail as hr
    from handrail.models import Scripted, call, reply

    @hr.tool(server="ledger")
    async def transfer(target: str, amount: int) -> str:
        """Move money."""
        with open("effects.txt", "a") as f:
            f.write(f"{target} {amount}\\n")
        return f"moved {amount} to {target}"

    agent = hr.Agent(Scripted([call("ledger/transfer", {"target": "bob", "amount": 5}),
                               reply("paid bob \\x1b[31m5\\x1b[0m")]), [transfer])
    tools = [transfer]
''')


def env() -> dict[str, str]:
    out = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    out.pop("HANDRAIL_STORE", None)
    return out


def read_until(fd: int, needle: bytes, seen: bytearray, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"never saw {needle!r} in {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}: {bytes(seen)!r}"
            seen.extend(chunk)


def drain(fd: int, seen: bytearray) -> None:
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            return
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return
        if not chunk:
            return
        seen.extend(chunk)


@pytest.mark.slow
def test_run_asks_in_the_terminal_and_y_approves(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text(AGENT)
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "handrail.cli", "run", "myagent:agent", "pay bob"],
        cwd=tmp_path, stdin=secondary, stdout=secondary, stderr=secondary, env=env(),
        close_fds=True)
    os.close(secondary)
    seen = bytearray()
    try:
        read_until(primary, b"Approve? [y/N", seen)
        assert b"ledger/transfer" in seen
        os.write(primary, b"y\n")
        drain(primary, seen)
        assert proc.wait(timeout=60) == 0, bytes(seen)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    text = bytes(seen).decode(errors="replace")
    assert "completed" in text and "paid bob" in text
    assert "\x1b[31m5" not in text  # what the model wrote is shown escaped
    assert (tmp_path / "effects.txt").read_text() == "bob 5\n"
    assert (tmp_path / ".handrail" / "runs.db").exists()
    runs = json.loads(subprocess.run([sys.executable, "-m", "handrail.cli", "runs", "--json"],
                                     cwd=tmp_path, capture_output=True, text=True, env=env(),
                                     timeout=60).stdout)
    shown = json.loads(subprocess.run(
        [sys.executable, "-m", "handrail.cli", "show", runs[0]["id"], "--json"], cwd=tmp_path,
        capture_output=True, text=True, env=env(), timeout=60).stdout)
    assert shown["calls"][0]["decided_by"] == "StdinApprover"


@pytest.mark.slow
def test_run_with_defer_pauses_and_the_printed_command_finishes_it(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text(AGENT)
    cmd = [sys.executable, "-m", "handrail.cli"]
    out = subprocess.run([*cmd, "run", "myagent:agent", "pay bob", "--defer", "--json"],
                         cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=60)
    assert out.returncode == 3, out.stderr
    data = json.loads(out.stdout)
    assert data["outcome"]["kind"] == "awaiting_approval"
    text = subprocess.run([*cmd, "run", "myagent:agent", "pay bob", "--defer"], cwd=tmp_path,
                          capture_output=True, text=True, env=env(), timeout=60).stdout
    assert "next: an action waits for approval: approve with `handrail approve " in text
    elsewhere = subprocess.run([*cmd, "run", "myagent:agent", "pay bob", "--defer", "--store",
                                "other.db"], cwd=tmp_path, capture_output=True, text=True,
                               env=env(), timeout=60).stdout
    assert "(give those commands --store other.db)" in elsewhere
    done = subprocess.run([*cmd, "approve", data["outcome"]["request_id"]], cwd=tmp_path,
                          capture_output=True, text=True, env=env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout
    assert (tmp_path / "effects.txt").read_text() == "bob 5\n"


def test_run_refuses_tools_without_a_model_and_a_model_for_an_agent(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text(AGENT)
    cmd = [sys.executable, "-m", "handrail.cli", "run"]
    tools = subprocess.run([*cmd, "myagent:tools", "x"], cwd=tmp_path, capture_output=True,
                           text=True, env=env(), timeout=60)
    assert tools.returncode == 1 and "pass --model" in tools.stderr
    agent = subprocess.run([*cmd, "myagent:agent", "x", "--model", "openai:gpt-4.1"],
                           cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=60)
    assert agent.returncode == 1 and "--model is for tools" in agent.stderr
    denied = subprocess.run([*cmd, "myagent:agent", "pay", "--approve", "deny", "--json"],
                            cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=60)
    assert denied.returncode == 0, denied.stderr
    assert not (tmp_path / "effects.txt").exists()


EDITS = textwrap.dedent('''
    import handrail as hr
    from handrail.builtin import workspace_tools
    from handrail.models import Scripted, call, reply

    agent = hr.Agent(Scripted([
        call("workspace/edit_file", {"path": "README.md", "old": "hello", "new": "goodbye"}),
        call("workspace/write_file", {"path": "NOTES.md", "content": "one\\n"}),
        call("workspace/write_file", {"path": "NOTES.md", "content": "two\\n"}),
        reply("done")]), workspace_tools(), policy=hr.Policy.default(), workspace=".")
''')


@pytest.mark.slow
def test_the_terminal_approver_shows_an_edit_s_diff_takes_a_reason_and_allows_for_the_run(
        tmp_path: Path) -> None:
    """Story: `n` denied with a fixed reason; edit_file showed no diff (write_file did); there
    was no "allow for this run" at the terminal (the inbox has remember)."""
    (tmp_path / "edits.py").write_text(EDITS)
    (tmp_path / "README.md").write_text("hello world\n")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "handrail.cli", "run", "edits:agent", "tidy"],
        cwd=tmp_path, stdin=secondary, stdout=secondary, stderr=secondary, env=env(),
        close_fds=True)
    os.close(secondary)
    seen = bytearray()
    try:
        read_until(primary, b"Approve? [y/N/a]", seen)
        assert b"-hello world" in seen and b"+goodbye world" in seen  # the edit, as a diff
        os.write(primary, b"n\n")
        read_until(primary, b"Why?", seen)
        os.write(primary, b"keep the greeting\n")
        read_until(primary, b"NOTES.md for the rest of this run\r\nApprove? [y/N/a]", seen)
        os.write(primary, b"a\n")
        drain(primary, seen)
        assert proc.wait(timeout=60) == 0, bytes(seen)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    text = bytes(seen).decode(errors="replace")
    assert text.count("Approve?") == 2  # the second write was allowed without asking
    assert (tmp_path / "README.md").read_text() == "hello world\n"
    assert (tmp_path / "NOTES.md").read_text() == "two\n"
    runs = json.loads(subprocess.run([sys.executable, "-m", "handrail.cli", "runs", "--json"],
                                     cwd=tmp_path, capture_output=True, text=True, env=env(),
                                     timeout=60).stdout)
    shown = json.loads(subprocess.run(
        [sys.executable, "-m", "handrail.cli", "show", runs[0]["id"], "--json"], cwd=tmp_path,
        capture_output=True, text=True, env=env(), timeout=60).stdout)
    edit = shown["calls"][0]
    assert edit["decision"]["kind"] == "deny"
    assert "keep the greeting" in json.dumps(edit)
    assert shown["calls"][1]["decision"]["remember"] == ["NOTES.md"]
    assert shown["calls"][2]["decision"] is None  # allowed by the remembered rule
