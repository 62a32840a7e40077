"""How a run ended (or paused): `RunOutcome` and `RunResult`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, assert_never

from handrail.errors import RunNotCompleted, UserError, VerificationFailed
from handrail.models import Usage

if TYPE_CHECKING:
    from handrail.gate import TurnPause
    from handrail.tools import Quote

__all__ = [
    "AwaitingAnswer",
    "AwaitingApproval",
    "AwaitingRecovery",
    "Cancelled",
    "Completed",
    "Failed",
    "RunOutcome",
    "RunResult",
    "next_step",
    "outcome_from_dict",
]


@dataclass(frozen=True, slots=True)
class Completed:
    """The model gave its final answer."""

    output: Any
    """The final answer: its text, or a value of the agent's `output_type`."""
    kind: Literal["completed"] = "completed"


@dataclass(frozen=True, slots=True)
class AwaitingApproval:
    """Paused: an action waits for a human decision. The process may exit."""

    request_id: str
    """Decide with `hr.resume_with_decision(store, request_id, ...)` or `handrail approve`."""
    kind: Literal["awaiting_approval"] = "awaiting_approval"


@dataclass(frozen=True, slots=True)
class AwaitingAnswer:
    """Paused: a tool asked a question nobody here could answer."""

    question_id: str
    """Answer with `hr.resume_with_answer(store, question_id, text, ...)` or `handrail answer`."""
    kind: Literal["awaiting_answer"] = "awaiting_answer"


@dataclass(frozen=True, slots=True)
class AwaitingRecovery:
    """Paused: a call was in flight when its process died; it may or may not have acted."""

    call_id: str
    """The call record's id; decide with `hr.resume_with_recovery` or `handrail recover`."""
    kind: Literal["awaiting_recovery"] = "awaiting_recovery"


@dataclass(frozen=True, slots=True)
class Failed:
    """The run stopped on an error (model failure, budget exhausted, a failed verification)."""

    error: str
    """What went wrong and what to do."""
    kind: Literal["failed"] = "failed"
    verification: VerificationFailed | None = field(default=None, kw_only=True)
    """Set when the final answer failed its `hr.Verify` check: every attempt, in order."""


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The run was cancelled by its caller; `hr.resume` may continue it."""

    reason: str
    """Why."""
    kind: Literal["cancelled"] = "cancelled"


RunOutcome = Completed | AwaitingApproval | AwaitingAnswer | AwaitingRecovery | Failed | Cancelled
"""Every way a run can end or pause; match on it."""

_BY_KIND: dict[str, type[Any]] = {
    "completed": Completed,
    "awaiting_approval": AwaitingApproval,
    "awaiting_answer": AwaitingAnswer,
    "awaiting_recovery": AwaitingRecovery,
    "failed": Failed,
    "cancelled": Cancelled,
}


def pause_outcome(pause: TurnPause) -> AwaitingApproval | AwaitingAnswer | AwaitingRecovery:
    """The run outcome for a turn the gate paused (the gate knows turns, not runs)."""
    # Imported here: reading outcomes (`handrail show`) does not need the gate (issue 11).
    from handrail.gate import CallInDoubt, PausedOnQuestion, PausedOnRequest

    if isinstance(pause, PausedOnRequest):
        return AwaitingApproval(pause.request_id)
    if isinstance(pause, PausedOnQuestion):
        return AwaitingAnswer(pause.question_id)
    if isinstance(pause, CallInDoubt):
        return AwaitingRecovery(pause.call_id)
    assert_never(pause)


def outcome_to_dict(outcome: RunOutcome) -> dict[str, Any]:
    """An outcome as a JSON-compatible dict."""
    if isinstance(outcome, Failed):
        # `verification` only when set: every other failure keeps its stored shape.
        data: dict[str, Any] = {"error": outcome.error, "kind": outcome.kind}
        if outcome.verification is not None:
            data["verification"] = outcome.verification.to_dict()
        return data
    if isinstance(outcome, Completed) and not isinstance(outcome.output, str):
        import pydantic_core

        return {"output": pydantic_core.to_jsonable_python(outcome.output), "kind": outcome.kind}
    return asdict(outcome)


def outcome_from_dict(data: Mapping[str, Any]) -> RunOutcome:
    """Rebuild an outcome from `outcome_to_dict` output."""
    cls = _BY_KIND.get(str(data.get("kind")))
    if cls is None:
        raise UserError(f"unknown run outcome kind {data.get('kind')!r}")
    if cls is Failed and data.get("verification") is not None:
        return Failed(str(data.get("error", "")),
                      verification=VerificationFailed.from_dict(data["verification"]))
    return cls(**{k: v for k, v in data.items() if k != "kind"})  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `agent.run` returns."""

    run_id: str
    """The run's id in the store."""
    outcome: RunOutcome
    """How it ended or why it paused."""
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    """Tokens spent by the run so far."""
    remembered: list[Any] = field(default_factory=list)
    """Rules an approver asked to remember during this run (run-scoped)."""
    in_memory: bool = False
    """The run lives in a memory store: a pause is lost when the process exits."""
    quoted: tuple[Quote, ...] = ()
    """For a completed text answer of an agent made with `quotes=True`: its spans copied
    from untrusted tool output (a page, an email, an MCP server's answer), each with the call
    it came from, so the app can show them as quotes or hold them back (docs/taint.md).
    Empty otherwise."""
    searched: bool = False
    """Whether the answer was searched for quotes (a completed text answer, `quotes=True`)."""

    @property
    def held(self) -> tuple[Quote, ...]:
        """The quotes that are words from inside a tool's text (`Quote.whole` is False).

        A sentence of a page, a review, an email, rather than a value a tool reported.
        """
        return tuple(q for q in self.quoted if not q.whole)

    def shown(self, marker: str = "[words of {tool}, held]") -> str:
        """The final text answer with each `held` quote replaced by `marker`.

        `{tool}` and `{call}` in `marker` name the quote's source. What an app shows a
        person: the held words one click away (`held`), with where they came from.

        Raises:
            UserError: the answer was not searched (an agent made without `quotes=True`, or
                an answer that is not text).
            RunNotCompleted: the run has not completed (as `output`).
        """
        output = self.output
        if not self.searched or not isinstance(output, str):
            raise UserError("this answer was not searched for quotes: make the agent with "
                            "hr.Agent(..., quotes=True) (a text answer)")
        for quote in reversed(self.held):
            output = (output[:quote.start] +
                      marker.format(tool=quote.source_tool, call=quote.source_call) +
                      output[quote.end:])
        return output

    @property
    def output(self) -> Any:
        """The final answer (text, or a value of the agent's `output_type`).

        Raises:
            RunNotCompleted: the run paused, failed or was cancelled; the error says how and
                what to do next (`outcome` stays available for `match`).
        """
        if isinstance(self.outcome, Completed):
            return self.outcome.output
        raise RunNotCompleted(self.run_id, self.outcome, next_step(self.outcome, self.run_id,
                                                                   in_memory=self.in_memory))


_LOST = ("; the run lives in a memory store and is lost when this process exits: pass "
         "store=hr.Store.open(\"runs.db\") to keep it")


def next_step(outcome: RunOutcome, run_id: str, *, in_memory: bool = False) -> str:
    """What a person does about `outcome`, in words (with the command that does it)."""
    lost = _LOST if in_memory else ""
    if isinstance(outcome, AwaitingApproval):
        return (f"an action waits for approval: approve with `handrail approve "
                f"{outcome.request_id}` (or `handrail deny {outcome.request_id} --reason "
                f"'not now'`: the model reads the reason), or "
                f"hr.resume_with_decision(store, {outcome.request_id!r}, ...){lost}")
    if isinstance(outcome, AwaitingAnswer):
        return (f"a tool asked a question: answer with `handrail answer {outcome.question_id} "
                f"'your answer'`, or hr.resume_with_answer(store, {outcome.question_id!r}, "
                f"text, ...){lost}")
    if isinstance(outcome, AwaitingRecovery):
        return (f"call {outcome.call_id} was in flight when its process died: decide with "
                f"`handrail recover {outcome.call_id} --retry` (run it again), `handrail "
                f"recover {outcome.call_id} --completed 'what it did'` (it happened) or "
                f"`handrail recover {outcome.call_id} --abort` (give up on it), or "
                f"hr.resume_with_recovery(store, {outcome.call_id!r}, ...){lost}")
    if isinstance(outcome, Failed):
        return f"the run failed: {outcome.error}"
    if isinstance(outcome, Cancelled):
        return (f"it was cancelled ({outcome.reason}): continue it with `handrail resume "
                f"{run_id}` or hr.resume(store, {run_id!r}, agent=...){lost}")
    if isinstance(outcome, Completed):
        return "it completed"
    assert_never(outcome)
