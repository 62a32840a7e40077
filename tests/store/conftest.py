"""Fixtures shared by the store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handrail.store import Store


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each backend in turn: the memory store, a SQLite file, PostgreSQL (skipped without)."""
    if request.param == "memory":
        s = Store.memory()
    elif request.param == "sqlite":
        s = Store.open(tmp_path / "runs.db")
    else:
        s = Store.open(request.getfixturevalue("pg_url"))
    yield s
    await s.close()
