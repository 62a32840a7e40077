"""Shared fixtures: async tests run on asyncio (anyio's pytest plugin); a real PostgreSQL.

`pg_server` starts one PostgreSQL server per test session (tests/pgserver.py) and removes it
at the end; `pg_url` is a fresh empty database on it for one test. Where no server can be
started (no binaries and no way to install them), PostgreSQL tests are skipped with the reason.
"""

from collections.abc import Iterator

import pytest

import pgserver


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.Server]:
    reason = pgserver.unavailable()
    if reason is not None:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = pgserver.start()
    try:
        yield server
    finally:
        pgserver.stop(server)


@pytest.fixture
def pg_url(pg_server: pgserver.Server) -> str:
    return pg_server.create_database()
