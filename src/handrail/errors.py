"""Every exception handrail raises, in one tree.

```
HandrailError
├── UserError                  a developer's misuse: fix the code, not the input
│   ├── HandlerStateError      stepping a finished handler, answering the wrong interaction
│   ├── PolicyError            a malformed rule, pattern or policy file
│   ├── ManifestError          a malformed handrail.toml
│   ├── ManifestDrift          the code and the reviewed manifest disagree (lists every problem)
│   └── ConfigError            a bad model string, a missing API key, a bad store URL
├── ToolError                  one call failed; .disposition says whether the world changed
│   ├── UnknownTool            NOT_SENT  the model named a tool nobody offers
│   ├── NotGranted             NOT_SENT  the manifest does not grant the tool
│   ├── InvalidArguments       NOT_SENT  arguments failed the input schema (model can retry)
│   ├── PolicyDenied           NOT_SENT  the policy refused an action of the call
│   ├── ApprovalDenied         NOT_SENT  the approver refused
│   ├── Deferred               NOT_SENT  the approver deferred; the run is paused
│   ├── CallCancelled          IN_DOUBT  cancelled while the body ran (NOT_SENT if it never started)
│   ├── ToolTimeout            IN_DOUBT  the deadline passed while the body ran
│   ├── TransportError         IN_DOUBT  the link to a remote tool broke after sending
│   ├── ToolFailed             LANDED    the body ran and raised
│   └── InvalidOutput          LANDED    the body ran and returned what its output schema refuses
├── StoreError                 the run store failed or refused
│   ├── NotFound               no run, call, request or question with that id
│   ├── AlreadyDecided         a second decision/answer on the same pending item
│   └── SchemaTooNew           the database was written by a newer handrail
├── ResumeRefused              resuming would cross a boundary (no policy, manifest changed)
├── VerificationFailed         a run's final answer failed its check (`Failed.verification`)
├── RunNotCompleted            `result.output` of a run that paused, failed or was cancelled
├── InteractionDeclined        raised inside a tool: its caller declined to answer ctx.ask/elicit
├── SignatureInvalid           a webhook delivery or decision link forged, expired or replayed
├── DeliveryFailed             a notification did not arrive (the dispatcher retries it)
└── ModelError                 the model provider failed
    ├── ModelAuthError         401/403: the key is missing or wrong
    ├── ModelNotFound          404: the model name is unknown to the provider
    ├── ModelRequestError      400: the provider refused the request (body shown)
    ├── ModelUnavailable       429/5xx/timeouts after every retry
    └── ModelResponseError     the response could not be understood
```

Retrying is automatic only for `Disposition.NOT_SENT`, or when the tool declares itself
idempotent.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "AlreadyDecided",
    "ApprovalDenied",
    "CallCancelled",
    "ConfigError",
    "Deferred",
    "DeliveryFailed",
    "Disposition",
    "HandlerStateError",
    "HandrailError",
    "InteractionDeclined",
    "InvalidArguments",
    "InvalidOutput",
    "Issue",
    "ManifestDrift",
    "ManifestError",
    "ModelAuthError",
    "ModelError",
    "ModelNotFound",
    "ModelRequestError",
    "ModelResponseError",
    "ModelUnavailable",
    "NotFound",
    "NotGranted",
    "PolicyDenied",
    "PolicyError",
    "ResumeRefused",
    "RunNotCompleted",
    "SchemaTooNew",
    "SignatureInvalid",
    "StoreError",
    "ToolError",
    "ToolFailed",
    "ToolTimeout",
    "TransportError",
    "UnknownTool",
    "UserError",
    "VerificationAttempt",
    "VerificationFailed",
]


class Disposition(enum.Enum):
    """Whether a failed call changed the world."""

    NOT_SENT = "not_sent"
    """The tool body never ran (or the request never left): safe to retry."""
    IN_DOUBT = "in_doubt"
    """The body may have run partly or wholly: only an idempotent tool may be retried blindly."""
    LANDED = "landed"
    """The body ran to its end (it failed, or returned invalid output): the effect happened."""


class HandrailError(Exception):
    """Base of every exception handrail raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other constructor arguments than their message, so the default
        # reduction (calling the class with `self.args`) would fail to unpickle them. Records
        # and worker processes move these errors across process boundaries.
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[HandrailError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class UserError(HandrailError):
    """A developer's misuse of the API; the message says what to change."""


class HandlerStateError(UserError):
    """A `ToolHandler` was stepped in a state that does not accept that step."""


class PolicyError(UserError):
    """A policy rule, pattern or policy file is malformed."""


class ManifestError(UserError):
    """A manifest file is malformed (unknown key, bad ref, duplicate grant...)."""


class ManifestDrift(UserError):
    """The toolbox and the manifest disagree; `problems` lists every disagreement."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"the code has drifted from the manifest ({len(self.problems)} problem"
            f"{'s' if len(self.problems) != 1 else ''}):\n{lines}"
        )


class ConfigError(UserError):
    """Configuration is missing or wrong (model string, API key, store URL)."""


class ToolError(HandrailError):
    """One tool call failed as an operation; `disposition` says whether the world changed.

    A model-visible failure of the tool's own logic is not a ToolError but a completed
    `ToolResult` with `is_error=True`.
    """

    default_disposition: ClassVar[Disposition]

    def __init__(self, message: str, *, disposition: Disposition | None = None) -> None:
        super().__init__(message)
        self.message = message
        if disposition is None:
            disposition = getattr(type(self), "default_disposition", None)
            if disposition is None:
                raise TypeError(
                    f"{type(self).__name__} declares no default_disposition: pass disposition="
                )
        if not isinstance(disposition, Disposition):
            raise TypeError(f"disposition must be an hr.Disposition, not {disposition!r}")
        self.disposition: Disposition = disposition


class UnknownTool(ToolError):
    """The model named a tool that is not offered."""

    default_disposition = Disposition.NOT_SENT


class NotGranted(ToolError):
    """The manifest in force does not grant this tool."""

    default_disposition = Disposition.NOT_SENT


@dataclass(frozen=True, kw_only=True, slots=True)
class Issue:
    """One problem found while validating arguments or output."""

    path: str
    """JSON path of the offending value, `$` for the whole payload (`$.amount`, `$.items[2]`)."""
    message: str
    """What is wrong with it, in words a model can act on."""


class InvalidArguments(ToolError):
    """The arguments failed the tool's input schema; the body did not run.

    `issues` carries each problem; `str(exc)` is a rendering meant for the model so it can fix
    the call and retry.
    """

    default_disposition = Disposition.NOT_SENT

    def __init__(self, tool: str, issues: Sequence[Issue]) -> None:
        self.tool = tool
        self.issues = list(issues)
        lines = "\n".join(f"- {i.path}: {i.message}" for i in self.issues)
        super().__init__(
            f"invalid arguments for tool '{tool}' — fix these and call it again:\n{lines}"
        )


class PolicyDenied(ToolError):
    """The policy denied an action of the call.

    The message is the one uniform sentence the model sees; `rule` and `layer` are for the
    operator and are never shown to the model.
    """

    default_disposition = Disposition.NOT_SENT
    MODEL_MESSAGE: ClassVar[str] = "This action is not permitted by the operator's policy."

    def __init__(self, *, rule: str | None = None, layer: str | None = None) -> None:
        super().__init__(self.MODEL_MESSAGE)
        self.rule = rule
        self.layer = layer


class ApprovalDenied(ToolError):
    """The approver denied the call; `reason` is shown to the model."""

    default_disposition = Disposition.NOT_SENT

    def __init__(self, reason: str) -> None:
        super().__init__(f"denied by the approver: {reason}")
        self.reason = reason


class Deferred(ToolError):
    """The approver deferred the decision; the run pauses with the request persisted."""

    default_disposition = Disposition.NOT_SENT


class CallCancelled(ToolError):
    """The call was cancelled by its caller (`ToolHandler.step(Cancel(...))`).

    IN_DOUBT when the body had started; NOT_SENT when it never did.
    """

    default_disposition = Disposition.IN_DOUBT

    def __init__(self, reason: str, *, disposition: Disposition | None = None) -> None:
        super().__init__(f"call cancelled: {reason}", disposition=disposition)
        self.reason = reason


class ToolTimeout(ToolError):
    """The call's deadline passed while the body ran."""

    default_disposition = Disposition.IN_DOUBT


class TransportError(ToolError):
    """The connection to a remote tool broke after the request was sent."""

    default_disposition = Disposition.IN_DOUBT


class ToolFailed(ToolError):
    """The body ran and raised; the exception is chained as `__cause__`."""

    default_disposition = Disposition.LANDED


class InvalidOutput(ToolError):
    """The body ran and returned output its output schema refuses."""

    default_disposition = Disposition.LANDED

    def __init__(self, tool: str, issues: Sequence[Issue]) -> None:
        self.tool = tool
        self.issues = list(issues)
        lines = "; ".join(f"{i.path}: {i.message}" for i in self.issues)
        super().__init__(f"tool '{tool}' returned output its output schema refuses: {lines}")


class StoreError(HandrailError):
    """The run store failed or refused an operation."""


class NotFound(StoreError):
    """No run, call, request or question has that id."""


class AlreadyDecided(StoreError):
    """The pending approval, question or recovery was already decided."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer handrail than this one."""


class ResumeRefused(HandrailError):
    """Resuming would cross a boundary: no policy recorded, or the manifest changed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VerificationAttempt:
    """One check of a run's final answer (`hr.Verify`), as the run records it."""

    attempt: int
    """Which attempt, from 1."""
    passed: bool
    """Whether the check passed."""
    reason: str = ""
    """Why it failed (exit code, timeout, the check's reason, a refusal); empty when passed."""
    exit_code: int | None = None
    """A command's exit code, when it ran to its end."""
    output: str = ""
    """A command's output as the model was shown it (bounded), or a check's detail."""
    call_id: str | None = None
    """The call record of a command (it passed the gate like any call); None for a check."""
    turn: int | None = None
    """The model turn whose final answer was checked."""
    at: float = 0.0
    """Unix time the result was recorded."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a run's events and outcome keep it)."""
        return {"attempt": self.attempt, "passed": self.passed, "reason": self.reason,
                "exit_code": self.exit_code, "output": self.output, "call_id": self.call_id,
                "turn": self.turn, "at": self.at}

    @classmethod
    def from_dict(cls, data: Any) -> VerificationAttempt:
        """Rebuild one from `to_dict` output (unknown keys, such as `kind`, are ignored)."""
        exit_code = data.get("exit_code")
        turn = data.get("turn")
        call_id = data.get("call_id")
        return cls(attempt=int(data.get("attempt", 0)), passed=bool(data.get("passed")),
                   reason=str(data.get("reason") or ""),
                   exit_code=exit_code if isinstance(exit_code, int) else None,
                   output=str(data.get("output") or ""),
                   call_id=call_id if isinstance(call_id, str) else None,
                   turn=turn if isinstance(turn, int) else None,
                   at=float(data.get("at") or 0.0))


class VerificationFailed(HandrailError):
    """A run's final answer failed its verification check; the run ended `Failed`.

    Carried by `hr.Failed.verification` (not raised by `agent.run`): `attempts` holds every
    check the run made, in order, the last one the failure that ended it.
    """

    def __init__(self, message: str, attempts: Sequence[VerificationAttempt]) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a run's stored outcome keeps it)."""
        return {"message": str(self), "attempts": [a.to_dict() for a in self.attempts]}

    @classmethod
    def from_dict(cls, data: Any) -> VerificationFailed:
        """Rebuild one from `to_dict` output."""
        return cls(str(data.get("message", "")),
                   [VerificationAttempt.from_dict(a) for a in data.get("attempts", ())])


class RunNotCompleted(HandrailError):
    """`RunResult.output` was read, but the run did not complete.

    The message says how the run ended and the next step (the command that approves, answers
    or resumes it); `outcome` is the outcome itself, for code that wants to `match` on it.
    """

    def __init__(self, run_id: str, outcome: Any, next_step: str) -> None:
        self.run_id = run_id
        """The run's id."""
        self.outcome = outcome
        """The `RunOutcome` the run has (`AwaitingApproval`, `Failed`, ...)."""
        self.next_step = next_step
        """What to do about it, in words."""
        kind = getattr(outcome, "kind", outcome)
        super().__init__(f"run {run_id} did not complete ({kind}): {next_step}")


class InteractionDeclined(HandrailError):
    """Raised inside a tool by `ctx.ask`/`ctx.elicit` when the caller declines to answer.

    A tool may catch it and carry on; uncaught, the call completes as a model-visible error
    result saying the question was declined (the tool asks before it acts, so nothing landed).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the caller declined to answer: {reason}")
        self.reason = reason


class SignatureInvalid(HandrailError):
    """A webhook delivery or a decision link does not check out.

    Its signature does not match (forged, or signed with another secret), it is too old or
    expired, or it was seen before (a replay, a link already used). Nothing was decided.
    """


class DeliveryFailed(HandrailError):
    """A notification did not arrive: the receiver refused it or could not be reached.

    The `Dispatcher` records each failed attempt as an event of the item's run (and in the
    item's notes) and retries later. `status` is the receiver's HTTP status when it answered
    (a refusal), None when it could not be reached.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ModelError(HandrailError):
    """The model provider failed."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ModelAuthError(ModelError):
    """401/403 from the provider: the API key is missing, wrong or lacks access."""


class ModelNotFound(ModelError):
    """404 from the provider: it does not know this model."""


class ModelRequestError(ModelError):
    """400 from the provider: it refused the request as malformed."""


class ModelUnavailable(ModelError):
    """Rate limits, server errors or timeouts persisted through every retry."""


class ModelResponseError(ModelError):
    """The provider's response could not be understood."""
