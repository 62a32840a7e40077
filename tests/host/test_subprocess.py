"""Programs as tools: the stdio contract, the envelope, the projection, killing the group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.host import ProcessCapture, Projection, StreamCapture
from handrail.sandbox import find_bwrap
from handrail.tools import CallContext

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

OPEN: dict[str, Any] = {"type": "object"}

needs_bwrap = pytest.mark.skipif(find_bwrap()[0] is None,
                                 reason=f"no working bubblewrap here: {find_bwrap()[1]}")


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


async def execute(tool: hr.SubprocessTool, arguments: dict[str, Any], workspace: Path,
                  **ctx: Any) -> hr.ToolResult:
    validated = tool.validate(arguments)
    context = CallContext(call_id=ctx.get("call_id", "c1"), tool_id=tool.spec.id,
                          workspace=workspace, run_id=ctx.get("run_id"),
                          agent=ctx.get("agent"), sandbox=ctx.get("sandbox", "auto"))
    with anyio.fail_after(60):
        return await tool.execute(validated, context)


def gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except FileNotFoundError:
        return True


def wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not gone_or_zombie(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ------------------------------------------------------------------ the envelope


async def test_stdin_is_the_input_json_and_the_environment_is_the_allowlist(
        tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    prog = script(tmp_path, "run", f"#!{sys.executable}\n"
                  "import json, os, sys\n"
                  "data = sys.stdin.read()\n"
                  "print(json.dumps({'stdin': data, 'env': dict(os.environ),"
                  " 'cwd': os.getcwd()}))\n")
    tool = hr.SubprocessTool("env", [str(prog)], OPEN, "Show.", env={"EXTRA": "1"})
    result = await execute(tool, {"text": "héllo", "n": 1}, workspace, run_id="r1",
                           agent="ag", call_id="call-9")
    assert not result.is_error
    text = result.render_text()
    assert text.startswith("Exit code: 0\n")
    out = json.loads(text.split("\n", 1)[1])
    assert json.loads(out["stdin"]) == {"text": "héllo", "n": 1}
    env = out["env"]
    assert "OPENAI_API_KEY" not in env
    assert env["HANDRAIL_WORKSPACE"] == str(workspace)
    assert (env["HANDRAIL_AGENT"], env["HANDRAIL_RUN_ID"], env["HANDRAIL_CALL_ID"]) == \
        ("ag", "r1", "call-9")
    assert env["EXTRA"] == "1"
    allowed = hr.host.PASSED_ENVIRONMENT | {"HANDRAIL_WORKSPACE", "HANDRAIL_AGENT",
                                            "HANDRAIL_RUN_ID", "HANDRAIL_CALL_ID", "EXTRA"}
    # The kernel/libc may add a few of its own (PWD, SHLVL, _, LC_CTYPE on macOS).
    assert set(env) - allowed <= {"PWD", "SHLVL", "_", "LC_CTYPE"}
    assert Path(out["cwd"]) == workspace


async def test_stderr_on_success_is_shown_after_its_marker(tmp_path: Path,
                                                           workspace: Path) -> None:
    prog = script(tmp_path, "run", "#!/bin/sh\necho out\necho warn >&2\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert not result.is_error
    assert result.render_text() == "Exit code: 0\nout\n--- stderr ---\nwarn"


async def test_a_silent_program_still_gets_a_non_empty_result(tmp_path: Path,
                                                              workspace: Path) -> None:
    prog = script(tmp_path, "run", "#!/bin/sh\nexit 0\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.render_text() == "Exit code: 0"
    assert not result.is_error


async def test_a_non_zero_exit_is_an_error_result(tmp_path: Path, workspace: Path) -> None:
    prog = script(tmp_path, "run", "#!/bin/sh\necho nope >&2\nexit 3\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.is_error
    assert result.render_text() == "Exit code: 3\n--- stderr ---\nnope"


async def test_binary_output_is_replaced_in_the_text(tmp_path: Path, workspace: Path) -> None:
    prog = script(tmp_path, "run", f"#!{sys.executable}\nimport sys\n"
                  "sys.stdout.buffer.write(b'ok\\xff\\xfe\\n')\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.render_text() == "Exit code: 0\nok\ufffd\ufffd"


async def test_a_program_that_is_not_executable(tmp_path: Path, workspace: Path) -> None:
    prog = tmp_path / "run"
    prog.write_text("#!/bin/sh\necho hi\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.is_error
    text = result.render_text()
    assert text.startswith("Exit code: 126\n") and "is not executable" in text


async def test_a_missing_program(tmp_path: Path, workspace: Path) -> None:
    tool = hr.SubprocessTool("t", [str(tmp_path / "nowhere")], OPEN, "T.")
    result = await execute(tool, {}, workspace)
    assert result.is_error and "Exit code: 127" in result.render_text()


async def test_a_foreign_signal_is_reported_as_such(tmp_path: Path, workspace: Path) -> None:
    # Unconfined: the wait status says "killed by SIGKILL" exactly.
    prog = script(tmp_path, "run", "#!/bin/sh\necho before\nkill -KILL $$\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace,
                           sandbox="off")
    assert result.is_error
    text = result.render_text()
    assert text.startswith(f"Exit code: {-signal.SIGKILL}\n")
    assert "Killed by signal SIGKILL (not sent by handrail" in text
    assert text.endswith("before")


@needs_bwrap
@pytest.mark.parametrize("body", ["kill -KILL $$", "exit 137"])
async def test_under_bubblewrap_a_signal_and_its_exit_code_are_said_to_look_the_same(
        tmp_path: Path, workspace: Path, body: str) -> None:
    # bwrap reports a program killed by signal N as exit code 128+N (its --json-status-fd
    # too): the record must not claim either, and must not say bwrap's own status.
    prog = script(tmp_path, "run", f"#!/bin/sh\necho before\n{body}\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.is_error
    assert result.metadata["handrail.sandbox"]["mechanism"] == "bwrap"
    assert result.render_text() == (
        "Exit code: 137\nExit code 137: the program exited with 137 or was killed by signal "
        "SIGKILL (not sent by handrail); inside the sandbox the two look the same\nbefore")


@needs_bwrap
async def test_under_bubblewrap_an_ordinary_exit_code_is_the_programs(
        tmp_path: Path, workspace: Path) -> None:
    # bwrap exits 1 when it cannot start the program: a program's own 1 stays the program's.
    prog = script(tmp_path, "run", "#!/bin/sh\necho nope >&2\nexit 1\n")
    result = await execute(hr.SubprocessTool("t", [str(prog)], OPEN, "T."), {}, workspace)
    assert result.metadata["handrail.sandbox"]["mechanism"] == "bwrap"
    assert result.render_text() == "Exit code: 1\n--- stderr ---\nnope"


# ------------------------------------------------------------------ the projection


def projected(size: int, head: int = 8, tail: int = 8) -> str:
    stream = StreamCapture("stdout", Projection(head, tail))
    data = bytes(ord("a") + i % 26 for i in range(size))
    for i in range(0, size, 3):  # chunk boundaries must not matter
        stream.feed(data[i:i + 3])
    return stream.project("/records/x/output.json")


def test_projection_below_at_and_over_its_bounds() -> None:
    assert projected(15) == "abcdefghijklmno"
    assert projected(16) == "abcdefghijklmnop"
    over = projected(17)
    assert over.startswith("abcdefgh\n[stdout: 17 bytes, 1 lines in all; showing the first 8 "
                           "and the last 8 bytes, 1 bytes left out; full record: "
                           "/records/x/output.json]\n")
    assert over.endswith("\njklmnopq")
    assert over.count("\n") == 2  # exactly one marker line


def test_projection_counts_lines_and_says_when_no_record_is_kept() -> None:
    stream = StreamCapture("stderr", Projection(4, 4))
    stream.feed(b"1\n2\n3\n4\n5\n6\n")
    text = stream.project(None)
    assert "[stderr: 12 bytes, 6 lines in all" in text and "no full record kept]" in text


async def test_projection_is_settable_per_tool(tmp_path: Path, workspace: Path) -> None:
    prog = script(tmp_path, "run", f"#!{sys.executable}\nimport sys\n"
                  "sys.stdout.write('x' * 100 + 'END')\n")
    tool = hr.SubprocessTool("t", [str(prog)], OPEN, "T.", projection=Projection(10, 3))
    text = (await execute(tool, {}, workspace)).render_text()
    assert text.startswith("Exit code: 0\nxxxxxxxxxx\n[stdout: 103 bytes")
    assert text.endswith("\nEND")


def test_the_envelope_of_a_capture_is_never_empty() -> None:
    capture = ProcessCapture.new()
    capture.exit_code = 0
    assert capture.envelope() == "Exit code: 0"


# ------------------------------------------------------------------ killing the group


TREE = """#!/bin/sh
# A child that ignores SIGTERM, then the parent waits: both must die.
sh -c 'trap "" TERM; echo "$$" > "$0"; exec sleep 1000' "$FIFO" &
wait
"""


async def call_tool(tool: hr.SubprocessTool, sandbox: str, outcome: list[object]) -> None:
    """One call through a ToolHandler (deadline included), as an agent's gate makes it."""
    handler = hr.ToolHandler(tool, sandbox=sandbox)
    try:
        out = await handler.step(hr.Invoke("c1", {}))
        assert isinstance(out, hr.Finished)
        outcome.append(out.result)
    except hr.ToolError as exc:
        outcome.append(exc)


OUTLIVES_TERM = """#!/bin/sh
# A tree that outlives SIGTERM: the parent notes it and waits on; its child ignores it.
trap 'echo TERM >> "$LOG"' TERM
sh -c 'trap "" TERM; echo "$$" > "$0"; exec sleep 1000' "$FIFO" &
child=$!
while kill -0 "$child" 2> /dev/null; do wait "$child"; done
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_cancel_or_deadline_kills_the_tree_within_the_grace(
        tmp_path: Path, workspace: Path, how: str) -> None:
    # Unconfined (the pids and the FIFO in /tmp are the test's means, not the subject): the
    # group gets SIGTERM, a grace, then SIGKILL. Nothing in this tree ends on SIGTERM, so only
    # a SIGKILL sent within the reaping's bound (grace + a few seconds, shielded) ends it: a
    # kill that waited past the grace for something else (the deadline, the program) is cut
    # off by that bound and leaves the tree alive.
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    log = tmp_path / "signals"
    prog = script(tmp_path, "run", OUTLIVES_TERM)
    tool = hr.SubprocessTool("t", [str(prog)], OPEN, "T.",
                             env={"FIFO": str(fifo), "LOG": str(log)},
                             grace=1.0, timeout=60 if how == "cancel" else 2, cwd=workspace)
    pids: list[int] = []
    outcome: list[object] = []

    def read_pid() -> int:
        with open(fifo) as fh:  # blocks until the child has written: no sleeps
            return int(fh.readline())

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_tool, tool, "off", outcome)
            pids.append(await anyio.to_thread.run_sync(read_pid, abandon_on_cancel=True))
            if how == "cancel":
                tg.cancel_scope.cancel()
    try:
        assert await anyio.to_thread.run_sync(wait_gone, pids[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)
    # SIGTERM came first, while the program could still act on it (its grace).
    assert "TERM" in log.read_text().split()
    if how == "cancel":
        assert outcome == []  # the cancellation propagated
    else:
        (error,) = outcome
        assert isinstance(error, hr.ToolTimeout)
        assert error.disposition is hr.Disposition.IN_DOUBT


async def test_a_cancel_while_the_program_is_being_started_still_kills_its_tree(
        tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The spawn is awaited: a cancel landing there used to lose the started process (never
    # registered, never killed: a child ignoring SIGTERM ran on). Here the spawn is held open
    # until the test has cancelled, so the cancel always lands inside it.
    from handrail.host import _process

    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    prog = script(tmp_path, "run", TREE)
    cancelled = anyio.Event()
    real_open = _process.anyio.open_process

    async def slow_open(*args: Any, **kwargs: Any) -> Any:
        process = await real_open(*args, **kwargs)
        await cancelled.wait()  # returns at once if shielded from the cancel; else raises
        return process

    monkeypatch.setattr(_process.anyio, "open_process", slow_open)
    tool = hr.SubprocessTool("t", [str(prog)], OPEN, "T.", env={"FIFO": str(fifo)},
                             grace=1.0, timeout=60, cwd=workspace)
    pids: list[int] = []
    outcome: list[object] = []

    def read_pid() -> int:
        with open(fifo) as fh:
            return int(fh.readline())

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_tool, tool, "off", outcome)
            pids.append(await anyio.to_thread.run_sync(read_pid, abandon_on_cancel=True))
            tg.cancel_scope.cancel()
            cancelled.set()
    try:
        assert await anyio.to_thread.run_sync(wait_gone, pids[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)
    assert outcome == []


CONFINED_TREE = """#!/bin/sh
# A child that ignores SIGTERM says it is ready, then holds the FIFO open until it dies; the
# parent notes SIGTERM and waits on.
trap 'echo TERM >> signals' TERM
sh -c 'trap "" TERM; echo ready >&3; exec sleep 1000' 3> alive &
child=$!
while kill -0 "$child" 2> /dev/null; do wait "$child"; done
"""


async def read_fifo(fd: int) -> bytes:
    """The next bytes of a non-blocking FIFO; b"" once every writer is gone."""
    while True:
        await anyio.wait_readable(fd)
        try:
            return os.read(fd, 100)
        except BlockingIOError:
            continue


@needs_bwrap
@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_confined_a_cancel_or_deadline_kills_the_whole_tree(
        workspace: Path, how: str) -> None:
    # Inside bubblewrap the program's pids and /tmp are its own: the test sees the child
    # through a FIFO in the workspace, which reads EOF only once every writer is gone. The
    # tree outlives SIGTERM; bwrap does not, and the program dies with it, at once
    # (docs/sandbox.md: no grace in the sandbox).
    fifo = workspace / "alive"
    os.mkfifo(fifo)
    prog = script(workspace, "run", CONFINED_TREE)
    tool = hr.SubprocessTool("t", [str(prog)], OPEN, "T.", grace=1.0, cwd=workspace,
                             timeout=60 if how == "cancel" else 2)
    outcome: list[object] = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opens at once, no writer needed
    try:
        with anyio.fail_after(30):  # a child that survives fails the test, not hangs it
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_tool, tool, "auto", outcome)
                assert await read_fifo(fd) == b"ready\n"  # the child is running
                if how == "cancel":
                    tg.cancel_scope.cancel()
            assert await read_fifo(fd) == b""  # EOF: the child (immune to SIGTERM) is dead
    finally:
        os.close(fd)
    # Killed, not asked: the program (in a session of its own) never saw the SIGTERM.
    assert not (workspace / "signals").exists()
    if how == "cancel":
        assert outcome == []
    else:
        (error,) = outcome
        assert isinstance(error, hr.ToolTimeout)
        assert error.disposition is hr.Disposition.IN_DOUBT


# ------------------------------------------------------------------ through an agent


async def test_a_subprocess_tool_passes_the_policy_before_it_runs(tmp_path: Path,
                                                                  workspace: Path) -> None:
    marker = tmp_path / "ran"
    prog = script(tmp_path, "run", f"#!/bin/sh\ntouch {marker}\necho done\n")
    tool = hr.SubprocessTool("t", [str(prog)], OPEN, "T.")
    from handrail.models import Scripted, call, reply

    policy = hr.Policy.default().layer("app").deny(hr.Act.CALL, "local/t")
    agent = hr.Agent(Scripted([call("local/t", {}), reply("ok")]), [tool], policy=policy,
                     workspace=workspace)
    await agent.run("go")
    assert not marker.exists()


async def test_a_deadline_kill_is_reported_as_ours(tmp_path: Path) -> None:
    capture = ProcessCapture.new()
    with anyio.fail_after(60):
        await hr.host.run_process(["sleep", "1000"], capture, timeout=0.5, grace=1)
    assert capture.timed_out and capture.signal_ours, capture
    text = capture.envelope()
    assert "Killed after the 0.5s timeout" in text
    # Seen once under the full suite: something else in the test process reaped the child
    # first (asyncio then reports 255), so the signal's name is checked when it is known.
    if capture.exit_code != 255:
        assert (capture.exit_code, capture.signal) == (-signal.SIGTERM, "SIGTERM"), capture
        assert "Killed by signal SIGTERM (sent by handrail)" in text
