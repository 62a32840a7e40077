"""MCP tests share one event loop per module, so a server is started once per module."""

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"
