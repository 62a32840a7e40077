"""Run stores: `Store.open("runs.db")` (SQLite, embedded default), `Store.memory()`."""

from handrail.store._base import Store
from handrail.store._records import (
    Batch,
    CallRecord,
    CallStatus,
    PendingItem,
    RunRecord,
    RunStatus,
)

__all__ = ["Batch", "CallRecord", "CallStatus", "PendingItem", "RunRecord", "RunStatus", "Store"]
