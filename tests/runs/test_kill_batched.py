"""SIGKILL in the middle of a group commit shared by 50 concurrent runs, then resume them all.

Group commit acknowledges a write only once the transaction holding it has committed. A kill
between a group's writes and its COMMIT loses the whole group, and so must lose nothing that
anyone was told about: every run resumes, and each of its effects happens exactly once (the
effects file counts them).
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections import Counter
from pathlib import Path

import forks
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("killable_many.py")
RUNS = 50


def drive(tmp: Path, *args: str, kill_at: int | None = None) -> tuple[int, str]:
    code, stdout, stderr = forks.shared().run(
        SCRIPT, [str(tmp / "runs.db"), str(tmp / "effects"), *args],
        {"KILL_AT": str(kill_at or "")}, tmp, timeout=300)
    return code, stdout.strip() or stderr


def effects(tmp: Path) -> Counter[str]:
    path = tmp / "effects"
    return Counter(path.read_text().split()) if path.exists() else Counter()


# Early (every run created, a turn in) and late (most of them two turns in): the operation at which
# the kill comes; each run writes ~8 times.
@pytest.mark.parametrize("at", [100, 250])
def test_a_kill_inside_a_batched_commit_of_50_runs_loses_and_doubles_nothing(
        tmp_path: Path, at: int) -> None:
    code, out = drive(tmp_path, "start", str(RUNS), kill_at=at)
    assert code == -signal.SIGKILL, out
    db = sqlite3.connect(tmp_path / "runs.db")
    rows = db.execute("SELECT status, task FROM runs").fetchall()
    db.close()
    # The kill came mid-way: runs had started, none had finished. A run whose creation was
    # in the lost group was never acknowledged, so it never ran anything either.
    assert rows and {status for status, _ in rows} == {"running"}, rows
    started = {int(task.rsplit(maxsplit=1)[-1]) for _, task in rows}
    assert {int(e.split(":")[0]) for e in effects(tmp_path)} <= started

    code, out = drive(tmp_path, "finish")
    assert code == 0, out
    outcomes = json.loads(out.splitlines()[-1])
    assert sorted(outcomes.values()) == ["completed"] * len(started), outcomes
    assert effects(tmp_path) == Counter({f"{k}:{n}": 1 for k in started for n in range(3)})


def test_fifty_runs_without_a_kill_complete_with_each_effect_once(tmp_path: Path) -> None:
    code, out = drive(tmp_path, "start", str(RUNS))
    assert code == 0, out
    assert sorted(json.loads(out.splitlines()[-1]).values()) == ["completed"] * RUNS
    assert effects(tmp_path) == Counter({f"{k}:{n}": 1 for k in range(RUNS) for n in range(3)})
