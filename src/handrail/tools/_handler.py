"""`ToolHandler` (one call as a resumable state machine) and `ToolImpl` (the tool seam).

`ToolImpl` is the seam every kind of tool (Python, MCP, subprocess, injected) implements.

The handler drives the tool's coroutine itself. When the body awaits `ctx.ask`, the awaitable
yields a private marker up the coroutine chain; the driver stops there and hands the caller an
`Interaction`, keeping the suspended coroutine. `Respond` sends the answer back in. Everything
else the body awaits (sockets, sleeps) is passed through to the event loop untouched. Rule that
follows: `ctx.ask` must be awaited in the tool's own task, not inside a task group or cancel
scope the tool opened (those are bound to the task that entered them).
"""

from __future__ import annotations

import abc
import collections
import contextlib
import enum
import inspect
import json
from collections.abc import Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from handrail.errors import (
    CallCancelled,
    Disposition,
    HandlerStateError,
    InteractionDeclined,
    InvalidArguments,
    Issue,
    ToolError,
    ToolFailed,
    ToolTimeout,
    UserError,
)
from handrail.tools._actions import Act, Action
from handrail.tools._content import ToolResult
from handrail.tools._context import CallContext, Elicitation, Question, _Suspend
from handrail.tools._spec import ToolSpec
from handrail.tools._steps import (
    Cancel,
    CancelInteraction,
    Decline,
    Finished,
    Interaction,
    Invoke,
    Respond,
    Submit,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "HandlerState",
    "ToolHandler",
    "ToolImpl",
    "check_argument_payload",
    "issues_from_validation_error",
    "raise_body_error",
]

DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
"""Arguments larger than this (as UTF-8 JSON) are refused before validation: 1 MiB."""

CLEANUP_SECONDS = 5.0
"""How long a cancelled body's cleanup (its `finally` blocks, `async with` exits) may take."""


class HandlerState(enum.Enum):
    """Where a ToolHandler is in its life."""

    NEW = "new"
    """Created; waits for `Invoke`."""
    SUSPENDED = "suspended"
    """The body asked something; waits for `Respond` (or `Cancel`)."""
    RUNNING = "running"
    """A step is executing the body right now."""
    FINISHED = "finished"
    """Completed, failed or cancelled; every further step is refused."""


class ToolImpl(abc.ABC):
    """How one tool validates, declares what it touches, and runs.

    Python tools, MCP tools, subprocess tools and injected host tools each subclass this; the
    `ToolHandler` and the gate treat them all alike.
    """

    spec: ToolSpec
    """The tool's declaration."""
    origin: str
    """Where the tool was defined, for error messages (`module.function`, `server X`...)."""
    needs_context: bool = True
    """False when `execute` ignores its context, so the handler can skip building one."""

    @abc.abstractmethod
    def validate(self, arguments: Mapping[str, Any] | str | bytes) -> Any:
        """Validate raw arguments (a mapping or JSON text) into what `execute` takes.

        Raises:
            InvalidArguments: the arguments fail the input schema.
        """

    def actions(self, validated: Any) -> list[Action]:
        """What a call with these arguments touches; by default `CALL server/name`."""
        return [self.default_action()]

    def bind(self, validated: Any, workspace: Any, decided: Any = None) -> Any:
        """The arguments as the body receives them: checked paths made canonical.

        Called at the moment of use. A tool without `hr.ReadPath`/`hr.WritePath` arguments
        returns `validated` unchanged.

        Raises:
            PathChanged: a path now resolves elsewhere than `decided` (not sent).
        """
        return validated

    def default_action(self) -> Action:
        """`CALL server/name`, built once per tool (an Action is immutable)."""
        # Kept with the id it was built for, compared by identity: `str(spec.id)` is a Python
        # call, and this runs every call (issue 38). A spec replaced since (another id
        # object, equal or not) rebuilds it.
        spec_id = self.spec.id
        cached: tuple[Any, Action] | None = getattr(self, "_default_action_cache", None)
        if cached is not None and cached[0] is spec_id:
            return cached[1]
        action = Action(Act.CALL, str(spec_id))
        with contextlib.suppress(AttributeError):  # a slotted subclass simply rebuilds it
            self._default_action_cache = (spec_id, action)
        return action

    @abc.abstractmethod
    def dump_arguments(self, validated: Any) -> dict[str, Any]:
        """The validated arguments as a JSON object (for records, digests and approvers)."""

    @abc.abstractmethod
    def execute(
        self, validated: Any, ctx: CallContext | None
    ) -> Coroutine[Any, Any, ToolResult]:
        """Run the body and return its checked result.

        `ctx` is None only when `needs_context` is False.

        Raises:
            InvalidOutput: the body's output fails the output schema.
            ToolError: a transport failure, with its disposition.
        """


def issues_from_validation_error(exc: ValidationError) -> list[Issue]:
    """Turn pydantic's errors into `Issue`s with JSON paths and messages a model can act on."""
    issues = []
    for err in exc.errors(include_url=False, include_context=False):
        path = "$"
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field; remove it (the tool accepts only the fields in its schema)"
        elif err["type"] == "missing":
            message = "required field is missing"
        issues.append(Issue(path=path, message=message))
    return issues


def check_argument_payload(
    tool: str, arguments: object, max_bytes: int
) -> Mapping[str, Any] | str | bytes:
    """Refuse arguments that are not a JSON object (or its text) or that exceed `max_bytes`.

    The size is that of the arguments as UTF-8 JSON, measured exactly: serialising a mapping
    costs less than estimating it would, and an estimate could be wrong in the direction that
    lets an over-sized payload through.

    Raises:
        InvalidArguments: not an object, or too large (NOT_SENT).
    """
    kind = type(arguments)
    if kind is dict or (kind is not str and isinstance(arguments, Mapping)):
        # Imported here, not with the module: the tool core imports without pydantic_core
        # (issue 11); once loaded this is a dictionary lookup.
        import pydantic_core

        try:
            size = len(pydantic_core.to_json(arguments, fallback=repr))
        except pydantic_core.PydanticSerializationError:
            # No UTF-8 form (a lone surrogate...): measure the ASCII-escaped form, never
            # smaller, and leave it to validation to name the offending field.
            try:
                size = len(json.dumps(arguments, default=repr))
            except (TypeError, ValueError) as exc:
                raise InvalidArguments(
                    tool, [Issue(path="$", message=f"arguments are not JSON-encodable: {exc}")]
                ) from None
    elif isinstance(arguments, str):
        # Each character is 1 to 4 bytes of UTF-8: count exactly only when it could matter.
        size = len(arguments)
        if size * 4 > max_bytes:
            size = len(arguments.encode("utf-8", "surrogatepass"))
    elif isinstance(arguments, bytes | bytearray):
        size = len(arguments)
    else:
        raise InvalidArguments(
            tool,
            [Issue(path="$", message="arguments must be a JSON object, got "
                   f"{type(arguments).__name__}")],
        )
    if size > max_bytes:
        raise InvalidArguments(
            tool,
            [Issue(path="$", message=f"arguments are {size} bytes, over the limit of "
                   f"{max_bytes} bytes; send less data")],
        )
    return arguments  # type: ignore[return-value]  # Mapping narrowed from object


class _Abandon(BaseException):
    """Thrown into a suspended body whose call is cancelled, so its cleanup runs.

    A BaseException, like a cancellation, so `except Exception` in a tool does not eat it.
    """


class _Drive:
    """Run the tool coroutine until it finishes or awaits `ctx.ask`/`ctx.elicit`.

    Awaiting a `_Drive` returns `(True, result)` when the body returned and `(False, marker)`
    when it suspended on a question. Anything else the body yields goes to the event loop, and
    whatever the loop throws back (a cancellation) is thrown into the body.
    """

    __slots__ = ("coro", "exc", "value")

    def __init__(
        self, coro: Coroutine[Any, Any, ToolResult], value: Any, exc: BaseException | None
    ) -> None:
        self.coro = coro
        self.value = value
        self.exc = exc

    def __await__(self) -> Generator[Any, Any, tuple[bool, Any]]:
        coro, send, exc = self.coro, self.value, self.exc
        cancelled: BaseException | None = None
        while True:
            try:
                yielded = coro.send(send) if exc is None else coro.throw(exc)
            except StopIteration as stop:
                return True, stop.value
            if type(yielded) is _Suspend:
                if cancelled is not None:
                    # The body caught a cancellation and then asked a question. A call being
                    # cancelled cannot suspend, and the cancellation is never swallowed: the
                    # body stays suspended here and the handler cleans it up.
                    raise cancelled
                return False, yielded
            try:
                send = yield yielded
                exc = None
            except BaseException as thrown:  # from the event loop: pass it into the body
                send, exc = None, thrown
                if not isinstance(thrown, Exception):
                    cancelled = thrown  # a cancellation, GeneratorExit, KeyboardInterrupt


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    try:
        coro.close()
    except RuntimeError:  # "coroutine ignored GeneratorExit": a body that insists on awaiting
        pass


def _prepare(impl: ToolImpl, arguments: object, max_bytes: int) -> Any:
    return impl.validate(check_argument_payload(impl.spec.id._str, arguments, max_bytes))


class ToolHandler:
    """One call of one tool, as a resumable state machine.

    ```python
    handler = box.handler("ledger/transfer")
    out = await handler.step(hr.Invoke("call-1", {"source": "a", "target": "b", "amount": 5}))
    while isinstance(out, hr.Interaction):
        out = await handler.step(hr.Respond(out.id, hr.Submit("yes")))
    result = out.result
    ```

    Steps:
        - `Invoke(call_id, arguments, answers=())` from NEW: validates (the body never sees bad
          input) and runs the body until it finishes (`Finished(result)`) or asks
          (`Interaction`). Recorded `answers` are given to the body's first questions, in order,
          without returning to the caller; the interaction ids are those of the original run.
        - `Respond(interaction_id, Submit | Decline | CancelInteraction)` from SUSPENDED:
          resumes exactly the pending interaction; a wrong id or an answer of the wrong shape is
          refused with `HandlerStateError` and leaves the state unchanged. `Decline` raises
          `InteractionDeclined` inside the tool (uncaught, the call finishes with an error
          result); `CancelInteraction` ends the call like `Cancel`.
        - `Cancel(reason)` from NEW or SUSPENDED: ends the call; the step raises `CallCancelled`
          (NOT_SENT from NEW, IN_DOUBT from SUSPENDED).

    Cancellation: our own cancel (`Cancel`, `CancelInteraction`) becomes `CallCancelled`; a
    suspended body gets a private exception thrown in so its `finally` blocks and `async with`
    exits run, shielded and bounded by `CLEANUP_SECONDS`. A cancellation from outside (an
    enclosing cancel scope) is never swallowed: it propagates, even if the body catches it, and
    the handler is FINISHED. A sync body runs in a worker thread that is abandoned on
    cancellation (it cannot be interrupted; it finishes in the background).

    Deadline: `spec.timeout` counts only time spent running, not time spent waiting for an
    answer; when it passes the step raises `ToolTimeout` (IN_DOUBT) and the handler is FINISHED.
    """

    __slots__ = (
        "_agent",
        "_answers",
        "_coro",
        "_decided",
        "_deps",
        "_elapsed",
        "_events",
        "_impl",
        "_interaction",
        "_max_bytes",
        "_n",
        "_permits",
        "_policy",
        "_replay",
        "_run_id",
        "_sandbox",
        "_trusted",
        "_workspace",
        "call_id",
        "state",
    )

    def __init__(
        self,
        impl: ToolImpl,
        *,
        run_id: str | None = None,
        agent: str | None = None,
        workspace: Any = None,
        deps: Any = None,
        permits: Any = None,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        decided_paths: Mapping[str, str] | None = None,
        trusted: list[Any] | None = None,
        events: Any = None,
        policy: Any = None,
        sandbox: str = "auto",
    ) -> None:
        self._impl = impl
        self._policy = policy
        self._sandbox = sandbox
        self._trusted = trusted
        self._decided = decided_paths
        self._permits = permits
        self._events = events
        self._run_id = run_id
        self._agent = agent
        self._workspace = workspace
        self._deps = deps
        self._max_bytes = max_argument_bytes
        self._coro: Coroutine[Any, Any, ToolResult] | None = None
        self._interaction: Interaction | None = None
        self._answers: list[Submit | Decline] = []
        self._replay: collections.deque[Submit | Decline] = collections.deque()
        self._elapsed = 0.0
        self._n = 0
        self.call_id: str | None = None
        """The call's id, once invoked."""
        self.state = HandlerState.NEW
        """Where the handler is; see `HandlerState`."""

    @property
    def spec(self) -> ToolSpec:
        """The tool being called."""
        return self._impl.spec

    @property
    def pending(self) -> Interaction | None:
        """The interaction awaiting an answer, when SUSPENDED."""
        return self._interaction

    @property
    def answers(self) -> list[Submit | Decline]:
        """Every answer the body received so far, in order (persist these to replay the call)."""
        return list(self._answers)

    async def step(self, step: Invoke | Respond | Cancel) -> Finished | Interaction:
        """Advance the call by one step; see the class docstring.

        Raises:
            InvalidArguments: on Invoke, the arguments fail the input schema (NOT_SENT).
            CallCancelled: on Cancel or CancelInteraction.
            ToolTimeout: the deadline passed while the body ran (IN_DOUBT).
            ToolFailed: the body raised (LANDED).
            InvalidOutput: the body's output fails its schema (LANDED).
            HandlerStateError: the step does not fit the handler's state.
        """
        state = self.state
        if isinstance(step, Invoke):
            if state is not HandlerState.NEW:
                raise HandlerStateError(f"cannot Invoke a handler that is {state.value}")
            return await self._invoke(step)
        if isinstance(step, Respond):
            return await self._respond(step)
        if isinstance(step, Cancel):
            if state is HandlerState.NEW:
                self.state = HandlerState.FINISHED
                raise CallCancelled(step.reason, disposition=Disposition.NOT_SENT)
            if state is HandlerState.SUSPENDED:
                failure = await self._abandon()
                raise CallCancelled(step.reason) from failure
            raise HandlerStateError(f"cannot Cancel a handler that is {state.value}")
        raise HandlerStateError(
            f"step() takes Invoke, Respond or Cancel, not {type(step).__name__}"
        )

    async def _invoke(self, step: Invoke) -> Finished | Interaction:
        impl = self._impl
        spec = impl.spec
        self.call_id = step.call_id
        self.state = HandlerState.RUNNING
        try:
            validated = _prepare(impl, step.arguments, self._max_bytes)
            # The moment of use: paths are canonicalised again and must match what was decided.
            validated = impl.bind(validated, self._workspace, self._decided)
        except BaseException:
            self.state = HandlerState.FINISHED
            raise
        ctx = None
        if impl.needs_context:
            ctx = CallContext(
                call_id=step.call_id,
                tool_id=spec.id,
                interactions=spec.interactions,
                run_id=self._run_id,
                agent=self._agent,
                workspace=self._workspace,
                deps=self._deps,
                permits=self._permits,
                trusted=self._trusted,
                events=self._events,
                policy=self._policy,
                sandbox=self._sandbox,
            )
        coro = impl.execute(validated, ctx)
        if not spec.interactions and spec.timeout is None:
            # Fast path: a tool that cannot ask needs no driver and no cancel scope.
            try:
                result = await coro
            except BaseException as exc:
                self.state = HandlerState.FINISHED
                raise_body_error(spec, exc)
            self.state = HandlerState.FINISHED
            return Finished(result)
        self._replay.extend(step.answers)
        self._coro = coro
        return await self._drive(None, None)

    @staticmethod
    async def run_once(
        impl: ToolImpl,
        arguments: Mapping[str, Any] | str | bytes,
        call_id: str,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
    ) -> ToolResult:
        """One call of a tool that cannot ask and has no deadline, without a state machine.

        Exactly `step(Invoke(...))`'s semantics for such tools; callers check
        `not spec.interactions and spec.timeout is None` first.
        """
        spec = impl.spec
        validated = impl.bind(impl.validate(
            check_argument_payload(spec.id._str, arguments, max_argument_bytes)
        ), None)
        ctx = CallContext(call_id=call_id, tool_id=spec.id) if impl.needs_context else None
        try:
            return await impl.execute(validated, ctx)
        except BaseException as exc:
            raise_body_error(spec, exc)

    async def _respond(self, step: Respond) -> Finished | Interaction:
        pending = self._interaction
        if self.state is not HandlerState.SUSPENDED or pending is None:
            raise HandlerStateError(
                f"cannot Respond to a handler that is {self.state.value}; nothing is pending"
            )
        if step.interaction_id != pending.id:
            raise HandlerStateError(
                f"interaction {step.interaction_id!r} is not the pending one ({pending.id!r}); "
                "nothing changed"
            )
        response = step.response
        if isinstance(response, CancelInteraction):
            failure = await self._abandon()
            raise CallCancelled(response.reason) from failure
        if isinstance(response, Submit):
            value = _check_answer(pending, response.value)
            self._answers.append(Submit(value))
            return await self._drive(value, None)
        if isinstance(response, Decline):
            self._answers.append(response)
            return await self._drive(None, InteractionDeclined(response.reason))
        raise HandlerStateError(
            f"Respond takes Submit, Decline or CancelInteraction, not {type(response).__name__}"
        )

    async def _drive(self, value: Any, exc: BaseException | None) -> Finished | Interaction:
        coro = self._coro
        assert coro is not None
        spec = self._impl.spec
        self.state = HandlerState.RUNNING
        self._interaction = None
        try:
            while True:
                done, out = await self._slice(coro, value, exc)
                if done:
                    self.state = HandlerState.FINISHED
                    self._coro = None
                    return Finished(out)
                self._n += 1
                interaction = Interaction(
                    id=f"{self.call_id}:{self._n}",
                    call_id=self.call_id or "",
                    tool_id=spec.id,
                    request=out.request,
                )
                if not self._replay:
                    self._interaction = interaction
                    self.state = HandlerState.SUSPENDED
                    return interaction
                recorded = self._replay.popleft()
                if isinstance(recorded, Decline):
                    value, exc = None, InteractionDeclined(recorded.reason)
                else:
                    value, exc = _check_answer(interaction, recorded.value, replayed=True), None
                    recorded = Submit(value)
                self._answers.append(recorded)
        except InteractionDeclined as declined:
            self.state = HandlerState.FINISHED
            self._coro = None
            return Finished(
                ToolResult.error(
                    f"tool '{spec.id}' stopped: its question was declined ({declined.reason})"
                )
            )
        except BaseException as err:
            self.state = HandlerState.FINISHED
            if _suspended(coro):
                await self._abandon()  # e.g. a cancellation the body caught before asking
            self._coro = None
            raise_body_error(spec, err)

    async def _slice(
        self, coro: Coroutine[Any, Any, ToolResult], value: Any, exc: BaseException | None
    ) -> tuple[bool, Any]:
        """Run the body until it returns or asks, under what is left of its deadline."""
        spec = self._impl.spec
        timeout = spec.timeout
        if timeout is None:
            return await _Drive(coro, value, exc)
        started = anyio.current_time()
        with anyio.move_on_after(max(timeout - self._elapsed, 0.0)) as scope:
            try:
                return await _Drive(coro, value, exc)
            finally:
                self._elapsed += anyio.current_time() - started
        assert scope.cancelled_caught
        raise ToolTimeout(
            f"tool '{spec.id}' did not finish within its {timeout:g}s deadline; it may have "
            "acted partly"
        )

    async def _abandon(self) -> Exception | None:
        """End a suspended body: throw `_Abandon` in and let its cleanup run, shielded.

        Returns the exception the cleanup raised, if any (to chain onto `CallCancelled`).
        """
        coro, self._coro = self._coro, None
        self._interaction = None
        self.state = HandlerState.FINISHED
        if coro is None:
            return None
        failure: Exception | None = None
        try:
            with anyio.move_on_after(CLEANUP_SECONDS, shield=True):
                await _Drive(coro, None, _Abandon())
        except _Abandon:
            pass
        except Exception as exc:  # the body's cleanup failed: reported as the cancel's cause
            failure = exc
        finally:
            _close(coro)  # still suspended if it asked again or overran CLEANUP_SECONDS
        return failure


def _suspended(coro: Coroutine[Any, Any, Any]) -> bool:
    if inspect.iscoroutine(coro):
        return inspect.getcoroutinestate(coro) == inspect.CORO_SUSPENDED
    return True  # a foreign coroutine type: assume the worst; abandoning a done one is harmless


def _check_answer(pending: Interaction, value: Any, *, replayed: bool = False) -> Any:
    """The answer as the body will receive it, or HandlerStateError (nothing changed)."""
    request = pending.request
    if replayed:
        what, after = f"the recorded answer to {pending.id!r}", "the call is abandoned"
    else:
        what, after = f"the answer to {pending.id!r}", "nothing changed"
    if isinstance(request, Elicitation):
        if not isinstance(value, Mapping):
            raise HandlerStateError(
                f"{what} must be an object (the interaction asks for a form), not "
                f"{type(value).__name__}; {after}"
            )
        from handrail.tools._schemas import local_validator, schema_issues  # only forms

        problems = schema_issues(local_validator(request.schema), dict(value))
        if problems:
            text = "; ".join(f"{e.path}: {e.message}" for e in problems)
            raise HandlerStateError(f"{what} does not match the form's schema ({text}); {after}")
        return dict(value)
    assert isinstance(request, Question)
    if not isinstance(value, str):
        raise HandlerStateError(
            f"{what} must be text (the interaction asks a question), not "
            f"{type(value).__name__}; {after}"
        )
    return value


def raise_body_error(spec: ToolSpec, exc: BaseException) -> NoReturn:
    """Re-raise a failure from inside a tool body as what the step's caller should see.

    This is the boundary between the tool's code and ours, so it is the one place that
    catches everything a body raises. Cancellation, KeyboardInterrupt and SystemExit are
    never swallowed; our own errors pass through; anything else is `ToolFailed` (LANDED).
    """
    if not isinstance(exc, Exception) or isinstance(exc, ToolError | UserError):
        raise exc
    raise ToolFailed(f"tool '{spec.id}' raised {type(exc).__name__}: {exc}") from exc
