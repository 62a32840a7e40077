"""What the store keeps: runs, calls and pending items, as plain frozen records."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from handrail.errors import StoreError

_R = TypeVar("_R")

__all__ = [
    "Batch",
    "CallRecord",
    "CallStatus",
    "PendingItem",
    "QuotaClaim",
    "QuotaExceeded",
    "RunRecord",
    "RunStatus",
    "clone",
    "new_batch",
    "update",
]


def update(record: _R, **changes: Any) -> _R:
    """Change fields of a record in place and return it."""
    for name, value in changes.items():
        setattr(record, name, value)
    return record


_COPIERS: dict[type, Any] = {}


def clone(record: _R) -> _R:
    """A shallow copy of a record.

    A straight-line copier is generated once per class: `copy.copy` goes through the pickle
    protocol and a loop over `__slots__` costs a getattr/setattr call per field, both several
    times slower on the per-call path of the memory store.
    """
    cls = type(record)
    copier = _COPIERS.get(cls)
    if copier is None:
        fields = cls.__slots__  # type: ignore[attr-defined]
        source = "def copy(r):\n    n = new(cls)\n" + "".join(
            f"    n.{name} = r.{name}\n" for name in fields) + "    return n\n"
        namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
        exec(source, namespace)
        copier = _COPIERS[cls] = namespace["copy"]
    return copier(record)  # type: ignore[no-any-return]


class RunStatus(enum.Enum):
    """A run's lifecycle."""

    RUNNING = "running"
    """A process is driving the run now (or died doing so: see the lease)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Paused: a deferred approval waits for a decision (`resume_with_decision`)."""
    AWAITING_ANSWER = "awaiting_answer"
    """Paused: a tool's question waits for an answer (`resume_with_answer`)."""
    AWAITING_RECOVERY = "awaiting_recovery"
    """Paused: a call was in flight at a crash; an operator decides (`resume_with_recovery`)."""
    COMPLETED = "completed"
    """Finished with a final answer. Terminal."""
    FAILED = "failed"
    """Stopped by an error (model failure, step budget). Terminal."""
    CANCELLED = "cancelled"
    """Stopped by its caller; `resume` may continue it."""
    READY = "ready"
    """Nobody drives it and nothing waits for a person: what it waited on was decided but it
    has not continued yet, or the process driving it stopped on an error or an interrupt (the
    run's last event says which). `resume` continues it."""


class CallStatus(enum.Enum):
    """Where one tool call is."""

    REFUSED = "refused"
    """Never sent: unknown tool, not granted, invalid arguments, denied. Result recorded."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Deferred to a human; a pending approval exists."""
    APPROVED = "approved"
    """Approved (possibly modified), not yet started."""
    STARTED = "started"
    """The body may be running. Found like this at resume: in doubt."""
    AWAITING_ANSWER = "awaiting_answer"
    """The body asked a question nobody here could answer; a pending question exists."""
    IN_DOUBT = "in_doubt"
    """Was in flight at a crash; a pending recovery exists."""
    FINISHED = "finished"
    """Ran (or was marked done by an operator); result recorded."""


# Run and call records are mutable: the loop updates them in place many times per call, and
# a frozen dataclass's replace() costs tens of microseconds here. Stores copy what they keep
# (memory) or serialise it (SQLite) at write time, so a caller's later change never leaks in.
@dataclass(kw_only=True, slots=True)
class RunRecord:
    """One agent run."""

    id: str
    """The run's id."""
    task: str
    """What the agent was asked."""
    agent: str | None = None
    """The agent's name."""
    status: RunStatus = RunStatus.RUNNING
    """Where the run is."""
    parent_id: str | None = None
    """The parent run, for a sub-agent."""
    policy: dict[str, Any] | None = None
    """The policy the run is bound by (`Policy.to_dict()`); resume refuses a run without one."""
    manifest_digest: str | None = None
    """The digest of the manifest in force, if any."""
    model: str | None = None
    """The model's name."""
    workspace: str | None = None
    """The absolute workspace root."""
    created_at: float = 0.0
    """Unix time the run started."""
    updated_at: float = 0.0
    """Unix time of the last change."""
    outcome: dict[str, Any] | None = None
    """The outcome of the status the run is in (`RunOutcome` as a dict): None while RUNNING or
    READY, else of the same kind as `status` (a store refuses a run whose two disagree)."""
    input_tokens: int = 0
    """Tokens sent to the model so far."""
    output_tokens: int = 0
    """Tokens the model produced so far."""
    model_requests: int = 0
    """Model requests made so far."""
    remembered: list[dict[str, Any]] = field(default_factory=list)
    """Rules an approver asked to remember for this run."""
    steps: int = 0
    """Model turns taken."""
    owner: str | None = None
    """Which process drives the run (`host:pid:nonce`)."""
    lease_until: float = 0.0
    """Until when the owner's claim holds without renewal."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Operator-relevant events (resumed, manifest change allowed, ...), as the run's driver
    recorded them; `Store.run_events` adds what other processes recorded (delivery attempts
    of its notifications)."""
    agent_ref: str | None = None
    """`module:object` that rebuilds the agent in another process (the CLI's resume uses it)."""
    parent_call_id: str | None = None
    """The parent's call that delegated to this run (a sub-agent's run), else None."""
    depth: int = 0
    """How deep in its tree this run is: 0 for a root, 1 for its sub-agents, and so on."""


@dataclass(kw_only=True, slots=True)
class CallRecord:
    """One tool call, from the model's request to its result, refused ones included."""

    id: str
    """The record's id (`<run_id>:<call_id>`)."""
    run_id: str
    """The run."""
    call_id: str
    """The model's call id."""
    turn: int
    """Which model turn asked for it."""
    index: int
    """Its position within the turn."""
    model_name: str
    """The tool name as the model sent it."""
    tool: str | None = None
    """The resolved tool id, or None when the name matched nothing."""
    arguments: str = ""
    """The arguments as the model sent them (JSON text)."""
    arguments_digest: str | None = None
    """sha256 of the canonical JSON of the validated arguments."""
    performed_arguments: dict[str, Any] | None = None
    """The validated arguments actually performed (differs when an approver modified them)."""
    actions: list[dict[str, Any]] = field(default_factory=list)
    """What the call touches (act, target, content digest — never file contents)."""
    verdict: dict[str, Any] | None = None
    """The policy's verdict: effect, rule, layer, reason."""
    decision: dict[str, Any] | None = None
    """The approver's decision, when asked."""
    decided_by: str | None = None
    """Who decided (approver name or operator)."""
    status: CallStatus = CallStatus.REFUSED
    """Where the call is."""
    result: dict[str, Any] | None = None
    """The result the model saw (`ToolResult.to_dict()`)."""
    disposition: str | None = None
    """For failures: not_sent / in_doubt / landed."""
    error: str | None = None
    """The operator-facing error (e.g. the rule that denied), never shown to the model."""
    answers: list[dict[str, Any]] = field(default_factory=list)
    """Responses to the tool's questions, replayed when the call is re-run."""
    pending_id: str | None = None
    """The pending approval, question or recovery this call waits on (or last waited on)."""
    started_at: float | None = None
    """When the body started."""
    ended_at: float | None = None
    """When the call ended."""
    provenance: dict[str, Any] | None = None
    """Where its output stands for the taint check, once it ran: `{"output": "trusted" |
    "untrusted", "trusted": [values the tool vouched for: ctx.trust, sanitizes]}`. A resumed
    run rebuilds its taint index from these and the results (docs/taint.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingItem:
    """Something waiting for a person: an approval, a question, or a recovery."""

    id: str
    """The item's id (what `handrail approve ID` takes)."""
    kind: str
    """`approval`, `question` or `recovery`."""
    run_id: str
    """The paused run."""
    call_record: str
    """The `CallRecord.id` it belongs to."""
    agent: str | None = None
    """The agent's name."""
    tool: str | None = None
    """The tool's id."""
    payload: dict[str, Any] = field(default_factory=dict)
    """The request (approval), question, or crash details (recovery)."""
    created_at: float = 0.0
    """When it was created."""
    state: str = "open"
    """`open` until decided, then `decided`."""
    decision: dict[str, Any] | None = None
    """The decision, answer or recovery chosen."""
    decided_by: str | None = None
    """Who decided."""
    decided_at: float | None = None
    """When."""
    deadline: float | None = None
    """When `on_expiry` applies if nobody decided (Unix time); None: the item never expires."""
    on_expiry: dict[str, Any] | None = None
    """The decision recorded at the deadline, by `expiry` (a deny unless a rule said else)."""
    escalate_at: float | None = None
    """When a second notification goes to the escalation target (before the deadline)."""
    approvals_needed: int = 1
    """How many distinct people must approve (four-eyes: 2); any deny ends it at once."""
    approvals: list[dict[str, Any]] = field(default_factory=list)
    """The approvals counted so far, `{"by", "at"}` each, one per person."""
    notified: int = 0
    """Notifications delivered: 0 none yet, 1 the first, 2 the escalation too."""
    notify_after: float = 0.0
    """No notification is attempted before this (a sender's hold, or the next retry)."""
    notes: list[dict[str, Any]] = field(default_factory=list)
    """What happened to the item besides its decision: each notification attempt (delivered
    or failed, to which target), the escalation, the expiry; `{"kind", "at", ...}` each."""


@dataclass(kw_only=True, slots=True)
class Batch:
    """Several writes committed in one transaction."""

    run: RunRecord | None = None
    """A run to insert or replace."""
    messages: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    """Messages to store as `(run_id, seq, dumped message)`; seq is the position in the run."""
    calls: list[CallRecord] = field(default_factory=list)
    """Call records to insert or replace."""
    pending: list[PendingItem] = field(default_factory=list)
    """Pending items to insert."""
    claims: list[QuotaClaim] = field(default_factory=list)
    """Quota counts to take with this batch's STARTED marks: each one counted in the same
    transaction, or the whole batch refused (`QuotaExceeded`) and nothing of it written."""


def positional_maker(cls: type, given: tuple[str, ...], signature: str | None = None
                     ) -> Callable[..., Any]:
    """A straight-line constructor of dataclass `cls`, `given` set from its arguments.

    Every other field gets its default: each list a new one, each other factory called anew.

    Generated once, as `clone`'s copiers are: a dataclass's keyword-only `__init__` (a type
    call, keyword matching, a call of each default factory) costs about twice this on the
    loop's per-call path (issue 38). Every field of `cls` is named, so a field added to it
    gets its default here without a change. `signature` is the generated function's
    parameter list (default: `given`, no defaults).
    """
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = [f"def make({signature or ', '.join(given)}):", "    n = new(cls)"]
    for f in fields(cls):
        if f.name in given:
            lines.append(f"    n.{f.name} = {f.name}")
        elif f.default_factory is list:
            lines.append(f"    n.{f.name} = []")  # a literal: no call
        elif f.default_factory is not MISSING:
            namespace[f"factory_{f.name}"] = f.default_factory
            lines.append(f"    n.{f.name} = factory_{f.name}()")
        else:
            namespace[f"default_{f.name}"] = f.default
            lines.append(f"    n.{f.name} = default_{f.name}")
    lines.append("    return n")
    exec("\n".join(lines) + "\n", namespace)
    make: Callable[..., Any] = namespace["make"]
    return make


new_batch: Callable[[RunRecord | None], Batch] = positional_maker(Batch, ("run",), "run=None")
"""`new_batch(run=None)`: `Batch(run=run)` for the per-turn path, without its `__init__`."""


@dataclass(kw_only=True, slots=True)
class QuotaClaim:
    """One call's place in one quota window, taken with its STARTED mark (see `Limit`)."""

    call_record: str
    """The `CallRecord.id` whose start it counts."""
    counter: str
    """What is counted (`Limit.counter`): the limit's act, pattern, window and key value."""
    window: int
    """The window's number since the epoch (`Limit.window`)."""
    limit: int
    """How many calls the window may start; ignored when `force`."""
    force: bool = False
    """Counted even over the limit (a call a person approved over it)."""
    count: int | None = None
    """Set by the store: the window's count with this call in it."""


class QuotaExceeded(StoreError):
    """A batch was not written: one of its claims found its window full.

    Raised by `Store.write`; nothing of the batch was stored. `claim` is the claim refused,
    `count` the window's count (the limit, or more when forced claims went over).
    """

    def __init__(self, claim: QuotaClaim, count: int) -> None:
        super().__init__(f"quota {claim.counter} window {claim.window}: {count} of "
                         f"{claim.limit} used; call {claim.call_record} not started")
        self.claim = claim
        self.count = count
