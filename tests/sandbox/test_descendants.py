"""Issue 33: "children included" covers every descendant, outside bubblewrap too.

The story: under `sandbox="off"` and the Landlock fallback, a program's child that called
`setsid()` left the program's process group, so the group kill at the deadline missed it,
and when the program ended by itself nothing killed it at all: it outlived its call (a
daemon holding a port, a miner, a loop writing into the workspace after the run ended).
Under bubblewrap the pid namespace ends with the program; elsewhere the launcher is a
subreaper that keeps every descendant below it and kills them (docs/sandbox.md).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.sandbox import _landlock

pytestmark = pytest.mark.anyio

PY = sys.executable

# The program: a child in a session of its own, whose child (a double fork, the daemon's
# way) writes its pid and sleeps with its output away from our pipes; the program waits
# for that pid, then exits at once or outlives its deadline (ignoring SIGTERM, as the daemon
# does: the grace period passes, and the final kill must reach the daemon before the
# launcher that holds it is gone).
PROGRAM = r"""
import os, signal, sys, time
pidfile, then = sys.argv[1], sys.argv[2]
if then == "linger":  # deaf to SIGTERM, the daemon too: only SIGKILL ends them
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        with open(pidfile + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(120)
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
print("daemon", open(pidfile).read(), flush=True)
if then == "linger":
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def daemons() -> Iterator[list[int]]:
    """Pids to kill after the test, should one have survived (no test leaves a process)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


MODES = [
    pytest.param("off", id="sandbox-off"),
    pytest.param("nothing", id="auto-with-no-mechanism"),
    pytest.param("landlock", id="landlock-fallback",
                 marks=pytest.mark.skipif(_landlock.abi() < 1, reason="needs Landlock")),
]


def no_bubblewrap(ws: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode in ("landlock", "nothing"):
        monkeypatch.setenv("HANDRAIL_BWRAP", str(ws / "no-such-bwrap"))
    if mode == "nothing":
        monkeypatch.setattr(_landlock, "abi", lambda: 0)


async def run(ws: Path, mode: str, then: str, deadline: float,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    no_bubblewrap(ws, mode, monkeypatch)
    box = hr.Toolbox(hr.builtin.workspace_tools())
    handler = box.handler("workspace/exec", workspace=ws,
                          sandbox="off" if mode == "off" else "auto")
    argv = [PY, "-c", PROGRAM, str(ws / "daemon.pid"), then]
    with anyio.fail_after(60):
        out = await handler.step(hr.Invoke("c", {"argv": argv, "timeout": deadline}))
    assert isinstance(out, hr.Finished), out
    structured: dict[str, Any] = out.result.structured
    return structured


@pytest.mark.parametrize("mode", MODES)
async def test_a_setsid_daemon_dies_when_the_program_ends(
        ws: Path, mode: str, daemons: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    out = await run(ws, mode, "exit", 60, monkeypatch)
    daemon = int((ws / "daemon.pid").read_text())
    daemons.append(daemon)
    assert out["exit_code"] == 0 and out["timed_out"] is False, out
    assert out["stdout"] == f"daemon {daemon}\n"
    assert await anyio.to_thread.run_sync(_gone_within, daemon, 10.0)
    assert out["sandbox"]["descendants"].startswith("reaped")
    assert out["sandbox"]["mechanism"] == ("landlock" if mode == "landlock" else "none")


@pytest.mark.parametrize("mode", MODES)
async def test_a_setsid_daemon_dies_with_a_program_past_its_deadline(
        ws: Path, mode: str, daemons: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole grace passes (the program and its daemon ignore SIGTERM); its length is not
    # what this checks, only that the SIGKILL after it reaches the daemon: half a second, not
    # the default five.
    from handrail.builtin import _exec

    monkeypatch.setattr(_exec, "run_process", functools.partial(_exec.run_process, grace=0.5))
    out = await run(ws, mode, "linger", 5, monkeypatch)
    daemon = int((ws / "daemon.pid").read_text())
    daemons.append(daemon)
    assert out["timed_out"] is True, out
    assert await anyio.to_thread.run_sync(_gone_within, daemon, 10.0)


@pytest.mark.parametrize("mode", MODES)
async def test_the_launcher_keeps_the_programs_exit(
        ws: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    no_bubblewrap(ws, mode, monkeypatch)
    box = hr.Toolbox(hr.builtin.workspace_tools())
    sandbox = "off" if mode == "off" else "auto"
    for argv, code in (([PY, "-c", "raise SystemExit(7)"], 7),
                       (["sh", "-c", "kill -TERM $$"], -signal.SIGTERM)):
        handler = box.handler("workspace/exec", workspace=ws, sandbox=sandbox)
        out = await handler.step(hr.Invoke("c", {"argv": argv}))
        assert isinstance(out, hr.Finished)
        assert out.result.structured["exit_code"] == code, out.result.structured
