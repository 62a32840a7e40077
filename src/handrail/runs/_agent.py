"""`Agent` and the loop that drives a model through the gate, durably.

The loop: model turn -> the turn's calls through the gate (concurrently, results in call order)
-> next turn, until a final answer, the step budget, a pause, or a cancel. Each turn costs two
store writes (the assistant message with its calls' first records; then the results, committed
before the next model request sees them; concurrent runs share their commits), so
per-turn cost does not grow with the run's length: messages are appended, never rewritten.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio

from handrail import collector
from handrail.approval import (
    Approver,
    CommandControl,
    Control,
    Decision,
    Defer,
    Request,
    Responder,
    ResponderNone,
    control_from,
)
from handrail.errors import ModelError, ModelResponseError, ResumeRefused, UserError
from handrail.gate import (
    RECORD_CONTENTS,
    ControlChain,
    Gate,
    Governance,
    check_intent,
    check_plan,
    describe_control,
    recorded_governance,
    stricter_contents,
    stricter_sandbox,
)
from handrail.host import (
    DEFAULT_HEAD_BYTES,
    DEFAULT_TAIL_BYTES,
    CallRecords,
    InjectionToolset,
    Projection,
    ToolInjection,
    merged_toolbox,
)
from handrail.models import (
    AssistantMessage,
    Model,
    ModelResponse,
    ModelSettings,
    ResponseDone,
    StreamingModel,
    SystemMessage,
    TextDelta,
    ToolCall,
    ToolCallStart,
    Usage,
    UserMessage,
    dump_messages,
    load_messages,
    provider_int,
)
from handrail.otel import Telemetry, telemetry_from
from handrail.policy import Policy, Rule
from handrail.runs import _logging as log
from handrail.runs._conversation import start_messages
from handrail.runs._events import EventKind, RunStream, call_detail, planned_detail
from handrail.runs._handle import RunHandle
from handrail.runs._interrupt import interrupt_handler_kept, second_interrupt_kills
from handrail.runs._outcome import (
    AwaitingApproval,
    Cancelled,
    Completed,
    Failed,
    RunOutcome,
    RunResult,
    next_step,
    outcome_to_dict,
    pause_outcome,
)
from handrail.runs._output import Accept, judge_final, output_for
from handrail.runs._subagents import (
    DEFAULT_MAX_DEPTH,
    Node,
    SubAgentTool,
    adopt,
    attach,
    plant,
    prepare_resume,
    tree_tools,
)
from handrail.runs._verify import Verification, Verify, check_max_attempts
from handrail.store import Batch, CallStatus, RunRecord, RunStatus, Store
from handrail.store.contract import ACTIVE_OWNERS, new_batch, new_owner
from handrail.tools import (
    DEFAULT_MAX_ARGUMENT_BYTES,
    Plan,
    Quote,
    Step,
    Toolbox,
    ToolImpl,
    Toolset,
)
from handrail.tools._plan import plan_from_response, plan_spec, planning_system

__all__ = ["Agent", "DeferAll", "Recovery", "RunEvent"]


class DeferAll:
    """The default approver: every ask is deferred (persisted; the run pauses for a person)."""

    name = "defer"
    defers_everything = True
    """Marks an approver that never decides, so a resume does not put open requests to it."""

    async def decide(self, request: Request) -> Decision:
        """Defer."""
        return Decision.defer()


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Progress, for a CLI, a log or `agent.run_stream`.

    The kinds and their details are listed in docs/runs.md ("Events").
    """

    kind: EventKind
    """What happened."""
    run_id: str
    """In which run."""
    detail: dict[str, Any]
    """The specifics (tool, verdict, text...)."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """An operator's decision on a call that was in flight when its process died."""

    kind: Literal["retry", "completed", "abort"]
    """`retry` runs it again; `completed` records `observation` as its result; `abort` tells
    the model it may or may not have happened."""
    observation: str | None = None
    """What the operator saw happen (for `completed`)."""

    @classmethod
    def retry(cls) -> Recovery:
        """Run the call again (through the policy again)."""
        return cls("retry")

    @classmethod
    def completed(cls, observation: str) -> Recovery:
        """The call did take effect; `observation` becomes its result."""
        return cls("completed", observation)

    @classmethod
    def abort(cls) -> Recovery:
        """Give up on the call; the model is told it may or may not have happened."""
        return cls("abort")

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the store."""
        return {"kind": self.kind, "observation": self.observation}


EventCallback = Callable[[RunEvent], Awaitable[None] | None]


def _toolbox(tools: object, max_argument_bytes: int) -> Toolbox:
    if isinstance(tools, Toolbox):
        return tools
    if isinstance(tools, Toolset) and not isinstance(tools, ToolImpl):
        return Toolbox([tools], max_argument_bytes=max_argument_bytes)
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise UserError("Agent(tools=...) takes a Toolbox, a Toolset, or a list of tools")
    return Toolbox(list(tools), max_argument_bytes=max_argument_bytes)


def _check_manifest(toolbox: Toolbox, manifest: Any, instructions: str | None,
                    model: str) -> None:
    from handrail.errors import ManifestDrift
    from handrail.manifest import agent_problems, problems

    found = [*problems(toolbox, manifest),
             *(p.message for p in agent_problems(manifest, instructions=instructions,
                                                  model=model))]
    if found:
        raise ManifestDrift(found)


class Agent:
    """A model, the tools it may call, and the boundary it runs within.

    ```python
    agent = hr.Agent(model="openai:gpt-4.1-mini", tools=box, policy=policy,
                     manifest=manifest, instructions="...")
    result = await agent.run("pay the invoice", store=store, approver=hr.StdinApprover())
    ```

    Args:
        model: A `hr.Model`, or a model string (`"openai:..."`, `"anthropic:..."`).
        tools: A Toolbox, any Toolset, or a list of tools/toolsets.
        policy: The policy; default `Policy.default()` (or the manifest's). With a manifest
            that has a policy, the manifest's stays the authority: this one can add denies and
            asks, never allows.
        instructions: The system prompt; default the manifest's.
        manifest: A `hr.Manifest`; checked against the tools now, and against the
            instructions and model when it has an `[agent]` section (drift raises
            `ManifestDrift` listing every problem), then only granted tools are offered and
            callable. `Agent.from_manifest` builds an agent from the manifest instead.
        workspace: The directory READ/WRITE paths are confined to.
        max_steps: Model turns allowed per run (the manifest's budget wins when smaller).
        name: The agent's name (records, pending lists); default the manifest's.
        expect_digest: Refuse to start unless the manifest's digest is exactly this.
        deps: Anything tools should reach as `ctx.deps`.
        settings: Model settings for every request.
        max_argument_bytes: Arguments larger than this (as JSON) are refused.
        max_invalid_turns: How many turns in a row the model may send only invalid
            arguments (each is returned to it as a fixable error) before the run fails.
        ref: `"module:object"` naming this agent (or a factory taking the `RunRecord`), so
            `handrail approve`/`resume` in another process can rebuild it.
        record_contents: `"digest"` (the default): once a call is performed, denied or
            refused, its stored copies of file contents become `{"sha256", "bytes"}`
            markers. `"full"` keeps the bytes in the audit trail (recorded in the run's
            events). See docs/runs.md, "Records and contents".
        verify: A `hr.Verify` every run's final answer must pass before the run completes
            (see docs/verify.md); `run(verify=...)` overrides it for one run.
        max_verify_attempts: How many checks a run may fail before it ends `Failed`.
        injection: A host's tools (`hr.ToolInjection`): its `tools()` is read at the start of
            every turn, an injected tool outranks a registered one of the same id, and its
            calls are answered by its `route()` after passing every stage of the gate.
        records_dir: Keep a disk record of every call the gate answers:
            `<records_dir>/<run_id>/<turn>/<call_id>/input.json` and `output.json`.
        output_head_bytes: Bytes of each stream of a program (or routed call) the model sees
            from its start; default 16 KiB (a tool's own setting wins).
        output_tail_bytes: Bytes it sees from its end; default 16 KiB.
        output_type: The type of the final output (a pydantic model, a dataclass, a
            TypedDict, a scalar); default `str`, the final reply's text. The model is offered
            a final-result tool taking it; the output is validated (an invalid one is returned
            to the model under `max_invalid_turns`), stored as JSON, and `result.output` is a
            value of this type. A final text reply that is valid JSON for it is accepted too.
        sandbox: How programs the tools start are confined (docs/sandbox.md): `"auto"` (the
            default) confines them with bubblewrap where the machine can and records that it
            did not otherwise; `"required"` refuses to start a program it cannot confine;
            `"off"` never confines (recorded in every program call's result).
        control: The tool control asked about every granted, valid call before the policy:
            a callable (sync or async, dict in, dict out) or `hr.CommandControl(argv)`. A
            manifest with a `[control]` section supplies it, and refuses another one. See
            docs/control.md.
        telemetry: Where runs report OpenTelemetry traces and metrics (docs/observability.md):
            None (the default) follows the global providers when one is configured, and
            costs nothing otherwise; a `hr.Telemetry` names providers and whether contents
            are captured; False never reports.
        quotes: Find, in a completed text answer, the spans copied from untrusted tool
            output (`RunResult.quoted`, docs/taint.md). Off by default: the search indexes
            every output the run read that no check had indexed yet (~0.05 µs a byte),
            a cost paid at the end of every run whether or not anyone reads the quotes.
    """

    def __init__(
        self,
        model: Model | str,
        tools: object = (),
        *,
        policy: Policy | None = None,
        instructions: str | None = None,
        manifest: Any = None,
        workspace: str | os.PathLike[str] = ".",
        max_steps: int = 50,
        name: str | None = None,
        expect_digest: str | None = None,
        deps: Any = None,
        settings: ModelSettings | None = None,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        ref: str | None = None,
        max_invalid_turns: int = 3,
        record_contents: Literal["digest", "full"] = "digest",
        verify: Verify | None = None,
        max_verify_attempts: int = 3,
        injection: ToolInjection | None = None,
        records_dir: str | os.PathLike[str] | None = None,
        output_head_bytes: int | None = None,
        output_tail_bytes: int | None = None,
        output_type: Any = str,
        sandbox: Literal["auto", "required", "off"] = "auto",
        control: object = None,
        telemetry: Telemetry | Literal[False] | None = None,
        quotes: bool = False,
    ) -> None:
        if not isinstance(quotes, bool):
            raise UserError(f"quotes must be True or False, got {quotes!r}")
        self.quotes = quotes
        if ref is not None and (not isinstance(ref, str) or ":" not in ref):
            raise UserError(f"ref must be 'module:object', got {ref!r}")
        self.ref = ref
        if isinstance(model, str):
            from handrail.models import infer_model

            model = infer_model(model)
        if not isinstance(model, Model):
            raise UserError(f"Agent(model=...) takes a hr.Model or a model string, not "
                            f"{type(model).__name__}")
        self.model = model
        self.toolbox = _toolbox(tools, max_argument_bytes)
        self.injected = None if injection is None else InjectionToolset(injection, self.toolbox)
        if not isinstance(max_steps, int) or max_steps < 1:
            raise UserError("max_steps must be a positive integer")
        root = Path(workspace).expanduser().resolve()
        if not root.is_dir():
            raise UserError(f"the workspace {str(root)!r} is not a directory; create it or pass "
                            "another workspace=")
        self.workspace = root
        self.manifest = manifest
        self.max_tokens: int | None = None
        self.max_wall_seconds: float | None = None
        if manifest is not None:
            if expect_digest is not None and manifest.digest != expect_digest:
                raise UserError(
                    f"the manifest's digest is {manifest.digest}, not the expected "
                    f"{expect_digest}: this deployment pins a reviewed manifest that has changed"
                )
            agent_section = manifest.agent
            instructions = instructions if instructions is not None else agent_section.instructions
            _check_manifest(self._reviewed_tools(manifest), manifest, instructions, model.name)
            if agent_section.instructions is not None:
                instructions = agent_section.instructions  # the reviewed spelling, exactly
            name = name if name is not None else agent_section.name
            budgets = manifest.budgets
            if budgets.max_steps is not None:
                max_steps = min(max_steps, budgets.max_steps)
            self.max_tokens = budgets.max_tokens
            self.max_wall_seconds = budgets.max_wall_seconds
            if manifest.policy is not None:
                policy = manifest.policy if policy is None else manifest.policy.contain(policy)
        elif expect_digest is not None:
            raise UserError("expect_digest= needs a manifest= to compare against")
        self.policy = policy if policy is not None else Policy.default()
        # A value condition naming an argument its tool lacks could never be decided: said
        # now, not at the first call (the manifest's view of a tool when one is in force).
        specs = self.toolbox.specs()
        self.policy.check_arguments(manifest.offer(specs) if manifest is not None else specs)
        self.instructions = instructions
        self.name = name
        self.max_steps = max_steps
        self.deps = deps
        self.settings = settings
        if not isinstance(max_invalid_turns, int) or max_invalid_turns < 0:
            raise UserError("max_invalid_turns must be a non-negative integer")
        self.max_invalid_turns = max_invalid_turns
        if record_contents not in RECORD_CONTENTS:
            raise UserError(f"record_contents must be one of {', '.join(RECORD_CONTENTS)}, "
                            f"not {record_contents!r}")
        self.record_contents = record_contents
        if verify is not None and not isinstance(verify, Verify):
            raise UserError("verify= takes hr.Verify.command(argv) or hr.Verify.check(fn)")
        self.verify = verify
        self.max_verify_attempts = check_max_attempts(max_verify_attempts)
        self.records_dir = None if records_dir is None else Path(records_dir).expanduser().resolve()
        self.projection: Projection | None = None
        if output_head_bytes is not None or output_tail_bytes is not None:
            try:
                self.projection = Projection(
                    DEFAULT_HEAD_BYTES if output_head_bytes is None else output_head_bytes,
                    DEFAULT_TAIL_BYTES if output_tail_bytes is None else output_tail_bytes)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        self.output_type = output_type
        self.output = output_for(output_type, self.toolbox, max_argument_bytes)

        if sandbox not in ("auto", "required", "off"):
            raise UserError(f"sandbox must be 'auto', 'required' or 'off', not {sandbox!r}")
        self.sandbox = sandbox

        self._control_given = _control(control, manifest)
        self.control = _placed(self._control_given, root)
        self.telemetry: Telemetry | None = telemetry_from(telemetry)

    def control_in(self, workspace: Path) -> Control | None:
        """This agent's tool control as it runs for a run in `workspace`."""
        if workspace == self.workspace:
            return self.control
        return _placed(self._control_given, workspace)

    def governance(self, policy: Policy | None = None) -> Governance:
        """What decides this agent's calls in a new run: see `hr.Governance`.

        Args:
            policy: The run's policy (default this agent's).
        """
        return Governance(policy=self.policy if policy is None else policy,
                          workspace=self.workspace, manifest=self.manifest,
                          control=self.control, sandbox=self.sandbox,
                          record_contents=self.record_contents)

    max_depth: int = DEFAULT_MAX_DEPTH
    """How many levels of sub-agents a tree rooted at this agent may have (docs/subagents.md);
    a deeper tree is refused when its run starts."""

    def as_tool(self, name: str | None = None, description: str | None = None, *,
                server: str = "agents", input_type: Any = None) -> SubAgentTool:
        """This agent as a tool of another agent: a sub-agent (docs/subagents.md).

        ```python
        coder = hr.Agent(model, [write_file], name="coder")
        planner = hr.Agent(model, [coder.as_tool()], name="planner")
        ```

        The tool takes the task (`{"task": "..."}`, or the fields of `input_type`) and returns
        this agent's final output. Calling it is a CALL action `<server>/<name>` the parent's
        policy decides; the child runs in the parent's store under the parent's approver and
        responder, within `parent_policy.contain(self.policy)`, and its run is durable: a
        pause anywhere in the tree pauses the root, and resuming the root continues it.

        Args:
            name: The tool's (and the child's) name; default the agent's `name`.
            description: What the parent's model is told; default from the instructions.
            server: The tool's server part.
            input_type: A pydantic model whose fields are the tool's arguments; the child's
                task is their JSON. Default: one string argument, `task`.

        Raises:
            UserError: no name, an input type that is not a pydantic model, or a tree below
                this agent with a cycle or in another workspace (the root's `max_depth` is
                checked when its run starts).
        """
        return SubAgentTool(self, name=name, description=description, server=server,
                            input_type=input_type)

    def _reviewed_tools(self, manifest: Any) -> Any:
        """What the manifest is checked against at construction.

        The registered tools and, with a host, its tools of now that the manifest grants: a
        grant one of them implements is not drift, and one it does not grant is never offered
        nor callable (the grant stage refuses it every turn). With sub-agents, the tools of
        the whole tree too: the root's manifest is in force for every run of its tree.
        """
        box = self.toolbox
        if self.injected is not None:
            merged = merged_toolbox(self.injected)
            injected = {str(t.id) for t in self.injected.declared()}
            box = Toolbox([i for i in merged.impls()
                           if str(i.spec.id) not in injected or manifest.grant(i.spec.id)],
                          max_argument_bytes=self.toolbox.max_argument_bytes)
        below = tree_tools(self)
        return box if not below else _TreeTools(box, below)

    def tools_of_tree(self) -> Any:
        """Every tool a run of this agent can call: its own, and its sub-agents' at every depth.

        What its manifest must grant (the root's manifest is in force for its whole tree,
        docs/subagents.md), and what `handrail manifest check` and `init` read for an agent
        with sub-agents: a Toolset (one tool per id, the agent's own first).
        """
        below = tree_tools(self)
        return self.toolbox if not below else _TreeTools(self.toolbox, below)

    def start(self, task: str, **options: Any) -> RunHandle:
        """A handle on a run of `task` that can be cancelled while it runs.

        ```python
        run = agent.start("tidy the notes", store=store)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_for_stop, run)  # calls run.cancel()
            result = await run.result()
        ```

        Nothing happens until `await run.result()`; `options` are those of `run`
        (`store=`, `approver=`, ...). See `RunHandle`.
        """
        if "cancel" in options:
            raise UserError("Agent.start makes its own cancel event: use run.cancel()")
        return RunHandle(functools.partial(self.run, task, **options))

    @classmethod
    def from_manifest(cls, manifest: Any, tools: object = (), *, model: Model | str | None = None,
                      **options: Any) -> Agent:
        """An agent as the manifest states it: its model, instructions, name and policy.

        ```python
        agent = hr.Agent.from_manifest("handrail.toml", box)
        ```

        Args:
            manifest: A `hr.Manifest`, or the path of a `handrail.toml` to load.
            tools: The tools, as for `Agent`; checked against the grants.
            model: Only when the manifest states no model, or to pass a `hr.Model` object
                (its `name` must be the manifest's model string).
            **options: Any other `Agent` argument (`workspace=`, `expect_digest=`, `ref=`...).

        Raises:
            ManifestError: the file cannot be read or breaks the format.
            ManifestDrift: the tools (or a `model=` given) differ from the manifest.
            UserError: the manifest states no model and none was given.
        """
        from handrail.manifest import Manifest

        if isinstance(manifest, str | os.PathLike):
            manifest = Manifest.load(manifest)
        if not isinstance(manifest, Manifest):
            raise UserError(f"Agent.from_manifest takes a hr.Manifest or the path of a "
                            f"handrail.toml, not {type(manifest).__name__}")
        if model is None:
            if manifest.agent.model is None:
                raise UserError(f"{manifest.source} states no [agent] model; add model = "
                                "\"provider:name\" to it, or pass model=")
            model = manifest.agent.model
        return cls(model, tools, manifest=manifest, **options)

    @property
    def manifest_digest(self) -> str | None:
        """The digest of the manifest in force, if any."""
        return None if self.manifest is None else str(self.manifest.digest)

    async def run(
        self,
        task: str,
        *,
        store: Store | None = None,
        approver: Approver | None = None,
        responder: Responder | None = None,
        on_event: EventCallback | None = None,
        cancel: anyio.Event | None = None,
        parent_run_id: str | None = None,
        verify: Verify | None = None,
        max_verify_attempts: int | None = None,
        continue_run: str | None = None,
        message_history: Sequence[Any] | None = None,
        intent: Sequence[str] | None = None,
        plan: Plan | Sequence[Step] | None = None,
        principal: str | None = None,
    ) -> RunResult:
        """Run the agent on `task` until it answers, pauses, fails or is cancelled.

        Args:
            task: What to do.
            store: Where the run is kept; default an in-memory store (no cross-process resume).
            approver: Decides what the policy marks ask; default defer (pause for a person).
            responder: Answers tools' questions; default nobody (the run pauses).
            on_event: Called with each `RunEvent`.
            cancel: Set it to stop the run at once; the outcome is `Cancelled` and
                `hr.resume` may continue it (calls cut off mid-way come back in doubt).
            parent_run_id: The parent run, for a sub-agent.
            verify: The check the final answer must pass (default the agent's); see
                docs/verify.md.
            max_verify_attempts: Checks the run may fail before it ends `Failed` (default
                the agent's).
            continue_run: A completed run in `store` to continue with `task` as the next
                user message: the new run starts with its whole history, its remembered
                rules and its recorded policy as the boundary (see `hr.Conversation`).
            message_history: Earlier handrail messages to start from (in-memory use).
            intent: The tools this task may change the world with, as CALL patterns
                (`["mail/send", "calendar/*"]`), said by the trusted side, not the model: a
                mutating call outside them asks, however its arguments were chosen
                (docs/taint.md). Recorded with the run; a sub-agent inherits it.
            plan: The world-changing calls this task commits to, made before any tool
                output was read (an `hr.Plan`, or a list of `hr.Step`: a tool pattern and
                the values it fixes for some arguments): a mutating call no step covers
                asks, and the person sees which argument differs and where its value came
                from (docs/taint.md). Recorded with the run; a sub-agent inherits it.
            principal: Who starts the run (a user id, a team): what a quota `per principal`
                counts apart (docs/policy.md). Recorded with the run; a sub-agent inherits it.

        Cancellation: an outside cancellation (an enclosing cancel scope) is never swallowed;
        like an exception or Ctrl-C it leaves the run READY in the store (the error in its
        events), and `hr.resume` continues it.
        """
        if not isinstance(task, str) or not task.strip():
            raise UserError("Agent.run needs a non-empty task string")
        if verify is not None and not isinstance(verify, Verify):
            raise UserError("verify= takes hr.Verify.command(argv) or hr.Verify.check(fn)")
        intended = None if intent is None else check_intent(intent)
        planned = None if plan is None else check_plan(plan)
        if principal is not None and (not isinstance(principal, str) or not principal.strip()
                                      or len(principal) > 200):
            raise UserError("principal= takes a non-empty name of at most 200 characters")
        collector.freeze_start_up()  # once per process: start-up leaves the GC's passes
        verify = verify if verify is not None else self.verify
        checking = None if verify is None else Verification(verify, check_max_attempts(
            self.max_verify_attempts if max_verify_attempts is None else max_verify_attempts))
        store = store if store is not None else Store.memory()
        now = time.time()
        start = await start_messages(self, store, task, continue_run, message_history, now)
        messages = start.messages
        owner = new_owner()
        # The run's governance, derived once here; every door that continues it carries it.
        governance = self.governance(start.policy)
        run = RunRecord(
            id=uuid.uuid4().hex[:16], task=task, agent=self.name, status=RunStatus.RUNNING,
            parent_id=parent_run_id, policy=start.policy.to_dict(),
            manifest_digest=governance.manifest_digest, model=self.model.name,
            workspace=str(governance.workspace), created_at=now, updated_at=now, owner=owner,
            lease_until=now + store.lease_seconds, agent_ref=self.ref,
            events=[governance.event(now),
                    *_contents_event(start.events, self.record_contents, now)]
            + ([checking.event()] if checking is not None else []),
            remembered=[r.to_dict() for r in start.remembered],
        )
        if self.records_dir is not None:  # `handrail show` prints each call's record path
            run.events = [*run.events,
                          {"kind": "records", "dir": str(self.records_dir), "at": now}]
        if intended is not None:  # read back by every runner of the run (resume too)
            run.events = [*run.events, {"kind": "intent", "tools": list(intended), "at": now}]
        if planned is not None:  # read back by every runner of the run (resume too)
            run.events = [*run.events, {"kind": "plan", "steps": planned.to_dict(), "at": now}]
        if principal is not None:  # read back by every runner of the run (resume too)
            run.events = [*run.events, {"kind": "principal", "name": principal, "at": now}]
        dumped = dump_messages(messages)
        await store.write(Batch(run=run, messages=[(run.id, i, m) for i, m in enumerate(dumped)]))
        runner = _Runner(self, store, run, governance, start.remembered, messages,
                         approver or DeferAll(), responder or ResponderNone(), on_event, verify)
        plant(runner)  # a tree of sub-agents, when this agent delegates
        return await runner.drive(cancel)

    async def plan(self, task: str) -> Plan:
        """A plan for `task`, made by the model before any tool output is in its context.

        One model request, outside any run: the agent's instructions, its tools (named and
        described, none callable but the plan tool) and `task`, nothing else. The model
        commits to the calls that will change the world and to the values the request fixes
        for them; give the result to `run(task, plan=...)` (and show it to the user first,
        if you like: it is what they would approve). Its values are trusted like the task.

        Raises:
            ModelError: the provider failed, or the model did not answer with a valid plan
                (`ModelResponseError`, saying what it did instead).
        """
        if not isinstance(task, str) or not task.strip():
            raise UserError("Agent.plan needs a non-empty task string")
        specs = self.toolbox.specs()
        if self.manifest is not None:  # the tools the run will be offered, no others
            specs = self.manifest.offer(specs)
        response = await self.model.request(
            [SystemMessage(planning_system(self.instructions, specs)), UserMessage(task)],
            [plan_spec()], self.settings)
        return plan_from_response(response.message, specs)

    def plan_sync(self, task: str) -> Plan:
        """`plan` for synchronous code (starts an event loop)."""
        return anyio.run(self.plan, task)

    def run_sync(self, task: str, **kwargs: Any) -> RunResult:
        """`run` for synchronous code (starts an event loop)."""
        return anyio.run(functools.partial(self.run, task, **kwargs))

    def run_stream(self, task: str, *, on_event: EventCallback | None = None,
                   **kwargs: Any) -> RunStream:
        """`run`, with its events read as an async iterator (`RunStream`).

        ```python
        async with agent.run_stream("task", store=store) as stream:
            async for event in stream:
                ...
        result = stream.result
        ```

        Args:
            task: What to do.
            on_event: Also called with each event, before the iterator sees it.
            **kwargs: Any other `run` argument.
        """
        return RunStream(lambda forward: self.run(task, on_event=forward, **kwargs), on_event)

    iter = run_stream
    """The same as `run_stream` (the name another agent framework uses)."""


class _TreeTools:
    """A root's tools and those of its tree, for the manifest check (ids may repeat)."""

    def __init__(self, box: Toolbox, below: list[ToolImpl]) -> None:
        self._box = box
        ids = {str(i.spec.id) for i in box.impls()}
        self._impls = list(box.impls())
        for impl in below:  # one tool per id: the manifest grants ids
            if str(impl.spec.id) not in ids:
                ids.add(str(impl.spec.id))
                self._impls.append(impl)

    def impls(self) -> list[ToolImpl]:
        """Every tool of the tree, the root's first."""
        return self._impls

    def changing(self) -> list[Any]:
        """The root toolbox's members whose tools may change (MCP servers)."""
        return list(self._box.changing())


def _control(value: object, manifest: Any) -> Control | None:
    """The agent's tool control: the one given, or the manifest's; never a different one."""
    control = control_from(value)
    pinned = None if manifest is None else manifest.control
    if pinned is not None and pinned.command is not None:
        wanted = (CommandControl(pinned.command) if pinned.timeout is None
                  else CommandControl(pinned.command, timeout=pinned.timeout))
        if control is None:
            control = wanted
        elif control != wanted:
            raise UserError(
                f"the manifest pins the tool control {wanted!r} ([control] in "
                f"{manifest.source}), but this agent was given {control.describe()}: pass "
                "control=None to use the manifest's, or change the manifest (reviewed)")
    return control


def _placed(control: Control | None, workspace: Path) -> Control | None:
    """`control`, a command one set to run in `workspace` unless it names its own directory."""
    if isinstance(control, CommandControl) and control.cwd is None:
        # A copy: the same CommandControl may serve agents with different workspaces.
        placed = CommandControl(control.argv, timeout=control.timeout,
                                max_output_bytes=control.max_output_bytes)
        placed.cwd = str(workspace)
        return placed
    return control


def governance_for(agent: Agent | None, *, policy: Policy, manifest: Any = None,
                   workspace: str | os.PathLike[str] | None = None,
                   sandbox: str | None = None) -> tuple[Governance, list[str]]:
    """The governance of a door that serves tools itself (`handrail serve`), as one value.

    From the served `agent` (when it is one), the `manifest` in force and the door's own
    flags: the policy given (already the manifest's containing the agent's); the workspace
    is the agent's (a different `workspace` flag is refused: no stricter choice settles two
    folders); the tool control is the agent's or the manifest's `[control]` (two different
    ones are refused); the sandbox mode is the stricter of the agent's and the flag's;
    `record_contents` is the agent's.

    Returns:
        The governance, and what the operator should be told about how it was settled.

    Raises:
        UserError: the flags or the manifest contradict the agent (which piece, and how).
    """
    notes: list[str] = []
    if sandbox is not None and sandbox not in ("off", "auto", "required"):
        raise UserError(f"sandbox must be 'auto', 'required' or 'off', not {sandbox!r}")
    if agent is None:
        root = Path("." if workspace is None else workspace).expanduser().resolve()
        if not root.is_dir():
            raise UserError(f"the workspace {str(root)!r} is not a directory")
        control = _placed(_control(None, manifest), root)
        return Governance(policy=policy, workspace=root, manifest=manifest, control=control,
                          sandbox=sandbox or "auto"), notes
    root = agent.workspace
    if workspace is not None:
        asked = Path(workspace).expanduser().resolve()
        if asked != root:
            raise UserError(
                f"the agent works in {str(root)!r} but --workspace says {str(asked)!r}: drop "
                "--workspace (the agent's workspace is the one its policy was written for), "
                "or give the agent workspace=")
    mode: str = agent.sandbox
    if sandbox is not None:
        mode = stricter_sandbox(agent.sandbox, sandbox)
        if mode != sandbox:
            notes.append(f"sandbox {mode}: the agent's sandbox={agent.sandbox!r} is stricter "
                         f"than --sandbox {sandbox}")
    control = _placed(_control(agent._control_given, manifest), root)
    return Governance(policy=policy, workspace=root, manifest=manifest, control=control,
                      sandbox=mode, record_contents=agent.record_contents), notes


def _intent_of(events: Sequence[Any]) -> tuple[str, ...] | None:
    """The intent recorded with a run (`Agent.run(intent=...)`), or None."""
    for event in reversed(events):
        if isinstance(event, dict) and event.get("kind") == "intent":
            return tuple(str(t) for t in event.get("tools") or ())
    return None


def _plan_of(events: Sequence[Any]) -> Plan | None:
    """The plan recorded with a run (`Agent.run(plan=...)`), or None."""
    for event in events:
        # Only the run's own event: one a tool recorded (`ctx.record_event`) has a call id.
        if isinstance(event, dict) and event.get("kind") == "plan" and "call_id" not in event:
            return Plan.from_dict(event.get("steps") or [])
    return None


def _principal_of(events: Sequence[Any]) -> str | None:
    """Who started a run (`Agent.run(principal=...)`), as it recorded, or None."""
    for event in events:
        # Only the run's own event: one a tool recorded (`ctx.record_event`) has a call id.
        if isinstance(event, dict) and event.get("kind") == "principal" and \
                "call_id" not in event:
            return str(event.get("name"))
    return None


class _Runner:
    """Drives one run: turns through the gate, state into the store."""

    node: Node | None = None
    """Its place in a tree of sub-agents (shared budgets, agent path), else None."""

    def __init__(self, agent: Agent, store: Store, run: RunRecord, governance: Governance,
                 remembered: list[Rule], messages: list[Any], approver: Approver,
                 responder: Responder, on_event: EventCallback | None,
                 verify: Verify | None = None) -> None:
        self.agent = agent
        self.store = store
        self.run = run
        self.messages = messages
        self.on_event = on_event
        self.started = time.monotonic()
        self.governance = governance
        """What decides this run's calls (derived at its start, or a resume's recorded one)."""
        self.scope = governance.scope(
            run_id=run.id, agent=agent.name, toolbox=agent.toolbox, store=store,
            approver=approver, responder=responder, remembered=remembered, deps=agent.deps,
            events=self._call_event,
            telemetry=None if agent.telemetry is None else agent.telemetry.start(),
            # A turn of reads commits once, on every store: the memory store too (one write
            # and one yield a turn instead of two; issue 11).
            mark_reads=False,
        )
        # What the task and the instructions say is trusted (docs/taint.md); a delegated
        # task is not: a model wrote it, and it carries the taint of what that model read
        # (the parent's provenance, inherited when the child is attached to its tree).
        self.scope.provenance.trust_text(
            "task", run.task if run.parent_call_id is None else None, agent.instructions)
        self.scope.intent = _intent_of(run.events)
        self.scope.plan = _plan_of(run.events)
        if self.scope.plan is not None and run.parent_call_id is None:
            # The values a plan fixes were written before any tool output, by the trusted
            # side: trusted like the task (a `*` pattern vouches for nothing).
            self.scope.provenance.trust_values(("plan", "plan"), [
                v for s in self.scope.plan.steps for v in s.arguments.values()
                if not (isinstance(v, str) and "*" in v)])
        self.scope.principal = _principal_of(run.events)
        self.records: CallRecords | None = None
        if agent.records_dir is not None or agent.projection is not None:
            self.records = CallRecords(agent.records_dir, projection=agent.projection)
            self.scope.before_execute = self.records.before_execute
        self.gate = Gate(self.scope)
        self.toolbox = agent.toolbox
        """This run's tools (a toolset's list may change between turns: `_refresh_tools`)."""
        self._check: Callable[[list[Any]], Mapping[str, str]] | None = None
        if governance.manifest is not None:  # tools that appear later meet the same check
            from handrail.manifest import refusals

            self._check = functools.partial(refusals, manifest=governance.manifest)
        self.offered = self.gate.offered()
        if agent.output is not None:
            self.offered.append(agent.output.spec)
        # Counted once here, then kept up to date: per-turn work never re-walks the history.
        self.turns = sum(1 for m in messages if isinstance(m, AssistantMessage))
        self.verification = Verification.of_run(run, verify or agent.verify)

    def _run_update(self, **changes: Any) -> RunRecord:
        run = self.run
        now = time.time()
        run.updated_at = now
        run.lease_until = now + self.store.lease_seconds
        remembered = self.scope.remembered
        if len(run.remembered) != len(remembered):
            run.remembered = [r.to_dict() for r in remembered]
        if changes:  # twice a turn without any: no loop to set up
            for name, value in changes.items():
                setattr(run, name, value)
        # `_mark()` written out (twice a turn: a call less each time).
        events = run.events
        self._run_mark = (id(run), id(events), len(events), len(remembered), run.status,
                          run.owner)
        return run

    _run_mark: tuple[Any, ...] | None = None

    def _mark(self) -> tuple[Any, ...]:
        # What a turn's calls can change of the run: the events its tools record (appended
        # in place), the rules an approval remembers, its status and owner (as
        # `_run_update` writes it out: the two stay the same tuple).
        run = self.run
        return (id(run), id(run.events), len(run.events), len(self.scope.remembered),
                run.status, run.owner)

    def _run_changed(self) -> bool:
        """Whether the run changed since it was last updated for a write (beyond its times)."""
        return self._mark() != self._run_mark

    async def _call_event(self, kind: str, record: bool, **detail: Any) -> None:
        """A tool's event (`ctx.report_progress`, `ctx.record_event`): kept if asked, told."""
        if record:
            # Written with the run at the end of the turn.
            self.run.events.append({"kind": kind, "at": time.time(), **detail})
        if kind == "call_progress":
            await self._emit("call_progress", **detail)
        else:
            await self._emit("call_event", event=kind, **detail)

    async def _emit(self, kind: EventKind, **detail: Any) -> None:
        if self.on_event is not None:
            out = self.on_event(RunEvent(kind, self.run.id, detail))
            if out is not None:
                await out

    def _result(self, outcome: RunOutcome, quoted: Sequence[Quote] | None = None) -> RunResult:
        usage = Usage(self.run.input_tokens, self.run.output_tokens, self.run.model_requests)
        return RunResult(self.run.id, outcome, usage, list(self.scope.remembered),
                         in_memory=not self.store.durable, quoted=tuple(quoted or ()),
                         searched=quoted is not None)

    async def _end(self, outcome: RunOutcome, status: RunStatus, batch: Batch | None = None
                   ) -> RunResult:
        batch = batch or Batch()
        batch.run = self._run_update(status=status, outcome=outcome_to_dict(outcome), owner=None,
                                     lease_until=0.0)
        await self.store.write(batch)
        self._ended = True
        if status.value.startswith("awaiting") and not self.store.durable and \
                (self.node is None or self.node.depth == 0):  # a tree warns once, at its root
            log.log_memory_pause(self.run.id, status.value, next_step(outcome, self.run.id))
        await self._emit("paused" if status.value.startswith("awaiting") else "finished",
                         outcome=outcome_to_dict(outcome))
        quoted: Sequence[Quote] | None = None
        if self.agent.quotes and isinstance(outcome, Completed) and \
                isinstance(outcome.output, str):
            quoted = await self.gate.quotes(outcome.output)
        return self._result(outcome, quoted)

    async def drive(self, cancel: anyio.Event | None) -> RunResult:
        """Drive the run; whatever way out it takes, the store tells the truth about it.

        A pause or an end is recorded by `_end`. Any other way out (an exception, Ctrl-C, an
        outside cancellation) leaves the run READY, its error in its events, so `handrail runs`
        does not show a run nobody drives as running and `resume` continues it at once.
        """
        telemetry = self.scope.telemetry
        if telemetry is not None:  # this segment inside its invoke_agent span
            return await telemetry.agent_segment(self.run, self.agent.name, self.agent.model.name,
                                                 lambda: self._drive_recorded(cancel))
        return await self._drive_recorded(cancel)

    async def _drive_recorded(self, cancel: anyio.Event | None) -> RunResult:
        try:
            return await self._drive_owned(cancel)
        except BaseException as exc:
            await self._left_ready(exc)
            raise

    _ended = False

    async def _left_ready(self, exc: BaseException) -> None:
        if self._ended:
            return  # the outcome was recorded; what failed after it (an event hook) changes nothing
        # Shielded and bounded: this runs while a cancellation or Ctrl-C unwinds the task.
        with anyio.move_on_after(10, shield=True):
            try:
                run = await self.store.run(self.run.id)
                if run.status is not RunStatus.RUNNING or run.owner != self.run.owner:
                    return  # taken over meanwhile: not ours to change
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                run.events = [*run.events, {"kind": "interrupted", "error": error[:1000],
                                            "at": time.time()}]
                run.status, run.outcome, run.owner, run.lease_until = (
                    RunStatus.READY, None, None, 0.0)
                run.updated_at = time.time()
                await self.store.write(Batch(run=run))
            except Exception:  # the store failing too: the original error is what is raised
                pass

    async def _drive_owned(self, cancel: anyio.Event | None) -> RunResult:
        owner = self.run.owner or ""
        ACTIVE_OWNERS.add(owner)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat)
                try:
                    with interrupt_handler_kept():  # each turn arms it (no system call)
                        return await self._drive(cancel)
                finally:
                    tg.cancel_scope.cancel()
            raise AssertionError("unreachable: the task group's body returns or raises")
        except BaseExceptionGroup as group:
            # The heartbeat never fails, so a group holds the loop's own exception: raise it
            # as itself, not wrapped (callers catch ModelError, KeyboardInterrupt...).
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            ACTIVE_OWNERS.discard(owner)

    async def _heartbeat(self) -> None:
        """Renew the run's lease while it runs, so a long tool call keeps its owner.

        Another machine presumes an owner gone once its lease lapses; without renewal a call
        longer than the lease would let a second worker take the run over mid-call.
        """
        interval = self.store.lease_seconds / 3
        while True:
            await anyio.sleep(interval)
            run = self.run
            if run.status is RunStatus.RUNNING and run.owner:
                run.lease_until = time.time() + self.store.lease_seconds
                await self.store.write(Batch(run=run), wait=False)

    async def _drive(self, cancel: anyio.Event | None) -> RunResult:
        if cancel is None:
            return await self._loop()
        outcome: RunResult | None = None

        async def loop(scope: anyio.CancelScope) -> None:
            nonlocal outcome
            outcome = await self._loop()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(loop, tg.cancel_scope)
            await cancel.wait()
            tg.cancel_scope.cancel()
        if outcome is not None:
            return outcome
        with anyio.CancelScope(shield=True):
            # Calls cut off mid-way stay STARTED: a resume finds them in doubt.
            run = await self.store.run(self.run.id)
            self.run = run
            return await self._end(Cancelled("cancelled by the caller"), RunStatus.CANCELLED)
        raise AssertionError("unreachable: the shielded block returns")

    async def _refresh_tools(self) -> None:
        """This turn's tools: what the gate resolves against, and what the model is offered.

        The host's `tools()`, and the tools of now of toolsets that can change (an MCP
        server that announced `tools/list_changed`): a tool that appeared is offered from
        this turn if the manifest admits it, else refused; one that went away is no longer
        offered, and a call to it is refused with the reason. The change is a `tools_changed`
        event of the run.
        """
        box, change = await self.toolbox.refreshed(self._check)
        if change is not None:
            self.toolbox = box
            await self._call_event("tools_changed", True, **change)
        injected = self.agent.injected
        if injected is not None:
            self.offered = self.gate.use_toolbox(merged_toolbox(injected, self.toolbox))
        elif change is not None:
            self.offered = self.gate.use_toolbox(box)
        else:
            return
        if self.agent.output is not None:
            self.offered.append(self.agent.output.spec)

    async def _loop(self) -> RunResult:
        agent = self.agent
        messages = self.messages
        if self._resumed:
            await self._reopen_interrupted()
        last = messages[-1]
        if isinstance(last, AssistantMessage) and last.tool_calls:
            await self._refresh_tools()  # a resumed turn: its calls meet the tools of now
        while True:
            last = messages[-1]
            calls = last.tool_calls if isinstance(last, AssistantMessage) else None
            if calls:
                turn = self.turns - 1
                # Only the first turn after a resume can have records: the others skip the
                # read (and its coroutine) altogether.
                existing = ({c.call_id: c for c in await self._turn_records(turn)}
                            if self._resumed else {})
                # Just counted (the model's turn, a moment ago): that update stands.
                first = new_batch(self.run if self._counted else self._run_update())
                self._counted = False
                if self._pending_message is not None:
                    first.messages.append(self._pending_message)
                    self._pending_message = None
                # A first Ctrl-C settles the turn while its programs get their grace period;
                # a second one kills them all at once (`second_interrupt_kills`).
                with second_interrupt_kills():
                    try:
                        result = await self.gate.drive_turn(turn, calls, existing, first)
                    except BaseException:
                        await self._record_interrupted(len(messages) - 1)
                        raise
                # Committed, or in `result.final` now. Not held across the final write, which
                # waits its turn behind the other runs' (issue 24: what every waiting run holds
                # is what the collector's young passes walk, at 1,000 runs ~40 objects each);
                # nor is the list of calls (`tool_calls` makes a new one).
                del first, calls
                if result.message_arguments:
                    # From now on the model sees its own call as the store keeps it, in this
                    # process and in any that resumes the run: one history either way.
                    shown = result.message_arguments
                    messages[-1] = AssistantMessage(tuple(
                        dataclasses.replace(p, arguments=shown[p.id])
                        if type(p) is ToolCall and p.id in shown else p for p in last.parts))
                    last = messages[-1]  # the message as replaced, not both
                    result.final.messages.append(await self._shown_message(
                        len(messages) - 1, shown))
                    del shown
                # The turn's assistant message is in its batch from here on (issue 24: not
                # held twice while the write waits).
                self._turn_entry = None
                if self.records is not None:
                    await self.records.answered(result.final.calls)
                if log.logger.isEnabledFor(logging.INFO):  # else no call to make a turn
                    log.log_calls(self.run.id, result.final.calls)
                if self.on_event is not None:
                    for r in result.final.calls:
                        await self._emit("call_finished", **call_detail(r))
                if result.pause is not None:
                    paused = pause_outcome(result.pause)
                    return await self._end(paused, RunStatus(paused.kind), result.final)
                if self._invalid_streak(result.final.calls):
                    messages.extend(result.results)
                    result.final.messages.extend(
                        (self.run.id, len(messages) - len(result.results) + i, m)
                        for i, m in enumerate(result.dumped))
                    return await self._end(Failed(
                        f"the model sent invalid tool arguments {self.invalid_turns} turns in "
                        f"a row (the budget is {agent.max_invalid_turns}); the run stops "
                        "rather than loop"), RunStatus.FAILED, result.final)
                seq = len(messages)
                messages.extend(result.results)
                batch = result.final
                run_id = self.run.id
                m = None
                for m in result.dumped:  # a loop, not a generator: this runs every turn
                    batch.messages.append((run_id, seq, m))
                    seq += 1
                # Nothing of the turn's result but its batch is held across the write (the
                # results are in `messages`, their stored forms in the batch).
                del result, m
                if batch.run is not None or self._run_changed():
                    # Else the turn changed nothing of the run but the times: its lease is the
                    # heartbeat's, its updated_at the next turn's (one row less to commit).
                    batch.run = self._run_update()
                # Committed before the model (or anyone) is shown these results: a run never
                # reports what a crash could take back. A commit on the loop costs tens of µs.
                # The batch is not held here while the write waits its turn: a store that
                # packs it first (the memory store) lets it go (issue 24).
                write = self.store.write(batch)
                del batch
                await write
                del write
            elif self.verification is not None and isinstance(last, AssistantMessage):
                # A final answer (new, or one a resumed run was checking): checked first.
                ended = await self.verification.step(self)
                if ended is not None:
                    return ended
            # budgets
            if self.node is not None:
                spent = self.node.tree.exhausted()
                if spent is not None:
                    return await self._end(Failed(spent), RunStatus.FAILED)
            if self.run.steps >= agent.max_steps:
                return await self._end(Failed(
                    f"the step budget of {agent.max_steps} model turns is exhausted; raise "
                    "max_steps (or the manifest's budgets.max_steps) or simplify the task"),
                    RunStatus.FAILED)
            if agent.max_tokens is not None and \
                    self.run.input_tokens + self.run.output_tokens >= agent.max_tokens:
                return await self._end(Failed(
                    f"the token budget of {agent.max_tokens} is exhausted"), RunStatus.FAILED)
            if agent.max_wall_seconds is not None and \
                    time.monotonic() - self.started >= agent.max_wall_seconds:
                return await self._end(Failed(
                    f"the wall-clock budget of {agent.max_wall_seconds}s is exhausted"),
                    RunStatus.FAILED)
            if self.agent.injected is not None or self.toolbox.can_change:
                await self._refresh_tools()  # else it would change nothing: no coroutine
            try:
                telemetry = self.scope.telemetry
                model = agent.model
                if telemetry is None and self.on_event is None:
                    # `_request`'s common case written out: no coroutine of its own, and the
                    # log line's arguments only when DEBUG is on (this runs every turn).
                    if log.logger.isEnabledFor(logging.DEBUG):
                        log.log_request(self.run.id, self.run.steps + 1, len(messages),
                                        len(self.offered))
                    response = await model.request(messages, self.offered, agent.settings)
                else:
                    response = await (self._request(messages) if telemetry is None else
                                      telemetry.chat(model.name, messages,
                                                     lambda: self._request(messages)))
                usage = _checked_usage(response.usage)
            except ModelError as exc:
                return await self._end(Failed(f"the model failed: {exc}"), RunStatus.FAILED)
            run = self.run
            run.steps += 1
            run.input_tokens += usage.input_tokens
            run.output_tokens += usage.output_tokens
            run.model_requests += usage.requests
            self._run_update()
            self._counted = True
            if self.node is not None:
                self.node.tree.spend(self.node.path, 1, usage.input_tokens + usage.output_tokens)
            message = response.message
            seq = len(messages)
            messages.append(message)
            self.turns += 1
            # Each model call's usage is kept with the turn it produced.
            dumped = dump_messages([message])[0]
            dumped["usage"] = {"input_tokens": usage.input_tokens,
                               "output_tokens": usage.output_tokens}
            dumped["model"] = response.model
            dumped["finish_reason"] = response.finish_reason
            # Not held across the turn's write: the message is in `messages`, the usage counted.
            del response
            entry = (self.run.id, seq, dumped)
            if self.on_event is not None:
                await self._emit("model_turn", text=message.text,
                                 calls=[c.name for c in message.tool_calls])
                await self._emit("usage", input_tokens=usage.input_tokens,
                                 output_tokens=usage.output_tokens,
                                 total_input_tokens=self.run.input_tokens,
                                 total_output_tokens=self.run.output_tokens)
                for c in message.tool_calls:
                    if c.name != getattr(agent.output, "name", None):
                        await self._emit("call_planned", **planned_detail(c))
            del usage
            final = judge_final(agent.output, message) if agent.output is not None else None
            if final is not None:
                done = await self._final_output(final, entry)
                if done is not None:
                    return done
                continue
            # A loop, not any() over a generator: any() closes the generator it stops early,
            # an exception (and its traceback) raised and caught every turn.
            for p in message.parts:
                if type(p) is ToolCall:
                    break
            else:
                if self.verification is not None:
                    self._pending_message = entry  # stored with the check's first write
                    continue
                return await self._end(Completed(message.text), RunStatus.COMPLETED,
                                       Batch(messages=[entry]))
            self._pending_message = self._turn_entry = entry
            # Kept by the runner until the turn's batch takes it: not held by this frame too
            # while the turn's write waits (issue 24).
            del entry, dumped

    async def _final_output(self, final: Any, entry: tuple[str, int, dict[str, Any]]
                            ) -> RunResult | None:
        """End with a valid typed output, or return an invalid one to the model (None)."""
        messages = self.messages
        start = len(messages)
        messages.extend(final.results if isinstance(final, Accept) else final.feedback)
        batch = Batch(messages=[entry, *((self.run.id, start + i, m) for i, m in
                                         enumerate(dump_messages(messages[start:])))])
        if isinstance(final, Accept):
            self.invalid_turns = 0
            return await self._end(Completed(final.value), RunStatus.COMPLETED, batch)
        self.invalid_turns += 1
        log.log_retry(self.run.id, final.error, self.invalid_turns, self.agent.max_invalid_turns)
        if self.invalid_turns > self.agent.max_invalid_turns:
            return await self._end(Failed(
                f"the model gave an invalid final output {self.invalid_turns} turns in a row "
                f"(the budget is {self.agent.max_invalid_turns}): {final.error}"),
                RunStatus.FAILED, batch)
        batch.run = self._run_update()
        await self.store.write(batch, wait=False)
        return None

    async def _record_interrupted(self, seq: int) -> None:
        """Record a turn an interruption cut short, every call of it settled by the gate.

        Shielded and bounded: it runs while a cancellation or Ctrl-C unwinds. Unless a call
        of the turn waits for a person, its results are appended to the history, so the
        history never holds a call without a result; a call cut off mid-way is IN_DOUBT and
        goes to recovery on resume (`_reopen_interrupted`).
        """
        settled = self.gate.take_interrupted()
        if settled is None:
            return
        with anyio.move_on_after(10, shield=True):
            batch = settled.final
            if settled.message_arguments:
                batch.messages.append(await self._shown_message(seq, settled.message_arguments))
            if settled.pause is None:
                self.messages.extend(settled.results)
                batch.messages.extend((self.run.id, seq + 1 + i, m)
                                      for i, m in enumerate(settled.dumped))
            batch.run = self._run_update()
            await self.store.write(batch)

    async def _reopen_interrupted(self) -> None:
        """On resume, drive again a turn an interruption settled that has a call still open.

        Its results were appended to the history (interrupted); a call of it in doubt goes
        to recovery now, and the turn's results are rewritten in place once it completes.
        """
        messages = self.messages
        last = max((i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)),
                   default=None)
        if last is None or last == len(messages) - 1 or not messages[last].tool_calls:
            return
        turn = self.turns - 1
        open_states = (CallStatus.IN_DOUBT, CallStatus.STARTED, CallStatus.APPROVED,
                       CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_ANSWER)
        if any(c.turn == turn and c.status in open_states
               for c in await self.store.calls(self.run.id)):
            del messages[last + 1:]

    _pending_message: tuple[str, int, dict[str, Any]] | None = None
    _turn_entry: tuple[str, int, dict[str, Any]] | None = None

    async def _shown_message(self, seq: int, arguments: dict[str, str]
                             ) -> tuple[str, int, dict[str, Any]]:
        """The turn's stored assistant message with its calls' arguments as the gate kept them.

        What the model is shown of its own earlier calls from now on: contents as markers, a
        refused call's arguments redacted.
        """
        entry = self._turn_entry
        if entry is not None and entry[1] == seq:
            stored = entry[2]
        else:  # a turn resumed from the store: its message as stored
            stored = (await self.store.messages(self.run.id))[seq]
        parts = [{**p, "arguments": arguments[p["id"]]}
                 if p.get("kind") == "tool_call" and p.get("id") in arguments else p
                 for p in stored.get("parts", ())]
        return (self.run.id, seq, {**stored, "parts": parts})

    async def _request(self, messages: list[Any]) -> ModelResponse:
        """One model turn; streamed (text deltas become events) when someone listens."""
        model = self.agent.model
        log.log_request(self.run.id, self.run.steps + 1, len(messages), len(self.offered))
        if self.on_event is None or not isinstance(model, StreamingModel):
            return await model.request(messages, self.offered, self.agent.settings)
        response: ModelResponse | None = None
        async for event in model.request_stream(messages, self.offered, self.agent.settings):
            if isinstance(event, TextDelta):
                await self._emit("text_delta", text=event.text)
            elif isinstance(event, ToolCallStart):
                await self._emit("call_started", call_id=event.id, name=event.name)
            elif isinstance(event, ResponseDone):
                response = event.response
        if response is None:
            raise ModelResponseError("the model's stream ended without a response")
        return response

    def _invalid_streak(self, records: list[Any]) -> bool:
        """Count turns whose every call had invalid arguments; True once over budget."""
        invalid = bool(records)
        for r in records:  # a loop, not all() over a generator: this runs every turn
            if not (r.error and r.error.startswith("invalid arguments")):
                invalid = False
                break
        if invalid:
            self.invalid_turns += 1
            log.log_retry(self.run.id, "every call of the turn had invalid arguments",
                          self.invalid_turns, self.agent.max_invalid_turns)
        else:
            self.invalid_turns = 0
        return self.invalid_turns > self.agent.max_invalid_turns

    invalid_turns = 0
    _counted = False
    """The run was updated with the model's turn just now (its first write may take it)."""

    async def _turn_records(self, turn: int) -> list[Any]:
        # Only the first turn driven after a resume can have records from an earlier attempt;
        # every later turn is new, so the hot path never reads the store.
        if not self._resumed:
            return []
        self._resumed = False
        return [c for c in await self.store.calls(self.run.id) if c.turn == turn]

    _resumed = False


_MAX_COUNT = 2**53  # the models' MAX_COUNT: what provider_int accepts


def _checked_usage(usage: Any) -> Usage:
    """A model's reported usage, refused unless every count is a whole number in 0..2**53.

    Any `Model` reports usage, not only the HTTP adapters: a count like 1e300 would otherwise
    reach the store and fail there, leaving the run without a truthful status.
    """
    if type(usage) is Usage:
        # The common case, checked without a call per count: exact ints in range are kept.
        # Spelled out: a generator and `all` cost more than the three checks (issue 11).
        i, o, r = usage.input_tokens, usage.output_tokens, usage.requests
        if type(i) is int and type(o) is int and type(r) is int and \
                0 <= i <= _MAX_COUNT and 0 <= o <= _MAX_COUNT and 0 <= r <= _MAX_COUNT:
            return usage
    try:
        return Usage(provider_int(usage.input_tokens, "input_tokens"),
                     provider_int(usage.output_tokens, "output_tokens"),
                     provider_int(usage.requests, "requests"))
    except (ValueError, AttributeError) as exc:
        raise ModelResponseError(f"the model reported an impossible usage: {exc}") from None


# ----------------------------------------------------------------- resume


def check_resumable(run: RunRecord, agent: Agent, allow_manifest_change: bool
                     ) -> list[dict[str, Any]]:
    """Refuse to resume across a boundary; returns the run's events plus what to record.

    The boundary: the recorded policy, the manifest, and (for a run that is not a
    sub-agent's: those are checked with their tree) the recorded governance
    (`resumed_pieces`: its workspace, its control).
    """
    events = _check_boundary(run, agent, allow_manifest_change)
    if run.depth == 0:  # a sub-agent's run is checked with its tree (`prepare_resume`)
        resumed_pieces(run, agent, None)
    return events


def _check_boundary(run: RunRecord, agent: Agent, allow_manifest_change: bool
                    ) -> list[dict[str, Any]]:
    """`check_resumable` but the governance's pieces (`_resume` derives those itself)."""
    if not isinstance(agent, Agent):
        raise UserError("resuming needs agent= (the Agent whose run this is)")
    if run.policy is None:
        raise ResumeRefused(
            f"run {run.id} has no recorded policy; refusing to resume it without a boundary"
        )
    events = list(run.events)
    Verification.of_run(run, agent.verify)  # a run checked by a callable needs it here
    if run.manifest_digest != agent.manifest_digest:
        if not allow_manifest_change:
            raise ResumeRefused(
                f"run {run.id} ran under manifest {run.manifest_digest}, but the manifest now "
                f"in force is {agent.manifest_digest}; pass allow_manifest_change=True to resume "
                "it under the new one (recorded)"
            )
        events.append({"kind": "manifest_changed", "from": run.manifest_digest,
                       "to": agent.manifest_digest, "at": time.time()})
    return events


@dataclass(frozen=True, slots=True)
class _Pieces:
    """The pieces of a resumed run's governance beside its policy (`resumed_pieces`)."""

    workspace: Path
    manifest: Any
    control: Control | None
    sandbox: str
    record_contents: str
    changed: dict[str, Any]
    """What differs from the recorded value (each piece: recorded, now), for the record."""


def resumed_pieces(run: RunRecord, agent: Agent, parent: Governance | None) -> _Pieces:
    """What a run resumes under: its recorded governance; the agent's only where stricter.

    The workspace is the recorded one (never the resuming process's folder); the tool
    control must be the recorded one (an added control, where none was recorded, is
    stricter and taken); the sandbox mode and `record_contents` are the stricter of the
    recorded and the agent's. A sub-agent's run takes its tree's root's pieces (`parent`).
    A run recorded before governance was (no `governance` event) resumes under its recorded
    workspace and its agent's other pieces.

    Raises:
        ResumeRefused: naming the piece: the recorded workspace is no longer a directory, or
            the agent's tool control is not the one the run ran under.
    """
    recorded = recorded_governance(run.events) or {}
    changed: dict[str, Any] = {}
    if parent is not None:
        workspace = parent.workspace
    else:
        text = recorded.get("workspace") or run.workspace
        workspace = Path(text) if isinstance(text, str) and text else agent.workspace
        if not workspace.is_absolute() or not workspace.is_dir():
            raise ResumeRefused(
                f"run {run.id} cannot be resumed: its workspace {str(workspace)!r} (recorded "
                "when it started) is no longer a directory; restore it — a run never continues "
                "in another folder than the one its calls were decided for")
    if workspace != agent.workspace:
        changed["workspace"] = {"recorded": str(workspace), "agent": str(agent.workspace)}
    control = ControlChain.of(None if parent is None else parent.control,
                              agent.control_in(workspace))
    described = describe_control(control)
    if "control" in recorded and recorded["control"] != described:
        if recorded["control"] is not None:
            raise ResumeRefused(
                f"run {run.id} cannot be resumed: it ran under the tool control "
                f"{recorded['control']}, but the agent resuming it has "
                f"{described or 'no control'}; resume it with the agent (and control) it ran "
                "under — nothing was decided or run")
        changed["control"] = {"recorded": None, "now": described}  # one added: stricter
    sandbox = agent.sandbox if parent is None else stricter_sandbox(parent.sandbox,
                                                                    agent.sandbox)
    contents = (agent.record_contents if parent is None
                else stricter_contents(parent.record_contents, agent.record_contents))
    if isinstance(recorded.get("sandbox"), str) and recorded["sandbox"] in ("off", "auto",
                                                                            "required"):
        kept = stricter_sandbox(recorded["sandbox"], sandbox)
        if kept != agent.sandbox:
            changed["sandbox"] = {"recorded": recorded["sandbox"], "agent": agent.sandbox}
        sandbox = kept
    if recorded.get("record_contents") in RECORD_CONTENTS:
        contents = stricter_contents(str(recorded["record_contents"]), contents)
    manifest = agent.manifest if parent is None or parent.manifest is None else parent.manifest
    return _Pieces(workspace, manifest, control, sandbox, contents, changed)


async def _decide_and_resume(store: Store, item_id: str, kind: str, decision: dict[str, Any],
                             decided_by: str, *, agent: Agent, approver: Approver | None,
                             responder: Responder | None,
                             allow_manifest_change: bool) -> RunResult:
    """Check the item, its run and the decision, record the decision (CAS), continue."""
    from handrail.runs._decisions import record_decision, wrong_kind

    item = await store.pending_item(item_id)
    if item.kind != kind:
        raise wrong_kind(item, kind)
    run = await store.run(item.run_id)
    owner = agent
    tree = await prepare_resume(store, run, agent)
    if tree is not None:  # an item of a sub-agent's run: checked, then the root continues
        run, owner, _ = tree
    check_resumable(run, agent, allow_manifest_change)
    counted = await record_decision(store, item_id, kind, decision, decided_by, agent=owner)
    if counted.state == "open":
        # One approval of several (four-eyes): counted, the run still waits. Not resumed: a
        # resume now would only pause again, and hold the run while the last approver's
        # decision lands.
        return RunResult(run.id, AwaitingApproval(item_id), in_memory=not store.durable)
    return await _resume(store, run.id, agent=agent, approver=approver,
                         responder=responder, allow_manifest_change=allow_manifest_change,
                         on_event=None, cancel=None)


def _contents_event(events: list[dict[str, Any]], mode: str, now: float
                    ) -> list[dict[str, Any]]:
    """`events`, plus a record that this run keeps file contents, when it starts to."""
    kept = [e for e in events if e.get("kind") == "record_contents"]
    current = kept[-1].get("mode") if kept else "digest"
    if mode != current:
        events = [*events, {"kind": "record_contents", "mode": mode, "at": now}]
    return events


_CONTAINED: dict[str, tuple[Policy, Policy]] = {}
"""Recorded policy (canonical JSON) -> (the agent policy it was contained by, the result)."""
_CONTAINED_MAX = 64


def _contained_policy(recorded: dict[str, Any], current: Policy) -> Policy:
    """`Policy.from_dict(recorded).contain(current)`, built once per recorded policy.

    A worker resumes many runs recorded under the same policy; building and compiling it
    (its patterns) was the largest CPU cost of a resume. Policies are immutable, so the
    result is shared; it is rebuilt when the agent's policy object changes.
    """
    key = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    cached = _CONTAINED.get(key)
    if cached is not None and cached[0] is current:
        return cached[1]
    policy = Policy.from_dict(recorded).contain(current)
    if len(_CONTAINED) >= _CONTAINED_MAX:
        _CONTAINED.pop(next(iter(_CONTAINED)))
    _CONTAINED[key] = (current, policy)
    return policy


async def _resume(store: Store, run_id: str, *, agent: Agent, approver: Approver | None,
                  responder: Responder | None, allow_manifest_change: bool,
                  on_event: EventCallback | None, cancel: anyio.Event | None,
                  node: Node | None = None, bound: Policy | None = None,
                  parent: Governance | None = None) -> RunResult:
    collector.freeze_start_up()  # a process whose first run is a resume
    run = await store.run(run_id)
    totals = None
    if node is None:
        # A run in a tree of sub-agents is always continued from its root, with the root
        # agent; every open child is checked against its tools first (refused if gone).
        tree = await prepare_resume(store, run, agent)
        if tree is not None:
            run, _, totals = tree
            run_id = run.id
    events = _check_boundary(run, agent, allow_manifest_change)
    pieces = resumed_pieces(run, agent, parent)
    # The owner is alive in this process from before the claim: a second resume of the same
    # run here, between this claim and the runner starting, must find it driven, not orphaned
    # (else both would claim it and drive it twice). The runner discards it when it ends.
    owner = new_owner()
    ACTIVE_OWNERS.add(owner)
    try:
        run = await store.claim(run_id, owner)
        now = time.time()
        resumed: dict[str, Any] = {"kind": "resumed", "at": now}
        if pieces.changed:  # where the agent differs from the record: what was kept
            resumed["governance"] = pieces.changed
        events.append(resumed)
        run.events = _contents_event(events, pieces.record_contents, now)
        # The recorded policy stays the boundary; the agent's current policy can only add
        # denies and asks to it (a deny added while paused wins).
        policy = _contained_policy(run.policy or {}, agent.policy)
        if bound is not None:  # a sub-agent: its parent's denies and asks of now apply too
            policy = policy.contain(bound)
        remembered = [Rule.from_dict(r) for r in run.remembered]
        messages = load_messages(await store.messages(run_id))
        governance = Governance(policy=policy, workspace=pieces.workspace,
                                manifest=pieces.manifest, control=pieces.control,
                                sandbox=pieces.sandbox, record_contents=pieces.record_contents)
        if recorded_governance(run.events) is None:  # a run from before: recorded from now on
            run.events = [governance.event(now), *run.events]
        runner = _Runner(agent, store, run, governance, remembered, messages,
                         approver or DeferAll(), responder or ResponderNone(), on_event)
        runner._resumed = True
        if node is not None:
            attach(runner, node)
        elif totals is not None:
            adopt(runner, totals)
        # The taint index as it stood: every output the run has seen, and every vouched
        # value. (Off the event loop: it is the whole history's text, indexed once; inline
        # when there is nothing to index, as for a run paused at its first call: the
        # thread hand-off would cost more than the work.)
        records = await store.calls(run_id)
        if any(r.answers or r.status is CallStatus.FINISHED for r in records):
            await anyio.to_thread.run_sync(runner.gate.restore_provenance, records)
        else:
            runner.gate.restore_provenance(records)
    except BaseException:
        ACTIVE_OWNERS.discard(owner)
        raise
    return await runner.drive(cancel)


async def resume(store: Store, run_id: str, *, agent: Agent, approver: Approver | None = None,
                 responder: Responder | None = None, allow_manifest_change: bool = False,
                 on_event: EventCallback | None = None,
                 cancel: anyio.Event | None = None) -> RunResult:
    """Continue a run that paused, was cancelled, or whose process died.

    It continues from its last committed step. Calls that were in flight when a process died
    come back as `AwaitingRecovery` unless their tool is idempotent (then they are retried).
    Completed calls never run again.

    Raises:
        NotFound: no such run.
        ResumeRefused: the run is finished or driven by a live process, has no recorded
            policy, or ran under another manifest (see `allow_manifest_change`).
    """
    return await _resume(store, run_id, agent=agent, approver=approver, responder=responder,
                         allow_manifest_change=allow_manifest_change, on_event=on_event,
                         cancel=cancel)


async def resume_with_decision(store: Store, request_id: str, decision: Decision, *,
                               agent: Agent, approver: Approver | None = None,
                               responder: Responder | None = None, decided_by: str = "operator",
                               allow_manifest_change: bool = False) -> RunResult:
    """Decide a deferred approval and continue its run, in any process.

    Exactly the persisted action (or the re-checked modification) is performed, once: a
    second decision raises `AlreadyDecided`, and of two processes deciding at once only one
    succeeds.

    Raises:
        AlreadyDecided: it was decided before.
        NotFound: no such request.
    """
    if not isinstance(decision, Decision) or isinstance(decision, Defer):
        raise UserError("resume_with_decision takes hr.Decision.approve(...) or "
                        ".deny(reason); deferring again means leaving it pending")
    return await _decide_and_resume(store, request_id, "approval", decision.to_dict(), decided_by,
                                    agent=agent,
                                    approver=approver, responder=responder,
                                    allow_manifest_change=allow_manifest_change)


async def resume_with_answer(store: Store, question_id: str, text: str, *, agent: Agent,
                             approver: Approver | None = None,
                             responder: Responder | None = None, answered_by: str = "operator",
                             allow_manifest_change: bool = False) -> RunResult:
    """Answer a tool's pending question and continue its run.

    The tool is re-run from its start with its recorded answers (a tool asks before it acts).
    An answer authorises nothing: the call still passes the policy.

    Raises:
        AlreadyDecided: it was answered before.
        NotFound: no such question.
    """
    if not isinstance(text, str):
        raise UserError("an answer is text")
    return await _decide_and_resume(store, question_id, "question", {"answer": text}, answered_by,
                                    agent=agent,
                                    approver=approver, responder=responder,
                                    allow_manifest_change=allow_manifest_change)


async def resume_with_recovery(store: Store, call_id: str, recovery: Recovery, *, agent: Agent,
                               approver: Approver | None = None,
                               responder: Responder | None = None,
                               decided_by: str = "operator",
                               allow_manifest_change: bool = False) -> RunResult:
    """Decide what became of a call that was in flight at a crash, and continue its run.

    Raises:
        AlreadyDecided: it was decided before.
        NotFound: no such pending recovery.
    """
    if not isinstance(recovery, Recovery):
        raise UserError("resume_with_recovery takes hr.Recovery.retry(), "
                        ".completed(observation) or .abort()")
    return await _decide_and_resume(store, call_id, "recovery", recovery.to_dict(), decided_by,
                                    agent=agent,
                                    approver=approver, responder=responder,
                                    allow_manifest_change=allow_manifest_change)


def _sync(fn: Callable[..., Awaitable[RunResult]]) -> Callable[..., RunResult]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> RunResult:
        return anyio.run(functools.partial(fn, *args, **kwargs))

    wrapper.__doc__ = f"Synchronous `{fn.__name__}` (starts an event loop)."
    return wrapper


resume_sync = _sync(resume)
resume_with_decision_sync = _sync(resume_with_decision)
resume_with_answer_sync = _sync(resume_with_answer)
resume_with_recovery_sync = _sync(resume_with_recovery)
