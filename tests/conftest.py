"""Shared fixtures: async tests run on asyncio (anyio's pytest plugin)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
