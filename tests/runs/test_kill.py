"""Kill tests with real processes: SIGKILL at each step boundary, then resume.

Nothing decided is lost and nothing is performed twice: the tool's side effect appends a line
to a file, and every scenario must end with each effect exactly once. Every scenario runs
against a SQLite file and against a real PostgreSQL database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import forks
import pytest

from handrail.store import Store

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("killable.py")
URLS: dict[Path, str] = {}


@pytest.fixture(params=["sqlite", "postgresql"], autouse=True)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Which store the scenario's processes share (its URL is looked up by `tmp_path`)."""
    url = (str(tmp_path / "runs.db") if request.param == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    URLS[tmp_path] = url
    return str(request.param)


def _read(tmp: Path, fn: Any) -> Any:
    async def main() -> Any:
        async with Store.open(URLS[tmp]) as store:
            return await fn(store)

    return anyio.run(main)


def drive(tmp: Path, *args: str, kill_at: str | None = None, ask: bool = False
          ) -> tuple[int, dict[str, Any]]:
    env = {"KILL_AT": kill_at or "", "ASK": "1" if ask else "0"}
    code, stdout, stderr = forks.shared().run(SCRIPT, [URLS[tmp], str(tmp / "effects"), *args],
                                         env, tmp)
    out = stdout.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {"stderr": stderr})


def effects(tmp: Path) -> list[int]:
    path = tmp / "effects"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def only_run(tmp: Path) -> str:
    async def get(store: Store) -> str:
        (run,) = await store.runs()
        return run.id

    return str(_read(tmp, get))


def finish(tmp: Path, run_id: str) -> dict[str, Any]:
    """Resume until done, deciding recoveries as an operator who looks at the world."""
    code, out = drive(tmp, "resume", run_id)
    for _ in range(6):
        assert code == 0, out
        if out["outcome"] != "awaiting_recovery":
            return out
        call_id = out["detail"]["call_id"]
        n = int(json.loads(_call_arguments(tmp, call_id))["n"])
        landed = n in effects(tmp)
        code, out = drive(tmp, "recover", call_id, f"effect {n} observed" if landed else "retry")
    raise AssertionError(out)


def _call_arguments(tmp: Path, record_id: str) -> str:
    async def get(store: Store) -> str:
        return (await store.call(record_id)).arguments

    return str(_read(tmp, get))


POINTS = [f"model:{n}" for n in range(4)] + [f"{w}:{n}" for n in range(3)
                                              for w in ("before", "after")]


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_a_step_boundary_then_resume_performs_each_effect_once(
        tmp_path: Path, point: str) -> None:
    code, _ = drive(tmp_path, "start", kill_at=point)
    assert code == -signal.SIGKILL
    out = finish(tmp_path, only_run(tmp_path))
    assert out["outcome"] == "completed", out
    assert sorted(effects(tmp_path)) == [0, 1, 2]


def test_an_uninterrupted_run_needs_no_resume(tmp_path: Path) -> None:
    code, out = drive(tmp_path, "start")
    assert (code, out["outcome"]) == (0, "completed")
    assert effects(tmp_path) == [0, 1, 2]


@pytest.mark.parametrize("point", ["before:0", "after:0", "model:1"])
def test_a_decided_approval_survives_a_kill_of_the_deciding_process(
        tmp_path: Path, point: str) -> None:
    code, out = drive(tmp_path, "start", ask=True)
    assert out["outcome"] == "awaiting_approval", out
    code, _ = drive(tmp_path, "decide", out["detail"]["request_id"], kill_at=point, ask=True)
    assert code == -signal.SIGKILL
    run_id = only_run(tmp_path)
    # The decision was committed before the kill: it is never asked again, never lost.
    request_id = out["detail"]["request_id"]
    item = _read(tmp_path, lambda store: store.pending_item(request_id))
    assert (item.kind, item.state) == ("approval", "decided")
    out = finish(tmp_path, run_id)
    # The later effects are asks too (ASK=1 for the deciding process only); the resumer
    # approves them, so the run completes with each effect exactly once.
    assert out["outcome"] == "completed", out
    assert sorted(effects(tmp_path)) == [0, 1, 2]


def test_two_processes_deciding_one_request_execute_it_once(tmp_path: Path) -> None:
    _, out = drive(tmp_path, "start", ask=True)
    request_id = out["detail"]["request_id"]
    env = {**os.environ, "KILL_AT": "", "ASK": "1"}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), URLS[tmp_path],
                               str(tmp_path / "effects"), "decide", request_id],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    errors = sorted(o.get("error", "") for o in outs)
    assert errors == ["", "AlreadyDecided"], outs
    assert effects(tmp_path) == [0]
