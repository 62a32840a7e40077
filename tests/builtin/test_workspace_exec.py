import os
import sys
import time
from pathlib import Path

import anyio
import pytest

import handrail as hr
from handrail.builtin._exec import EXEC_OUTPUT_LIMIT_BYTES
from handrail.tools import HandlerState

pytestmark = pytest.mark.anyio

PY = sys.executable


async def test_exec_returns_code_and_both_streams(call) -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = await call("exec", argv=[PY, "-c", script])
    assert not result.is_error  # a non-zero exit is information, not a tool failure
    assert result.structured["exit_code"] == 3
    assert result.structured["stdout"] == "out\n"
    assert result.structured["stderr"] == "err\n"
    assert result.structured["timed_out"] is False


async def test_exec_runs_in_the_workspace_with_empty_stdin(call, workspace: Path) -> None:
    script = "import os, sys; print(os.getcwd()); print(repr(sys.stdin.read()))"
    result = await call("exec", argv=[PY, "-c", script])
    cwd, stdin = result.structured["stdout"].splitlines()
    assert cwd == str(await anyio.Path(workspace).resolve())
    assert stdin == "''"


async def test_exec_does_not_pass_the_hosts_secrets(call, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    script = "import os; print(os.environ.get('OPENAI_API_KEY')); print('PATH' in os.environ)"
    result = await call("exec", argv=[PY, "-c", script])
    assert result.structured["stdout"].split() == ["None", "True"]


async def test_exec_argv_is_not_a_shell(call, workspace: Path) -> None:
    result = await call("exec", argv=[PY, "-c", "import sys; print(sys.argv[1:])", "$HOME; ls *"])
    assert result.structured["stdout"] == "['$HOME; ls *']\n"


# A program that must start before its timeout gets a generous one (an interpreter can take
# seconds to start on a loaded machine) and prints a marker once running: the marker in the
# output proves it was killed while running, not before it began.
STARTS_WITHIN = 4


async def test_exec_kills_the_program_at_its_timeout(call) -> None:
    result = await call("exec", argv=[PY, "-c", "import time; print('start', flush=True); "
                                     "time.sleep(3600)"], timeout=STARTS_WITHIN)
    # Killed at its timeout (said so), while running (its marker): a call that waited for
    # the program instead would outlast the test's own timeout (no clock asserted here).
    assert result.is_error
    assert result.structured["timed_out"] is True
    assert result.structured["exit_code"] != 0
    assert result.structured["stdout"] == "start\n"


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while not _gone_or_zombie(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
async def test_exec_is_not_held_by_a_child_holding_the_pipes(call, monkeypatch) -> None:
    # Outside bubblewrap (here the Landlock fallback, or nothing): the launcher is a
    # subreaper and kills what the program left behind when it ends, so the pipes close at
    # once, as in the sandbox's pid namespace (tests/sandbox/test_exec_sandbox.py).
    monkeypatch.setenv("HANDRAIL_BWRAP", "/nonexistent/bwrap")
    script = ("import subprocess, sys; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
              "print(p.pid, flush=True)")
    result = await call("exec", argv=[PY, "-c", script], timeout=STARTS_WITHIN)
    # Not held for the child's 30 s: held past its own timeout, the call would say timed_out.
    assert result.structured["timed_out"] is False
    assert result.structured["exit_code"] == 0  # the parent itself finished
    child = int(result.structured["stdout"])
    assert await anyio.to_thread.run_sync(_wait_gone, child)


async def test_exec_bounds_output(call) -> None:
    n = EXEC_OUTPUT_LIMIT_BYTES * 3
    script = f"import sys; sys.stdout.write('x' * {n}); sys.stderr.write('e')"
    result = await call("exec", argv=[PY, "-c", script])
    out = result.structured
    assert out["exit_code"] == 0
    assert out["stdout_truncated"] is True
    assert out["stderr_truncated"] is False
    half = EXEC_OUTPUT_LIMIT_BYTES // 2  # the first and the last half, one marker line
    assert out["stdout"].startswith("x" * half + "\n[stdout: ")
    assert out["stdout"].endswith("]\n" + "x" * half)
    assert f"{n} bytes" in out["stdout"]
    assert out["stderr"] == "e"


async def test_exec_missing_program(call) -> None:
    result = await call("exec", argv=["handrail-no-such-program-xyz"])
    assert result.is_error
    assert "not found" in result.render_text()


@pytest.mark.parametrize(
    "arguments",
    [
        {"argv": []},
        {"argv": "ls -la"},
        {"argv": [""]},
        {"argv": ["echo", "a\x00b"]},
        {"argv": ["true"], "timeout": 0},
        {"argv": ["true"], "timeout": 601},
    ],
    ids=["empty", "shell-string", "empty-program", "nul", "zero-timeout", "huge-timeout"],
)
async def test_exec_refuses_bad_arguments(box, workspace: Path, arguments) -> None:
    handler = box.handler("workspace/exec", workspace=workspace)
    with pytest.raises(hr.InvalidArguments):
        await handler.step(hr.Invoke("c", arguments))


def _wait_for_pids(pidfile: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while not pidfile.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the program never started")
        time.sleep(0.02)
    return [int(pid) for pid in pidfile.read_text().split()]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
async def test_exec_cancelled_from_outside_kills_the_program(box, workspace: Path,
                                                             monkeypatch) -> None:
    # Unconfined: the pids a sandboxed program sees are its own namespace's
    # (tests/sandbox/test_exec_sandbox.py checks the sandboxed program dies too).
    monkeypatch.setenv("HANDRAIL_BWRAP", "/nonexistent/bwrap")
    handler = box.handler("workspace/exec", workspace=workspace)
    pidfile = workspace / "pid"
    # The program starts a child of its own: cancelling must kill both.
    script = ("import os, subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
              "open('pid.tmp', 'w').write(f'{os.getpid()} {c.pid}'); "
              "os.replace('pid.tmp', 'pid'); time.sleep(30)")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(handler.step, hr.Invoke("c", {"argv": [PY, "-c", script]}))
            pids = await anyio.to_thread.run_sync(_wait_for_pids, pidfile)
            tg.cancel_scope.cancel()
    assert handler.state is HandlerState.FINISHED
    for pid in pids:
        assert await anyio.to_thread.run_sync(_wait_gone, pid)
