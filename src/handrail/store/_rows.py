"""Decoding a row of the SQL stores (SQLite, PostgreSQL) into records: one column order.

Both backends keep runs and calls in the same columns (`_RUN_COLUMNS`, `_CALL_COLUMNS` in each),
with JSON text for structured fields, so a row read back is decoded here, once.
"""

from __future__ import annotations

import json
from typing import Any

from handrail.store._records import CallRecord, CallStatus, RunRecord, RunStatus

__all__ = ["DECISION_COLUMNS", "DecisionRows", "call_from_row", "decision_from_row", "loads",
           "run_from_row"]

DECISION_COLUMNS = ("id", "run_id", "call_id", "turn", "idx", "model_name", "tool", "actions",
                    "verdict", "decision", "decided_by", "status")
"""The call columns `call_history(decisions_only=True)` reads, in `decision_from_row`'s
order: what the policy decided a call on, and what became of it."""
DECISION_INDEXES = (0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14)
"""Their positions among the full call columns (the log's `c0..c22` are those columns)."""


def loads(text: str | None) -> Any:
    """JSON text from a column, or None for NULL."""
    return None if text is None else json.loads(text)


def run_from_row(row: tuple[Any, ...]) -> RunRecord:
    """A run row, in the stores' run column order."""
    return RunRecord(
        id=row[0], task=row[1], agent=row[2], status=RunStatus(row[3]), parent_id=row[4],
        policy=loads(row[5]), manifest_digest=row[6], model=row[7], workspace=row[8],
        created_at=row[9], updated_at=row[10], outcome=loads(row[11]), input_tokens=row[12],
        output_tokens=row[13], model_requests=row[14], remembered=loads(row[15]),
        steps=row[16], owner=row[17], lease_until=row[18], events=loads(row[19]),
        agent_ref=row[20], parent_call_id=row[21], depth=row[22],
    )


def call_from_row(row: tuple[Any, ...]) -> CallRecord:
    """A call row, in the stores' call column order (provenance last)."""
    return CallRecord(
        id=row[0], run_id=row[1], call_id=row[2], turn=row[3], index=row[4], model_name=row[5],
        tool=row[6], arguments=row[7], arguments_digest=row[8],
        performed_arguments=loads(row[9]), actions=loads(row[10]), verdict=loads(row[11]),
        decision=loads(row[12]), decided_by=row[13], status=CallStatus(row[14]),
        result=loads(row[15]), disposition=row[16], error=row[17], answers=loads(row[18]),
        pending_id=row[19], started_at=row[20], ended_at=row[21], provenance=loads(row[22]),
    )


def decision_from_row(row: tuple[Any, ...]) -> CallRecord:
    """A call row of `DECISION_COLUMNS`: the other fields left at their defaults."""
    return CallRecord(
        id=row[0], run_id=row[1], call_id=row[2], turn=row[3], index=row[4], model_name=row[5],
        tool=row[6], actions=loads(row[7]), verdict=loads(row[8]), decision=loads(row[9]),
        decided_by=row[10], status=CallStatus(row[11]),
    )


_STATUSES = {s.value: s for s in CallStatus}


class DecisionRows:
    """Decodes the `DECISION_COLUMNS` rows of one history read, each distinct JSON text once.

    A recorded call's actions, verdict and decision repeat across a record (the same file
    read, the same rule, `{"kind": "approve", ...}`): decoding each text once instead of once
    per row is most of the cost of reading 100,000 calls. Records with equal texts share
    one decoded value, which `call_history(decisions_only=True)` says: read-only. A text is
    remembered only while fewer than `MEMO` are (a record of all-distinct texts gains nothing
    from remembering them, and would keep each twice).
    """

    MEMO = 65_536
    __slots__ = ("_memo",)

    def __init__(self) -> None:
        """A decoder with nothing remembered yet."""
        self._memo: dict[str, Any] = {}

    def _loads(self, text: str | None) -> Any:
        if text is None:
            return None
        memo = self._memo
        value = memo.get(text, memo)
        if value is memo:
            value = json.loads(text)
            if len(memo) < self.MEMO:
                memo[text] = value
        return value

    def __call__(self, row: tuple[Any, ...]) -> CallRecord:
        """The record of one row (as `decision_from_row`, values shared)."""
        loads_ = self._loads
        return CallRecord(
            id=row[0], run_id=row[1], call_id=row[2], turn=row[3], index=row[4],
            model_name=row[5], tool=row[6], actions=loads_(row[7]), verdict=loads_(row[8]),
            decision=loads_(row[9]), decided_by=row[10], status=_STATUSES[row[11]],
        )
