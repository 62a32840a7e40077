"""Run stores: `Store.open("runs.db")` (SQLite), `Store.memory()`, `Store.open("postgresql://")`.

PostgreSQL (`handrail[postgres]`) is for many processes on many machines.

The contract (the `Store` interface, the records, the batch) is `handrail.store.contract`.
This module is the backend registry: URL scheme -> factory. Each factory imports its backend
only when a store of that kind is opened, so importing the contract loads no driver.
"""

from __future__ import annotations

from handrail.store.contract import (
    Batch,
    CallRecord,
    CallStatus,
    Durability,
    PendingItem,
    RunRecord,
    RunStatus,
    Store,
    register_backend,
)

__all__ = ["Batch", "CallRecord", "CallStatus", "PendingItem", "RunRecord", "RunStatus", "Store"]


def _open_sqlite(url: str, durability: Durability) -> Store:
    from handrail.store._sqlite import SQLiteStore

    return SQLiteStore(url.removeprefix("sqlite://"), durability=durability)


def _open_memory(url: str, durability: Durability) -> Store:
    # Nothing in memory survives the process, whatever durability was asked for: this store
    # is for tests and benchmarks, and says so in `Store.memory`'s docstring.
    from handrail.store._memory import MemoryStore

    return MemoryStore()


def _open_postgres(url: str, durability: Durability) -> Store:
    from handrail.store._postgres import PostgresStore

    return PostgresStore(url, durability=durability)


register_backend("sqlite", _open_sqlite)
register_backend("memory", _open_memory)
register_backend("postgresql", _open_postgres)
register_backend("postgres", _open_postgres)
