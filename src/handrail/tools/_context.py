"""What a running tool can reach: `CallContext`, and the questions it may ask its caller."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from handrail.errors import UserError
from handrail.tools._actions import Action
from handrail.tools._names import ToolId

__all__ = ["CallContext", "Elicitation", "Question"]


@dataclass(frozen=True, slots=True)
class Question:
    """A question about intent, for whoever called the tool (or drives the agent).

    An answer need not be one of `choices`, and an answer authorises nothing: approvals are a
    separate channel.
    """

    question: str
    """What is asked."""
    context: str | None = None
    """Why it is asked, or what the asker already knows."""
    choices: Sequence[str] = ()
    """Suggested answers; the answer may be anything."""
    kind: Literal["question"] = "question"
    agent_path: Sequence[str] = ()
    """Who asks, from the root of a tree of agents (`("planner", "coder")`); the gate fills it
    in for a sub-agent's tool (docs/subagents.md). Empty outside a tree."""

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise UserError("a Question needs non-empty question text")
        object.__setattr__(self, "choices", tuple(self.choices))
        object.__setattr__(self, "agent_path", tuple(self.agent_path))


@dataclass(frozen=True, slots=True)
class Elicitation:
    """A request for structured input matching `schema` (MCP's form elicitation)."""

    message: str
    """What is asked, for a person."""
    schema: Mapping[str, Any] = field(default_factory=dict)
    """JSON Schema (an object) the answer must validate against."""
    kind: Literal["form"] = "form"

    def __post_init__(self) -> None:
        import jsonschema  # lazily: only forms need it

        if not isinstance(self.message, str) or not self.message.strip():
            raise UserError("an elicitation needs a non-empty message")
        schema = dict(self.schema)
        if schema.get("type") != "object":
            raise UserError(
                "an elicitation's schema must describe a JSON object (\"type\": \"object\"), "
                f"got {schema.get('type')!r}"
            )
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise UserError(
                f"an elicitation's schema is not valid JSON Schema: {exc.message}"
            ) from None
        object.__setattr__(self, "schema", schema)


class _Suspend:
    """Awaited by `ctx.ask`/`ctx.elicit`; the handler's driver intercepts it (see _handler)."""

    __slots__ = ("request",)

    def __init__(self, request: Question | Elicitation) -> None:
        self.request = request

    def __await__(self) -> Generator[Any, Any, Any]:
        response = yield self
        return response


class CallContext:
    """Handed to a tool that asks for it (a parameter annotated `hr.CallContext`).

    Attributes describe the call; `ask` and `elicit` suspend the call until its caller answers.
    A tool must ask before it acts: a call resumed in a new process is re-run from the start
    with its recorded answers, so anything done before a question may be done twice.
    """

    __slots__ = ("_events", "_interactions", "_permits", "_trusted", "agent", "call_id", "deps",
                 "policy", "run_id", "sandbox", "tool_id", "workspace")

    def __init__(
        self,
        *,
        call_id: str,
        tool_id: ToolId,
        interactions: frozenset[str] = frozenset(),
        run_id: str | None = None,
        agent: str | None = None,
        workspace: Path | None = None,
        deps: Any = None,
        permits: Callable[[Action], bool] | None = None,
        trusted: list[Any] | None = None,
        events: Callable[..., Awaitable[None]] | None = None,
        policy: Any = None,
        sandbox: str = "auto",
    ) -> None:
        self.call_id = call_id
        """The call's id, as the model gave it."""
        self.tool_id = tool_id
        """The tool being called."""
        self.run_id = run_id
        """The run this call belongs to, when run by an agent."""
        self.agent = agent
        """The name of the agent making the call."""
        self.workspace = workspace
        """The agent's workspace root (absolute), when there is one."""
        self.deps = deps
        """Whatever the host passed as `deps` (a database handle, a client...)."""
        self.policy = policy
        """The policy in force for this call (an `hr.Policy`), when run by an agent; a tool
        that starts programs derives their sandbox from it (`handrail.sandbox.wrap`)."""
        self.sandbox = sandbox
        """The agent's sandbox mode for programs: "auto", "required" or "off"."""
        self._interactions = interactions
        self._permits = permits
        self._trusted = trusted
        self._events = events

    async def report_progress(self, progress: float, total: float | None = None,
                              message: str | None = None) -> None:
        """Tell the run how far the call has come (an agent's `on_event` gets `call_progress`).

        Outside an agent run, or with nobody listening, it does nothing.
        """
        if self._events is not None:
            await self._events("call_progress", False, call_id=self.call_id,
                               tool=str(self.tool_id), progress=progress, total=total,
                               message=message)

    async def record_event(self, kind: str, **detail: Any) -> None:
        """Keep an event in the run's record (`RunRecord.events`); `on_event` gets it too.

        For what happened around the call that an operator should see later (a tool's server
        was restarted...). `detail` must be JSON-compatible. Outside a run it does nothing.
        """
        if self._events is not None:
            await self._events(kind, True, call_id=self.call_id, tool=str(self.tool_id),
                               **detail)

    def permits(self, action: Action) -> bool:
        """Whether the policy in force allows `action` outright (not ask, not deny).

        For a tool whose one declared action covers many things (a search under a directory
        reads every file in it): it checks each thing before touching it, so a rule denying
        `.env` holds inside a search of `.`. Outside an agent run there is no policy and
        everything is permitted.
        """
        return True if self._permits is None else self._permits(action)

    def trust(self, value: Any) -> None:
        """Vouch for `value`: the tool has validated it, so it is trusted from now on.

        An explicit, recorded act (the call's record keeps what it trusted): a later call may
        use this value in a protected argument without a person, even where it also appeared
        in untrusted output. Strings, numbers, and lists or objects of them (each leaf).
        Outside an agent run it does nothing.

        Raises:
            UserError: `value` is not JSON data, or is larger than 64 KiB as JSON.
        """
        import json

        try:
            size = len(json.dumps(value))
        except (TypeError, ValueError):
            raise UserError(f"ctx.trust takes JSON data (strings, numbers, lists, objects), "
                            f"not {type(value).__name__}") from None
        if size > 65536:
            raise UserError(f"ctx.trust takes at most 64 KiB of JSON, got {size} bytes: vouch "
                            "for the values a later call will use, not a whole document")
        if self._trusted is not None:
            self._trusted.append(value)

    async def ask(self, question: Question) -> str:
        """Ask the caller `question` and wait for the answer.

        Raises:
            InteractionDeclined: the caller declined to answer.
        """
        if not isinstance(question, Question):
            raise UserError(f"ctx.ask takes an hr.Question, not {type(question).__name__}")
        self._require("question")
        answer: str = await _Suspend(question)
        return answer

    async def elicit(self, schema: Mapping[str, Any], message: str) -> dict[str, Any]:
        """Ask the caller for input matching the JSON Schema `schema`; returns the object.

        The answer is validated against `schema` before the tool sees it.

        Raises:
            InteractionDeclined: the caller declined to answer.
        """
        self._require("form")
        answer: dict[str, Any] = await _Suspend(Elicitation(message, schema))
        return dict(answer)

    def _require(self, kind: str) -> None:
        if kind not in self._interactions:
            method = "ask" if kind == "question" else "elicit"
            raise UserError(
                f"tool '{self.tool_id}' called ctx.{method} but does not declare the "
                f"interaction kind {kind!r}: add interactions={{{kind!r}}} to its declaration"
            )
