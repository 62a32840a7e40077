"""A tree of agents is one durable thing: paused deep inside in one process, resumed from its
root in another, each effect exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
from trees import effects_of

import handrail as hr

HERE = Path(__file__).parent
SCRIPT = HERE / "tree_process.py"


def _proc(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
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
