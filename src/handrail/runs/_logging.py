"""What a run logs under the standard `handrail` logger.

INFO: one line per tool call (tool, verdict, decision, status, duration). WARNING: a model turn
retried (invalid arguments, an output that fails `output_type`) and a run that pauses in a
memory store (its pending item dies with the process). DEBUG: each model request.

The library adds only a `NullHandler`: nothing is printed unless the application configures
logging (`logging.basicConfig(level=logging.INFO)`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["log_calls", "log_memory_pause", "log_request", "log_retry", "logger"]

logger = logging.getLogger("handrail")
logger.addHandler(logging.NullHandler())

_MAX_FIELD = 200


def _clean(value: object) -> str:
    """A model-chosen value, safe on one log line: control characters escaped, bounded."""
    text = str(value)
    if len(text) > _MAX_FIELD:
        text = text[:_MAX_FIELD] + "..."
    if text.isprintable():
        return text
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")


def log_calls(run_id: str, records: Iterable[Any]) -> None:
    """One INFO line per finished call record of a turn."""
    if not logger.isEnabledFor(logging.INFO):
        return
    for r in records:
        verdict = (r.verdict or {}).get("effect", "-")
        decision = (r.decision or {}).get("kind", "-")
        if r.started_at is not None and r.ended_at is not None:
            duration = f"{(r.ended_at - r.started_at) * 1000:.0f}ms"
        else:
            duration = "-"
        logger.info("run %s call %s %s: verdict=%s decision=%s status=%s duration=%s%s",
                    run_id, _clean(r.call_id), _clean(r.tool or r.model_name), verdict,
                    _clean(decision), r.status.value, duration,
                    f" error={_clean(r.error)}" if r.error else "")


def log_retry(run_id: str, what: str, attempt: int, budget: int) -> None:
    """WARNING: a model turn was returned to the model to fix (`what` says why)."""
    logger.warning("run %s: %s; the model is asked to fix it (invalid turn %d of %d allowed)",
                   run_id, _clean(what), attempt, budget)


def log_memory_pause(run_id: str, kind: str, next_step: str) -> None:
    """WARNING: a run paused into a memory store, where its pending item dies with the process."""
    logger.warning("run %s paused (%s) in a memory store: the pending item is lost when this "
                   "process exits; pass store=hr.Store.open(\"runs.db\") to keep it. %s",
                   run_id, kind, next_step)


def log_request(run_id: str, step: int, messages: int, tools: int) -> None:
    """DEBUG: a model request is about to be sent."""
    logger.debug("run %s: model request %d (%d messages, %d tools offered)",
                 run_id, step, messages, tools)
