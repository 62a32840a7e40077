"""A turn of reads is committed once, with its results; a turn that changes the world, twice.

A decision and a call's STARTED mark are committed before the side effect they allow. A call
to a tool that changes nothing (`mutates=False`) allows none, so a turn made only of such
calls (or of refusals) is committed in one transaction, with its results, before the model
is shown them: the assistant message, the run's counters and the finished records together.
A crash before that commit leaves the run at the end of the previous turn (the model is asked
again). Any mutating call in the turn keeps the two commits.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import anyio
import forks
import pytest

import handrail as hr
from handrail.models import Scripted, call, calls, reply
from handrail.store import Store

pytestmark = pytest.mark.anyio


def _status(path: Path, record_suffix: str) -> str | None:
    """The newest stored status of the call whose record id ends with `record_suffix`."""
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT c14 FROM log WHERE kind = 1 AND c0 LIKE ? ORDER BY id DESC "
                         "LIMIT 1", (f"%:{record_suffix}",)).fetchone()
        if row is None:
            row = db.execute("SELECT status FROM calls WHERE id LIKE ?",
                             (f"%:{record_suffix}",)).fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


async def test_a_read_runs_before_its_turn_is_committed_a_write_after(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    seen: dict[str, str | None] = {}

    @hr.tool(mutates=False)
    async def peek(n: int) -> int:
        """Read."""
        seen[f"peek {n}"] = _status(path, f"call_{n}_0")
        return n

    @hr.tool
    async def change(n: int) -> int:
        """Write."""
        seen[f"change {n}"] = _status(path, f"call_{n}_0")
        return n

    turns = [call("peek", {"n": 0}), call("change", {"n": 1}), call("peek", {"n": 2}),
             reply("ok")]
    agent = hr.Agent(Scripted(turns), [peek, change],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/change"))
    async with hr.Store.open(path) as store:
        result = await agent.run("go", store=store)
        assert result.output == "ok", result.outcome
        records = await store.calls(result.run_id)
        messages = await store.messages(result.run_id)
    # The reads ran with nothing of their turn stored; the write only once it was STARTED.
    assert seen == {"peek 0": None, "change 1": "started", "peek 2": None}
    assert [c.status.value for c in records] == ["finished"] * 3
    assert [m["kind"] for m in messages] == ["user", "assistant", "tool_result", "assistant",
                                             "tool_result", "assistant", "tool_result",
                                             "assistant"]


async def test_a_turn_mixing_a_read_and_a_write_commits_both_marks_first(tmp_path: Path
                                                                         ) -> None:
    path = tmp_path / "runs.db"
    seen: dict[str, str | None] = {}

    @hr.tool(mutates=False)
    async def peek(n: int) -> int:
        """Read."""
        seen["peek"] = _status(path, "call_0_0")
        return n

    @hr.tool
    async def change(n: int) -> int:
        """Write."""
        seen["change"] = _status(path, "call_0_1")
        return n

    turns = [calls([("peek", {"n": 0}), ("change", {"n": 1})]), reply("ok")]
    agent = hr.Agent(Scripted(turns), [peek, change],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/change"))
    async with hr.Store.open(path) as store:
        result = await agent.run("go", store=store)
    assert result.output == "ok", result.outcome
    assert seen == {"peek": "started", "change": "started"}


SCRIPT = Path(__file__).with_name("readable.py")


def _drive(tmp: Path, *args: str, kill_at: str = "") -> tuple[int, dict[str, str]]:
    code, stdout, stderr = forks.shared().run(
        SCRIPT, [str(tmp / "runs.db"), str(tmp / "effects"), *args], {"KILL_AT": kill_at},
        tmp)
    out = stdout.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {"stderr": stderr})


@pytest.mark.slow
def test_a_kill_inside_a_read_resumes_from_the_turn_before(tmp_path: Path) -> None:
    code, _ = _drive(tmp_path, "start", kill_at="look:1")
    assert code == -signal.SIGKILL

    async def inspect() -> tuple[str, list[str], list[str]]:
        async with Store.open(tmp_path / "runs.db") as store:
            (run,) = await store.runs()
            calls = await store.calls(run.id)
            messages = await store.messages(run.id)
            return run.id, [f"{c.call_id} {c.status.value}" for c in calls], \
                [m["kind"] for m in messages]

    run_id, calls, kinds = anyio.run(inspect)
    # Nothing of the read's turn was stored: the run stands at the end of turn 0.
    assert calls == ["call_0_0 finished"]
    assert kinds == ["user", "assistant", "tool_result"]
    code, out = _drive(tmp_path, "resume", run_id)
    assert (code, out["outcome"]) == (0, "completed"), out
    lines = (tmp_path / "effects").read_text().splitlines()
    # Each change exactly once; the read, which changes nothing, again.
    assert lines == ["effect 0", "look 1", "look 1", "effect 2"]
    _, calls, kinds = anyio.run(inspect)
    assert calls == ["call_0_0 finished", "call_1_0 finished", "call_2_0 finished"]
    assert kinds == ["user"] + ["assistant", "tool_result"] * 3 + ["assistant"]


async def test_what_a_turn_changed_of_the_run_is_committed_with_its_results(tmp_path: Path
                                                                            ) -> None:
    # The results write leaves the run's row alone when the turn changed nothing of it but
    # its times; an event a tool recorded is a change, committed before the model is asked.
    path = tmp_path / "runs.db"
    stored: list[list[str]] = []

    @hr.tool
    async def change(ctx: hr.CallContext, n: int) -> int:
        """Write, and keep an event."""
        await ctx.record_event("restarted", n=n)
        return n

    def ask(text: str) -> object:
        def make(messages: object, tools: object) -> object:
            db = sqlite3.connect(path)
            try:
                (events,) = db.execute("SELECT events FROM runs").fetchone()
            finally:
                db.close()
            stored.append([e["kind"] for e in json.loads(events)])
            return call("change", {"n": 0}) if text == "call" else reply(text)

        return make

    agent = hr.Agent(Scripted([ask("call"), ask("ok")]), [change],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/change"))
    async with hr.Store.open(path) as store:
        result = await agent.run("go", store=store)
    assert result.output == "ok", result.outcome
    assert stored[-1] == ["governance", "restarted"]  # the run's own, first


async def test_a_turn_that_changed_nothing_of_the_run_leaves_its_row_alone() -> None:
    """Issue 38: the run's mark taken by its update (written out there) and the one a turn
    compares with agree: a changing call's turn that recorded nothing writes its results
    without the run, and one that recorded an event writes the run with them."""
    writes: list[tuple[bool, int]] = []  # (the run in the write, its call records)
    store = hr.Store.memory()
    write = store.write

    async def spy(batch: hr.store.Batch, *, wait: bool = True) -> None:
        writes.append((batch.run is not None, len(batch.calls)))
        await write(batch, wait=wait)

    store.write = spy  # type: ignore[method-assign]

    @hr.tool
    async def change(ctx: hr.CallContext, n: int) -> int:
        """Write; keep an event when asked."""
        if n:
            await ctx.record_event("restarted", n=n)
        return n

    agent = hr.Agent(Scripted([call("change", {"n": 0}), call("change", {"n": 1}),
                               reply("ok")]), [change],
                     policy=hr.Policy.default().layer("app").allow(hr.Act.CALL, "local/change"))
    result = await agent.run("go", store=store)
    assert result.output == "ok", result.outcome
    # Each turn: its STARTED mark with the run's counters, then its results; the last, the end.
    first_turn, second_turn = writes[1:3], writes[3:5]
    assert first_turn == [(True, 1), (False, 1)], writes  # nothing of the run changed
    assert second_turn == [(True, 1), (True, 1)], writes  # an event recorded: the run too
    run = await store.run(result.run_id)
    assert [e["kind"] for e in run.events if e["kind"] == "restarted"] == ["restarted"]
