"""`handrail worker` (PostgreSQL) continues a tree whose grandchild's approval was decided
elsewhere: it takes the decided child's run, and the tree continues from its root, once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from trees import effects_of, worker_tree

import handrail as hr

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
HANDRAIL = [sys.executable, "-m", "handrail.cli"]


def test_a_worker_continues_a_tree_decided_without_resume(tmp_path: Path, pg_url: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    effects = str(tmp_path / "effects")
    monkeypatch.setenv("TREE_EFFECTS", effects)
    env = {**os.environ, "PYTHONPATH": str(HERE), "TREE_EFFECTS": effects}
    env.pop("HANDRAIL_STORE", None)

    async def start() -> hr.RunResult:
        async with hr.Store.open(pg_url) as store:
            return await worker_tree().run("go", store=store)

    paused = anyio.run(start)
    assert isinstance(paused.outcome, hr.AwaitingApproval)
    decided = subprocess.run([*HANDRAIL, "approve", paused.outcome.request_id, "--no-resume",
                              "--store", pg_url], cwd=HERE, capture_output=True, text=True,
                             env=env, timeout=120)
    assert decided.returncode == 0, decided.stderr
    assert effects_of(effects) == []

    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([*HANDRAIL, "worker", "--store", pg_url, "--poll", "1",
                                   "--grace", "20"], cwd=HERE, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        async def settled() -> hr.RunRecord:
            async with hr.Store.open(pg_url) as store:
                # Generous: on a loaded machine the worker's start alone takes many seconds
                # (the per-test timeout is above this, so a failure says what ran out).
                deadline = time.monotonic() + 240
                while True:
                    root = await store.run(paused.run_id)
                    if root.status is hr.RunStatus.COMPLETED or time.monotonic() > deadline:
                        return root
                    await anyio.sleep(0.2)

        root = anyio.run(settled)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert root.status is hr.RunStatus.COMPLETED, log.read_text()
    assert (root.outcome or {}).get("output") == "effect 3 done"
    assert effects_of(effects) == ["effect 3"]

    async def runs() -> list[hr.RunRecord]:
        async with hr.Store.open(pg_url) as store:
            return await store.runs()

    assert sorted((r.agent, r.status.value) for r in anyio.run(runs)) == [
        ("coder", "completed"), ("planner", "completed"), ("tester", "completed")]
    lines = [json.loads(t) for t in log.read_text().splitlines() if t.startswith("{")]
    assert any(e.get("event") == "run_resumed" and e.get("outcome") == "completed"
               for e in lines), lines
