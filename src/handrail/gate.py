"""The gate: every tool call, from any source, passes the nine stages here, in this order.

```
1. resolve    model name -> tool, exactly; unknown -> model-visible error, not sent
2. grant      the manifest in force must grant the tool; else declined (uniform)
3. validate   arguments against the input schema; invalid -> InvalidArguments to the model
4. actions    what the call touches (Action(act, target, content))
4b. control   the tool control, when the agent has one: pass (on to 5) | refuse (not sent)
             | hold (a person decides, like a deferral); any failure of it refuses
   taint      a protected argument seen in untrusted tool output -> the verdict below can
              be no better than ask (`taint = "deny"`: deny); see docs/taint.md
5. policy     deny-first over all layers -> Verdict; deny -> one uniform sentence
6. approve    ask -> Approver: approve (maybe modified: back through 3-5) | deny | defer
7. execute    the handler runs; it may ask its caller (Responder) and be resumed
8. result     ToolResult, output schema checked (by the handler)
9. record     every call is recorded, refused ones included, never with file contents
```

Provenance (docs/taint.md): every result a call returns is untrusted data unless its tool is
declared `trusted_output`; stage 9 records that with the call (`CallRecord.provenance`) and
feeds it to the run's `Provenance` index, which the taint stage asks.

Records and contents: while a call may still be performed (pending approval, in flight, in
doubt) its records keep the exact arguments, so it is performed exactly as approved after a
process exit. Once it is performed, denied or refused, every stored copy of a write's content
(the call record's arguments and performed arguments, a modified approval, the approval or
recovery it waited on, and the stored assistant message) is replaced by a marker
`{"sha256": ..., "bytes": N}` (see `forget_contents`); a refused call's arguments are replaced
whole. `record_contents="full"` (an Agent option, recorded in the run's events) keeps them.

A turn's calls are planned (stages 1-5, no I/O) together, recorded in one transaction with
the assistant message, then approved and executed in call order where it matters: a
mutating call starts after every call before it has finished, a read after every mutating
call before it (reads next to each other run concurrently). Every READ/WRITE path is
canonicalised again at the moment of use and the call is refused, not sent, if it now leads
elsewhere. Results go back in call order and every call id gets exactly one result. A call
resumed from the store re-enters at the stage its record says it reached, so nothing decided
is lost and nothing finished runs twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import anyio

from handrail.approval import (
    Approve,
    Approver,
    Control,
    ControlVerdict,
    Decision,
    Defer,
    Deny,
    Request,
    Responder,
    adjudicate,
)
from handrail.errors import (
    AlreadyDecided,
    CallCancelled,
    Disposition,
    HandlerStateError,
    InvalidArguments,
    Issue,
    NotFound,
    PolicyDenied,
    PolicyError,
    ToolError,
    UserError,
)
from handrail.models import ToolCall, ToolResultMessage
from handrail.otel import Instrumentation
from handrail.policy import Act, Action, AskTerms, Effect, Limit, Policy, Rule, Verdict
from handrail.store import Batch, CallRecord, CallStatus, PendingItem, Store
from handrail.store.contract import QuotaClaim, QuotaExceeded, positional_maker, update
from handrail.tools import (
    CallContext,
    Cancel,
    Decline,
    Elicitation,
    Finished,
    Interaction,
    Invoke,
    PathChanged,
    Plan,
    Provenance,
    Question,
    Quote,
    Respond,
    Submit,
    Taint,
    Toolbox,
    ToolHandler,
    ToolId,
    ToolImpl,
    ToolResult,
    ToolSpec,
    address_pointers,
    call_words,
    check_argument_payload,
    decided_paths,
    local_validator,
    pointer_values,
    raise_body_error,
    schema_issues,
    scrub_host_paths,
    slot_setter,
)
from handrail.tools._plan import Miss
from handrail.tools._schemas import compile_check

__all__ = [
    "GOVERNANCE_EVENT",
    "NOT_GRANTED_MESSAGE",
    "RECORD_CONTENTS",
    "SANDBOX_MODES",
    "CallInDoubt",
    "ControlChain",
    "DelegatedPause",
    "Gate",
    "Governance",
    "PausedOnQuestion",
    "PausedOnRequest",
    "RunScope",
    "TurnPause",
    "TurnResult",
    "content_marker",
    "describe_control",
    "recorded_governance",
    "stricter_contents",
    "stricter_sandbox",
]

NOT_GRANTED_MESSAGE = "This tool is not available to this agent."
"""What the model sees for a tool the manifest does not grant (uniform, reveals nothing)."""

REDACTED = "[redacted: a refused call's record keeps only the arguments' digest]"
"""What a refused call's record holds in place of its arguments."""

RECORD_CONTENTS = ("digest", "full")
"""The choices for `record_contents`: keep a finished write's content as its digest (the
default), or keep the bytes (an explicit opt-in, recorded in the run's events)."""


@dataclass(kw_only=True)
class RunScope:
    """Everything the gate needs to decide and perform one run's calls."""

    run_id: str
    agent: str | None
    toolbox: Toolbox
    policy: Policy
    """The effective policy (recorded policy, the current one's denies, remembered rules)."""
    store: Store
    approver: Approver
    responder: Responder
    workspace: Path
    manifest: Any = None
    deps: Any = None
    remembered: list[Rule] = field(default_factory=list)
    record_contents: str = "digest"
    """`digest`: a finished call's stored contents become markers; `full`: the bytes stay."""
    provenance: Provenance = field(default_factory=Provenance)
    """The run's trusted text and untrusted tool output, for the taint stage."""
    events: Any = None
    """`events(kind, record, **detail)`: a tool's `ctx.report_progress`/`ctx.record_event`."""
    before_execute: Callable[[CallRecord], Awaitable[None]] | None = None
    """Awaited in the task that runs a call's body, just before it runs (a host's per-call
    disk record); a call refused before that point never reaches it."""
    intent: Sequence[str] | None = None
    """The tools (CALL patterns) this run's task may change the world with, as the trusted
    side gave them (`Agent.run(intent=...)`); a mutating call outside them asks. None: no
    intent, every allowed call is decided by its rules and its arguments' taint alone."""
    plan: Plan | None = None
    """The world-changing calls this run's task committed to before any tool output
    (`Agent.run(plan=...)`): an allowed mutating call no step covers asks. None: no plan."""
    sandbox: str = "auto"
    """How programs started by tools are confined: "auto", "required" or "off" (see
    docs/sandbox.md); reaches the tool as `ctx.sandbox`, with `ctx.policy`."""
    control: Control | None = None
    """The tool control asked about every granted, valid call before the policy (4b)."""
    telemetry: Instrumentation | None = None
    """Where the run's spans and metrics go (`handrail.otel`); None: nowhere, at no cost."""
    agent_path: tuple[str, ...] = ()
    """Where this run's agent stands in a tree of agents, from the root (docs/subagents.md):
    put on every `Request` and `Question` so a person sees who asks. Empty outside a tree."""
    principal: str | None = None
    """Who started the run (`Agent.run(principal=...)`), what `limit ... per principal`
    counts apart; None: the runs of nobody in particular, counted together."""
    mark_reads: bool = True
    """Commit a STARTED mark before a call that changes nothing runs. False (the agent loop
    on a durable store, and `handrail serve`): a turn whose calls all change nothing commits
    once, with its results; a read
    cut off by a crash is not in doubt (nothing can be repeated blindly), so no mark is owed
    before it. A call that mutates or asks is marked first either way."""

    def remember(self, rules: Sequence[Rule]) -> None:
        """Install run-scoped rules on top; deny-first means they never beat a deny."""
        if not rules:
            return
        self.remembered.extend(rules)
        self.policy = self.policy.with_layer_on_top("remembered", list(rules))


SANDBOX_MODES = ("off", "auto", "required")
"""The sandbox modes, weakest first: of two, the later one is the stricter."""


def stricter_sandbox(a: str, b: str) -> str:
    """The stricter of two sandbox modes (`"required"` over `"auto"` over `"off"`)."""
    return a if SANDBOX_MODES.index(a) >= SANDBOX_MODES.index(b) else b


def stricter_contents(a: str, b: str) -> str:
    """The stricter of two `record_contents` modes: `"digest"` (keeps less) over `"full"`."""
    return "digest" if "digest" in (a, b) else a


class ControlChain:
    """Several tool controls asked in turn: the first that does not pass decides.

    A tree of agents is governed by its root (docs/subagents.md): a sub-agent's calls go to
    the root's control first, then to each control below it down to the child's own. A control
    of a child can only add refusals and holds to its root's, never lift one.
    """

    def __init__(self, members: Sequence[Control]) -> None:
        flat: list[Control] = []
        for member in members:
            for one in (member.members if isinstance(member, ControlChain) else (member,)):
                if one not in flat:  # the same control twice is asked once
                    flat.append(one)
        self.members: tuple[Control, ...] = tuple(flat)
        """The controls, root's first."""

    @staticmethod
    def of(*controls: Control | None) -> Control | None:
        """The chain of the controls given (None skipped): None, one control, or a chain."""
        present = ControlChain([c for c in controls if c is not None]).members
        if not present:
            return None
        return present[0] if len(present) == 1 else ControlChain(present)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ControlChain) and other.members == self.members

    def __hash__(self) -> int:
        return hash(self.members)

    @property
    def timeout(self) -> float:
        """The longest the whole chain may take: its members' timeouts together."""
        # 5 s: `adjudicate`'s default for a control that names no timeout.
        return sum(float(getattr(m, "timeout", 5.0)) for m in self.members)

    async def adjudicate(self, query: dict[str, Any]) -> ControlVerdict:
        """Each member's verdict in turn (`adjudicate`); the first that is not a pass."""
        verdict = ControlVerdict(decision="pass", reason="")
        for member in self.members:
            verdict = await adjudicate(member, query)
            if verdict.decision != "pass":
                break
        return verdict

    async def ask(self, query: dict[str, Any]) -> Any:
        """The chain's answer as one control's (`adjudicate` above keeps a failure's flag)."""
        verdict = await self.adjudicate(query)
        return {"decision": verdict.decision, "reason": verdict.reason}

    def describe(self) -> str:
        """Each member's description, root's first, joined by `then`."""
        return " then ".join(m.describe() for m in self.members)


def describe_control(control: Control | None) -> str | None:
    """What a run records of its tool control (None: no control)."""
    return None if control is None else control.describe()


GOVERNANCE_EVENT = "governance"
"""The kind of the event that records a run's governance (see `Governance.event`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Governance:
    """Everything that decides a run's calls, derived once when the run starts.

    What every door carries (docs/architecture.md): `Agent.run`, a sub-agent's run (its
    root's governance made stricter by the child's), every resume in any process
    (`handrail approve`/`deny`/`answer`/`recover`/`resume`, the inbox, `handrail worker`) and
    each session of `handrail serve`. A door builds its gate's scope with `scope()`, never
    from local defaults. The run records it: the policy in `RunRecord.policy`, the manifest's
    digest in `manifest_digest`, the workspace in `workspace`, and the rest in the run's
    first `governance` event (`event()`), which a resume reads back (`recorded_governance`).
    """

    policy: Policy
    """The policy in force (recorded, contained, remembered rules excluded)."""
    workspace: Path
    """The absolute workspace every READ/WRITE path is confined to."""
    manifest: Any = None
    """The manifest in force (a tree's root's), or None."""
    control: Control | None = None
    """The tool control every granted, valid call is put to (a tree: root's first)."""
    sandbox: str = "auto"
    """How programs the tools start are confined: "off", "auto" or "required"."""
    record_contents: str = "digest"
    """`digest` or `full`: what a finished call's stored contents become."""

    @property
    def taint(self) -> str:
        """What a tainted protected argument gets: `ask` or `deny` (the policy's)."""
        return self.policy.taint

    @property
    def manifest_digest(self) -> str | None:
        """The digest of the manifest in force, or None."""
        return None if self.manifest is None else str(self.manifest.digest)

    def event(self, at: float) -> dict[str, Any]:
        """The run's `governance` event: what it records beside its policy.

        The workspace, the manifest's digest and the taint mode are repeated here so that
        one event states the whole value (`handrail show --json` reads it).
        """
        return {"kind": GOVERNANCE_EVENT, "workspace": str(self.workspace),
                "manifest": self.manifest_digest, "control": describe_control(self.control),
                "sandbox": self.sandbox, "taint": self.taint,
                "record_contents": self.record_contents, "at": at}

    def scope(self, *, run_id: str, agent: str | None, toolbox: Toolbox, store: Store,
              approver: Approver, responder: Responder, remembered: Sequence[Rule] = (),
              **rest: Any) -> RunScope:
        """The gate's scope of one run under this governance (the one way a door builds it).

        `rest` are the scope's other fields (deps, telemetry, events...), none of which
        decides a call.
        """
        remembered = list(remembered)
        policy = (self.policy.with_layer_on_top("remembered", remembered) if remembered
                  else self.policy)
        return RunScope(run_id=run_id, agent=agent, toolbox=toolbox, policy=policy,
                        store=store, approver=approver, responder=responder,
                        workspace=self.workspace, manifest=self.manifest,
                        remembered=remembered, record_contents=self.record_contents,
                        sandbox=self.sandbox, control=self.control, **rest)


def recorded_governance(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The governance a run recorded when it started (its first `governance` event), or None.

    Only the run's own event counts: one a tool recorded (`ctx.record_event`) always carries
    its `call_id`, and is ignored.
    """
    for event in events:
        if isinstance(event, Mapping) and event.get("kind") == GOVERNANCE_EVENT \
                and "call_id" not in event:
            return dict(event)
    return None


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical_c() -> Callable[[Any], str] | None:
    """`_CANONICAL.encode` without its Python layers, when the json C accelerator exists.

    `JSONEncoder.encode` with `ensure_ascii=False` builds a C encoder and a float formatter
    per call (~3 µs of a 4 µs digest); this builds the same C encoder once, with the same
    options, and so the same text. It is built without a `markers` dict: it then holds no
    state between calls (safe from any thread), and a circular value, which validated
    arguments never are, fails with RecursionError instead of ValueError.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    enc = _CANONICAL
    strings = json.encoder.encode_basestring  # ensure_ascii=False
    encoder = make(None, enc.default, strings, None, ":", ",", True, False, True)

    def encode(value: Any) -> str:
        if type(value) is str:  # what JSONEncoder.encode does for a bare string
            return strings(value)
        return "".join(encoder(value, 0))

    return encode


_ENCODE = _canonical_c() or _CANONICAL.encode


def _record_maker() -> Callable[[str, str, str, int, int, str, str | None, str], CallRecord]:
    """A straight-line constructor of a new call's record, every other field its default.

    Its arguments are `(id, run_id, call_id, turn, index, model_name, tool, arguments)`; a
    default factory is called anew for each record.
    Generated once, as the store's `clone` is: `CallRecord(...)`'s keyword-only `__init__`
    matches each keyword and evaluates each default, ~10 k instructions of a fast-path call;
    this stores the same fields positionally, in about half (issue 38). Every field of
    `CallRecord` is named, so a field added to it gets its default here without a change.
    """
    given = ("id", "run_id", "call_id", "turn", "index", "model_name", "tool", "arguments")
    make: Callable[[str, str, str, int, int, str, str | None, str], CallRecord] = (
        positional_maker(CallRecord, given))
    return make


_new_record = _record_maker()


def _sha256_of() -> Callable[[bytes], Any]:
    """The interpreter's own SHA-256 (`_sha256`, `_sha2` from 3.12), else hashlib's.

    The same digest; for a short text the built-in one skips OpenSSL's context set-up and
    its finalisation, ~1.5 k instructions of a fast-path call (issue 38).
    """
    for name in ("_sha256", "_sha2"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        made: Callable[[bytes], Any] | None = getattr(module, "sha256", None)
        if made is not None:
            return made
    return hashlib.sha256


_SHA256 = _sha256_of()


def _digest(arguments: Any) -> str:
    # Sorted keys at every depth: the same arguments always give the same digest, whatever
    # order the model wrote them in.
    digest: str = _SHA256(_ENCODE(arguments).encode()).hexdigest()
    return "sha256:" + digest


def content_marker(content: bytes) -> dict[str, Any]:
    """What a record keeps in place of file contents: their sha256 and size."""
    return {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}


Contents = dict[int, set[str]]
"""Known contents by size, each as the set of their sha256 hex digests."""


def _strip(value: Any, contents: Contents) -> Any:
    """`value` with every string that is exactly one of `contents` replaced by its marker."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        digests = contents.get(len(data))
        if digests:
            # Hashed only when the size matches a known content: short strings stay cheap.
            digest = hashlib.sha256(data).hexdigest()
            if digest in digests:
                return {"sha256": digest, "bytes": len(data)}
        return value
    if isinstance(value, dict):
        return {k: _strip(v, contents) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, contents) for v in value]
    return value


def _strip_text(text: str, contents: Contents) -> str:
    # Text that is not JSON is kept: such arguments are refused before any action, so they
    # named nothing the call could have written.
    try:
        value = json.loads(text)
    except ValueError:
        return text
    stripped = _strip(value, contents)
    return text if stripped == value else _CANONICAL.encode(stripped)


def _refused_arguments(text: str) -> str:
    """What the stored assistant message keeps of a refused call's arguments."""
    return _CANONICAL.encode({"redacted": REDACTED, **content_marker(text.encode(
        "utf-8", "surrogatepass"))})


def _contents_of(payload: dict[str, Any], actions: Sequence[Action]) -> Contents:
    contents: Contents = {}
    for data in [a.content for a in actions if a.content] + _payload_contents(payload):
        if data:
            contents.setdefault(len(data), set()).add(hashlib.sha256(data).hexdigest())
    return contents


def _is_refusal_marker(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("redacted") == REDACTED


def _payload_without_contents(payload: dict[str, Any], contents: Contents
                              ) -> dict[str, Any]:
    """An approval or recovery item's payload once its call is over: contents as markers."""
    import base64

    kept = dict(payload)
    raw = kept.get("content")
    if isinstance(raw, str):
        data = base64.b64decode(raw)
        kept["content"] = None
        kept["content_sha256"] = hashlib.sha256(data).hexdigest()
        kept["content_bytes"] = len(data)
    if "arguments" in kept:
        kept["arguments"] = _strip(kept["arguments"], contents)
    actions = kept.get("actions")
    if isinstance(actions, list):
        kept["actions"] = [_action_without_content(a) for a in actions]
    return kept


def _action_without_content(action: Any) -> Any:
    import base64

    if not isinstance(action, dict) or not isinstance(action.get("content"), str):
        return action
    data = base64.b64decode(action["content"])
    return {**action, "content": None, "content_sha256": hashlib.sha256(data).hexdigest(),
            "content_bytes": len(data)}


def _payload_contents(payload: dict[str, Any]) -> list[bytes]:
    """The contents an approval payload carries (the request's and its actions')."""
    import base64

    found = [payload.get("content")] + [a.get("content") for a in payload.get("actions", ())
                                        if isinstance(a, dict)]
    return [base64.b64decode(c) for c in found if isinstance(c, str)]


def _action_record(action: Action) -> dict[str, Any]:
    # Never the content itself: a refusal's record must not hold file contents.
    target = list(action.target) if isinstance(action.target, tuple) else action.target
    out: dict[str, Any] = {"act": action.act.value, "target": target}
    if action.content is not None:
        out["content_sha256"] = hashlib.sha256(action.content).hexdigest()
        out["content_bytes"] = len(action.content)
    return out


def _record_canonical(records: list[dict[str, Any]], decided: Mapping[str, str]) -> None:
    """Name each READ/WRITE path of a call with several actions in its decided form.

    The verdict names the canonical target of the action that decided; the others' would be
    lost, and a replay of the record (`handrail policy what-if`) must judge the paths as
    they were decided, not as the disk resolves them later. A path that could not be made
    canonical (outside the workspace) is marked `confined`.
    """
    for entry in records:
        if entry["act"] in ("read", "write") and isinstance(entry["target"], str):
            canonical = decided.get(entry["target"])
            if canonical is None:
                entry["confined"] = True
            else:
                entry["canonical"] = canonical


class _ToolPlan:
    """What one version of the rules decides about a tool whatever its arguments (issue 11).

    Built once per tool while the policy, the toolbox, the manifest and the workspace stay
    the same objects (`Gate._tool_plan`); any of them replaced (a remembered rule, a new
    toolbox, a resumed run's contained policy) and every plan is built again. It holds the
    tool as offered, and the verdict and record dicts of the one action most tools declare,
    `CALL server/name`: a CALL's verdict depends on nothing but the rules, the target and
    `mutates` (no path, no address), so deciding it again per call only repeats this.
    """

    __slots__ = ("action_records", "fast", "impl", "planned", "spec", "stems", "target",
                 "tool_id", "verdict", "verdict_record")

    def __init__(self, impl: ToolImpl, spec: ToolSpec, scope: RunScope) -> None:
        self.impl = impl
        self.spec = spec
        """The tool as offered: the manifest's view (its mutates, protected...) when one is
        in force."""
        action = Action(Act.CALL, str(impl.spec.id))
        self.target = action.target
        self.verdict = scope.policy.check(action, workspace=scope.workspace,
                                          mutates=spec.mutates)
        self.verdict_record = self.verdict.to_dict()
        self.action_records = [_action_record(action)]
        # A rule with value conditions decides on the arguments: no verdict can be planned.
        self.planned = not scope.policy.conditional
        self.tool_id = str(impl.spec.id)
        manifest = scope.manifest
        self.fast = (self.planned and self.verdict.effect is Effect.ALLOW
                     and not spec.protected
                     and spec.input_schema is impl.spec.input_schema
                     and (manifest is None or manifest.grant(impl.spec.id) is not None)
                     and not scope.policy.limits_for([action], workspace=scope.workspace))
        """Whether a call of this tool may take the gate's fast path (`Gate._fast_turn`): the
        rules allow its CALL whatever its arguments, the manifest grants it and supplies no
        schema of its own, it declares no protected argument, and no quota counts it. Its
        arguments are still validated, its actions compared with the CALL, its arguments
        looked up for addresses and, for a mutating tool, for a value a sentence of tool
        output names (the taint stage), per call."""
        self.stems = call_words(impl.spec.id.name) if spec.mutates else ()
        """The tool name's words a sentence naming this call holds (`Provenance.named`)."""

    def called(self, actions: Sequence[Action]) -> Verdict | None:
        """The planned verdict when `actions` is exactly the tool's CALL; else None."""
        if len(actions) != 1 or not self.planned:
            return None
        action = actions[0]
        if action.act is not Act.CALL or action.content is not None or \
                action.target != self.target:
            return None
        return self.verdict


_NO_PATHS: Mapping[str, str] = MappingProxyType({})
"""A call's decided paths when it has none (shared: read-only)."""


class _Call:
    """One call's working state within a turn.

    Every field but the call and its record starts as a class attribute, and an instance
    holds only what it changes: a new call sets two attributes, not two dozen (issue 38:
    the fast path makes one a call). The defaults are immutable (None, the empty tuple, a
    frozen mapping, False), so an instance never shares a state it could change in place.
    """

    # The sequences start as the empty tuple and are replaced, never changed in place (a
    # tuple cannot be): most calls never fill one, and each list a call allocates and frees
    # costs it (issue 11). `trusted` is the one list a tool appends to (ctx.trust): made
    # when a context is.
    impl: ToolImpl | None = None
    # The tool as offered, from the plan its check used: the same all turn (the toolbox and
    # the manifest change between turns only), so read without the plan.
    offered: ToolSpec | None = None
    validated: Any = None
    actions: Sequence[Action] = ()
    decided: Mapping[str, str] = _NO_PATHS  # READ/WRITE target as given -> canonical
    verdict: Verdict | None = None
    result: ToolResult | None = None
    stored: dict[str, Any] | None = None  # `result.to_dict()`, made by `finish`
    outcome: TurnPause | None = None
    pending: Sequence[PendingItem] = ()
    answers: Sequence[Submit | Decline] = ()
    reask: PendingItem | None = None  # an open deferred approval to put to the approver
    spent: Sequence[PendingItem] = ()  # decided items whose payload may hold contents
    taint: Sequence[Taint] = ()  # protected arguments seen in untrusted output
    trusted: list[Any] | None = None  # what the body vouched for with ctx.trust
    # The tool control's verdict on the arguments with this digest: asked once per
    # arguments within a turn (a modified approval has other arguments: asked again).
    controlled: tuple[str, ControlVerdict] | None = None
    held: str | None = None  # the control's reason when it holds this call
    began = False  # its body was entered in this process (an interrupt: in doubt)
    # The quotas its start counts in (policy.limits_for), and the reason when one of them
    # was found full (the approver is shown it).
    limits: Sequence[tuple[Limit, str]] = ()
    over: str | None = None
    span: Any = None  # its execute_tool span, while open (telemetry on)

    def __init__(self, call: ToolCall, record: CallRecord) -> None:
        self.call = call
        self.record = record

    def finish(self, result: ToolResult, status: CallStatus, *, disposition: str | None = None,
               error: str | None = None) -> None:
        self.result = result
        record = self.record
        record.status = status
        record.result = self.stored = result.to_dict()
        record.disposition = disposition
        record.error = error
        record.ended_at = time.time()
        if status is CallStatus.REFUSED:
            # A refusal's record never holds what the call would have written: the arguments
            # go, their digest and the actions (content as sha256 and size) stay.
            record.arguments = REDACTED
            record.performed_arguments = None

    def pause(self, outcome: TurnPause, status: CallStatus, item: PendingItem | None) -> None:
        self.outcome = outcome
        pending_id = self.record.pending_id
        if item is not None:
            self.pending = [*self.pending, item]
            pending_id = item.id
        update(self.record, status=status, pending_id=pending_id)


# What stopped a turn short. The gate knows calls and turns, not runs: `handrail.runs` maps
# each of these to its run outcome (AwaitingApproval, AwaitingAnswer, AwaitingRecovery).


@dataclass(frozen=True, slots=True)
class PausedOnRequest:
    """A call waits for a person's decision on an approval request (persisted, open)."""

    request_id: str
    """The pending approval request's id."""
    kind: Literal["paused_on_request"] = "paused_on_request"


@dataclass(frozen=True, slots=True)
class PausedOnQuestion:
    """A tool asked a question (or a form) nobody here could answer (persisted, open)."""

    question_id: str
    """The pending question's id."""
    kind: Literal["paused_on_question"] = "paused_on_question"


@dataclass(frozen=True, slots=True)
class CallInDoubt:
    """A call was in flight when its process died; an operator says what happened."""

    call_id: str
    """The call record's id (also the id of its pending recovery item)."""
    kind: Literal["call_in_doubt"] = "call_in_doubt"


TurnPause = PausedOnRequest | PausedOnQuestion | CallInDoubt
"""Why a turn stopped before every call had a result."""


class DelegatedPause(Exception):
    """Raised by a tool body that delegated to a durable run which now waits for a person.

    The gate leaves the call STARTED and pauses the turn on `pause` (the delegate's item):
    the tool must be `idempotent`, its re-run continuing the delegate rather than acting
    again. Sub-agent tools (`Agent.as_tool`, docs/subagents.md) are the one user.
    """

    def __init__(self, pause: TurnPause) -> None:
        super().__init__(pause.kind)
        self.pause = pause
        """The delegate's open item, which the turn (and its run) pauses on."""


@dataclass
class TurnResult:
    """The outcome of driving one turn's calls."""

    results: list[ToolResultMessage]
    """One result per call, in call order (complete only when `pause` is None)."""
    pause: TurnPause | None
    """The first pause in call order, when a call waits for a person; else None."""
    final: Batch
    """The turn's last records and pending items, for the caller to commit."""
    message_arguments: dict[str, str] = field(default_factory=dict)
    """Call id -> the arguments the stored assistant message keeps from now on (contents
    replaced by markers, a refused call's arguments whole); the caller rewrites the message."""
    dumped: list[dict[str, Any]] = field(default_factory=list)
    """`results` as stored messages (`dump_messages(results)`): each result's dict is the one
    its call record holds, when the record's is the result's (one `to_dict` a call)."""


def _turn_result_maker() -> Callable[
        [list[ToolResultMessage], TurnPause | None, Batch, dict[str, str], list[dict[str, Any]]],
        TurnResult]:
    """`TurnResult(results, pause, final, message_arguments, dumped)`, positionally.

    Generated once from the dataclass's fields, as `_record_maker` is (a field added to it
    becomes a parameter here, and the call fails until it is passed): the fast path
    returns one a call, and a plain function skips the type call and its `__init__`
    (issue 38).
    """
    names = [f.name for f in dataclasses.fields(TurnResult)]
    source = (f"def make({', '.join(names)}):\n    n = new(cls)\n"
              + "".join(f"    n.{name} = {name}\n" for name in names) + "    return n\n")
    namespace: dict[str, Any] = {"new": object.__new__, "cls": TurnResult}
    exec(source, namespace)
    make: Callable[[list[ToolResultMessage], TurnPause | None, Batch, dict[str, str],
                    list[dict[str, Any]]], TurnResult] = namespace["make"]
    return make


_new_turn_result = _turn_result_maker()


_EVERY_PATH = frozenset({"**", "**/*"})
"""Patterns of a rule that did not choose which paths: its allow vouches for none."""


class Gate:
    """Stages 1-9 for the calls of one run (see the module docstring)."""

    def __init__(self, scope: RunScope) -> None:
        self.scope = scope
        # What the model is offered, by id: the manifest's view of each tool (its schema for
        # untyped tools, the stricter mutates/idempotent) is what the gate enforces.
        self._offered: dict[ToolId, ToolSpec] = {s.id: s for s in self.offered()}
        self._schema_checks: dict[ToolId, tuple[Any, Callable[[Any], bool] | None]] = {}
        # Plans by id(impl) (each plan holds its impl, so the id is not reused meanwhile),
        # valid for the objects in `_planned_for` (see `_ToolPlan`).
        self._plans: dict[int, _ToolPlan] = {}
        self._planned_for: tuple[Any, ...] = ()
        # One writer of the taint index at a time; taken without a trip through the event
        # loop when nobody holds it.
        self._indexing = anyio.Lock(fast_acquire=True)
        # Finished calls' outputs not indexed yet: (source, result, trusted, vouched values),
        # in the order they finished. Indexed when a call with protected arguments is about
        # to be checked (`_catch_up_index`).
        self._unindexed: list[_Queued] = []
        # The gates of the runs above a delegated run (`inherit`), the root first.
        self._parents: tuple[Gate, ...] = ()
        self._intent_policy: tuple[Sequence[str], Policy] | None = None
        self._plan_policies: tuple[Plan, list[Policy]] | None = None

    # ---------------------------------------------------------------- a turn

    async def drive_turn(
        self,
        turn: int,
        calls: Sequence[ToolCall],
        existing: dict[str, CallRecord],
        first_write: Batch,
    ) -> TurnResult:
        """Plan, record, approve, execute and record every call of one turn.

        `existing` holds records from an earlier attempt at this turn (a resume); `first_write`
        carries what must be committed with the turn's first records (the assistant message,
        the run's update). Results come back in call order.

        With `RunScope.mark_reads` false, a new turn whose every call either was
        refused or runs a tool that changes nothing (`mutates=False`), with nothing pending, is not
        committed before its calls run: `first_write` joins the turn's `final` batch instead, which
        the caller commits before anyone sees a result (one commit per turn instead of two). A
        STARTED mark and a decision are committed before the side effect they allow; such a turn has
        none, and a crash before its commit leaves the run at the previous turn's end, as if the
        model had not answered yet.
        """
        scope = self.scope
        self._deferred = None
        if len(calls) == 1 and not existing and scope.telemetry is None and \
                scope.control is None:
            fast = await self._fast_turn(turn, calls[0], first_write)
            if fast is not None:
                return fast
        states: list[_Call] = []
        for index, call in enumerate(calls):
            record = existing.get(call.id)
            if record is None:
                record = CallRecord(id=f"{scope.run_id}:{call.id}", run_id=scope.run_id,
                                    call_id=call.id, turn=turn, index=index,
                                    model_name=call.name, arguments=call.arguments)
            states.append(_Call(call, record))
        if scope.telemetry is not None:
            scope.telemetry.calls_started(states)
        if scope.control is not None and not existing and len(states) > 1:
            # The control is the only I/O of a plan: a new turn's calls are put to it
            # together (their plans share nothing, nothing has acted yet).
            async with anyio.create_task_group() as tg:
                for state in states:
                    tg.start_soon(self._plan, state)
        else:
            # In call order: a decision re-entered here can remember rules for later calls.
            for state in states:
                if state.call.id in existing:
                    await self._reenter(state)
                elif self._resolve(state):  # stages 1-2 here: one coroutine less a call
                    await self._check(state, state.call.arguments)
        return await self._drive_planned(states, existing, first_write)

    async def _fast_turn(self, turn: int, call: ToolCall, first_write: Batch
                         ) -> TurnResult | None:
        """A turn of one new call, on the fast path when its tool's plan allows (else None).

        The common case: one call of a tool whose CALL the rules allow whatever its
        arguments (`_ToolPlan.fast`), no control, no telemetry. Stages 1-2 are the plan's
        (resolved by exact name; the grant decided with the plan); stage 3 validates as
        `_check` does; stage 4 takes the tool's actions and, when they are exactly the
        planned CALL, stage 5 the planned verdict, once the taint stage found no address
        among the arguments and no value a sentence of tool output names for the call.
        Anything else (invalid arguments, other actions, an address, a named value, an
        intent or a plan over a mutating call) leaves the call to the general stages at the
        point it differs: nothing is skipped, only what the plan has decided already.
        """
        scope = self.scope
        impl = scope.toolbox.by_model_name(call.name)
        if impl is None:
            return None
        plan = self._tool_plan(impl)
        if not plan.fast:
            return None
        mutates = plan.spec.mutates
        if mutates and (scope.intent is not None or scope.plan is not None):
            return None
        record = _new_record(f"{scope.run_id}:{call.id}", scope.run_id, call.id, turn, 0,
                             call.name, plan.tool_id, call.arguments)
        state = _Call(call, record)
        state.impl = impl
        state.offered = plan.spec
        # 3. validate
        try:
            payload = check_argument_payload(plan.tool_id, call.arguments,
                                             scope.toolbox.max_argument_bytes)
            validated = impl.validate(payload)
        except InvalidArguments:
            await self._check(state, call.arguments)  # the general stage writes the refusal
            return await self._drive_planned([state], {}, first_write)
        dumped = impl.dump_arguments(validated)
        state.validated = validated
        # 4. actions
        try:
            actions = list(impl.actions(validated))
        except Exception:  # boundary: the general stage refuses it, never allows
            await self._check(state, call.arguments)
            return await self._drive_planned([state], {}, first_write)
        # taint: the addresses among the arguments, as `_check_actions` looks them up (a
        # mutating call's links too); any found leaves the call to the general stages.
        # A mutating call's value a sentence of tool output names beside the tool's words
        # (`Provenance.named`) leaves it too: the fast path skips no taint check.
        links: list[tuple[str, tuple[str, ...]]] | None = [] if mutates else None
        general = plan.called(actions) is None or \
            bool(address_pointers(dumped, mutates=mutates, links=links)) or bool(links)
        if not general and plan.stems and not getattr(impl, "delegates", False):
            general = bool(await self._named(plan.stems, dumped, ()))
        if general:
            await self._check_actions(state, plan, dumped, actions)
            return await self._drive_planned([state], {}, first_write)
        # 5. policy: the planned verdict, an allow (`_check_actions` with nothing to add).
        state.actions = actions
        state.verdict = plan.verdict
        record.arguments_digest = _digest(dumped)
        record.performed_arguments = dumped
        record.actions = list(map(dict, plan.action_records))  # no comprehension's frame
        record.verdict = dict(plan.verdict_record)
        record.status = CallStatus.STARTED
        record.started_at = time.time()
        first_write.calls.append(record)
        if not scope.mark_reads and not mutates and not first_write.pending and \
                not first_write.claims:
            final = first_write  # one commit for the turn, with its result (`drive_turn`)
        else:
            await self._write_claiming(first_write, [state])
            final = Batch(calls=[record])
        spec = impl.spec
        try:
            if spec.interactions or spec.timeout is not None or impl.needs_context or \
                    scope.before_execute is not None or state.decided:
                await self._execute(state, persist_start=False)
            else:
                # Stages 7-8 as `_execute` takes them for a body that needs no context, asks
                # nothing and has no deadline, written out: no coroutine of its own, every
                # call (issue 38). The same steps in the same order, its failures the same.
                try:
                    bound = impl.bind(validated, scope.workspace, state.decided)
                except PathChanged as exc:
                    state.finish(ToolResult.error(str(exc)), CallStatus.REFUSED,
                                 disposition=Disposition.NOT_SENT.value, error=str(exc))
                else:
                    state.began = True
                    try:
                        done = await impl.execute(bound, None)
                    except DelegatedPause as paused:
                        state.outcome = paused.pause
                    except BaseException as exc:
                        self._body_failed(state, spec, exc)
                    else:
                        state.finish(done, CallStatus.FINISHED)
                        self._observe(state)
        except BaseException as exc:
            if _is_interrupt(exc):
                if final is first_write:
                    self._deferred = first_write
                self.interrupted = self._settled([state])
            raise
        result = state.result
        if result is None or record.status is not CallStatus.FINISHED:
            # Paused (a delegate waits for a person) or refused at the moment of use.
            if final is first_write:
                self._deferred = first_write
            return self._turn_result([state])
        # Stage 9 as `_turn_result` makes it for one finished call: nothing to forget (its
        # one action is the CALL, without content; no decision, nothing spent).
        stored = state.stored
        return _new_turn_result([_result_message(call.id, call.name, result)], None, final,
                                {}, [{"kind": "tool_result", "call_id": call.id,
                                      "name": call.name, "result": stored if stored is not None
                                      and record.result is stored else result.to_dict()}])

    async def _drive_planned(self, states: list[_Call], existing: dict[str, CallRecord],
                             first_write: Batch) -> TurnResult:
        """`drive_turn` once every call is planned: record, approve, execute, record."""
        scope = self.scope
        # One transaction: the turn's message, every refusal, and a STARTED mark for each call
        # about to run (so a crash mid-call is found in doubt, never silently re-run).
        now = time.time()
        for state in states:
            if state.result is None and state.outcome is None and \
                    state.record.status is CallStatus.STARTED:
                update(state.record, started_at=now)
        first_write.calls.extend(s.record for s in states
                                 if s.result is not None or s.outcome is not None
                                 or s.record.status is CallStatus.STARTED)
        first_write.pending.extend(p for s in states for p in s.pending)
        for s in states:
            s.pending = ()
            if s.limits and s.result is None and s.outcome is None and \
                    s.record.status is CallStatus.STARTED:
                first_write.claims.extend(self._claims(s))
        if not scope.mark_reads and not existing and not first_write.pending and \
                not first_write.claims and self._act_on_nothing(states):
            self._deferred = first_write
        else:
            await self._write_claiming(first_write, states)

        async def act(state: _Call) -> None:
            if state.result is not None or state.outcome is not None:
                return
            if state.record.status is CallStatus.APPROVED and state.held is not None and \
                    state.reask is None:
                # Held by the tool control: a person decides through the pending request;
                # the agent's approver (which may approve everything) is not asked.
                request = self._request(state)
                await self._decide(state, request, Decision.defer(),
                                   decided_by="tool control")
                return
            if state.record.status is CallStatus.APPROVED:  # ask: the approver decides now
                reask = state.reask
                request = (self._request(state) if reask is None
                           else Request.from_dict(reask.payload))
                decision = await (scope.approver.decide(request) if scope.telemetry is None
                                  else scope.telemetry.decide(state, scope.approver, request))
                if not isinstance(decision, Decision):
                    raise TypeError(f"{_name(scope.approver)}.decide returned {decision!r}, "
                                    "not an hr.Decision")
                decided_by = _name(scope.approver)
                if reask is not None:
                    if isinstance(decision, Defer):
                        state.pause(PausedOnRequest(reask.id), CallStatus.AWAITING_APPROVAL,
                                    None)
                        return
                    if isinstance(decision, Approve):
                        decision.check(request.act)  # never record what cannot be applied
                    try:
                        counted = await scope.store.decide(reask.id, decision.to_dict(),
                                                           decided_by)
                    except AlreadyDecided:
                        # Someone decided first, elsewhere: theirs stands.
                        won = await scope.store.pending_item(reask.id)
                        decision = Decision.from_dict(won.decision or {})
                        decided_by = won.decided_by or "operator"
                    else:
                        if counted.state == "open":
                            # Four-eyes: this approver was one of the people it needs.
                            state.pause(PausedOnRequest(reask.id),
                                        CallStatus.AWAITING_APPROVAL, None)
                            return
                        state.spent = [*state.spent, counted]
                        decided_by = counted.decided_by or decided_by
                elif isinstance(decision, Approve) and request.terms.approvals > 1:
                    # Four-eyes: an approver's yes is one of the approvals the rule needs. The
                    # request is persisted with it counted, and waits for the others.
                    decision.check(request.act)
                    await self._decide(state, request, Decision.defer(),
                                       decided_by=decided_by, approved_by=decided_by)
                    return
                await self._decide(state, request, decision, decided_by=decided_by)
                if _status(state) is CallStatus.STARTED and state.result is None:
                    await self._execute(state, persist_start=True)
            elif state.record.status is CallStatus.STARTED:
                await self._execute(state, persist_start=False)

        try:
            if len(states) == 1 and scope.telemetry is None:
                await act(states[0])  # what `_act_all` does with one call, a frame less
            else:
                await self._act_all(states, act if scope.telemetry is None
                                    else scope.telemetry.traced(act))
        except BaseException as exc:
            # Cancelled or Ctrl-C: every call that has no result yet gets one, so the turn
            # never leaves a call unanswered (see `settle_interrupted`). An error (a broken
            # approver, the store) is not a stop: the run is left as it is, to be resumed.
            if _is_interrupt(exc):
                self.interrupted = self._settled(states)
            raise
        finally:
            if scope.telemetry is not None:  # before stage 9 turns contents into markers
                scope.telemetry.calls_ended(states)
        return self._turn_result(states)

    _deferred: Batch | None = None
    """The turn's first write when `RunScope.mark_reads` false let it join the final batch."""

    def _act_on_nothing(self, states: list[_Call]) -> bool:
        """Whether no planned call of the turn changes anything (a loop: no generator)."""
        for state in states:
            if not self._acts_on_nothing(state):
                return False
        return True

    def _acts_on_nothing(self, state: _Call) -> bool:
        """Whether a planned call changes nothing: refused, or a read about to run."""
        if state.outcome is not None:
            return False  # waits for a person: its pause is committed as it always was
        if state.result is not None:
            return True  # refused before acting
        impl = state.impl
        if state.record.status is not CallStatus.STARTED or impl is None:
            return False
        offered = state.offered if state.offered is not None else self._spec(impl)
        return not offered.mutates

    interrupted: TurnResult | None = None
    """The turn an interruption cut short, its calls settled; `take_interrupted` hands it to
    the caller, which records it (shielded) before the interruption propagates."""

    def take_interrupted(self) -> TurnResult | None:
        """The settled turn of the last interruption (once), or None."""
        settled, self.interrupted = self.interrupted, None
        return settled

    def _settled(self, states: list[_Call]) -> TurnResult:
        for state in states:
            if state.result is None and state.outcome is None:
                settle_interrupted(state, idempotent=state.impl is not None
                                   and self._spec(state.impl).idempotent)
        return self._turn_result(states)

    async def _act_all(self, states: list[_Call], act: Any) -> None:
        if len(states) == 1:
            await act(states[0])
        else:
            # The order guarantee (docs/architecture.md): effects happen in call order. A
            # mutating call starts once every call before it has finished; a read starts once
            # every mutating call before it has finished, so reads next to each other run
            # concurrently. No call's check can be raced by an earlier call's effect, and each
            # path is checked again at its moment of use (`_recheck_paths`).
            mutating = [s.impl is not None and self._mutates(s.impl) for s in states]
            done = [anyio.Event() for _ in states]

            async def in_order(i: int) -> None:
                try:
                    for j in range(i):
                        if mutating[i] or mutating[j]:
                            await done[j].wait()
                    await act(states[i])
                finally:
                    done[i].set()

            async with anyio.create_task_group() as tg:
                for i in range(len(states)):
                    tg.start_soon(in_order, i)


    def _turn_result(self, states: list[_Call]) -> TurnResult:
        scope = self.scope
        pause = next((s.outcome for s in states if s.outcome is not None), None)
        results: list[ToolResultMessage] = []
        dumped: list[dict[str, Any]] = []
        for s in states:
            result = s.result
            if result is not None:
                call = s.call
                results.append(_result_message(call.id, call.name, result))
                # The record's dict when `finish` made it from this result and the record
                # still holds it (a resumed call's result was read back: dumped anew).
                stored = s.stored
                dumped.append({"kind": "tool_result", "call_id": call.id, "name": call.name,
                               "result": stored if stored is not None
                               and s.record.result is stored else result.to_dict()})
        final = Batch(calls=[s.record for s in states],
                      pending=[p for s in states for p in s.pending])
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            # Its records are the states' own (in `final` already, as they are now).
            final.run = deferred.run
            final.messages[:0] = deferred.messages
            final.pending[:0] = deferred.pending
        shown: dict[str, str] = {}
        if scope.record_contents != "full":
            for s in states:
                text = forget_contents(s.record, s.call.arguments, s.actions, s.spent,
                                       final.pending)
                if text is not None:
                    shown[s.call.id] = text
        return TurnResult(results, pause, final, shown, dumped)

    # ------------------------------------------------------ stages 1-5: plan

    async def _plan(self, state: _Call) -> None:
        if self._resolve(state):
            await self._check(state, state.call.arguments)

    def _resolve(self, state: _Call) -> bool:
        """Stages 1-2: the call's tool, and its grant; False once the call is refused."""
        scope = self.scope
        call = state.call
        # 1. resolve: the exact model name, no nearest match.
        impl = scope.toolbox.by_model_name(call.name)
        if impl is None:
            names = sorted(s.id.model_name for s in self.offered())
            available = f"Available tools: {', '.join(names) or 'none'}."
            # A tool offered earlier and withdrawn since (its MCP server removed it...).
            withdrawn = scope.toolbox.withdrawn(call.name)
            state.finish(
                ToolResult.error(f"{scrub_host_paths(withdrawn, scope.workspace).rstrip('.')}. "
                                 f"{available}"
                                 if withdrawn else
                                 f"There is no tool named {call.name!r}. {available}"),
                CallStatus.REFUSED, disposition=Disposition.NOT_SENT.value,
                error=withdrawn or "unknown tool",
            )
            return False
        state.impl = impl
        state.record.tool = str(impl.spec.id)
        # 2. grant
        manifest = scope.manifest
        if manifest is not None and manifest.grant(impl.spec.id) is None:
            state.finish(ToolResult.error(NOT_GRANTED_MESSAGE), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value,
                         error=f"tool '{impl.spec.id}' is not granted by the manifest")
            return False
        return True

    async def _check(self, state: _Call, arguments: Any) -> None:
        """Stages 3-5: a refusal, or STARTED (allow), or APPROVED (ask, or held).

        APPROVED means an approver decides (ask), or a person does (held by the control).
        """
        scope = self.scope
        impl = state.impl
        assert impl is not None
        # 3. validate
        try:
            payload = check_argument_payload(str(impl.spec.id), arguments,
                                             scope.toolbox.max_argument_bytes)
            validated = impl.validate(payload)
        except InvalidArguments as exc:
            state.finish(ToolResult.error(str(exc)), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value, error="invalid arguments")
            return
        dumped = impl.dump_arguments(validated)
        plan = self._tool_plan(impl)
        state.offered = plan.spec
        problems = self._manifest_schema_problems(impl, plan.spec, dumped)
        if problems:
            state.finish(ToolResult.error(str(InvalidArguments(str(impl.spec.id), problems))),
                         CallStatus.REFUSED, disposition=Disposition.NOT_SENT.value,
                         error="invalid arguments (manifest schema)")
            return
        state.validated = validated
        # 4. actions
        try:
            actions = list(impl.actions(validated))
        except Exception as exc:  # boundary: a broken actions() refuses, never allows
            state.finish(ToolResult.error(f"The call could not be checked: {exc}"),
                         CallStatus.REFUSED, disposition=Disposition.NOT_SENT.value,
                         error=f"actions() raised {type(exc).__name__}: {exc}")
            return
        await self._check_actions(state, plan, dumped, actions)

    async def _check_actions(self, state: _Call, plan: _ToolPlan, dumped: dict[str, Any],
                             actions: list[Action]) -> None:
        """Stages 4b-5 for a valid call whose actions are known (`_check`'s second half)."""
        scope = self.scope
        impl = state.impl
        assert impl is not None
        state.actions = actions
        record = state.record
        digest = _digest(dumped)
        # 4b. control: it sees only granted, valid calls, and can only make things stricter.
        state.held = None
        controlled: ControlVerdict | None = None
        if scope.control is not None:
            controlled = await self._control(state, digest, dumped, actions)
            if controlled.decision == "refuse":
                record.arguments_digest = digest
                record.actions = [_action_record(a) for a in actions]
                record.verdict = {"control": controlled.to_dict()}
                shown = (f"The tool control could not check this call, so it was refused: "
                         f"{controlled.reason}" if controlled.failed else
                         f"The tool control refused this call: {controlled.reason}")
                state.finish(ToolResult.error(shown), CallStatus.REFUSED,
                             disposition=Disposition.NOT_SENT.value,
                             error=(controlled.reason if controlled.failed else
                                    f"refused by the tool control: {controlled.reason}"))
                return
            if controlled.decision == "hold":
                state.held = controlled.reason
        # taint: looked up before the policy, so the verdict below is final. Protected are
        # the tool's declared arguments and, for every tool, any argument that is an
        # address: a URL or host (reaching one is how a read exfiltrates), and for a
        # mutating tool an email address too (where it sends).
        # A link in a mutating call's free text (a body, a post) sends its reader somewhere:
        # its links are looked up, not the text around them.
        links: list[tuple[str, tuple[str, ...]]] | None = [] if plan.spec.mutates else None
        addresses = address_pointers(dumped, mutates=plan.spec.mutates, links=links)
        protected = (*plan.spec.protected, *addresses) if addresses else plan.spec.protected
        if protected or links:
            await self._catch_up_index()
            state.taint = scope.provenance.taint(dumped, protected, links or ())
        else:
            state.taint = ()
        # A mutating call whose value a sentence of tool output names beside the words of
        # the tool's own name ("delete the file with ID 13") is that text's call.
        if plan.spec.mutates and not getattr(impl, "delegates", False):
            named = await self._named(plan.stems, dumped, protected)
            if named:
                state.taint = (*state.taint, *named)
        # 5. policy
        planned = plan.called(actions)
        verdict = planned or scope.policy.check_all(actions, workspace=scope.workspace,
                                                    mutates=plan.spec.mutates,
                                                    arguments=dumped)
        if verdict.effect is Effect.ALLOW:
            if state.taint:
                state.taint = self._steering(state.taint, actions, verdict)
            if state.taint:
                verdict = _tainted(verdict, state.taint, scope.policy.taint)
            elif scope.intent is not None and plan.spec.mutates and \
                    not getattr(impl, "delegates", False) and \
                    not self._intended(str(impl.spec.id)):
                verdict = _unintended(verdict, scope.intent, scope.policy.taint)
            if verdict.effect is Effect.ALLOW and scope.plan is not None and \
                    plan.spec.mutates and not getattr(impl, "delegates", False):
                miss = self._plan_miss(str(impl.spec.id), dumped)
                if miss is not None:
                    verdict = _unplanned(verdict, miss, scope.plan, scope.policy.taint)
                    if miss.pointer is not None:
                        # A person asked sees where the value the plan did not fix came
                        # from, when a tool's output held it (the taint lines).
                        await self._catch_up_index()
                        state.taint = tuple(scope.provenance.taint(dumped, [miss.pointer]))
        # What the verdict was about: compared with the paths again at the moment of use.
        state.decided = (_NO_PATHS if planned is not None
                         else decided_paths(actions, scope.workspace))
        state.verdict = verdict
        # A start counted in a quota stays counted (a call re-checked after a crash).
        previous = _counted(record.verdict)
        record.arguments_digest = digest
        record.performed_arguments = dumped
        if planned is verdict:
            # Copies: a record's dicts are its own (the taint and control entries below).
            record.actions = [dict(a) for a in plan.action_records]
            record.verdict = dict(plan.verdict_record)
        else:
            record.actions = [_action_record(a) for a in actions]
            if len(actions) > 1:
                _record_canonical(record.actions, state.decided)
            record.verdict = verdict.to_dict()
        if state.taint:
            record.verdict["taint"] = [t.to_dict() for t in state.taint]
        if controlled is not None:
            record.verdict["control"] = controlled.to_dict()
        state.limits = () if verdict.effect is Effect.DENY else \
            scope.policy.limits_for(actions, workspace=scope.workspace)
        if state.limits:
            state.over = None
            if previous is not None:
                record.verdict["quota"] = previous  # counted already: carried over
        if verdict.effect is Effect.DENY:
            state.finish(ToolResult.error(PolicyDenied.MODEL_MESSAGE), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value, error=verdict.reason)
        elif verdict.effect is Effect.ASK or state.held is not None:
            # A hold answers like an ask the agent's approver may not decide: `act` parks it.
            record.status = CallStatus.APPROVED
        else:
            record.status = CallStatus.STARTED

    def _steering(self, taint: Sequence[Taint], actions: Sequence[Action],
                  verdict: Verdict) -> Sequence[Taint]:
        """The taint that can steer: without a path the policy itself allows to be written.

        A workspace file named in a listing and edited under `allow write *.py` is not
        steered by the listing: the policy already lets any such path be written, whoever
        named it. Called only when the rules of this moment (remembered ones too) allowed
        the call, so every WRITE action of it is one they allow. Only a rule that chose
        which paths counts: an allow by a default, or by a rule matching every path
        (`Policy.permissive()`, `allow write **`), says nothing about this one, and a path
        a tool's output picked still asks.
        """
        rule = verdict.rule
        if rule is None or rule.pattern.lstrip("/") in _EVERY_PATH:
            return taint
        allowed = {os.path.normpath(a.target) for a in actions
                   if a.act is Act.WRITE and isinstance(a.target, str)}
        if not allowed:
            return taint
        return tuple(t for t in taint
                     if not (isinstance(t.value, str) and os.path.normpath(t.value) in allowed))

    def _intended(self, tool: str) -> bool:
        """Whether the run's intent (`Agent.run(intent=...)`) names this tool."""
        matcher = self._intent_policy
        if matcher is None or matcher[0] is not self.scope.intent:
            assert self.scope.intent is not None
            matcher = self._intent_policy = (self.scope.intent,
                                             intent_policy(self.scope.intent))
        verdict = matcher[1].check(Action(Act.CALL, tool), workspace=self.scope.workspace,
                                   mutates=True)
        return verdict.effect is Effect.ALLOW

    def _plan_miss(self, tool: str, arguments: Mapping[str, Any]) -> Miss | None:
        """Why a call is outside the run's plan (`Agent.run(plan=...)`), or None."""
        plan = self.scope.plan
        assert plan is not None
        cached = self._plan_policies
        if cached is None or cached[0] is not plan:
            cached = self._plan_policies = (plan, [intent_policy([s.tool]) for s in plan.steps])
        steps = [step for step, matcher in zip(plan.steps, cached[1], strict=True)
                 if matcher.check(Action(Act.CALL, tool), workspace=self.scope.workspace,
                                  mutates=True).effect is Effect.ALLOW]
        return plan.miss(tool, steps, arguments)

    async def quotes(self, answer: str) -> list[Quote]:
        """The spans of a final `answer` copied from untrusted output (`Provenance.quotes`).

        About two index lookups per word (~5 µs each): a long answer is searched in a worker
        thread, with the index locks of this run and the runs above it held, so no output
        is indexed into a corpus while the thread reads it.
        """
        await self._catch_up_index()
        provenance = self.scope.provenance
        if len(answer) <= QUOTES_INLINE_CHARS:
            return provenance.quotes(answer)
        async with contextlib.AsyncExitStack() as held:
            for gate in (*self._parents, self):  # root first, as nobody else nests them
                await held.enter_async_context(gate._indexing)
            return await anyio.to_thread.run_sync(provenance.quotes, answer)

    def inherit(self, parent: Gate) -> None:
        """A delegated run's gate: what the parent's run read taints this run's calls.

        The parent's provenance is looked up too (its untrusted outputs, its trusted task),
        and the parent's intent (and principal) applies here when this run has none of its
        own.
        """
        self._parents = (*parent._parents, parent)
        self.scope.provenance.inherit(parent.scope.provenance)
        if self.scope.intent is None:
            self.scope.intent = parent.scope.intent
        if self.scope.plan is None:
            self.scope.plan = parent.scope.plan
        if self.scope.principal is None:  # a tree's calls are its starter's
            self.scope.principal = parent.scope.principal

    async def _control(self, state: _Call, digest: str, dumped: dict[str, Any],
                       actions: Sequence[Action]) -> ControlVerdict:
        """Stage 4b: the tool control's verdict on these exact arguments (asked once per turn).

        The query holds the validated arguments and the actions (file contents as their
        sha256 and size: the arguments carry them already).
        """
        scope = self.scope
        assert scope.control is not None and state.impl is not None
        cached = state.controlled
        if cached is not None and cached[0] == digest:
            return cached[1]
        query = {"id": state.call.id, "run_id": scope.run_id, "agent": scope.agent,
                 "tool": str(state.impl.spec.id), "input": dumped,
                 "actions": [_action_record(a) for a in actions]}
        control = scope.control
        verdict = (await control.adjudicate(query) if isinstance(control, ControlChain)
                   else await adjudicate(control, query))
        state.controlled = (digest, verdict)
        return verdict

    def _released(self, state: _Call) -> list[PendingItem]:
        """The approvals a call has just acted on, kept from now on without their contents.

        Once an approval is applied, the call record's performed arguments hold what will be
        performed (and are what a retry after a crash uses): the request's bytes are not
        needed again, and a crash mid-call must not leave them behind.
        """
        if self.scope.record_contents == "full" or _status(state) is not CallStatus.STARTED:
            return []
        return [dataclasses.replace(item, payload=_payload_without_contents(
                    item.payload, _contents_of(item.payload, state.actions)))
                for item in state.spent if item.kind == "approval"]

    def _permits_for(self, impl: ToolImpl) -> Any:
        scope = self.scope
        mutates = self._mutates(impl)

        def permits(action: Action) -> bool:
            # The policy of this moment (remembered rules included), confinement included.
            verdict = scope.policy.check(action, workspace=scope.workspace, mutates=mutates)
            return verdict.effect is Effect.ALLOW

        return permits

    @staticmethod
    def _trusted(state: _Call) -> list[Any]:
        """The list a call's context appends what its body vouches for to (made on first use)."""
        if state.trusted is None:
            state.trusted = []
        return state.trusted

    def _spec(self, impl: ToolImpl) -> ToolSpec:
        return self._tool_plan(impl).spec

    def _tool_plan(self, impl: ToolImpl) -> _ToolPlan:
        """The tool's plan under the rules of this moment (built again when they change)."""
        scope = self.scope
        version = self._planned_for
        if not version or version[0] is not scope.policy or version[1] is not scope.toolbox \
                or version[2] is not scope.manifest or version[3] is not scope.workspace:
            self._plans.clear()
            self._planned_for = (scope.policy, scope.toolbox, scope.manifest, scope.workspace)
        plan = self._plans.get(id(impl))
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            plan = self._plans[id(impl)] = _ToolPlan(
                impl, self._offered.get(impl.spec.id, impl.spec), scope)
        return plan

    def _mutates(self, impl: ToolImpl) -> bool:
        # The offered spec already takes the stricter of the tool's and the manifest's word.
        return self._spec(impl).mutates

    def _manifest_schema_problems(self, impl: ToolImpl, offered: ToolSpec,
                                  dumped: dict[str, Any]) -> list[Issue]:
        """Stage 3 for a schema the manifest supplied (a tool that left its arguments open)."""
        if offered.input_schema is impl.spec.input_schema:
            return []
        checks = self._schema_checks.get(offered.id)
        if checks is None:
            # Never fetching: a manifest's schema is reviewed text, but a `$ref` in it must
            # not make the gate reach a host the policy never saw (`local_validator`).
            checks = (local_validator(offered.input_schema),
                      compile_check(offered.input_schema))
            self._schema_checks[offered.id] = checks
        return schema_issues(checks[0], dumped, checks[1])

    def use_toolbox(self, toolbox: Toolbox) -> list[ToolSpec]:
        """Install the tools of the coming turn (a host may change them between turns).

        Resolution and the grant read this toolbox, and what it returns is what the model is
        offered: one list for both. Returns the offered specs.
        """
        self.scope.toolbox = toolbox
        offered = self.offered()
        self._offered = {s.id: s for s in offered}
        self._schema_checks.clear()
        self._plans.clear()
        return offered

    def offered(self) -> list[Any]:
        """The specs the model is offered (the manifest's grants, when one is in force)."""
        specs = self.scope.toolbox.specs()
        manifest = self.scope.manifest
        return manifest.offer(specs) if manifest is not None else specs

    # ------------------------------------------------- quotas (with the STARTED mark)

    def _claims(self, state: _Call) -> list[QuotaClaim]:
        """The quota claims of a call about to be marked STARTED (none if counted already).

        A call a person approved is counted over a limit that asks (they were asked, or
        decided on this very call); a limit that denies still holds it back.
        """
        record = state.record
        if _counted(record.verdict) is not None:
            return []
        approved = _approved(record)
        now = time.time()
        claims = []
        shown = []
        for limit, layer in state.limits:
            value = self._quota_key(limit)
            window, _, _ = limit.window(now)
            claims.append(QuotaClaim(call_record=record.id, counter=limit.counter(value),
                                     window=window, limit=limit.count,
                                     force=approved and limit.then is Effect.ASK))
            shown.append({"limit": limit.describe(), "layer": layer,
                          "key": f"{limit.key}={value}" if limit.key != "global" else "global",
                          "window": limit.window_text(now), "max": limit.count,
                          "count": None, "counted": True})
        # Written with the STARTED mark (the same transaction): a crash after it finds the
        # start counted. The counts themselves are the store's, filled in once committed.
        record.verdict = {**(record.verdict or {}), "quota": shown}
        return claims

    def _quota_key(self, limit: Limit) -> str:
        scope = self.scope
        if limit.key == "run":
            return scope.run_id
        if limit.key == "agent":
            return scope.agent or ""
        if limit.key == "principal":
            return scope.principal or ""
        return ""

    async def _write_claiming(self, batch: Batch, states: Sequence[_Call]) -> None:
        """Write `batch`; a call whose quota is full gets its limit's effect, and again.

        Each refusal takes one claim out, so this writes at most once per claim more.
        """
        while True:
            try:
                await self.scope.store.write(batch)
            except QuotaExceeded as exc:
                refused = exc.claim.call_record
                (state,) = [s for s in states if s.record.id == refused]
                self._over_limit(state, exc)
                batch.claims = [c for c in batch.claims if c.call_record != refused]
                if state.record.status is CallStatus.APPROVED:
                    # Not started: it waits for the approver, as any ask (written with it).
                    batch.calls = [c for c in batch.calls if c is not state.record]
                continue
            break
        for claim in batch.claims:
            for state in states:
                if state.record.id == claim.call_record:
                    _fill_count(state.record, claim)

    def _over_limit(self, state: _Call, exc: QuotaExceeded) -> None:
        """The call would go over a quota: refuse it (deny) or put it to the approver (ask)."""
        record = state.record
        shown = list((record.verdict or {}).get("quota") or [])
        limit, layer, entry = None, "", None
        for (candidate, where), one in zip(state.limits, shown, strict=False):
            if candidate.counter(self._quota_key(candidate)) == exc.claim.counter:
                limit, layer, entry = candidate, where, one
                break
        assert limit is not None and entry is not None
        for one in shown:
            one["counted"] = False
            one["count"] = None
        entry.update(count=exc.count, over=True)
        reason = (f"{limit.describe()} in layer {layer!r}: {exc.count} of {limit.count} "
                  f"used in {entry['window']} ({entry['key']})")
        effect = limit.then
        verdict = Verdict(effect, None, layer, (record.verdict or {}).get("target", ""), reason)
        record.verdict = {**verdict.to_dict(), "quota": shown}
        state.verdict = verdict
        if effect is Effect.DENY:
            state.finish(ToolResult.error(PolicyDenied.MODEL_MESSAGE), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value, error=reason)
        else:
            state.over = reason
            update(record, status=CallStatus.APPROVED, started_at=None)

    # --------------------------------------------------- stage 6: approve

    def _request(self, state: _Call) -> Request:
        impl = state.impl
        assert impl is not None
        scope = self.scope
        mutates = self._mutates(impl)
        arguments = state.record.performed_arguments
        checked = [(a, scope.policy.check(a, workspace=scope.workspace, mutates=mutates,
                                          arguments=arguments))
                   for a in state.actions]
        asked = [(a, v) for a, v in checked if v.effect is Effect.ASK] or checked
        action, verdict = asked[0]
        reason = verdict.reason
        if state.verdict is not None and state.verdict.layer == TAINT_LAYER:
            reason = state.verdict.reason  # the rules allowed it: the taint is why it asks
        if state.over is not None:
            reason = state.over  # the rules let it start: a full quota is why it asks
        return Request(
            id=f"ap-{_uid()}",
            act=action.act,
            target=verdict.target,
            content=action.content,
            tool=str(impl.spec.id),
            arguments=state.record.performed_arguments or {},
            call_id=state.call.id,
            agent=scope.agent,
            run_id=scope.run_id,
            workspace=str(scope.workspace),
            actions=tuple(a for a, _ in asked),
            verdict_reason=(reason if state.held is None
                            else f"held by the tool control: {state.held}"),
            taint=tuple(state.taint),
            held=state.held,
            agent_path=scope.agent_path,
            terms=AskTerms.strictest(v.rule.terms for _, v in asked
                                     if v.effect is Effect.ASK and v.rule is not None),
        )

    async def _decide(self, state: _Call, request: Request | None, decision: Decision, *,
                      decided_by: str, approved_by: str | None = None) -> None:
        """Apply an approver's decision: refuse, pause (defer), or mark the call to run."""
        update(state.record, decision=decision.to_dict(), decided_by=decided_by)
        if isinstance(decision, Deny):
            state.finish(ToolResult.error(f"The operator denied this call: {decision.reason}"),
                         CallStatus.REFUSED, disposition=Disposition.NOT_SENT.value,
                         error=f"denied by {decided_by}")
            return
        assert request is not None, "approving or deferring needs the request"
        if isinstance(decision, Approve):
            if decision.modified is not None:
                update(state.record, error=None)
                arguments: Any = dict(decision.modified)
            else:
                arguments = state.record.performed_arguments or {}
            # Re-validated and re-checked: an approval can never carry an action across a
            # deny (one added while paused included). Ask is what this decision answered.
            await self._check(state, arguments)
            if state.result is None:
                update(state.record, status=CallStatus.STARTED)
            # Remembered rules apply from the next call on: this one's record keeps the
            # verdict the policy gave it (ask), beside the decision that answered it.
            self.scope.remember(decision.remember_rules(request.act))
            return
        # The rules' terms, and the deferring approver's deadline if it gave one (docs/notify.md).
        now = time.time()
        terms = (request.terms if not isinstance(decision, Defer) or decision.expires is None
                 else AskTerms.strictest([request.terms, decision.terms()]))
        item = PendingItem(id=request.id, kind="approval", run_id=self.scope.run_id,
                           call_record=state.record.id, agent=self.scope.agent,
                           tool=request.tool, payload=request.to_dict(), created_at=now,
                           approvals=[] if approved_by is None else [
                               {"by": approved_by, "at": now}],
                           **terms.item_fields(now))
        state.pause(PausedOnRequest(request.id), CallStatus.AWAITING_APPROVAL, item)

    # --------------------------------------------------- stages 7-8: execute

    async def _execute(self, state: _Call, *, persist_start: bool) -> None:
        scope = self.scope
        impl = state.impl
        assert impl is not None
        if persist_start:
            update(state.record, status=CallStatus.STARTED,
                                   started_at=time.time())
            batch = Batch(calls=[state.record], pending=self._released(state))
            if state.limits:
                batch.claims = self._claims(state)
            await self._write_claiming(batch, [state])
            if state.result is not None:
                return  # a full quota refused it: not started
            if state.record.status is not CallStatus.STARTED:  # pragma: no cover - defensive
                # Approved calls are counted over a limit that asks: only one that denies
                # refuses them. Should one ever ask here, it is refused, never run uncounted.
                state.finish(ToolResult.error(PolicyDenied.MODEL_MESSAGE), CallStatus.REFUSED,
                             disposition=Disposition.NOT_SENT.value, error=state.over)
                return
        spec = impl.spec
        try:
            self._recheck_paths(state)
            bound = impl.bind(state.validated, scope.workspace, state.decided)
        except PathChanged as exc:
            state.finish(ToolResult.error(str(exc)), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value, error=str(exc))
            return
        if scope.before_execute is not None:
            await scope.before_execute(state.record)
        state.began = True
        try:
            if not spec.interactions and spec.timeout is None:
                # The common case needs no state machine: the body cannot ask.
                ctx = (CallContext(call_id=state.call.id, tool_id=spec.id, run_id=scope.run_id,
                                   agent=scope.agent, workspace=scope.workspace, deps=scope.deps,
                                   permits=self._permits_for(impl), trusted=self._trusted(state),
                                   events=scope.events, policy=scope.policy,
                                   sandbox=scope.sandbox)
                       if impl.needs_context else None)
                try:
                    result = await impl.execute(bound, ctx)
                except DelegatedPause as paused:
                    # A sub-agent waits for a person: the call stays STARTED (its body, the
                    # child's durable run, is continued when this run is resumed) and the
                    # turn pauses on the child's item.
                    state.outcome = paused.pause
                    return
                except BaseException as exc:
                    raise_body_error(spec, exc)
            else:
                maybe = await self._drive_handler(state)
                if maybe is None:
                    return  # paused on a question
                result = maybe
        except ToolError as exc:
            self._tool_failed(state, exc)
            return
        state.finish(result, CallStatus.FINISHED)
        self._observe(state)

    def _body_failed(self, state: _Call, spec: ToolSpec, exc: BaseException) -> None:
        """What a body raised, as `_execute` takes it.

        A `ToolError` (what `raise_body_error` makes of any failure but a cancellation or an
        interrupt, which it raises again) is the call's error result.
        """
        try:
            raise_body_error(spec, exc)
        except ToolError as error:
            self._tool_failed(state, error)

    def _tool_failed(self, state: _Call, exc: ToolError) -> None:
        """A call the tool failed: finished, with the error as its result, and observed."""
        # What the model sees names no host path: workspace-relative, or a placeholder.
        shown = scrub_host_paths(_model_text(exc), self.scope.workspace)
        state.finish(ToolResult.error(shown), CallStatus.FINISHED,
                     disposition=exc.disposition.value, error=str(exc))
        self._observe(state)

    def _observe(self, state: _Call) -> None:
        """Stage 9 for provenance: record where this call's output stands, and index it.

        The output is untrusted unless the tool (as offered: a manifest grant may override
        it) is declared `trusted_output`. What the body vouched for (`ctx.trust`) and the
        values at its `sanitizes` pointers become trusted: explicit acts, kept in the record.
        """
        impl, result = state.impl, state.result
        assert impl is not None and result is not None
        spec = state.offered if state.offered is not None else self._spec(impl)
        vouched: list[dict[str, Any]] = []
        if state.trusted:
            vouched = [{"value": v, "by": "ctx.trust"} for v in state.trusted]
        if spec.sanitizes and not result.is_error:
            vouched += [{"value": v, "by": "sanitizes", "pointer": where}
                        for pointer in spec.sanitizes
                        for where, v in pointer_values(result.structured, pointer)]
        trusted = spec.trusted_output
        record = state.record
        record.provenance = {"output": "trusted" if trusted else "untrusted",
                             "trusted": vouched}
        # The result object, not the record's dict: the run's history keeps the object alive
        # anyway, and the dict (with its content list) would be three more objects kept per
        # call for the collector to walk until a protected call comes (issue 11). Its dict is
        # made again when indexed: `to_dict` of the result the record's dict was made from.
        self._queue_for_index(record, result if state.stored is record.result
                              else record.result, trusted, vouched)

    def _queue_for_index(self, record: CallRecord, result: ToolResult | dict[str, Any] | None,
                         trusted: bool, vouched: list[dict[str, Any]]) -> None:
        """`_index` for what `_observe` has at hand: no provenance dict read back, no coroutine.

        `result` is the output (or its dict), `trusted` its standing, `vouched` the
        provenance's vouched entries.
        """
        self._unindexed.append(((record.call_id, record.tool or record.model_name),
                                result, trusted,
                                tuple(t.get("value") for t in vouched) if vouched else (),
                                record.turn))

    async def _index(self, record: CallRecord, provenance: dict[str, Any]) -> None:
        """Queue a finished call's output for the taint index (see `_catch_up_index`).

        Only a call with protected arguments reads the index, and most tools have none: so
        outputs wait in call order of finishing, and are indexed before such a call is
        checked (a toolbox can gain one later: nothing is skipped, only postponed). Until
        then the queue keeps each result's dict: about what the run's history (its
        `ToolResultMessage`s) keeps of it in memory anyway.
        """
        self._queue_for_index(record, record.result, provenance.get("output") == "trusted",
                              list(provenance.get("trusted", ())))

    async def _catch_up_index(self) -> None:
        """Index every queued output, in a worker thread when they are large.

        Indexing costs about half a microsecond per character, and a tool decides how many
        it returns: past `INDEX_INLINE_CHARS` of JSON (`pydantic_core`, ~1 µs for a small
        result) the queue is indexed off the event loop. One writer at a time; returns once
        everything queued before the call is in the index.
        """
        for parent in self._parents:
            await parent._catch_up_index()
        if not self._unindexed and not self._indexing.locked():
            return
        # Imported here: the gate imports without pydantic_core (issue 11).
        import pydantic_core

        async with self._indexing:
            queued: list[_Indexed] = [
                (source, result.to_dict() if isinstance(result, ToolResult) else result,
                 trusted, vouched, turn)
                for source, result, trusted, vouched, turn in self._unindexed]
            self._unindexed = []
            size = 0
            for _, result, _, _, _ in queued:
                if result is not None:
                    size += len(pydantic_core.to_json(result))
                    if size > INDEX_INLINE_CHARS:
                        break
            # Inline when small and no gram index is due (building one over 64 KB of text
            # costs ~20 ms: never on the event loop).
            if size <= INDEX_INLINE_CHARS and not self.scope.provenance.settle_due(size):
                self._index_queued(queued)
            else:
                await anyio.to_thread.run_sync(self._index_queued, queued)

    def _index_queued(self, queued: list[_Indexed]) -> None:
        index = self.scope.provenance
        for source, result, trusted, vouched, turn in queued:
            if result is not None:
                index.add_output(source, result, trusted=trusted, turn=turn)
            if vouched:
                index.trust_values(source, vouched)
        index.settle()  # here (a worker thread when due), not in the lookup that follows

    async def _named(self, stems: tuple[str, ...], dumped: dict[str, Any],
                     skip: Sequence[str]) -> list[Taint]:
        """`Provenance.named` for a mutating call, its scan in a thread when much is due.

        The first check of a tool reads every sentence holding its verb (~0.2 µs a byte of
        such text): past `INDEX_INLINE_CHARS` of output not yet scanned, off the event loop.
        """
        await self._catch_up_index()
        provenance = self.scope.provenance
        if stems and provenance.naming_due(stems) > INDEX_INLINE_CHARS:
            async with self._indexing:  # nothing is added to the index meanwhile
                await anyio.to_thread.run_sync(provenance.scan_naming, stems)
        return provenance.named(stems, dumped, skip)

    def _index_now(self, record: CallRecord, provenance: dict[str, Any]) -> None:
        source = (record.call_id, record.tool or record.model_name)
        index = self.scope.provenance
        if record.result is not None:
            index.add_output(source, record.result,
                             trusted=provenance.get("output") == "trusted", turn=record.turn)
        vouched = [t.get("value") for t in provenance.get("trusted", ())]
        if vouched:
            index.trust_values(source, vouched)

    def restore_provenance(self, records: Sequence[CallRecord]) -> None:
        """Rebuild the run's taint index from its stored calls (a resumed run, once).

        A call that finished before provenance was recorded counts as untrusted output.
        """
        index = self.scope.provenance
        for record in records:
            answers = [a.get("value") for a in record.answers if a.get("kind") == "submit"]
            if answers:
                index.trust_values((record.call_id, "answer"), answers)
            if record.status is CallStatus.FINISHED and record.result is not None:
                self._index_now(record, record.provenance or {"output": "untrusted"})

    def _recheck_paths(self, state: _Call) -> None:
        """Canonicalise each READ/WRITE target again, at the moment of use.

        Raises:
            PathChanged: one leads elsewhere than when the policy decided (not sent).
        """
        if not state.decided:
            return
        now = decided_paths(state.actions, self.scope.workspace)
        for given, then in state.decided.items():
            if now.get(given) != then:
                raise PathChanged(
                    f"the path {given!r} was checked as {then!r} but now leads to "
                    f"{now.get(given, 'outside the workspace')!r} (a symlink changed in "
                    "between); refused, nothing was done — check the path and call again"
                )

    async def _drive_handler(self, state: _Call) -> ToolResult | None:
        scope = self.scope
        impl = state.impl
        assert impl is not None
        handler = ToolHandler(impl, run_id=scope.run_id, agent=scope.agent,
                              workspace=scope.workspace, deps=scope.deps,
                              permits=self._permits_for(impl), events=scope.events,
                              max_argument_bytes=scope.toolbox.max_argument_bytes,
                              decided_paths=state.decided, trusted=self._trusted(state),
                              policy=scope.policy, sandbox=scope.sandbox)
        out = await handler.step(Invoke(state.call.id, state.record.performed_arguments or {},
                                        answers=list(state.answers)))
        while isinstance(out, Interaction):
            answer = await self._ask(out)
            if answer is None:
                await self._pause_on_question(state, handler, out)
                return None
            pending = out
            try:
                out = await handler.step(Respond(pending.id, Submit(answer)))
            except HandlerStateError as exc:
                # The responder's answer does not fit (a form's schema): the tool hears a
                # decline with the reason, rather than the run failing on someone's typo.
                out = await handler.step(Respond(pending.id, Decline(str(exc))))
        assert isinstance(out, Finished)
        update(state.record, answers=[_answer_record(a) for a in handler.answers])
        # A person's answers are trusted text (a value they typed may be used without asking).
        submitted = [a.value for a in handler.answers if isinstance(a, Submit)]
        if submitted:
            async with self._indexing:
                self.scope.provenance.trust_values((state.call.id, "answer"), submitted)
        return out.result

    async def _ask(self, interaction: Interaction) -> Any:
        request = interaction.request
        responder = self.scope.responder
        path = self.scope.agent_path
        if isinstance(request, Question):
            if path:
                request = dataclasses.replace(request, agent_path=path)
            return await responder.answer(request)
        assert isinstance(request, Elicitation)
        question = Question(request.message, context="Answer with a JSON object matching: "
                            + json.dumps(request.schema), agent_path=path)
        text = await responder.answer(question)
        return None if text is None else _form_answer(text)

    async def _pause_on_question(self, state: _Call, handler: ToolHandler,
                                 interaction: Interaction) -> None:
        request = interaction.request
        payload: dict[str, Any]
        if isinstance(request, Question):
            payload = {"kind": "question", "question": request.question,
                       "context": request.context, "choices": list(request.choices)}
        else:
            payload = {"kind": "form", "message": request.message, "schema": dict(request.schema)}
        if self.scope.agent_path:
            payload["agent_path"] = list(self.scope.agent_path)
        # The suspended coroutine is abandoned: the resumed call re-runs with its answers.
        try:
            await handler.step(Cancel("paused for an answer"))
        except CallCancelled:
            pass
        item = PendingItem(id=f"q-{_uid()}", kind="question", run_id=self.scope.run_id,
                           call_record=state.record.id, agent=self.scope.agent,
                           tool=str(handler.spec.id), payload=payload, created_at=time.time())
        update(state.record,
                               answers=[_answer_record(a) for a in handler.answers])
        state.pause(PausedOnQuestion(item.id), CallStatus.AWAITING_ANSWER, item)

    # ------------------------------------------------ resume: re-enter a call

    async def _reenter(self, state: _Call) -> None:
        """Continue a call recorded by an earlier attempt, from the stage it reached."""
        scope = self.scope
        record = state.record
        status = record.status
        if status in (CallStatus.REFUSED, CallStatus.FINISHED):
            assert record.result is not None
            state.result = ToolResult.from_dict(record.result)
            return
        impl = scope.toolbox.by_model_name(record.model_name)
        # A call that may have acted stays in doubt when its tool is gone: never "not sent".
        in_flight = status in (CallStatus.STARTED, CallStatus.IN_DOUBT)
        if impl is None and not in_flight:
            state.finish(ToolResult.error(f"The tool {record.model_name!r} is no longer "
                                          "available."), CallStatus.REFUSED,
                         disposition=Disposition.NOT_SENT.value, error="tool gone at resume")
            return
        state.impl = impl
        # A tool re-runs from its start with every answer it was given (see AWAITING_ANSWER).
        state.answers = [_answer_from(a) for a in record.answers]
        item = await _pending(scope.store, record.pending_id)
        if scope.telemetry is not None:
            scope.telemetry.waited(state, item)
        arguments = record.performed_arguments or {}

        if status is CallStatus.AWAITING_APPROVAL:
            if item is not None and item.state == "open" and not _defers(scope.approver) \
                    and item.payload.get("held") is None:
                # Resumed with an approver who can decide now: it is shown the exact request
                # that was persisted (the act phase asks it, and records its decision with a
                # compare-and-swap, as `resume_with_decision` would).
                await self._check(state, arguments)
                if state.result is None and state.held is not None:
                    # The tool control holds it now: only a person decides, not this approver.
                    state.pause(PausedOnRequest(item.id), CallStatus.AWAITING_APPROVAL, None)
                elif state.result is None:
                    state.reask = item
                    update(state.record, status=CallStatus.APPROVED)
                return
            if item is None or item.state == "open":
                state.pause(PausedOnRequest(record.pending_id or ""), status, None)
                return
            state.spent = [*state.spent, item]
            await self._check(state, arguments)  # the policy in force now: a new deny wins
            if state.result is None:
                decision = Decision.from_dict(item.decision or {})
                # A denied request was kept without its contents: only an approval needs it.
                request = None if isinstance(decision, Deny) else Request.from_dict(item.payload)
                await self._decide(state, request, decision,
                                   decided_by=item.decided_by or "operator")
                state.pending = [*state.pending, *self._released(state)]
            return

        if status is CallStatus.AWAITING_ANSWER:
            if item is None or item.state == "open":
                state.pause(PausedOnQuestion(record.pending_id or ""), status, None)
                return
            await self._check(state, arguments)
            if state.result is None:
                answer = _resumed_answer(item)
                state.answers = [*(_answer_from(a) for a in record.answers), answer]
                update(state.record, answers=[_answer_record(a) for a in state.answers])
                # An answer authorises nothing: an ask met now (one added while the tool
                # waited) goes to the approver unless this call was approved before.
                if _status(state) is CallStatus.STARTED or _approved(state.record):
                    update(state.record, status=CallStatus.STARTED)
            return

        if status is CallStatus.APPROVED:
            await self._check(state, arguments)  # asks the approver again: nothing was decided
            return

        # STARTED (in flight at a crash) or IN_DOUBT (an operator was asked).
        if status is CallStatus.STARTED and impl is not None and self._spec(impl).idempotent:
            await self._rerun(state, arguments)
            return
        # A retry decided without the agent (`--no-resume`) that this agent cannot perform:
        # asked again, the tool's absence in the item, rather than recorded as not sent.
        cannot_retry = impl is None and item is not None and item.state != "open" and \
            (item.decision or {}).get("kind") == "retry"
        if status is CallStatus.STARTED or item is None or item.kind != "recovery" or \
                cannot_retry:
            payload = {"tool": record.tool, "arguments": arguments,
                       "started_at": record.started_at}
            if impl is None:
                payload["tool_missing"] = True
            item = PendingItem(id=record.id, kind="recovery", run_id=scope.run_id,
                               call_record=record.id, agent=scope.agent, tool=record.tool,
                               payload=payload, created_at=time.time())
            state.pause(CallInDoubt(record.id), CallStatus.IN_DOUBT, item)
            return
        if item.state == "open":
            state.pause(CallInDoubt(record.id), CallStatus.IN_DOUBT, None)
            return
        state.spent = [*state.spent, item]
        choice = item.decision or {}
        if choice.get("kind") == "retry":
            await self._rerun(state, arguments)
            return
        if choice.get("kind") == "completed":
            state.finish(ToolResult.text(str(choice.get("observation", ""))),
                         CallStatus.FINISHED, disposition=Disposition.LANDED.value,
                         error=f"marked completed by {item.decided_by}")
            # An operator's observation is a person's word: trusted.
            update(state.record, provenance={"output": "trusted", "trusted": [],
                                             "by": item.decided_by or "operator"})
            await self._index(state.record, state.record.provenance or {})
            return
        state.finish(ToolResult.error("The operator aborted this call after an interruption; "
                                      "it may or may not have taken effect."),
                     CallStatus.FINISHED, disposition=Disposition.IN_DOUBT.value,
                     error=f"aborted by {item.decided_by}")


    async def _rerun(self, state: _Call, arguments: Any) -> None:
        """Run a call again after a crash: re-checked, and asked again only if it never was."""
        approved = _approved(state.record)
        await self._check(state, arguments)
        if approved and state.record.status is CallStatus.APPROVED:
            # The approval given before the crash still answers this ask; a deny still wins.
            update(state.record, status=CallStatus.STARTED)


def forget_contents(record: CallRecord, sent: str, actions: Sequence[Action],
                    spent: Sequence[PendingItem], pending: list[PendingItem]) -> str | None:
    """Replace every stored copy of a finished call's contents by markers (stage 9).

    A call that may still be performed keeps everything. A refused call's record already holds
    no arguments; a performed one's arguments keep their shape, with each value that is
    exactly the content of one of its WRITE actions (or of the approval it answered) replaced
    by `content_marker`. Decided items in `spent` are appended to `pending` (the turn's final
    write replaces them) with their contents as markers.

    Returns:
        The arguments text the stored assistant message should keep for `sent` (the model's
        own text), or None when it may keep what it has.
    """
    if record.status not in (CallStatus.FINISHED, CallStatus.REFUSED):
        return None
    if record.status is CallStatus.FINISHED and not spent and not record.decision and \
            not _holds_contents(record.actions, actions):
        return None  # nothing to replace: what the loop below would find (most calls)
    contents: Contents = {}
    # The record's actions name the contents of the last check (the performed arguments);
    # an approval it answered names the contents the model first asked to write.
    for action in record.actions:
        size, digest = action.get("content_bytes"), action.get("content_sha256")
        if isinstance(size, int) and size and isinstance(digest, str):
            contents.setdefault(size, set()).add(digest)
    for data in [a.content for a in actions if a.content] + [
            c for item in spent if item.kind == "approval"
            for c in _payload_contents(item.payload)]:
        if data:
            contents.setdefault(len(data), set()).add(hashlib.sha256(data).hexdigest())
    for item in spent:
        pending.append(dataclasses.replace(
            item, payload=_payload_without_contents(item.payload, contents)))
    if record.decision and record.decision.get("modified") is not None:
        record.decision = {**record.decision,
                           "modified": _strip(record.decision["modified"], contents)}
    if record.status is CallStatus.REFUSED:
        if record.arguments != REDACTED or _is_refusal_marker(sent):
            return None
        return _refused_arguments(sent)
    if not contents:
        return None
    if record.performed_arguments is not None:
        record.performed_arguments = _strip(record.performed_arguments, contents)
    record.arguments = _strip_text(record.arguments, contents)
    text = _strip_text(sent, contents)
    return None if text == sent else text


def _holds_contents(records: Sequence[dict[str, Any]], actions: Sequence[Action]) -> bool:
    """Whether a call's actions (as checked, or as recorded) carry any file contents."""
    for action in actions:
        if action.content:
            return True
    for record in records:
        if "content_bytes" in record or "content_sha256" in record:
            return True
    return False


_result_message_fields = tuple(slot_setter(ToolResultMessage, f)
                               for f in ("call_id", "name", "result", "kind"))


def _result_message(call_id: str, name: str, result: ToolResult) -> ToolResultMessage:
    """`ToolResultMessage(call_id, name, result)`, through its slots' setters.

    One a call: about half the cost of its frozen `__init__` (issue 11).
    """
    message: ToolResultMessage = object.__new__(ToolResultMessage)
    set_call_id, set_name, set_result, set_kind = _result_message_fields
    set_call_id(message, call_id)
    set_name(message, name)
    set_result(message, result)
    set_kind(message, "tool_result")
    return message


_Queued = tuple[tuple[str, str], "ToolResult | dict[str, Any] | None", bool, Sequence[Any], int]
"""A finished call's output waiting for the taint index: (source, result or its dict, trusted,
vouched values, the call's turn)."""

_Indexed = tuple[tuple[str, str], "dict[str, Any] | None", bool, Sequence[Any], int]
"""A queued output as indexed: its result as `ToolResult.to_dict()` makes it."""

INDEX_INLINE_CHARS = 2048
"""Queued results this small (as JSON) are indexed on the event loop; larger ones in a thread
(a thread hand-off costs about what indexing 300 characters does)."""

QUOTES_INLINE_CHARS = 2048
"""A final answer this short is searched for quotes on the event loop (~2 ms at most)."""

_MAX_PLANS = 1024
"""Tool plans kept per gate at most (a toolbox can be large); past it they are rebuilt."""

TAINT_LAYER = "taint"
"""The `layer` of a verdict the taint stage made stricter than the rules' allow."""


def check_intent(intent: object) -> tuple[str, ...]:
    """`Agent.run(intent=...)` as a tuple of CALL patterns, or a `UserError` saying why not."""
    if isinstance(intent, str) or not isinstance(intent, Sequence | frozenset | set):
        raise UserError("intent= takes a list of tool patterns this task may change the world "
                        f"with, e.g. ['mail/send', 'calendar/*'], not {intent!r}")
    patterns = tuple(intent)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise UserError(f"intent=: {pattern!r} is not a tool pattern ('server/name')")
    try:
        intent_policy(patterns)
    except PolicyError as exc:
        raise UserError(f"intent=: {exc}") from None
    return patterns


def intent_policy(patterns: Sequence[str]) -> Policy:
    """A policy whose CALL allows are exactly the intent's patterns (for matching only)."""
    layer = Policy.default().layer("intent")
    for pattern in patterns:
        layer = layer.allow(Act.CALL, pattern)
    return layer


def _unintended(allowed: Verdict, intent: Sequence[str], effect: str) -> Verdict:
    """The verdict for an allowed mutating call the run's intent does not name."""
    named = ", ".join(intent) if intent else "no tool"
    return Verdict(Effect.DENY if effect == "deny" else Effect.ASK, None, TAINT_LAYER,
                   allowed.target, f"intent: this task may change the world with {named} "
                   f"only; nobody asked for this call, so it may come from what a tool "
                   f"returned (the rules alone would allow it: {allowed.reason})")


def check_plan(plan: object) -> Plan:
    """`Agent.run(plan=...)` as a `Plan` whose tool patterns are valid, or a `UserError`."""
    checked = Plan.of(plan)
    for step in checked.steps:
        try:
            intent_policy([step.tool])
        except PolicyError as exc:
            raise UserError(f"plan=: {exc}") from None
    return checked


def _unplanned(allowed: Verdict, miss: Miss, plan: Plan, effect: str) -> Verdict:
    """The verdict for an allowed mutating call no step of the run's plan covers."""
    return Verdict(Effect.DENY if effect == "deny" else Effect.ASK, None, TAINT_LAYER,
                   allowed.target, f"{miss.describe(plan.steps)}; the plan was made before "
                   f"any tool output was read, so this call may come from what a tool "
                   f"returned (the rules alone would allow it: {allowed.reason})")


def _tainted(allowed: Verdict, taint: Sequence[Taint], effect: str) -> Verdict:
    """The verdict for an allowed call whose protected arguments came from untrusted output."""
    more = f" (and {len(taint) - 1} more)" if len(taint) > 1 else ""
    return Verdict(Effect.DENY if effect == "deny" else Effect.ASK, None, TAINT_LAYER,
                   allowed.target, f"taint: {taint[0].describe()}{more}; the rules alone "
                   f"would allow it ({allowed.reason})")


INTERRUPTED_NOT_SENT = ("Interrupted: the run was stopped before this call ran; nothing was "
                        "done.")
"""The result of a call an interruption reached before its body started."""
INTERRUPTED_IN_DOUBT = ("Interrupted: the run was stopped while this call was running; it may "
                        "or may not have taken effect.")
"""The result of a call an interruption cut off mid-way (in doubt: recovery on resume)."""


def settle_interrupted(state: _Call, *, idempotent: bool) -> None:
    """Give a call an interruption reached its result: not sent, or in doubt if it began.

    An in-doubt call keeps its arguments and goes to an operator's recovery when the run is
    resumed (its record says IN_DOUBT and no recovery item exists yet); an idempotent one
    stays STARTED and is retried on resume, as after a crash.
    """
    if state.began:
        state.result = ToolResult.error(INTERRUPTED_IN_DOUBT)
        status = CallStatus.STARTED if idempotent else CallStatus.IN_DOUBT
        update(state.record, status=status, result=state.result.to_dict(),
               disposition=Disposition.IN_DOUBT.value, error="interrupted while running",
               ended_at=time.time())
        return
    state.finish(ToolResult.error(INTERRUPTED_NOT_SENT), CallStatus.REFUSED,
                 disposition=Disposition.NOT_SENT.value, error="interrupted before it ran")


def _is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a stop (a cancellation, Ctrl-C, exit), possibly grouped."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_interrupt(e) for e in exc.exceptions)
    return isinstance(exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt | SystemExit)


def _status(state: _Call) -> CallStatus:
    # Read through a function: mypy narrows `state.record.status` across the call that
    # changes it and would call the comparison unreachable.
    return state.record.status


def _counted(verdict: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """A record's quota entries when its start was counted already, else None."""
    shown = None if verdict is None else verdict.get("quota")
    if shown and all(one.get("counted") for one in shown):
        return list(shown)
    return None


def _fill_count(record: CallRecord, claim: QuotaClaim) -> None:
    """Put the store's count for `claim` into the record's quota entry (the next write has it)."""
    for one in (record.verdict or {}).get("quota") or []:
        if one.get("count") is None and one.get("counted"):
            one["count"] = claim.count
            return


def _approved(record: CallRecord) -> bool:
    """Whether an approver approved this call before (its approval still answers an ask)."""
    return (record.decision or {}).get("kind") == "approve"


def _defers(approver: object) -> bool:
    """Whether an approver only ever defers (the default), so asking it again is pointless."""
    return bool(getattr(approver, "defers_everything", False))


async def _pending(store: Store, item_id: str | None) -> PendingItem | None:
    if not item_id:
        return None
    try:
        return await store.pending_item(item_id)
    except NotFound:
        return None


def _resumed_answer(item: PendingItem) -> Submit | Decline:
    """The operator's answer to a pending question, shaped for the tool that asked.

    A form's answer arrives as text (the CLI, `resume_with_answer`): it is parsed as JSON and
    checked against the form's schema; one that does not fit reaches the tool as a decline.
    """
    answer = (item.decision or {}).get("answer")
    if item.payload.get("kind") != "form":
        return Submit(answer)
    value = _form_answer(answer) if isinstance(answer, str) else answer
    errors = schema_issues(local_validator(item.payload.get("schema") or {}), value)
    if errors or not isinstance(value, dict):
        reason = errors[0].message if errors else "a form's answer is a JSON object"
        return Decline(f"the answer does not fit the form: {reason}")
    return Submit(value)


def _form_answer(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"answer": text}


def _answer_record(answer: Submit | Decline) -> dict[str, Any]:
    if isinstance(answer, Decline):
        return {"kind": "decline", "reason": answer.reason}
    return {"kind": "submit", "value": answer.value}


def _answer_from(data: dict[str, Any]) -> Submit | Decline:
    if data.get("kind") == "decline":
        return Decline(str(data.get("reason", "declined")))
    return Submit(data.get("value"))


def _model_text(exc: ToolError) -> str:
    if exc.disposition is Disposition.IN_DOUBT:
        return f"The tool did not complete ({exc}); it may have partly taken effect."
    return f"The tool failed: {exc}"


def _name(obj: object) -> str:
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) else type(obj).__name__


def _uid() -> str:
    return uuid.uuid4().hex[:12]
