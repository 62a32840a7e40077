"""`handrail serve --stdio`'s own transport (handrail.mcp._stdio): pipes on the event loop.

What the SDK's thread-based transport guaranteed still holds: a tool's stray output (and a
child's) never reaches the wire, and a client's over-long line is refused, not buffered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from serve_tools import MANIFEST

from handrail.mcp._stdio import MAX_MESSAGE_BYTES, MessageTooLong, split_lines

HERE = Path(__file__).parent

NOISY_TOOLS = '''
import subprocess
import sys

import handrail as hr

@hr.tool(mutates=False)
def noisy(word: str) -> str:
    """Print to stdout, and let a child write to fd 1, then answer."""
    print("STRAY PRINT " + word, flush=True)
    subprocess.run([sys.executable, "-c", "print('STRAY CHILD')"], check=True)
    return "quiet " + word

box = hr.Toolbox([noisy])
'''
NOISY_MANIFEST = '''
[[tools]]
ref = "local/noisy"
description = "Noisy."
mutates = false
'''


def test_split_lines_joins_chunks_and_skips_blank_lines() -> None:
    buffer = bytearray()
    lines, skipping = split_lines(buffer, b'{"a": 1}\n{"b"', False)
    assert lines == [b'{"a": 1}'] and not skipping and bytes(buffer) == b'{"b"'
    lines, skipping = split_lines(buffer, b': 2}\n\n  \n{"c": 3}\n', skipping)
    assert lines == [b'{"b": 2}', b'{"c": 3}'] and not skipping and not buffer


def test_a_line_over_the_limit_is_refused_once_and_never_held() -> None:
    buffer = bytearray()
    lines, skipping = split_lines(buffer, b"x" * 8, False, limit=10)
    assert lines == [] and bytes(buffer) == b"x" * 8
    lines, skipping = split_lines(buffer, b"x" * 8, skipping, limit=10)
    assert len(lines) == 1 and isinstance(lines[0], MessageTooLong)
    assert skipping and not buffer  # what came is dropped, not kept
    lines, skipping = split_lines(buffer, b"y" * 100, skipping, limit=10)
    assert lines == [] and skipping and not buffer  # still the long line: dropped
    lines, skipping = split_lines(buffer, b'yy\n{"ok": 1}\n', skipping, limit=10)
    assert lines == [b'{"ok": 1}'] and not skipping
    # A long line that ends within one chunk is refused too, and the next one is kept.
    lines, skipping = split_lines(buffer, b"z" * 20 + b'\n{"ok": 2}\n', False, limit=10)
    assert isinstance(lines[0], MessageTooLong) and lines[1:] == [b'{"ok": 2}']



@pytest.mark.parametrize(("chunk", "expected"), [
    (b'{"a": 1}\n', [b'{"a": 1}']),
    (b"   \n", []),  # a blank line is no message
    (b"x" * 10 + b"\n", [b"x" * 10]),  # at the limit: kept
    (b"x" * 11 + b"\n", ["too long"]),  # past it: refused, never taken as a line
])
def test_a_chunk_of_one_whole_line_splits_as_any_other(chunk: bytes, expected: list[object]
                                                       ) -> None:
    # The one-line chunk's shortcut (issue 38) gives what the line-by-line split gives.
    buffer = bytearray()
    lines, skipping = split_lines(buffer, chunk, False, limit=10)
    got = ["too long" if isinstance(line, MessageTooLong) else line for line in lines]
    assert got == expected and not skipping and not buffer
    # After an unfinished line, the same chunk ends that line instead.
    lines, _ = split_lines(bytearray(b'{"b": '), b'2}\n', False)
    assert lines == [b'{"b": 2}']
    # While a long line is skipped, a chunk that ends it gives nothing.
    lines, skipping = split_lines(bytearray(), b'{"c": 3}\n', True, limit=10)
    assert lines == [] and not skipping


class _Taker:
    """The link's place: takes each line that names `tools/call`."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []

    def take(self, line: bytes) -> bool:
        if b"tools/call" in line:
            self.taken.append(line)
            return True
        return False


class _Pipe:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_stdin_lines_the_link_takes_start_at_once_and_the_rest_wait_in_order() -> None:
    from handrail.mcp._stdio import _BACKLOG_HIGH, _BACKLOG_LOW, _Lines

    link, pipe = _Taker(), _Pipe()
    lines = _Lines(link)  # type: ignore[arg-type]
    lines.connection_made(pipe)
    lines.data_received(b'{"tools/call": 1}\n{"ping": 2}\n{"tools/call": 3}\n{"tools/')
    # The first is the link's at once; the ping waits for the SDK's server, and the call
    # after it waits behind it (handled in the order they came, as a reading loop would).
    assert link.taken == [b'{"tools/call": 1}']
    assert list(lines.backlog) == [b'{"ping": 2}', b'{"tools/call": 3}']
    lines.delivered()
    lines.delivered()
    lines.data_received(b'call": 4}\n')  # the unfinished line, finished: taken at once
    assert link.taken[-1] == b'{"tools/call": 4}' and not lines.backlog
    # Past the bound of waiting lines stdin is not read; read again once they are down.
    lines.data_received(b'{"ping": 5}\n' * (_BACKLOG_HIGH + 1))
    assert pipe.paused
    while len(lines.backlog) > _BACKLOG_LOW + 1:
        lines.delivered()
    assert pipe.paused
    lines.delivered()
    assert not pipe.paused
    assert not lines.ended
    lines.eof_received()
    assert lines.ended


class _Raw:
    """`handrail serve --stdio` driven over raw pipes, one JSON-RPC line at a time."""

    def __init__(self, root: Path, target: str, manifest: str) -> None:
        (root / "handrail.toml").write_text(manifest)
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(root), str(HERE),
                                              os.environ.get("PYTHONPATH", "")])}
        self.stderr_path = root / "serve.stderr"
        self._stderr = open(self.stderr_path, "wb")  # closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handrail.cli", "serve", target, "--stdio", "--store",
             "memory"], cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr)
        # Reads below block: a server that hangs is killed, so the test fails, never hangs.
        self._watchdog = threading.Timer(120, self.proc.kill)
        self._watchdog.start()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, id_: int, method: str, params: dict[str, Any]) -> None:
        self.send(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method,
                              "params": params}).encode() + b"\n")

    def read(self) -> dict[str, Any]:
        """The next line the server wrote on its stdout: it must be JSON-RPC."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the server closed stdout: {self.stderr_path.read_text()[-2000:]}"
        message: dict[str, Any] = json.loads(line)  # anything else corrupts the wire
        return message

    def initialize(self) -> None:
        self.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw", "version": "0"}})
        assert "result" in self.read()
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._watchdog.cancel()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()


def test_stray_output_of_a_tool_and_its_child_never_reaches_the_wire(tmp_path: Path) -> None:
    (tmp_path / "noisy_tools.py").write_text(NOISY_TOOLS)
    raw = _Raw(tmp_path, "noisy_tools:box", NOISY_MANIFEST)
    try:
        raw.initialize()
        raw.request(2, "tools/call", {"name": "noisy", "arguments": {"word": "hi"}})
        answer = raw.read()  # json.loads of every line: a stray print would fail here
        assert answer["id"] == 2, answer
        assert answer["result"]["content"][0]["text"] == "quiet hi"
    finally:
        code = raw.close()
    assert code == 0
    err = raw.stderr_path.read_text()
    assert "STRAY PRINT hi" in err and "STRAY CHILD" in err  # diverted to stderr


def test_an_over_long_line_is_refused_and_the_session_goes_on(tmp_path: Path) -> None:
    raw = _Raw(tmp_path, "serve_tools:box", MANIFEST)
    try:
        raw.initialize()
        # One line past the limit, in pieces (never a whole message the server could parse).
        piece = b"x" * (1024 * 1024)
        raw.send(b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"p": "')
        for _ in range(MAX_MESSAGE_BYTES // len(piece) + 1):
            raw.send(piece)
        raw.send(b'"}}\n')
        raw.request(4, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})
        replies = [raw.read()]
        while replies[-1].get("id") != 4:
            replies.append(raw.read())
        assert replies[-1]["result"]["content"][0]["text"] == "5"
        assert all(r.get("id") != 3 for r in replies)  # the long request was never served
        [refused] = [r for r in replies if "error" in r]
        assert refused["id"] is None and refused["error"]["code"] == -32700
        assert "longer than" in refused["error"]["message"]
        # A line that is no JSON-RPC message is answered the same way.
        raw.send(b"this is not json\n")
        answer = raw.read()
        assert answer["id"] is None and answer["error"]["code"] == -32700
    finally:
        code = raw.close()
    assert code == 0


def test_a_regular_file_on_stdin_is_served_by_the_sdks_transport(tmp_path: Path) -> None:
    """Not a pipe: the SDK's thread-based transport serves it (the event loop cannot)."""
    (tmp_path / "handrail.toml").write_text(MANIFEST)
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(json.dumps(m) for m in [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "file", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "add", "arguments": {"a": 1, "b": 2}}},
    ]) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE),
                                                        os.environ.get("PYTHONPATH", "")])}
    with open(requests, "rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "handrail.cli", "serve", "serve_tools:box", "--stdio",
             "--store", "memory"], cwd=tmp_path, env=env, stdin=stdin, capture_output=True,
            timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    replies = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    # (The call's answer races the end of input, which ends the session: not asserted.)
    assert replies[0]["id"] == 1 and "serverInfo" in replies[0]["result"], replies
