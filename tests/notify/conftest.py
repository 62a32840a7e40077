"""Fixtures for notifications, deadlines and four-eyes: every store, a clock to move."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from handrail.store import Store


class Clock:
    """A clock a test moves (`store.clock = clock`): deadlines pass without waiting."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
