"""The collector setting for many runs on one loop: what it sets, and where handrail applies it.

It is process-wide, so every check runs in a fresh interpreter: the test session's own
collector stays as it comes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from handrail.cli import build_parser


def _probe(code: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    state: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return state


STATE = "json.dumps({'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count()})"


def test_tuning_freezes_start_up_and_makes_full_passes_rarer() -> None:
    state = _probe(f"""
        import gc, json
        import handrail
        from handrail.collector import FULL_PASS_EVERY, tune_for_many_runs
        young, middle, _ = gc.get_threshold()
        tune_for_many_runs()
        state = json.loads({STATE})
        state['expected'] = [young, middle, FULL_PASS_EVERY]
        print(json.dumps(state))
    """)
    assert state["threshold"] == state["expected"]
    assert state["frozen"] > 1000  # the imports


@pytest.mark.parametrize("command", ["serve", "worker", "inbox"])
def test_the_servers_are_marked_as_processes_of_many_runs(command: str) -> None:
    args = build_parser().parse_args([command])
    assert args.many_runs is True
    assert getattr(build_parser().parse_args(["runs"]), "many_runs", False) is False


def test_the_cli_tunes_only_a_process_it_was_started_as() -> None:
    # `handrail worker` as a program (argv from sys.argv) is tuned; `main([...])` called by
    # another program, or a reading command, leaves the collector alone.
    code = f"""
        import gc, json, sys
        import handrail.cli._worker as worker
        from handrail import cli
        def probe(args):
            print({STATE})
            return 0
        worker._cmd_worker = probe
        MODE
    """
    as_program = _probe(code.replace("MODE", "sys.argv = ['handrail', 'worker']; cli.main()"))
    assert as_program["threshold"][2] != 10 and as_program["frozen"] > 0
    called = _probe(code.replace("MODE", "cli.main(['worker'])"))
    assert called["threshold"][2] == 10 and called["frozen"] == 0


# The freeze handrail makes by itself at the first run of a process (issues 11 and 24): what
# start-up built leaves every collector pass; nothing is pinned that was garbage; a collector
# a host set up is left alone.

_RUN = """
import asyncio, gc, json, weakref
import handrail as hr
from handrail.models import Scripted, call, reply

@hr.tool(mutates=False)
async def add(a: int) -> int:
    return a + 1

agent = hr.Agent(Scripted([call("add", {"a": 1}), reply("done")]), [add])

def run():
    return asyncio.run(agent.run("add"))

def state(**extra):
    return json.dumps({'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count(),
                       **extra})
"""


def test_the_first_run_freezes_start_up_once_and_leaves_the_thresholds() -> None:
    state = _probe(_RUN + """
        before = gc.get_freeze_count()
        assert run().output == "done"
        first = gc.get_freeze_count()
        junk = [[object()] for _ in range(5000)]  # made after the first run
        assert run().output == "done"
        print(state(before=before, first=first))
    """.replace("\n        ", "\n"))
    assert state["before"] == 0
    assert state["first"] > 1000  # the imports, the agent, its tools
    # The second run froze nothing more (the count only drops, as frozen objects are freed).
    assert state["frozen"] <= state["first"]
    assert state["threshold"] == [700, 10, 10]


def test_nothing_that_was_garbage_is_pinned_by_the_freeze() -> None:
    state = _probe(_RUN + """
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.disable(); gc.enable()  # (no pass has run since the cycle was made)
        assert run().output == "done"
        print(state(alive=gone() is not None))
    """.replace("\n        ", "\n"))
    assert state["frozen"] > 1000
    assert state["alive"] is False


@pytest.mark.parametrize(("setup", "label"), [
    ("import handrail.collector; handrail.collector.leave_alone()", "leave_alone"),
    ("gc.disable()", "a disabled collector"),
    ("gc.set_threshold(1000, 10, 10)", "other thresholds"),
    ("gc.freeze(); host_frozen = gc.get_freeze_count()", "a host's own freeze"),
])
def test_a_collector_set_up_by_the_host_is_left_alone(setup: str, label: str) -> None:
    state = _probe(_RUN + f"""
        host_frozen = 0
        {setup}
        assert run().output == "done"
        print(state(host_frozen=host_frozen))
    """.replace("\n        ", "\n"))
    assert state["frozen"] == state["host_frozen"], label


_TIDY = """
import asyncio, gc, json
import handrail as hr
from handrail.models import Scripted, call, reply
@hr.tool(mutates=True)
async def tidy(a: int) -> int:
    return a
agent = hr.Agent(Scripted([call("tidy", {"a": 1}), reply("done")]), [tidy])
"""
"""A mutating tool the default policy asks about: a run pauses, to be resumed elsewhere."""


def test_a_process_whose_first_run_is_a_resume_freezes_too(tmp_path: Any) -> None:
    db = tmp_path / "runs.db"
    made = _probe(_TIDY + textwrap.dedent(f"""
        async def main():
            store = hr.Store.open({str(db)!r})
            result = await agent.run("tidy", store=store)
            await store.close()
            return result
        result = asyncio.run(main())
        print(json.dumps({{'run': result.run_id,
                          'outcome': type(result.outcome).__name__}}))
    """))
    assert made["outcome"] == "AwaitingApproval"
    state = _probe(_TIDY + textwrap.dedent(f"""
        async def main():
            store = hr.Store.open({str(db)!r})
            before = gc.get_freeze_count()
            await hr.resume(store, {made['run']!r}, agent=agent)
            await store.close()
            return before
        before = asyncio.run(main())
        print(json.dumps({{'before': before, 'frozen': gc.get_freeze_count()}}))
    """))
    assert state["before"] == 0
    assert state["frozen"] > 1000
