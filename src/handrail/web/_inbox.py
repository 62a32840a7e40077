"""What the inbox shows and does, without HTTP: the pending list, one item, a run, decisions.

Deciding goes through the same path as the CLI and the library: `hr.resume_with_decision`,
`hr.resume_with_answer`, `hr.resume_with_recovery` (check, compare-and-swap the decision,
continue the run), started in the background. The request that decided waits only for the
compare-and-swap, so it can say at once whether this decision won; the run then continues on
its own. Without an agent to continue the run with (it recorded no `ref`), the decision is
recorded and the run waits for `handrail resume`.

A store that `handrail worker` processes serve (PostgreSQL) is different: there the workers
continue runs, on whichever machine is free, so by default the inbox only records the decision
(as `handrail approve --no-resume` does) and a worker, woken by the decision's notification,
continues the run. `resume_runs=True` makes the inbox continue them itself anyway.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
from anyio.abc import TaskGroup

from handrail.approval import Decision
from handrail.approval._notify import delivery_text
from handrail.errors import (
    AlreadyDecided,
    HandrailError,
    InvalidArguments,
    NotFound,
    PolicyError,
    ResumeRefused,
    UserError,
)
from handrail.policy import (
    Action,
    Effect,
    OutsideWorkspace,
    Policy,
    Rule,
    UncanonicalPath,
    quota_lines,
    resolve_in_workspace,
)
from handrail.runs import (
    Agent,
    Recovery,
    record_decision,
    resume_with_answer,
    resume_with_decision,
    resume_with_recovery,
    tree_of,
)
from handrail.runs._program import confinement_note, program_of, result_confinement, text_lines
from handrail.runs._standing import quota_standing
from handrail.store import PendingItem, RunRecord, Store
from handrail.store.contract import principal
from handrail.tools import Act, ToolImpl, local_validator, schema_issues

__all__ = ["AgentFor", "EditCheck", "Inbox", "ItemView", "Refused"]

AgentFor = Callable[[RunRecord], Agent | None]
"""Rebuilds the agent of a run (from the `ref` it recorded), or None when it cannot."""

MAX_DIFF_LINES = 400
MAX_FILE_BYTES = 1 << 20
MAX_TEXT = 64 * 1024
"""Longest reason, answer, observation or pattern accepted from the page."""
PAGE_SIZE = 50
AGENT_CACHE = 64
MAX_JOBS = 1000
"""How many runs' last background resume the run pages can still report."""
"""How many rebuilt agents are kept (one per run)."""


class Refused(Exception):
    """A decision the inbox will not record; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of a rendered diff."""

    kind: str
    """`add`, `del`, `ctx`, `hunk`, `file` or `note`."""
    text: str
    """The line, as text (escaped when rendered)."""


@dataclass(frozen=True, slots=True)
class ActionView:
    """One action of an approval, as shown."""

    act: str
    target: str
    diff: list[DiffLine] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ItemView:
    """Everything the page shows about one pending item."""

    item: PendingItem
    run: RunRecord | None
    actions: list[ActionView]
    arguments_json: str
    schema: dict[str, Any] | None
    """The tool's input schema (for editing), when the agent could be rebuilt."""
    schema_json: str
    can_resume: bool
    """Whether the inbox can continue the run itself (an agent was rebuilt)."""
    agent_problem: str | None
    """Why the agent could not be rebuilt, when it could not."""
    quota: list[str] = field(default_factory=list)
    """For an approval, each quota its call falls under: the window's count now (held or
    not), the limit and the window (`quota_standing`)."""
    deliveries: list[str] = field(default_factory=list)
    """Each delivery attempt of the item's notifications, one line each (the latest)."""


@dataclass(frozen=True, slots=True)
class EditCheck:
    """Edited arguments as the server understood them: what approving them would do."""

    arguments: dict[str, Any]
    """The validated arguments, as the tool dumps them (what is recorded and performed)."""
    arguments_json: str
    """The same, pretty."""
    digest: str
    """sha256 of their canonical JSON: approving must name the previewed one."""
    actions: list[ActionView]
    """What the edited call touches, with diffs."""
    effect: str
    """The policy's verdict on them (`ask` or `allow`; a deny is refused)."""
    reason: str
    """Why."""


@dataclass(frozen=True, slots=True)
class Filters:
    """The list's filters."""

    agent: str | None = None
    tool: str | None = None
    kind: str | None = None
    older_than: float | None = None
    """Seconds."""


@dataclass(slots=True)
class Job:
    """A resume the inbox started, for the run's page."""

    run_id: str
    item_id: str
    started_at: float
    state: str = "running"
    """`running`, `done` or `failed`."""
    message: str = ""
    error: BaseException | None = None
    """What stopped it, when it failed."""


class _DecisionSignal:
    """A store wrapper that reports the outcome of the one `decide` a resume makes.

    `resume_with_*` check, then compare-and-swap, then continue the run; the request that
    decided waits only for the compare-and-swap (the event), never for the run.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self.done = anyio.Event()
        self.error: BaseException | None = None
        self.decided: PendingItem | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def decide(self, item_id: str, decision: dict[str, Any], decided_by: str, *,
                     payload: dict[str, Any] | None = None) -> PendingItem:
        try:
            self.decided = await self._store.decide(item_id, decision, decided_by,
                                                    payload=payload)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.done.set()
        return self.decided


class Inbox:
    """The inbox over one store.

    Args:
        store: The run store (SQLite; the memory store lives in another process).
        agent_for: Rebuilds a run's agent, or returns None when it cannot.
        resume_runs: Whether a decision continues its run here. None (the default): unless
            the store is one `handrail worker` processes serve (PostgreSQL), whose workers
            continue it.
    """

    def __init__(self, store: Store, agent_for: AgentFor, *,
                 resume_runs: bool | None = None) -> None:
        self.store = store
        self.agent_for = agent_for
        self.resume_runs = (not served_by_workers(store)) if resume_runs is None \
            else resume_runs
        self.jobs: dict[str, Job] = {}
        self.task_group: TaskGroup | None = None
        self._agents: dict[str, tuple[Agent | None, str | None]] = {}

    # ------------------------------------------------------------ reading

    async def items(self, filters: Filters) -> list[PendingItem]:
        """Open items, newest first."""
        items = await self.store.pending(kind=filters.kind, agent=filters.agent,
                                         tool=filters.tool, older_than=filters.older_than)
        items.sort(key=lambda p: p.created_at, reverse=True)
        return items

    async def all_open(self) -> list[PendingItem]:
        """Every open item (for the filter choices)."""
        return await self.store.pending()

    async def agent(self, run: RunRecord, *, fresh: bool = False
                    ) -> tuple[Agent | None, str | None]:
        """The run's agent, or None with the reason.

        Rebuilt in a worker thread: importing the agent's module and building it (a manifest
        read from disk) is blocking work. Pages reuse the last few built; a decision gets a
        fresh one (`fresh=True`), as `handrail approve` would, and it both checks edited
        arguments and continues the run.
        """
        cached = None if fresh else self._agents.get(run.id)
        if cached is not None:
            return cached
        session = _mcp_session(run)
        if session is not None:
            # A call an MCP client made through `handrail serve`: no agent to rebuild, and
            # none is needed (the serving process continues it, or nothing can).
            return None, session
        try:
            agent = await anyio.to_thread.run_sync(self.agent_for, run)
            problem = None if agent is not None else (
                "the run recorded no agent reference; the inbox records decisions and the "
                f"run waits for `handrail resume {run.id} --agent MODULE:OBJECT`")
        except Exception as exc:  # boundary: the run's own code; its failure is shown, not raised
            agent, problem = None, (f"the run's agent could not be rebuilt: "
                                    f"{type(exc).__name__}: {exc}")
        self._agents.pop(run.id, None)
        if len(self._agents) >= AGENT_CACHE:
            self._agents.pop(next(iter(self._agents)))
        self._agents[run.id] = (agent, problem)
        return agent, problem

    async def _item_agent(self, run: RunRecord, agent: Agent | None) -> Agent | None:
        """The agent whose tool made the run's items.

        The run's own agent or, for a sub-agent's run, that sub-agent rebuilt from the root's
        agent (the run's `agent_ref` names the root's), as `handrail approve` finds it
        (docs/subagents.md).

        Raises:
            ResumeRefused: the tree no longer matches the root agent (a child renamed, its
                manifest changed).
        """
        if agent is None or not run.depth:
            return agent
        _, owner = await tree_of(self.store, run, agent)
        return owner

    async def view(self, item_id: str) -> ItemView:
        """One item with its context (diff, schema, run).

        Raises:
            NotFound: no such item.
        """
        item = await self.store.pending_item(item_id)
        try:
            run: RunRecord | None = await self.store.run(item.run_id)
        except NotFound:
            run = None
        agent, problem = (await self.agent(run)) if run is not None else (None, "the run is gone")
        owner = agent
        if run is not None:
            try:
                owner = await self._item_agent(run, agent)
            except HandrailError as exc:
                owner, problem = None, f"the sub-agent that asks could not be rebuilt: {exc}"
        schema: dict[str, Any] | None = None
        impl = _impl(owner, item.tool)
        if impl is not None:
            schema = dict(impl.spec.input_schema)
        actions: list[ActionView] = []
        payload = item.payload
        if item.kind == "approval":
            workspace = payload.get("workspace") or (run.workspace if run else None)
            readable = _read_policy(run, agent)
            for action in _payload_actions(payload):
                diff = await anyio.to_thread.run_sync(
                    _action_diff, action, workspace, item.tool, payload.get("arguments"),
                    readable)
                actions.append(ActionView(act=str(action.get("act")),
                                          target=_target_text(action.get("target")), diff=diff))
            arguments: Any = payload.get("arguments")
        else:
            arguments = payload.get("arguments") if item.kind == "recovery" else None
        quota = (await quota_standing(self.store, run, payload)
                 if run is not None and item.kind == "approval" and item.state == "open"
                 else [])
        deliveries = [line for line in map(delivery_text, item.notes) if line is not None]
        return ItemView(
            quota=quota, deliveries=deliveries[-MAX_NOTES:],
            item=item, run=run, actions=actions,
            arguments_json=json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=True),
            schema=schema, schema_json=json.dumps(schema or {}),
            can_resume=owner is not None and self.resume_runs,
            agent_problem=problem)

    async def run_view(self, run_id: str) -> tuple[RunRecord, list[dict[str, Any]]]:
        """A run and its timeline (model text and calls per turn, like `handrail show`).

        Raises:
            NotFound: no such run.
        """
        run = await self.store.run(run_id)
        calls = await self.store.calls(run_id)
        messages = await self.store.messages(run_id)
        by_turn: dict[int, list[Any]] = {}
        for c in calls:
            by_turn.setdefault(c.turn, []).append(c)
        # What became of each call's pending item besides its decision (notifications, the
        # escalation, the expiry, a decision link used), beside the call: the run's record.
        notes: dict[str, list[str]] = {}
        for c in [c for c in calls if c.pending_id][:MAX_NOTED_CALLS]:
            try:
                item = await self.store.pending_item(str(c.pending_id))
            except NotFound:
                continue
            notes[c.id] = [_note_text(n) for n in item.notes[-MAX_NOTES:]]
        timeline: list[dict[str, Any]] = []
        turn = -1
        for m in messages:
            kind = m.get("kind")
            if kind == "user":
                timeline.append({"kind": "user", "text": _short(str(m.get("text", "")), 2000)})
            elif kind == "assistant":
                turn += 1
                text = "".join(str(p.get("text", "")) for p in m.get("parts", [])
                               if p.get("kind") == "text")
                timeline.append({"kind": "model", "text": _short(text, 4000),
                                 "calls": [_call_view(c, notes.get(c.id, []))
                                           for c in by_turn.get(turn, [])]})
        return run, timeline

    # ----------------------------------------------------------- deciding

    async def check_edit(self, item_id: str, modified_json: str) -> EditCheck:
        """What approving `modified_json` would do, for the person to see before approving."""
        item, run, agent = await self._open(item_id, "approval")
        return await self._check_modified(item, run, agent, modified_json)

    async def approve(self, item_id: str, user: str, *, modified_json: str | None = None,
                      previewed: str | None = None, remember: str | None = None) -> str:
        """Approve (optionally with edited arguments, or remembering a pattern).

        Edited arguments are approved only as previewed: `previewed` is the digest the
        preview showed, and arguments that no longer check out to it are refused.
        """
        item, run, agent = await self._open(item_id, "approval")
        modified: dict[str, Any] | None = None
        if modified_json is not None:
            checked = await self._check_modified(item, run, agent, modified_json)
            if previewed is None or not hmac.compare_digest(checked.digest, previewed):
                raise Refused(409, "these arguments are not the ones previewed; check the "
                                   "edited arguments again before approving them")
            modified = checked.arguments
        patterns: tuple[str, ...] = ()
        if remember is not None and remember.strip():
            pattern = _bounded(remember.strip(), "the pattern to remember")
            try:
                Rule(Act(item.payload.get("act")), pattern, Effect.ALLOW)
            except (PolicyError, ValueError) as exc:
                raise Refused(422, f"the pattern to remember is not valid: {exc}") from None
            patterns = (pattern,)
        decision = Decision.approve(modified=modified, remember=patterns)
        return await self._decide(item, run, agent, user, decision.to_dict(),
                                  lambda store, a: resume_with_decision(
                                      store, item_id, decision, agent=a, decided_by=user))

    async def deny(self, item_id: str, user: str, reason: str) -> str:
        """Deny with a reason the model will read."""
        reason = _bounded(reason.strip(), "the reason")
        if not reason:
            raise Refused(422, "a denial needs a reason: the model reads it and can adapt")
        item, run, agent = await self._open(item_id, "approval")
        decision = Decision.deny(reason)
        return await self._decide(item, run, agent, user, decision.to_dict(),
                                  lambda store, a: resume_with_decision(
                                      store, item_id, decision, agent=a, decided_by=user),
                                  redact=True)

    async def answer(self, item_id: str, user: str, text: str) -> str:
        """Answer a question (a choice or free text; a form's answer is JSON)."""
        text = _bounded(text, "the answer")
        item, run, agent = await self._open(item_id, "question")
        if item.payload.get("kind") == "form":
            # In a thread: the schema (the tool's) may hold patterns that take a while.
            await anyio.to_thread.run_sync(_check_form_answer, text,
                                           item.payload.get("schema") or {})
        elif not text.strip():
            raise Refused(422, "the answer is empty")
        return await self._decide(item, run, agent, user, {"answer": text},
                                  lambda store, a: resume_with_answer(
                                      store, item_id, text, agent=a, answered_by=user))

    async def recover(self, item_id: str, user: str, choice: str, observation: str) -> str:
        """Decide a call that was in flight at a crash."""
        item, run, agent = await self._open(item_id, "recovery")
        if choice == "retry":
            recovery = Recovery.retry()
        elif choice == "abort":
            recovery = Recovery.abort()
        elif choice == "completed":
            observation = _bounded(observation.strip(), "the observation")
            if not observation:
                raise Refused(422, "say what happened: the observation becomes the call's "
                                   "result")
            recovery = Recovery.completed(observation)
        else:
            raise Refused(422, "choose retry, completed or abort")
        return await self._decide(item, run, agent, user, recovery.to_dict(),
                                  lambda store, a: resume_with_recovery(
                                      store, item_id, recovery, agent=a, decided_by=user))

    async def _open(self, item_id: str, kind: str) -> tuple[PendingItem, RunRecord, Agent | None]:
        try:
            item = await self.store.pending_item(item_id)
            run = await self.store.run(item.run_id)
        except NotFound as exc:
            raise Refused(404, str(exc)) from None
        if item.kind != kind:
            raise Refused(422, f"{item_id} is a pending {item.kind}, not a {kind}")
        if item.state != "open":
            raise Refused(409, _already(item))
        agent, _ = await self.agent(run, fresh=True)
        return item, run, agent

    async def _check_modified(self, item: PendingItem, run: RunRecord, agent: Agent | None,
                              text: str) -> EditCheck:
        """Edited arguments: parsed, validated by the tool, checked by the run's policy.

        A sub-agent's item is checked by the sub-agent (its tool, its contained policy), which
        is rebuilt from the root's agent the run's `ref` names, as `handrail approve` does.
        """
        try:
            agent = await self._item_agent(run, agent)
        except HandrailError as exc:
            raise Refused(422, f"the arguments cannot be edited here: {exc}") from None
        impl = _impl(agent, item.tool)
        if agent is None and _mcp_session(run) is not None:
            raise Refused(422, "the arguments cannot be edited here: an MCP client's call is "
                               "checked by the `handrail serve` that serves its tool; approve "
                               "or deny it as it is")
        if agent is None or impl is None:
            raise Refused(422, "the arguments cannot be edited here: the tool that checks them "
                               "is not available (the run's agent could not be rebuilt)")
        limit = agent.toolbox.max_argument_bytes
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise Refused(422, f"the edited arguments are larger than {limit} bytes")
        try:
            arguments = json.loads(text)
        except ValueError as exc:
            raise Refused(422, f"the edited arguments are not JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise Refused(422, "the edited arguments must be a JSON object")
        try:
            validated = impl.validate(arguments)
        except InvalidArguments as exc:
            raise Refused(422, f"the edited arguments do not fit the tool's schema: {exc}"
                          ) from None
        dumped = impl.dump_arguments(validated)
        try:
            actions = list(impl.actions(validated))
        except Exception as exc:  # boundary: a broken actions() refuses, never allows
            raise Refused(422, f"the edited call could not be checked: {exc}") from None
        policy = Policy.from_dict(run.policy or {}).contain(agent.policy)
        if run.remembered:
            policy = policy.with_layer_on_top(
                "remembered", [Rule.from_dict(r) for r in run.remembered])
        workspace = run.workspace or str(agent.workspace)
        verdict = policy.check_all(actions, workspace=workspace, mutates=impl.spec.mutates,
                                   arguments=dumped)
        if verdict.effect is Effect.DENY:
            raise Refused(422, f"the policy denies the edited call: {verdict.reason}")
        views = []
        for action in actions:
            # The canonical target, as the policy judged it (and the gate will).
            target = policy.check(action, workspace=workspace, mutates=impl.spec.mutates).target
            shown = {"act": action.act.value, "target": target,
                     "content": None if action.content is None
                     else base64.b64encode(action.content).decode("ascii")}
            diff = await anyio.to_thread.run_sync(_action_diff, shown, workspace, item.tool,
                                                  dumped, policy)
            views.append(ActionView(act=action.act.value, target=target, diff=diff))
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
        return EditCheck(
            arguments=dumped,
            arguments_json=json.dumps(dumped, indent=2, sort_keys=True, ensure_ascii=False),
            digest=hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest(),
            actions=views, effect=verdict.effect.value, reason=verdict.reason)

    async def _decide(self, item: PendingItem, run: RunRecord, agent: Agent | None, user: str,
                      decision: dict[str, Any],
                      resume: Callable[[Store, Agent], Awaitable[Any]], *,
                      redact: bool = False) -> str:
        """Record the decision (compare-and-swap) and continue the run in the background."""
        if agent is not None and not self.resume_runs:
            # Left to the workers: recorded as `handrail approve --no-resume` records it
            # (checked against the item and the rebuilt agent; a denial without contents).
            try:
                counted = await record_decision(self.store, item.id, item.kind, decision,
                                                user, agent=agent)
            except AlreadyDecided:
                raise Refused(409, _already(await self.store.pending_item(item.id))) from None
            except UserError as exc:
                raise Refused(422, f"not decided: {exc}") from None
            if counted.state == "open":
                return _one_of(item, counted, user)
            return "Recorded. A worker (`handrail worker`) continues the run."
        session = _mcp_session(run)
        if session is not None and session.startswith(_ENDED):
            raise Refused(409, f"not decided: {session}")
        if agent is None:
            payload = _without_contents(item.payload) if redact else None
            try:
                counted = await self.store.decide(item.id, decision, user, payload=payload)
            except AlreadyDecided:
                raise Refused(409, _already(await self.store.pending_item(item.id))) from None
            except UserError as exc:
                raise Refused(422, f"not decided: {exc}") from None
            if counted.state == "open":
                return _one_of(item, counted, user)
            if session is not None:
                return ("Recorded. The MCP client's call goes on by itself: at once if it is "
                        "still waiting, else when its client makes the same call again.")
            return (f"Recorded. The run waits for `handrail resume {run.id} --agent "
                    "MODULE:OBJECT`.")
        if self.task_group is None:
            raise RuntimeError("the inbox's background task group is not running")
        signal = _DecisionSignal(self.store)
        job = Job(run_id=run.id, item_id=item.id, started_at=time.time())

        async def go() -> None:
            try:
                result = await resume(cast(Store, signal), agent)
            except ResumeRefused as exc:
                if signal.decided is not None:
                    job.state, job.message = "done", (
                        f"decision recorded; the run is not continued here: {exc}")
                else:
                    job.state, job.message = "failed", str(exc)
            except Exception as exc:  # boundary: a failed resume is reported, the server stays
                job.state, job.message = "failed", f"{type(exc).__name__}: {exc}"
                job.error = exc
            else:
                job.state, job.message = "done", f"the run is now {result.outcome.kind}"
            finally:
                signal.done.set()

        self.task_group.start_soon(go)
        await signal.done.wait()
        if signal.decided is None:
            error = signal.error
            if isinstance(error, AlreadyDecided):
                raise Refused(409, _already(await self.store.pending_item(item.id)))
            # Refused before the compare-and-swap (the decision does not fit, the run cannot
            # be continued): nothing was recorded.
            status = 422 if isinstance(job.error, HandrailError | ValueError) else 409
            raise Refused(status, f"not decided: {job.message or error}")
        if signal.decided.state == "open":
            return _one_of(item, signal.decided, user)  # not resumed (resume_with_decision)
        self.jobs.pop(run.id, None)
        if len(self.jobs) >= MAX_JOBS:
            self.jobs.pop(next(iter(self.jobs)))
        self.jobs[run.id] = job
        return "Decided. The run continues in the background."


# ------------------------------------------------------------------ helpers


def served_by_workers(store: Store) -> bool:
    """Whether `handrail worker` processes continue this store's runs (PostgreSQL)."""
    return callable(getattr(store, "claim_ready", None))


def _impl(agent: Agent | None, tool: str | None) -> ToolImpl | None:
    if agent is None or not tool:
        return None
    try:
        return agent.toolbox.get(tool)
    except HandrailError:
        return None


def _one_of(before: PendingItem, after: PendingItem, user: str) -> str:
    """What a four-eyes approval that did not decide the item says."""
    count, needed = len(after.approvals), after.approvals_needed
    if count == len(before.approvals) and any(
            principal(str(a.get("by", ""))) == principal(user) for a in after.approvals):
        return (f"Your approval was already counted ({count} of {needed}); it needs "
                f"{needed - count} more from other people.")
    return (f"Approval {count} of {needed} recorded; it waits for {needed - count} more "
            "from other people.")


def _already(item: PendingItem) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(item.decided_at or 0))
    return f"already decided by {item.decided_by or 'someone'} at {when}"


def _bounded(text: str, what: str) -> str:
    if len(text) > MAX_TEXT:
        raise Refused(422, f"{what} is longer than {MAX_TEXT} characters")
    return text


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _target_text(target: Any) -> str:
    if isinstance(target, list):
        return " ".join(str(t) for t in target)
    return str(target)


def _payload_actions(payload: dict[str, Any]) -> list[dict[str, Any]]:
    actions = payload.get("actions") or []
    if actions:
        return [a for a in actions if isinstance(a, dict)]
    return [{"act": payload.get("act"), "target": payload.get("target"),
             "content": payload.get("content")}]


def _check_form_answer(text: str, schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise Refused(422, f"the form's answer must be JSON: {exc}") from None
    try:
        # Never fetching a `$ref` the form's schema names (`local_validator`).
        issues = schema_issues(local_validator(schema, check=True), value)
    except jsonschema.SchemaError as exc:
        raise Refused(422, f"the form's schema is broken: {exc.message}") from None
    if issues:
        raise Refused(422, f"the answer does not fit the form: {issues[0].message}") from None


def _without_contents(request: dict[str, Any]) -> dict[str, Any]:
    """A denied request as it is kept: what it touched and a digest, never the bytes.

    The same shape `hr.resume_with_decision` keeps for a denial it records.
    """
    kept = dict(request)
    content = kept.get("content")
    if content:
        try:
            raw = base64.b64decode(content)
        except (binascii.Error, ValueError):
            raw = b""
        kept["content"] = None
        kept["content_sha256"] = hashlib.sha256(raw).hexdigest()
        kept["content_bytes"] = len(raw)
    kept["arguments"] = {"redacted": "a denied request keeps only what it touched"}
    kept["actions"] = [{**a, "content": None} for a in kept.get("actions", [])]
    return kept


MAX_NOTED_CALLS = 200
"""The most calls of one run page whose items' notes are read (a pending item each)."""
MAX_NOTES = 20
"""The most recent notes shown for one call's item."""


def _note_text(note: dict[str, Any]) -> str:
    """One line for a note of a pending item (what `Dispatcher` and the inbox record)."""
    delivery = delivery_text(note)
    if delivery is not None:
        return delivery
    kind = note.get("kind")
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(note.get("at") or 0)))
    if kind == "expired":
        return f"expired: {note.get('decision')} by default at {at}"
    if kind == "link_used":
        return f"decision link ({note.get('action')}) used by {note.get('by')} at {at}"
    return f"{_short(str(kind), 40)} at {at}"


def _call_view(c: Any, notes: list[str] | None = None) -> dict[str, Any]:
    verdict = c.verdict or {}
    result = c.result or {}
    texts = [str(i.get("text", "")) for i in result.get("content", []) if i.get("kind") == "text"]
    return {
        "id": c.id, "tool": c.tool or c.model_name, "status": c.status.value,
        "actions": [f"{a.get('act')} {_target_text(a.get('target'))}" for a in c.actions],
        "effect": verdict.get("effect", "-"), "reason": verdict.get("reason") or c.error or "",
        "decision": (c.decision or {}).get("kind"), "decided_by": c.decided_by,
        "result": _short(" ".join(texts), 2000), "is_error": bool(result.get("is_error")),
        "disposition": c.disposition,
        # A program's exit code and output, and a warning when it ran unconfined (or with
        # denies the sandbox could not enforce): beside the call, as `handrail show` has them.
        "program": _program_view(result),
        "sandbox": confinement_note(result_confinement(result)),
        # Each quota the call counted in (or was held back by): count, limit and window.
        "quota": quota_lines(verdict),
        "notes": notes or [],
    }


def _program_view(result: Any) -> dict[str, Any] | None:
    program = program_of(result)
    if program is None:
        return None
    return {**program, "stdout": "\n".join(text_lines(program["stdout"])),
            "stderr": "\n".join(text_lines(program["stderr"]))}


def _read_current(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError:
        return b""


def _read_policy(run: RunRecord | None, agent: Any) -> Policy:
    """The policy that decides whether the inbox may show a file's current contents.

    The run's recorded policy (and its remembered rules) within the agent's; without a
    recorded one, the default policy (its secrets layer hides `.env` and kin).
    """
    policy = Policy.from_dict(run.policy) if run is not None and run.policy else \
        Policy.default()
    if agent is not None and getattr(agent, "policy", None) is not None:
        policy = policy.contain(agent.policy)
    if run is not None and run.remembered:
        policy = policy.with_layer_on_top("remembered",
                                          [Rule.from_dict(r) for r in run.remembered])
    return policy


def _action_diff(action: dict[str, Any], workspace: str | None, tool: str | None,
                 arguments: Any, policy: Policy | None = None) -> list[DiffLine]:
    """The diff a write would make against the file as it is now (runs in a thread).

    A file the policy denies for READ is never read: everyone signed in to the inbox
    would see its contents in the diff (a write to `.env` is exactly what to look at twice,
    but not by showing the secret).
    """
    if action.get("act") != "write":
        return []
    target = action.get("target")
    if not isinstance(target, str) or not workspace:
        return [DiffLine("note", "no diff: the target is not a file in a known workspace")]
    try:
        path = resolve_in_workspace(target, workspace)
    except (OutsideWorkspace, UncanonicalPath):
        return [DiffLine("note", "no diff: the target is outside the workspace")]
    try:
        denied = policy is None or policy.check(Action(Act.READ, target), workspace=workspace,
                                                mutates=False).effect is Effect.DENY
    except HandrailError:
        denied = True  # not decidable: not shown
    if denied:
        return [DiffLine("note", "no diff: the current file is READ-denied")]
    old = _read_current(path)
    content = action.get("content")
    if content:
        try:
            new = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            return [DiffLine("note", "no diff: the recorded content is not base64")]
    elif tool == "workspace/edit_file" and isinstance(arguments, dict):
        new_or_note = _edited(old, arguments)
        if isinstance(new_or_note, DiffLine):
            return [new_or_note]
        new = new_or_note
    else:
        return [DiffLine("note", "no diff: the tool does not say what it will write")]
    # Named as in a repository (`a/docs/x.md`), not `b//srv/project/docs/x.md`.
    shown = path.relative_to(Path(workspace).resolve()).as_posix() \
        if path.is_relative_to(Path(workspace).resolve()) else target
    return _diff_lines(shown, old, new)


_ENDED = "the MCP session this call belongs to has ended"


def _mcp_session(run: RunRecord) -> str | None:
    """For a call an MCP client made through `handrail serve`: what deciding it does.

    The gateway marks its runs (`handrail.mcp` SESSION_EVENT, "mcp_session") and renews a
    waiting call's lease while its session lives; a session whose server stopped (or was
    killed) has none.
    """
    if not any(isinstance(e, dict) and e.get("kind") == "mcp_session" for e in run.events):
        return None
    if run.owner is None or run.lease_until < time.time():
        return (f"{_ENDED} (the `handrail serve` that held it is gone): nothing would run "
                "it, so it is not decided here; an approval expires, recorded, when `handrail "
                "serve` next starts with this store")
    return ("a call an MCP client made through `handrail serve`, waiting in its session: "
            "once decided it goes on by itself (at once if the client still waits, else at "
            "the client's same call again); nothing to resume. Its arguments cannot be "
            "edited here")


def _edited(old: bytes | None, arguments: dict[str, Any]) -> bytes | DiffLine:
    before, after = arguments.get("old"), arguments.get("new")
    if old is None or not isinstance(before, str) or not isinstance(after, str):
        return DiffLine("note", "no diff: the file does not exist (the edit will fail)")
    text = _decode(old)
    if text is None:
        return DiffLine("note", "no diff: the file is not UTF-8 text (the edit will fail)")
    count = text.count(before)
    if count != 1:
        return DiffLine("note", f"no diff: the text to replace occurs {count} times now "
                                "(the edit will fail)")
    return text.replace(before, after, 1).encode("utf-8")


def _decode(data: bytes) -> str | None:
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _diff_lines(target: str, old: bytes | None, new: bytes) -> list[DiffLine]:
    if old is not None and len(old) > MAX_FILE_BYTES:
        return [DiffLine("note", f"no diff: the current file is larger than {MAX_FILE_BYTES} "
                                 f"bytes; the write puts {len(new)} bytes")]
    new_text = _decode(new)
    old_text = "" if old is None else _decode(old)
    if new_text is None or old_text is None:
        before = "absent" if old is None else f"{len(old)} bytes"
        return [DiffLine("note", f"binary content: {before} -> {len(new)} bytes")]
    lines = difflib.unified_diff(
        old_text.splitlines(), new_text.splitlines(),
        fromfile="/dev/null" if old is None else f"a/{target}", tofile=f"b/{target}",
        lineterm="")
    out: list[DiffLine] = []
    for n, line in enumerate(_take(lines, MAX_DIFF_LINES + 1)):
        if n == MAX_DIFF_LINES:
            out.append(DiffLine("note", "… more diff lines not shown: deny if unsure"))
            break
        if line.startswith(("---", "+++")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append(DiffLine(kind, line))
    if not out:
        return [DiffLine("note", "no change: the file already holds exactly these bytes")]
    if not new_text.endswith("\n") and new_text:
        out.append(DiffLine("note", "\\ no newline at end of file"))
    return out


def _take(lines: Iterator[str], n: int) -> Iterator[str]:
    for i, line in enumerate(lines):
        if i >= n:
            return
        yield line
