"""Sub-agents: an agent offered to another as a tool, and a tree of runs as one durable thing.

`child.as_tool()` is a `SubAgentTool`: one more tool of the parent, so a delegation passes
every stage of the gate like any call (a CALL action `agents/<name>` the parent's policy
decides). Its body drives the child's run in the same store, under the parent's approver and
responder and under `parent_policy.contain(child.policy)`, and returns the child's output.

Durability, in three rules (docs/subagents.md):

- A child's run id is derived from its parent's run id and the delegating call's id
  (`child_run_id`), so the body finds "its" child again in any process without a lookup
  table: started once, then continued, never started twice.
- When the child pauses for a person, the body raises `DelegatedPause` with the child's item:
  the delegating call stays STARTED and the parent's turn (and so the root's run) pauses on
  that item. The tool is `idempotent`: a resumed parent re-enters the call, and its body
  continues the child's run (whose own calls are exactly-once as any run's) instead of acting
  again. So a crash mid-child sends the child's in-flight calls to recovery, and the parent's
  delegating call is never re-run blindly.
- A resume always drives the tree from its root, with the root agent: each open child is
  rebuilt from the root agent's tools by name, and a child that no longer exists, or whose
  manifest changed, refuses the resume (recorded in the root's events) before anything is
  decided or run.

Budgets: the root's `max_steps`, `max_tokens` (manifest) and `max_wall_seconds` are counted
across the whole tree in the process driving it (`Tree`); each agent also keeps its own
`max_steps` for its run. A child that exhausts the tree's budget fails, and so does every run
above it, each with the reason.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from handrail.approval import Approver, Responder
from handrail.errors import InvalidArguments, Issue, NotFound, ResumeRefused, UserError
from handrail.gate import (
    CallInDoubt,
    ControlChain,
    DelegatedPause,
    Governance,
    PausedOnQuestion,
    PausedOnRequest,
    describe_control,
    recorded_governance,
    stricter_contents,
    stricter_sandbox,
)
from handrail.models import dump_messages
from handrail.policy import Policy
from handrail.runs._outcome import outcome_to_dict
from handrail.runs._tree import _OPEN_CALL, child_run_id, sub_runs
from handrail.store import Batch, RunRecord, RunStatus, Store
from handrail.store.contract import new_owner
from handrail.tools import CallContext, SchemaTool, ToolId, ToolResult, ToolSpec

if TYPE_CHECKING:
    import pydantic

    from handrail.runs._agent import Agent, _Runner

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "SubAgentTool",
    "Tree",
    "adopt",
    "attach",
    "child_run_id",
    "plant",
    "prepare_resume",
    "sub_runs",
    "tree_of",
]

DEFAULT_MAX_DEPTH = 4
"""How many levels of sub-agents a tree may have below its root (`Agent.max_depth`)."""

MAX_TASK_CHARS = 100_000
"""The longest task a parent's model may hand to a sub-agent (it is a model's output)."""

def _is_model_class(value: object) -> bool:
    # pydantic is imported only for a typed input: the agent core loads without it (issue 11).
    import pydantic

    return isinstance(value, type) and issubclass(value, pydantic.BaseModel)


class SubAgentTool(SchemaTool):
    """An agent offered to another agent as a tool (`Agent.as_tool`); see the module doc."""

    delegates = True
    """The gate checks a run's intent on the child's own calls, not on the delegation."""

    def __init__(self, agent: Agent, *, name: str | None, description: str | None,
                 server: str, input_type: type[pydantic.BaseModel] | None) -> None:
        name = name if name is not None else agent.name
        if not name:
            raise UserError("a sub-agent needs a name: Agent(..., name=\"coder\") or "
                            "agent.as_tool(name=\"coder\")")
        if input_type is not None and not _is_model_class(input_type):
            raise UserError("as_tool(input_type=...) takes a pydantic model class")
        self.agent = agent
        """The child agent."""
        self.name = name
        """The child's name in the tree (the tool's name; `agent_path` entries)."""
        self.input_type = input_type
        if input_type is None:
            schema: dict[str, Any] = {
                "type": "object",
                "properties": {"task": {"type": "string", "minLength": 1,
                                        "maxLength": MAX_TASK_CHARS,
                                        "description": "What the sub-agent should do."}},
                "required": ["task"],
            }
        else:
            schema = input_type.model_json_schema()
        if description is None:
            about = (agent.instructions or "").strip().splitlines()
            description = f"Delegate a task to the sub-agent {name!r}" + (
                f": {about[0][:200]}" if about else ".")
        # A delegation mutates unless every tool the child (and its children) may call is a
        # read: two delegations in one turn then keep the order of their effects. A host's
        # tools are known only at run time: a child with some may mutate.
        mutates = agent.injected is not None or any(s.mutates for s in _tree_specs(agent))
        spec = ToolSpec(ToolId(server, name), description, schema, mutates=mutates,
                        idempotent=True)  # its re-run continues the child's run: see above
        super().__init__(spec, self._delegate, origin=f"sub-agent {name!r}")
        check_tree(agent, self, max_depth=None)  # the depth is the root's to limit, at run

    def validate(self, arguments: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
        """The JSON Schema's check, then the input model's own (its validators): stage 3.

        Raises:
            InvalidArguments: naming each problem (the model may fix them; nothing ran).
        """
        checked = super().validate(arguments)
        if self.input_type is not None:
            import pydantic  # loaded already: the input model is one

            try:
                self.input_type.model_validate(checked)
            except pydantic.ValidationError as exc:
                raise InvalidArguments(str(self.spec.id), [
                    Issue(path="$" + "".join(f".{p}" for p in e["loc"]), message=e["msg"])
                    for e in exc.errors()]) from None
        return checked

    def _task(self, arguments: dict[str, Any]) -> str:
        if self.input_type is None:
            return str(arguments["task"])
        return self.input_type.model_validate(arguments).model_dump_json()

    async def _delegate(self, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        node = None if ctx.run_id is None else _LIVE.get(ctx.run_id)
        if node is None or ctx.run_id is None:
            raise UserError(f"the sub-agent tool {self.spec.id} runs inside an agent's run "
                            "(pass it in the parent's tools); it cannot be called alone")
        task = self._task(arguments)
        run_id = child_run_id(ctx.run_id, ctx.call_id)
        try:
            existing: RunRecord | None = await node.store.run(run_id)
        except NotFound:
            existing = None
        if existing is None:
            result_outcome = await _start_child(self, node, ctx, task, run_id)
        else:
            result_outcome = await _continue_child(self, node, ctx, existing)
        return _as_result(self.name, result_outcome)


def _as_result(name: str, outcome: dict[str, Any]) -> ToolResult:
    """The delegating call's result for the child's outcome (or the parent's pause)."""
    kind = outcome.get("kind")
    if kind == "completed":
        output = outcome.get("output")
        return ToolResult.text(output) if isinstance(output, str) else ToolResult.json(output)
    if kind == "awaiting_approval":
        raise DelegatedPause(PausedOnRequest(str(outcome["request_id"])))
    if kind == "awaiting_answer":
        raise DelegatedPause(PausedOnQuestion(str(outcome["question_id"])))
    if kind == "awaiting_recovery":
        raise DelegatedPause(CallInDoubt(str(outcome["call_id"])))
    if kind == "failed":
        return ToolResult.error(f"The sub-agent {name!r} failed: {outcome.get('error')}")
    return ToolResult.error(f"The sub-agent {name!r} stopped: {outcome.get('reason', kind)}")


# --------------------------------------------------------------------- the tree


@dataclass
class Tree:
    """Budgets shared by every run of one tree, counted by the process driving it."""

    max_steps: int
    """The root's `max_steps`: model turns across the tree."""
    max_tokens: int | None
    """The root's token budget (input + output), across the tree."""
    max_wall_seconds: float | None
    """The root's wall-clock budget, from when this process started driving the tree."""
    max_depth: int
    """How many levels of sub-agents the tree may have."""
    started: float
    """`time.monotonic()` when this process started driving the tree."""
    steps: int = 0
    """Model turns spent across the tree (restored from the store on resume)."""
    tokens: int = 0
    """Tokens spent across the tree."""
    last: tuple[str, ...] = ()
    """The agent path of the last spender, for the reason of a failure."""

    def spend(self, path: tuple[str, ...], steps: int, tokens: int) -> None:
        """Count one model turn of the agent at `path`."""
        self.steps += steps
        self.tokens += tokens
        self.last = path

    def exhausted(self) -> str | None:
        """Why the tree may not take another model turn, or None."""
        by = f" (spent across the tree; the last turn by {'/'.join(self.last)})"
        if self.steps >= self.max_steps:
            return (f"the tree's step budget of {self.max_steps} model turns is exhausted{by}; "
                    "raise the root's max_steps or simplify the task")
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return f"the tree's token budget of {self.max_tokens} is exhausted{by}"
        if self.max_wall_seconds is not None and \
                time.monotonic() - self.started >= self.max_wall_seconds:
            return f"the tree's wall-clock budget of {self.max_wall_seconds}s is exhausted{by}"
        return None


@dataclass(eq=False)
class Node:
    """What a run in a tree hands down to the sub-agents it delegates to."""

    tree: Tree
    path: tuple[str, ...]
    """Agent names from the root to this run's agent."""
    depth: int
    """0 for the root."""
    store: Store
    approver: Approver
    """The one approver of the whole tree (the root's)."""
    responder: Responder
    """The one responder of the whole tree (the root's)."""
    ref: str | None
    """The root agent's ref: what rebuilds the tree in another process."""
    on_event: Any = None
    """The root's `on_event`: every run of the tree reports to it (see `_forward`)."""
    governance: Governance | None = None
    """The governance of this node's run: what its sub-agents' runs are governed under."""
    parent: Node | None = None
    """The node of the run that delegated to this one (None for the root)."""
    gate: Any = None
    """This run's gate, once attached: a child's gate inherits its taint (docs/taint.md)."""

    def below(self, name: str, depth: int) -> Node:
        """The node of a sub-agent `name` of this run, at `depth` (its governance set later)."""
        return Node(tree=self.tree, path=(*self.path, name), depth=depth, store=self.store,
                    approver=self.approver, responder=self.responder, ref=self.ref,
                    on_event=self.on_event, parent=self)

    def forward(self) -> Any:
        """A sub-agent's `on_event`: its events go to the root's listener, with its run id.

        Its `paused` and `finished` are not: the root reports how the tree paused or ended
        (a listener such as `RunStream` or the terminal view reads those as the run's).
        """
        listener = self.on_event
        if listener is None:
            return None

        async def forward(event: Any) -> None:
            if event.kind in ("paused", "finished"):
                return
            out = listener(event)
            if out is not None:
                await out

        return forward


_LIVE: weakref.WeakValueDictionary[str, Node] = weakref.WeakValueDictionary()
"""Run id -> the node of a run this process drives in a tree (a delegating body finds its
parent here; an entry goes when its runner does)."""


def _tree_specs(agent: Agent) -> list[ToolSpec]:
    return [impl.spec for impl in agent.toolbox.impls()]


def sub_agents(agent: Agent) -> list[SubAgentTool]:
    """The sub-agent tools among `agent`'s tools."""
    return [impl for impl in agent.toolbox.impls() if isinstance(impl, SubAgentTool)]


def tree_tools(agent: Agent) -> list[Any]:
    """The tools of every agent below `agent` (each once): what its manifest must cover.

    A tree is governed by its root: the root's manifest grants every call of the tree, so
    it is checked (drift) against these too, and `handrail manifest check` reviews them.
    """
    found: dict[int, Any] = {}
    seen: set[int] = {id(agent)}
    stack = [child.agent for child in sub_agents(agent)]
    while stack:
        below = stack.pop()
        if id(below) in seen:
            continue  # a cycle: `check_tree` refuses it, with the path
        seen.add(id(below))
        for impl in below.toolbox.impls():
            found.setdefault(id(impl), impl)
        stack.extend(child.agent for child in sub_agents(below))
    return list(found.values())


def child_governance(parent: Governance, policy: Policy, agent: Agent) -> Governance:
    """A sub-agent's run's governance: its root's, made stricter by the child's own.

    The parent's effective `policy` contains the child's; the root's control is asked first
    (then the child's own, if any); the sandbox mode and `record_contents` are the stricter;
    the workspace is the root's; the manifest in force is the root's when it has one (it
    covers the tree: `tree_tools`), else the child's.
    """
    return Governance(
        policy=policy, workspace=parent.workspace,
        manifest=parent.manifest if parent.manifest is not None else agent.manifest,
        control=ControlChain.of(parent.control, agent.control_in(parent.workspace)),
        sandbox=stricter_sandbox(parent.sandbox, agent.sandbox),
        record_contents=stricter_contents(parent.record_contents, agent.record_contents))


def check_tree(agent: Agent, tool: SubAgentTool | None = None, *,
               max_depth: int | None = DEFAULT_MAX_DEPTH) -> None:
    """Refuse a tree with a cycle, deeper than `max_depth`, or spread over two workspaces.

    Raises:
        UserError: naming the path where the tree goes wrong.
    """

    def walk(node: Agent, path: tuple[str, ...], seen: tuple[int, ...]) -> None:
        for child in sub_agents(node):
            here = (*path, child.name)
            if id(child.agent) in seen:
                raise UserError(f"the sub-agents form a cycle: {' -> '.join(here)}; an agent "
                                "cannot delegate to itself or to an agent above it")
            if max_depth is not None and len(here) - 1 > max_depth:
                raise UserError(f"the tree of sub-agents is deeper than {max_depth} levels "
                                f"at {'/'.join(here)}; set the root's max_depth, or flatten it")
            if child.agent.workspace != node.workspace:
                raise UserError(
                    f"the sub-agent {'/'.join(here)} works in {str(child.agent.workspace)!r} "
                    f"but its parent in {str(node.workspace)!r}: a sub-agent works in its "
                    "parent's workspace (its policy is contained in the parent's, whose paths "
                    "are relative to that workspace)")
            walk(child.agent, here, (*seen, id(child.agent)))

    walk(agent, (tool.name if tool is not None else agent.name or "agent",), (id(agent),))


def plant(runner: _Runner) -> None:
    """Make a new root run a tree, when its agent delegates: checked, budgeted, registered."""
    agent = runner.agent
    if not sub_agents(agent):
        return
    max_depth = agent.max_depth
    check_tree(agent, max_depth=max_depth)
    tree = Tree(max_steps=agent.max_steps, max_tokens=agent.max_tokens,
                max_wall_seconds=agent.max_wall_seconds, max_depth=max_depth,
                started=runner.started)
    node = Node(tree=tree, path=(agent.name or "agent",), depth=0, store=runner.store,
                approver=runner.scope.approver, responder=runner.scope.responder,
                ref=agent.ref, on_event=runner.on_event)
    attach(runner, node)


def attach(runner: _Runner, node: Node) -> None:
    """Put `runner` at `node` of its tree: its sub-agents are governed under its governance."""
    node.governance = runner.governance
    runner.node = node
    runner.scope.agent_path = node.path
    node.gate = runner.gate
    if node.parent is not None and node.parent.gate is not None:
        # A task the parent's model wrote carries the taint of what that model read.
        runner.gate.inherit(node.parent.gate)
    _LIVE[runner.run.id] = node


async def _start_child(tool: SubAgentTool, parent: Node, ctx: CallContext, task: str,
                       run_id: str) -> dict[str, Any]:
    """Start the child's run (its record first, so any process finds it), then drive it."""
    from handrail.runs._agent import _contents_event, _Runner
    from handrail.runs._conversation import start_messages

    agent = tool.agent
    depth = parent.depth + 1
    if depth > parent.tree.max_depth:
        raise UserError(f"the sub-agent {'/'.join((*parent.path, tool.name))} would run at "
                        f"depth {depth}, past the tree's limit of {parent.tree.max_depth}")
    store = parent.store
    now = time.time()
    start = await start_messages(agent, store, task, None, None, now)
    # The parent's effective policy (its remembered rules included) is the authority; the
    # child's own policy only adds denies and asks. The parent's policy is itself contained
    # in its parent's, so no run of the tree allows what its root does not.
    parent_policy = ctx.policy if isinstance(ctx.policy, Policy) else None
    if parent_policy is None:
        raise UserError("a sub-agent needs its parent's policy (the gate passes it)")
    policy = parent_policy.contain(start.policy)
    if parent.governance is None:
        raise UserError("a sub-agent runs inside its parent's governed run")
    governance = child_governance(parent.governance, policy, agent)
    owner = new_owner()
    run = RunRecord(
        id=run_id, task=task, agent=tool.name, status=RunStatus.RUNNING,
        parent_id=ctx.run_id, parent_call_id=ctx.call_id, depth=depth,
        policy=policy.to_dict(), manifest_digest=agent.manifest_digest, model=agent.model.name,
        workspace=str(governance.workspace), created_at=now, updated_at=now, owner=owner,
        lease_until=now + store.lease_seconds, agent_ref=parent.ref,
        events=[governance.event(now),
                *_contents_event([], governance.record_contents, now)],
    )
    messages = start.messages
    await store.write(Batch(run=run, messages=[(run.id, i, m) for i, m in
                                               enumerate(dump_messages(messages))]))
    # Kept in the parent's record (written with its turn): `handrail runs` counts a tree's
    # runs and `handrail show` draws it from these.
    await ctx.record_event("delegated", run=run_id, agent=tool.name, depth=depth)
    node = parent.below(tool.name, depth)
    runner = _Runner(agent, store, run, governance, [], messages, parent.approver,
                     parent.responder, node.forward())
    attach(runner, node)
    return outcome_to_dict((await runner.drive(None)).outcome)


async def _continue_child(tool: SubAgentTool, parent: Node, ctx: CallContext,
                          run: RunRecord) -> dict[str, Any]:
    """The delegating call re-entered: its child's run, continued (or its end, reused)."""
    from handrail.runs._agent import _resume

    if run.agent != tool.name or run.parent_id != ctx.run_id:
        raise ResumeRefused(f"run {run.id} is not the run of sub-agent {tool.name!r} for call "
                            f"{ctx.call_id}; refusing to continue it")
    if run.status in (RunStatus.COMPLETED, RunStatus.FAILED) and run.outcome is not None:
        return dict(run.outcome)  # it ended before the parent recorded it: reused, not re-run
    node = parent.below(tool.name, run.depth)
    parent_policy = ctx.policy if isinstance(ctx.policy, Policy) else Policy.default()
    result = await _resume(parent.store, run.id, agent=tool.agent, approver=parent.approver,
                           responder=parent.responder, allow_manifest_change=False,
                           on_event=node.forward(), cancel=None, node=node,
                           bound=parent_policy, parent=parent.governance)
    return outcome_to_dict(result.outcome)


# --------------------------------------------------------------------- resuming


async def _chain(store: Store, run: RunRecord) -> list[RunRecord]:
    """The runs from the root of `run`'s tree down to `run`."""
    chain = [run]
    while chain[0].depth > 0 and chain[0].parent_id is not None:
        if len(chain) > 64:
            raise ResumeRefused(f"run {run.id} has more than 64 ancestors; refusing it")
        chain.insert(0, await store.run(chain[0].parent_id))
    return chain


def _child_tool(agent: Agent, model_name: str) -> SubAgentTool | None:
    impl = agent.toolbox.by_model_name(model_name)
    return impl if isinstance(impl, SubAgentTool) else None


async def _refused(store: Store, root: RunRecord, reason: str) -> ResumeRefused:
    """Record a refusal in the root's events (the tree stays as it was) and return it.

    Not while a process drives the root: its runner owns the record (and refuses this resume
    anyway, when it claims the run).
    """
    if root.status is not RunStatus.RUNNING:
        root.events = [*root.events, {"kind": "resume_refused", "reason": reason[:2000],
                                      "at": time.time()}]
        await store.write(Batch(run=root))
    return ResumeRefused(reason)


async def _survey(store: Store, run: RunRecord, agent: Agent | None, path: tuple[str, ...],
                  root: RunRecord, totals: list[int], above: Any = None) -> None:
    """Check each open child under `run` against `agent`'s tools; add up what the tree spent.

    With `agent` None the subtree is only counted (every run's steps and tokens). One read
    of the run's calls (when checking) and one per child: a run's delegations are found from
    its `delegated` events, never by probing each of its calls.
    """
    totals[0] += run.steps
    totals[1] += run.input_tokens + run.output_tokens
    if len(path) > 64:
        return
    # The controls in force for `run`'s calls, root's first (its children's start with them).
    above = None if agent is None else ControlChain.of(above, agent.control)
    calls = await store.calls(run.id) if agent is not None else []
    by_id = {c.call_id: c for c in calls}
    for call_id, child in (await sub_runs(store, run, calls)).items():
        here = (*path, str(child.agent))
        call = by_id.get(call_id)
        if agent is None or call is None or call.status not in _OPEN_CALL or \
                child.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            await _survey(store, child, None, here, root, totals)  # settled: counted only
            continue
        tool = _child_tool(agent, call.model_name)
        if tool is None or tool.name != child.agent:
            raise await _refused(store, root, (
                f"run {root.id} cannot be resumed: its sub-agent {'/'.join(here)} (run "
                f"{child.id}, called as {call.model_name!r}) is no longer among the tools of "
                f"{'/'.join(path)}; restore the sub-agent under its old name (a renamed "
                "sub-agent is a different agent), nothing was decided or run"))
        if child.manifest_digest != tool.agent.manifest_digest:
            raise await _refused(store, root, (
                f"run {root.id} cannot be resumed: its sub-agent {'/'.join(here)} (run "
                f"{child.id}) ran under manifest {child.manifest_digest}, but that agent's "
                f"manifest is now {tool.agent.manifest_digest}; nothing was decided or run"))
        recorded = (recorded_governance(child.events) or {}).get("control")
        expected = describe_control(ControlChain.of(above, tool.agent.control))
        if recorded is not None and recorded != expected:
            raise await _refused(store, root, (
                f"run {root.id} cannot be resumed: its sub-agent {'/'.join(here)} (run "
                f"{child.id}) ran under the tool control {recorded}, but the tree now has "
                f"{expected or 'no control'}; nothing was decided or run"))
        await _survey(store, child, tool.agent, here, root, totals, above)


async def prepare_resume(store: Store, run: RunRecord, agent: Agent
                         ) -> tuple[RunRecord, Agent, list[int]] | None:
    """For a run in a tree: its root, the agent of `run`, and the tree's spent budget.

    None when the run is not in a tree (no parent, and `agent` delegates to nobody). Every
    open child is checked against the root agent's tools first: a refusal is recorded on the
    root and raised before anything is decided or run.

    Raises:
        ResumeRefused: the run is a sub-agent's and `agent` is not its root's agent, or a
            child of the tree no longer exists or changed its manifest.
    """
    # `depth`, not `parent_id`: a run started with `Agent.run(parent_run_id=...)` names a
    # parent without being a sub-agent's run (it resumes alone, as before).
    if run.depth == 0 and not sub_agents(agent):
        return None
    chain = await _chain(store, run)
    root = chain[0]
    if root.agent != agent.name:
        raise ResumeRefused(
            f"run {run.id} is in the tree of run {root.id}, whose agent is {root.agent!r}; "
            f"resume it with the root's agent (the agent of run {root.id}), not {agent.name!r}")
    totals = [0, 0]
    await _survey(store, root, agent, (agent.name or "agent",), root, totals)
    owner = agent
    for parent, child in itertools.pairwise(chain):
        call = await store.call(f"{parent.id}:{child.parent_call_id}")
        tool = _child_tool(owner, call.model_name)
        if tool is None:
            raise ResumeRefused(
                f"run {child.id} is a sub-agent's run in the tree of run {root.id}: resume it "
                f"with the root's agent (the agent of run {root.id}), whose tools include "
                f"{call.model_name!r}")
        owner = tool.agent
    return root, owner, totals


async def tree_of(store: Store, run: RunRecord, agent: Agent) -> tuple[RunRecord, Agent]:
    """The root run of `run`'s tree and the agent that drives `run`, rebuilt from `agent`.

    `(run, agent)` for a run that is not a sub-agent's. What a caller that decides an item
    needs: the root is what continues (with `agent`, the root's agent), and the item's own
    agent checks the decision (modified arguments against its tool's schema).

    Raises:
        ResumeRefused: `agent` is not the root's agent, or a child of the tree no longer
            exists or changed its manifest (recorded in the root's events).
    """
    found = await prepare_resume(store, run, agent)
    return (run, agent) if found is None else (found[0], found[1])


def adopt(runner: _Runner, totals: Sequence[int]) -> None:
    """Make a resumed root run a tree again, its spent budget restored."""
    plant(runner)
    node = runner.node
    if node is not None:
        node.tree.steps, node.tree.tokens = int(totals[0]), int(totals[1])
