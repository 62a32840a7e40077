"""Fixtures for notifications, deadlines and four-eyes: every store, a clock to move."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from notify_helpers import Clock

from handrail.store import Store


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL of each kind in turn (PostgreSQL skipped without a server)."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(backend: str, clock: Clock) -> AsyncIterator[Store]:
    s = Store.open(backend)
    s.clock = clock
    yield s
    await s.close()
