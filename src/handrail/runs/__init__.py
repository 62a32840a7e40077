"""Agent runs: the loop, outcomes, and resuming across processes.

Names load from their module on first use (PEP 562), as in `handrail.tools`: `handrail show`
takes `thread` (a conversation's runs) without importing the agent loop, the gate, the host,
the approval machinery, the models or the policy (issue 11).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handrail.runs._agent import (
        Agent,
        DeferAll,
        Recovery,
        RunEvent,
        check_resumable,
        governance_for,
        resume,
        resume_sync,
        resume_with_answer,
        resume_with_answer_sync,
        resume_with_decision,
        resume_with_decision_sync,
        resume_with_recovery,
        resume_with_recovery_sync,
    )
    from handrail.runs._conversation import Conversation
    from handrail.runs._decisions import record_decision, wrong_kind
    from handrail.runs._events import (
        CallFinishedDetail,
        CallPlannedDetail,
        EventKind,
        RunStream,
        UsageDetail,
    )
    from handrail.runs._handle import RunHandle
    from handrail.runs._outcome import (
        AwaitingAnswer,
        AwaitingApproval,
        AwaitingRecovery,
        Cancelled,
        Completed,
        Failed,
        RunOutcome,
        RunResult,
        next_step,
        outcome_from_dict,
        outcome_to_dict,
    )
    from handrail.runs._printer import TerminalPrinter
    from handrail.runs._subagents import SubAgentTool, tree_of
    from handrail.runs._tree import child_run_id, conversation_of, sub_runs, thread
    from handrail.runs._verify import (
        VERIFY_OUTPUT_CHARS,
        NotVerified,
        Verified,
        Verify,
        VerifyContext,
    )

_LAZY: dict[str, str] = {
    "Agent": "handrail.runs._agent",
    "AwaitingAnswer": "handrail.runs._outcome",
    "AwaitingApproval": "handrail.runs._outcome",
    "AwaitingRecovery": "handrail.runs._outcome",
    "CallFinishedDetail": "handrail.runs._events",
    "CallPlannedDetail": "handrail.runs._events",
    "Cancelled": "handrail.runs._outcome",
    "Completed": "handrail.runs._outcome",
    "Conversation": "handrail.runs._conversation",
    "DeferAll": "handrail.runs._agent",
    "EventKind": "handrail.runs._events",
    "Failed": "handrail.runs._outcome",
    "NotVerified": "handrail.runs._verify",
    "Recovery": "handrail.runs._agent",
    "RunEvent": "handrail.runs._agent",
    "RunHandle": "handrail.runs._handle",
    "RunOutcome": "handrail.runs._outcome",
    "RunResult": "handrail.runs._outcome",
    "RunStream": "handrail.runs._events",
    "SubAgentTool": "handrail.runs._subagents",
    "TerminalPrinter": "handrail.runs._printer",
    "UsageDetail": "handrail.runs._events",
    "VERIFY_OUTPUT_CHARS": "handrail.runs._verify",
    "Verified": "handrail.runs._verify",
    "Verify": "handrail.runs._verify",
    "VerifyContext": "handrail.runs._verify",
    "check_resumable": "handrail.runs._agent",
    "governance_for": "handrail.runs._agent",
    "child_run_id": "handrail.runs._tree",
    "conversation_of": "handrail.runs._tree",
    "next_step": "handrail.runs._outcome",
    "outcome_from_dict": "handrail.runs._outcome",
    "outcome_to_dict": "handrail.runs._outcome",
    "record_decision": "handrail.runs._decisions",
    "resume": "handrail.runs._agent",
    "resume_sync": "handrail.runs._agent",
    "resume_with_answer": "handrail.runs._agent",
    "resume_with_answer_sync": "handrail.runs._agent",
    "resume_with_decision": "handrail.runs._agent",
    "resume_with_decision_sync": "handrail.runs._agent",
    "resume_with_recovery": "handrail.runs._agent",
    "resume_with_recovery_sync": "handrail.runs._agent",
    "sub_runs": "handrail.runs._tree",
    "thread": "handrail.runs._tree",
    "tree_of": "handrail.runs._subagents",
    "wrong_kind": "handrail.runs._decisions",
}
"""Public name -> the module that defines it."""

__all__ = [
    "VERIFY_OUTPUT_CHARS",
    "Agent",
    "AwaitingAnswer",
    "AwaitingApproval",
    "AwaitingRecovery",
    "CallFinishedDetail",
    "CallPlannedDetail",
    "Cancelled",
    "Completed",
    "Conversation",
    "DeferAll",
    "EventKind",
    "Failed",
    "NotVerified",
    "Recovery",
    "RunEvent",
    "RunHandle",
    "RunOutcome",
    "RunResult",
    "RunStream",
    "SubAgentTool",
    "TerminalPrinter",
    "UsageDetail",
    "Verified",
    "Verify",
    "VerifyContext",
    "check_resumable",
    "child_run_id",
    "conversation_of",
    "governance_for",
    "next_step",
    "outcome_from_dict",
    "outcome_to_dict",
    "record_decision",
    "resume",
    "resume_sync",
    "resume_with_answer",
    "resume_with_answer_sync",
    "resume_with_decision",
    "resume_with_decision_sync",
    "resume_with_recovery",
    "resume_with_recovery_sync",
    "sub_runs",
    "thread",
    "tree_of",
    "wrong_kind",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'handrail.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
