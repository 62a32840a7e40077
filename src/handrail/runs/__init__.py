"""Agent runs: the loop, outcomes, and resuming across processes."""

from handrail.runs._agent import (
    Agent,
    DeferAll,
    Recovery,
    RunEvent,
    check_resumable,
    resume,
    resume_sync,
    resume_with_answer,
    resume_with_answer_sync,
    resume_with_decision,
    resume_with_decision_sync,
    resume_with_recovery,
    resume_with_recovery_sync,
)
from handrail.runs._decisions import record_decision, wrong_kind
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
    outcome_from_dict,
)

__all__ = [
    "Agent",
    "AwaitingAnswer",
    "AwaitingApproval",
    "AwaitingRecovery",
    "Cancelled",
    "Completed",
    "DeferAll",
    "Failed",
    "Recovery",
    "RunEvent",
    "RunHandle",
    "RunOutcome",
    "RunResult",
    "check_resumable",
    "outcome_from_dict",
    "record_decision",
    "resume",
    "resume_sync",
    "resume_with_answer",
    "resume_with_answer_sync",
    "resume_with_decision",
    "resume_with_decision_sync",
    "resume_with_recovery",
    "resume_with_recovery_sync",
    "wrong_kind",
]
