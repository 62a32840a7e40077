"""A turn's results are committed before the model is shown them.

The story: the loop used to queue a turn's results write without waiting for it, so the next
model request (a message to a third party) could carry results that a crash would then take
back. Now the results transaction commits first. The model here looks at the database file
itself, with a plain SQLite connection, at the instant it is asked (before anything else can
run), and finds every earlier call FINISHED.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import handrail as hr
from handrail.models import ModelResponse, ModelSettings, Scripted, call, reply
from handrail.tools import ToolSpec

pytestmark = pytest.mark.anyio


@hr.tool(mutates=False)
async def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def _status(db: sqlite3.Connection, record_id: str) -> str | None:
    # The newest record of the call: in the append-only log if not folded yet, else the table.
    row = db.execute("SELECT c14 FROM log WHERE kind = 1 AND c0 = ? ORDER BY id DESC LIMIT 1",
                     (record_id,)).fetchone()
    if row is None:
        row = db.execute("SELECT status FROM calls WHERE id = ?", (record_id,)).fetchone()
    return None if row is None else str(row[0])


class _Inspecting:
    """A scripted model that first checks the file for the calls it is about to be shown."""

    def __init__(self, path: Path, turns: list[Any]) -> None:
        self.inner = Scripted(turns)
        self.path = path
        self.seen: list[list[str | None]] = []

    @property
    def name(self) -> str:
        return "inspecting"

    async def request(self, messages: Sequence[Any], tools: Sequence[ToolSpec],
                      settings: ModelSettings | None = None) -> ModelResponse:
        db = sqlite3.connect(self.path)
        try:
            run_id = db.execute("SELECT id FROM runs").fetchone()[0]
            shown = [m.call_id for m in messages if isinstance(m, hr.models.ToolResultMessage)]
            self.seen.append([_status(db, f"{run_id}:{c}") for c in shown])
        finally:
            db.close()
        return await self.inner.request(messages, tools, settings)


async def test_results_are_committed_before_the_next_model_request(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    model = _Inspecting(path, [call("add", {"a": i, "b": 1}) for i in range(3)] + [reply("ok")])
    agent = hr.Agent(model, [add], policy=hr.Policy.default())
    async with hr.Store.open(path) as store:
        result = await agent.run("add", store=store)
    assert result.output == "ok"
    assert model.seen == [[], ["finished"], ["finished"] * 2, ["finished"] * 3]
