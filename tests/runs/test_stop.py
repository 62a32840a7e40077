"""A clean stop (issue 19): `run.cancel()` and Ctrl-C settle every call of the turn.

Every call of the interrupted turn gets exactly one result ("interrupted"; not sent, or in
doubt for a call whose body had started), so the history never holds a call without a result;
a call in doubt goes to an operator's recovery on resume, and its result is then rewritten in
place.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, calls, reply

pytestmark = pytest.mark.anyio

STARTED: dict[str, anyio.Event] = {}
RELEASE: list[anyio.Event] = []


def _started(name: str) -> anyio.Event:
    return STARTED.setdefault(name, anyio.Event())


@hr.tool(server="t", mutates=False)
async def quick() -> str:
    """Answers at once."""
    return "quick"


@hr.tool(server="t", mutates=False)
async def slow_a() -> str:
    """Blocks until released."""
    _started("slow_a").set()
    await RELEASE[0].wait()
    return "a"


@hr.tool(server="t", mutates=False)
async def slow_b() -> str:
    """Blocks until released."""
    _started("slow_b").set()
    await RELEASE[0].wait()
    return "b"


WRITES: list[str] = []


@hr.tool(server="t")
async def write(text: str) -> str:
    """A mutating call: runs after every call before it in the turn."""
    WRITES.append(text)
    return "written"


@pytest.fixture(autouse=True)
def _reset() -> None:
    STARTED.clear()
    RELEASE[:] = [anyio.Event()]
    WRITES.clear()


POLICY = hr.Policy.default().layer("app").allow("call", "t/*")
TOOLS = [quick, slow_a, slow_b, write]


def agent(turns: list[Any]) -> hr.Agent:
    return hr.Agent(Scripted(turns), TOOLS, policy=POLICY)


def seen(into: list[list[ToolResultMessage]]) -> Any:
    def turn(messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        into.append([m for m in messages if isinstance(m, ToolResultMessage)])
        return reply("done")

    return turn


async def cancel_when_started(run: hr.RunHandle, *names: str) -> None:
    with anyio.fail_after(30):
        for name in names:
            await _started(name).wait()
    run.cancel()


async def stopped(turns: list[Any], store: hr.Store, *names: str) -> hr.RunResult:
    run = agent(turns).start("go", store=store)
    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_when_started, run, *names)
        with anyio.fail_after(60):
            result = await run.result()
    return result


def results_after_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = max(i for i, m in enumerate(messages) if m.get("kind") == "assistant"
               and any(p.get("kind") == "tool_call" for p in m.get("parts", ())))
    return messages[last + 1:]


THREE = calls([("t/quick", {}), ("t/slow_a", {}), ("t/slow_b", {})])


async def test_a_cancel_amid_three_parallel_calls_leaves_exactly_three_results(
        tmp_path: Path) -> None:
    async with hr.Store.open(tmp_path / "runs.db") as store:
        result = await stopped([THREE, reply("never")], store, "slow_a", "slow_b")
        assert result.outcome == hr.Cancelled("cancelled by the caller")
        stored = await store.messages(result.run_id)
        after = results_after_calls(stored)
        assert len(after) == 3
        assert [m["call_id"] for m in after] == ["call_0_0", "call_0_1", "call_0_2"]
        records = {r.call_id: r for r in await store.calls(result.run_id)}
        assert records["call_0_0"].status is hr.CallStatus.FINISHED
        for cid in ("call_0_1", "call_0_2"):
            assert records[cid].status is hr.CallStatus.IN_DOUBT
            assert records[cid].disposition == "in_doubt"
            assert records[cid].result is not None and records[cid].result["is_error"]
            assert "may or may not" in str(records[cid].result)
        assert (await store.run(result.run_id)).status is hr.RunStatus.CANCELLED


async def test_calls_not_yet_started_are_settled_not_sent(tmp_path: Path) -> None:
    # The mutating write waits for the read before it; the read after it waits for it.
    turn = calls([("t/slow_a", {}), ("t/write", {"text": "x"}), ("t/quick", {})])
    async with hr.Store.open(tmp_path / "runs.db") as store:
        result = await stopped([turn, reply("never")], store, "slow_a")
        assert isinstance(result.outcome, hr.Cancelled)
        after = results_after_calls(await store.messages(result.run_id))
        assert len(after) == 3
        records = {r.call_id: r for r in await store.calls(result.run_id)}
        assert records["call_0_0"].status is hr.CallStatus.IN_DOUBT
        for cid in ("call_0_1", "call_0_2"):
            assert records[cid].status is hr.CallStatus.REFUSED
            assert records[cid].disposition == "not_sent"
            assert records[cid].error == "interrupted before it ran"
        assert WRITES == []


async def test_a_resumed_cancelled_turn_sends_in_doubt_calls_to_recovery(
        tmp_path: Path) -> None:
    got: list[list[ToolResultMessage]] = []
    async with hr.Store.open(tmp_path / "runs.db") as store:
        result = await stopped([THREE, seen(got)], store, "slow_a", "slow_b")
        first = await hr.resume(store, result.run_id, agent=agent([THREE, seen(got)]))
        assert first.outcome == hr.AwaitingRecovery(f"{result.run_id}:call_0_1")
        second = await hr.resume_with_recovery(
            store, first.outcome.call_id, hr.Recovery.completed("a was seen done"),
            agent=agent([THREE, seen(got)]))
        assert second.outcome == hr.AwaitingRecovery(f"{result.run_id}:call_0_2")
        done = await hr.resume_with_recovery(store, second.outcome.call_id,
                                             hr.Recovery.abort(),
                                             agent=agent([THREE, seen(got)]))
        assert done.outcome == hr.Completed("done")
        stored = await store.messages(result.run_id)
    # The model saw one result per call; the recovered ones replaced "interrupted".
    (shown,) = got
    assert [m.call_id for m in shown] == ["call_0_0", "call_0_1", "call_0_2"]
    assert shown[1].result.render_text() == "a was seen done"
    assert "aborted" in shown[2].result.render_text()
    tool_messages = [m for m in stored if m.get("kind") == "tool_result"]
    assert len(tool_messages) == 3


async def test_cancel_before_the_run_starts() -> None:
    run = agent([THREE, reply("x")]).start("go", store=hr.Store.memory())
    run.cancel()
    assert run.cancelled
    result = await run.result()
    assert isinstance(result.outcome, hr.Cancelled)
    with pytest.raises(hr.UserError, match="runs once"):
        await run.result()


async def test_an_error_is_not_a_stop() -> None:
    # A failure that is not a stop leaves the turn for resume (the calls are not settled).
    boom = hr.CallbackApprover(lambda r: (_ for _ in ()).throw(RuntimeError("approver bug")))
    ask = hr.Policy.default().layer("app").ask("call", "t/write")
    store = hr.Store.memory()
    a = hr.Agent(Scripted([call("t/write", {"text": "x"}), reply("done")]), TOOLS, policy=ask)
    with pytest.raises(RuntimeError, match="approver bug"):
        await a.run("go", store=store, approver=boom)
    (run,) = await store.runs()
    assert [r.status for r in await store.calls(run.id)] == []  # nothing settled
    done = await hr.resume(store, run.id, agent=a, approver=hr.ApproveAll())
    assert done.outcome == hr.Completed("done") and WRITES == ["x"]


def _as_in_a_terminal() -> None:
    """In the child, before exec: SIGINT as a terminal's process has it (the default).

    A test run started in the background (`./scripts/test &`, nohup) ignores SIGINT and its
    children inherit that; Python then leaves it ignored, and so does handrail (rightly), so a
    Ctrl-C sent to the script would never arrive and the test would wait out its timeout.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SIGINT_SCRIPT = """
import anyio, sys
from pathlib import Path
import handrail as hr
from handrail.models import Scripted, calls, reply

here = Path(sys.argv[1])

def blocker(name):
    @hr.tool(server="t", name=name, mutates=False)
    async def block() -> str:
        "Blocks."
        print(name, flush=True)  # the test waits for both lines, then presses Ctrl-C
        await anyio.sleep_forever()
        return name
    return block

@hr.tool(server="t", mutates=False)
async def quick() -> str:
    "Quick."
    return "quick"

agent = hr.Agent(Scripted([calls([("t/quick", {}), ("t/a", {}), ("t/b", {})]), reply("x")]),
                 [quick, blocker("a"), blocker("b")],
                 policy=hr.Policy.default().layer("app").allow("call", "t/*"))

async def main():
    async with hr.Store.open(here / "runs.db") as store:
        await agent.run("go", store=store)

try:
    anyio.run(main)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.slow
def test_ctrl_c_in_another_process_settles_the_turn(tmp_path: Path) -> None:
    (tmp_path / "agent_script.py").write_text(SIGINT_SCRIPT)
    process = subprocess.Popen([sys.executable, str(tmp_path / "agent_script.py"),
                                str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal)
    try:
        assert process.stdout is not None
        started = {process.stdout.readline().strip(), process.stdout.readline().strip()}
        assert started == {"a", "b"}
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=240)  # generous: a loaded machine
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()  # reaped: never a zombie left for the session's end
    assert process.returncode == 130, err

    async def check() -> None:
        async with hr.Store.open(tmp_path / "runs.db") as store:
            (run,) = await store.runs()
            assert run.status is hr.RunStatus.READY
            after = results_after_calls(await store.messages(run.id))
            assert len(after) == 3
            statuses = sorted(r.status.value for r in await store.calls(run.id))
            assert statuses == ["finished", "in_doubt", "in_doubt"]

    anyio.run(check)


CONTROL_SIGINT_SCRIPT = """
import anyio, sys
from pathlib import Path
import handrail as hr
from handrail.models import Scripted, call, reply

here = Path(sys.argv[1])

@hr.tool(server="t", mutates=False)
async def quick() -> str:
    "Quick."
    return "quick"

hang = "sleep 300 & echo $! $$ > " + str(here / "fifo") + "; exec sleep 300"
agent = hr.Agent(Scripted([call("t/quick", {}), reply("x")]), [quick],
                 policy=hr.Policy.default().layer("app").allow("call", "t/*"),
                 control=hr.CommandControl(["sh", "-c", hang], timeout=300))

async def main():
    async with hr.Store.open(here / "runs.db") as store:
        await agent.run("go", store=store)

try:
    anyio.run(main)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_ctrl_c_while_the_control_runs_kills_its_process_group(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "agent_script.py").write_text(CONTROL_SIGINT_SCRIPT)
    process = subprocess.Popen([sys.executable, str(tmp_path / "agent_script.py"),
                                str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal)
    try:
        # Opening the FIFO waits for the control to write to it: no polling.
        with open(tmp_path / "fifo") as fifo:
            pids = [int(p) for p in fifo.read().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=240)  # generous: a loaded machine
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()  # reaped: never a zombie left for the session's end
    assert process.returncode == 130, err
    assert not any(_alive(p) for p in pids)

    async def check() -> None:
        async with hr.Store.open(tmp_path / "runs.db") as store:
            (run,) = await store.runs()
            assert run.status is hr.RunStatus.READY
            # Stopped while planning: nothing of the turn was recorded, nothing unanswered.
            assert await store.calls(run.id) == []
            kinds = [m["kind"] for m in await store.messages(run.id)]
            assert kinds == ["user"]

    anyio.run(check)


SECOND_SIGINT_SCRIPT = """
import anyio, signal, sys
from pathlib import Path
import handrail as hr
from handrail.models import Scripted, call, reply

# As in a terminal, whatever the test runner was started with (a background job ignores it).
signal.signal(signal.SIGINT, signal.default_int_handler)
here = Path(sys.argv[1])
# The program survives SIGTERM (it says so through a FIFO) and would outlive a grace period of
# 600 s; its pid goes to another FIFO once its handler is in place.
stubborn = (
    "import os, signal\\n"
    "def term(*_):\\n"
    "    with open(" + repr(str(here / "term")) + ", 'w') as f: f.write('term')\\n"
    "signal.signal(signal.SIGTERM, term)\\n"
    "with open(" + repr(str(here / "fifo")) + ", 'w') as f: f.write(str(os.getpid()))\\n"
    "while True: signal.pause()\\n")
tool = hr.SubprocessTool("stubborn", [sys.executable, "-c", stubborn], {"type": "object"}, "Hangs.",
                         server="t", grace=600, mutates=False)
# Unconfined: its FIFOs are in /tmp, which a confined program sees private and empty.
agent = hr.Agent(Scripted([call("t/stubborn", {}), reply("x")]), [tool],
                 policy=hr.Policy.default().layer("app").allow("call", "t/*"), sandbox="off")

async def main():
    async with hr.Store.open(here / "runs.db") as store:
        await agent.run("go", store=store)

try:
    anyio.run(main)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.slow
def test_a_second_ctrl_c_kills_the_programs_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.mkfifo(tmp_path / "term")
    (tmp_path / "agent_script.py").write_text(SECOND_SIGINT_SCRIPT)
    process = subprocess.Popen([sys.executable, str(tmp_path / "agent_script.py"),
                                str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal)
    pid = None
    try:
        with open(tmp_path / "fifo") as fifo:  # waits for the program to start: no polling
            pid = int(fifo.read())
        assert _alive(pid)
        process.send_signal(signal.SIGINT)
        # The first Ctrl-C: the turn is settled, the program got SIGTERM and its grace period.
        with open(tmp_path / "term") as term:
            assert term.read(4) == "term"  # (the leader gets it twice: group and pid)
        assert process.poll() is None and _alive(pid)
        process.send_signal(signal.SIGINT)
        # The second: its group is killed at once, not after the 600 s grace period.
        _, err = process.communicate(timeout=240)  # generous: a loaded machine
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()  # reaped: never a zombie left for the session's end
        if pid is not None and _alive(pid):
            os.killpg(pid, signal.SIGKILL)
            pytest.fail("the second Ctrl-C left the program running")
    assert process.returncode == 130, err
