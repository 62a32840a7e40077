"""A tree of agents is one durable thing: paused deep inside in one process, resumed from its
root in another, each effect exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
from trees import effects_of

import handrail as hr

HERE = Path(__file__).parent
SCRIPT = HERE / "tree_process.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}


def _proc(*args: str) -> dict[str, Any]:
    env = _env()
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_grandchilds_deferral_across_a_process_exit_resumes_the_tree_exactly_once(
        tmp_path: Path) -> None:
    db, effects = str(tmp_path / "runs.db"), str(tmp_path / "effects")
    started = _proc(db, effects, "start")
    assert started["outcome"] == "awaiting_approval"
    request_id = started["detail"]["request_id"]
    assert effects_of(effects) == []

    decided = _proc(db, effects, "decide", request_id)
    assert decided["pid"] != started["pid"]
    assert decided["run_id"] == started["run_id"]
    assert decided["outcome"] == "completed"
    assert decided["detail"]["output"] == "effect 3 done"
    assert effects_of(effects) == ["effect 3"]

    again = _proc(db, effects, "decide", request_id)
    assert again["error"].startswith("already decided")
    assert effects_of(effects) == ["effect 3"]

    async def runs() -> list[hr.RunRecord]:
        async with hr.Store.open(db) as store:
            return await store.runs()

    found = anyio.run(runs)
    assert sorted((r.agent, r.depth, r.status.value) for r in found) == [
        ("coder", 1, "completed"), ("planner", 0, "completed"), ("tester", 2, "completed")]
    by_agent = {r.agent: r for r in found}
    assert by_agent["tester"].parent_id == by_agent["coder"].id
    assert by_agent["coder"].parent_id == by_agent["planner"].id == started["run_id"]


def test_a_crash_mid_child_sends_its_call_to_recovery_and_never_re_runs_the_delegation(
        tmp_path: Path) -> None:
    db, effects = str(tmp_path / "runs.db"), str(tmp_path / "effects")
    crashed = subprocess.run([sys.executable, str(SCRIPT), db, effects, "crash"], env=_env(),
                             capture_output=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert effects_of(effects) == ["slow"]

    async def root_id() -> str:
        async with hr.Store.open(db) as store:
            (root,) = [r for r in await store.runs() if r.depth == 0]
            return root.id

    run_id = anyio.run(root_id)
    resumed = _proc(db, effects, "resume", run_id)
    assert resumed["run_id"] == run_id
    assert resumed["outcome"] == "awaiting_recovery"  # the child's call, in doubt
    call_id = resumed["detail"]["call_id"]
    assert effects_of(effects) == ["slow"]  # neither the call nor the delegation re-ran

    done = _proc(db, effects, "recover", call_id)
    assert done["outcome"] == "completed" and done["detail"]["output"] == "it ran once"
    assert effects_of(effects) == ["slow"]

    async def runs() -> list[hr.RunRecord]:
        async with hr.Store.open(db) as store:
            return await store.runs()

    found = anyio.run(runs)
    assert sorted((r.agent, r.status.value) for r in found) == [
        ("planner", "completed"), ("worker", "completed")]
    (worker,) = [r for r in found if r.agent == "worker"]
    assert call_id.startswith(worker.id + ":")
