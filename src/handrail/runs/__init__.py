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
from handrail.runs._conversation import Conversation, conversation_of, thread
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
from handrail.runs._subagents import SubAgentTool
from handrail.runs._verify import (
    VERIFY_OUTPUT_CHARS,
    NotVerified,
    Verified,
    Verify,
    VerifyContext,
)

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
    "conversation_of",
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
    "thread",
    "wrong_kind",
]
