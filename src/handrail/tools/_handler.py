"""`ToolHandler`: one call of one tool as a resumable state machine, and `ToolImpl`, the seam
every kind of tool (Python, MCP, subprocess, injected) implements.

The handler drives the tool's coroutine itself. When the body awaits `ctx.ask`, the awaitable
yields a private marker up the coroutine chain; the driver stops there and hands the caller an
`Interaction`, keeping the suspended coroutine. `Respond` sends the answer back in. Everything
else the body awaits (sockets, sleeps) is passed through to the event loop untouched. Rule that
follows: `ctx.ask` must be awaited in the tool's own task, not inside a task group or cancel
scope the tool opened (those are bound to the task that entered them).
"""

from __future__ import annotations

import abc
import enum
import itertools
from collections.abc import Coroutine, Generator, Mapping
from typing import Any, NoReturn

import anyio
import pydantic_core
from pydantic import ValidationError

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
from handrail.tools._context import CallContext, Elicitation, _Suspend
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

__all__ = ["DEFAULT_MAX_ARGUMENT_BYTES", "HandlerState", "ToolHandler", "ToolImpl"]

DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
"""Arguments larger than this (as JSON) are refused before validation: 1 MiB."""


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
        return [Action(Act.CALL, str(self.spec.id))]

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
    """Refuse arguments that are not a JSON object (or its text) or that exceed `max_bytes`."""
    if isinstance(arguments, str | bytes | bytearray):
        size = len(arguments)
    elif isinstance(arguments, dict | Mapping):
        if len(arguments) > 8 or max_bytes < 4096:
            size = len(pydantic_core.to_json(arguments, fallback=repr))
        else:
            size = _small_size(arguments)
    else:
        raise InvalidArguments(
            tool,
            [Issue(path="$", message=f"arguments must be a JSON object, got "
                   f"{type(arguments).__name__}")],
        )
    if size > max_bytes:
        raise InvalidArguments(
            tool,
            [Issue(path="$", message=f"arguments are {size} bytes, over the limit of "
                   f"{max_bytes} bytes; send less data")],
        )
    return arguments  # type: ignore[return-value]


def _small_size(arguments: Mapping[str, Any]) -> int:
    # Cheap upper-ish bound for the common case of a few scalar arguments; anything nested or
    # long falls back to exact serialisation.
    total = 0
    for key, value in arguments.items():
        kind = type(value)
        if kind is int or kind is float or kind is bool or value is None:
            total += len(key) + 28
        elif kind is str and len(value) < 512:
            total += len(key) + len(value) * 6 + 6
        else:
            return len(pydantic_core.to_json(arguments, fallback=repr))
    return total


class _Drive:
    """Run the tool coroutine until it finishes or awaits `ctx.ask`/`ctx.elicit`."""

    __slots__ = ("coro", "exc", "value")

    def __init__(self, coro: Coroutine[Any, Any, ToolResult], value: Any, exc: BaseException |
                 None) -> None:
        self.coro = coro
        self.value = value
        self.exc = exc

    def __await__(self) -> Generator[Any, Any, tuple[bool, Any]]:
        coro, send, exc = self.coro, self.value, self.exc
        while True:
            try:
                yielded = coro.send(send) if exc is None else coro.throw(exc)
            except StopIteration as stop:
                return True, stop.value
            if type(yielded) is _Suspend:
                return False, yielded
            try:
                send = yield yielded
                exc = None
            except BaseException as thrown:  # the event loop's cancellation, passed in
                send, exc = None, thrown


_ids = itertools.count(1)


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
        - `Invoke(call_id, arguments)` from NEW: validates (the body never sees bad input) and
          runs the body until it finishes (`Finished(result)`) or asks (`Interaction`).
        - `Respond(interaction_id, Submit | Decline | CancelInteraction)` from SUSPENDED:
          resumes exactly the pending interaction; a wrong id or an answer of the wrong shape is
          refused with `HandlerStateError` and leaves the state unchanged.
        - `Cancel(reason)` from NEW or SUSPENDED: ends the call; the step raises `CallCancelled`.

    Cancellation: `Cancel` closes the suspended coroutine (its `finally` blocks run). A
    cancellation from outside (an enclosing cancel scope) is never swallowed: it propagates and
    the handler is FINISHED. The deadline (`spec.timeout`) counts only time spent running, not
    time spent waiting for an answer; when it passes the step raises `ToolTimeout`.
    """

    __slots__ = ("_answers", "_coro", "_ctx", "_deps", "_elapsed", "_impl", "_interaction",
                 "_max_bytes", "_run_id", "_agent", "_workspace", "_n", "call_id", "state")

    def __init__(
        self,
        impl: ToolImpl,
        *,
        run_id: str | None = None,
        agent: str | None = None,
        workspace: Any = None,
        deps: Any = None,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
    ) -> None:
        self._impl = impl
        self._run_id = run_id
        self._agent = agent
        self._workspace = workspace
        self._deps = deps
        self._max_bytes = max_argument_bytes
        self._coro: Coroutine[Any, Any, ToolResult] | None = None
        self._ctx: CallContext | None = None
        self._interaction: Interaction | None = None
        self._answers: list[Submit | Decline] = []
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
        """Every response given so far, in order (persist these to replay the call later)."""
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
                self._close()
                raise CallCancelled(step.reason)
            raise HandlerStateError(f"cannot Cancel a handler that is {state.value}")
        raise HandlerStateError(
            f"step() takes Invoke, Respond or Cancel, not {type(step).__name__}"
        )

    async def _invoke(self, step: Invoke) -> Finished | Interaction:
        impl = self._impl
        self.call_id = step.call_id
        self.state = HandlerState.RUNNING
        try:
            arguments = check_argument_payload(str(impl.spec.id), step.arguments, self._max_bytes)
            validated = impl.validate(arguments)
        except BaseException:
            self.state = HandlerState.FINISHED
            raise
        spec = impl.spec
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
                replay=list(step.answers) if step.answers else None,
            )
        self._answers.extend(step.answers)
        self._ctx = ctx
        coro = impl.execute(validated, ctx)
        if not spec.interactions and spec.timeout is None:
            # Fast path: a tool that cannot ask needs no driver and no cancel scope.
            try:
                result = await coro
            except BaseException as exc:
                self.state = HandlerState.FINISHED
                _raise_body_error(spec, exc)
            self.state = HandlerState.FINISHED
            return Finished(result)
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
        validated = impl.validate(check_argument_payload(str(spec.id), arguments,
                                                         max_argument_bytes))
        ctx = CallContext(call_id=call_id, tool_id=spec.id) if impl.needs_context else None
        try:
            return await impl.execute(validated, ctx)
        except BaseException as exc:
            _raise_body_error(spec, exc)

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
            self._close()
            raise CallCancelled(response.reason)
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
        timeout = spec.timeout
        try:
            if timeout is None:
                done, out = await _Drive(coro, value, exc)
            else:
                remaining = timeout - self._elapsed
                started = anyio.current_time()
                with anyio.move_on_after(max(remaining, 0.0)) as scope:
                    done, out = await _Drive(coro, value, exc)
                self._elapsed += anyio.current_time() - started
                if scope.cancelled_caught:
                    raise ToolTimeout(
                        f"tool '{spec.id}' did not finish within its {timeout:g}s deadline; "
                        "it may have acted partly"
                    )
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
            self._coro = None
            _raise_body_error(spec, err)
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
        self._interaction = interaction
        self.state = HandlerState.SUSPENDED
        return interaction

    def _close(self) -> None:
        self.state = HandlerState.FINISHED
        self._interaction = None
        if self._coro is not None:
            self._coro.close()
            self._coro = None


def _check_answer(pending: Interaction, value: Any) -> Any:
    request = pending.request
    if isinstance(request, Elicitation):
        if not isinstance(value, Mapping):
            raise HandlerStateError(
                f"interaction {pending.id!r} asks for a form: answer with an object, not "
                f"{type(value).__name__}; nothing changed"
            )
        import jsonschema  # lazily: only forms need it

        problems = sorted(
            jsonschema.Draft202012Validator(request.schema).iter_errors(dict(value)),
            key=lambda e: list(e.absolute_path),
        )
        if problems:
            text = "; ".join(f"{e.json_path}: {e.message}" for e in problems)
            raise HandlerStateError(
                f"the answer to {pending.id!r} does not match the form's schema ({text}); "
                "nothing changed"
            )
        return dict(value)
    if not isinstance(value, str):
        raise HandlerStateError(
            f"interaction {pending.id!r} asks a question: answer with text, not "
            f"{type(value).__name__}; nothing changed"
        )
    return value


def _raise_body_error(spec: ToolSpec, exc: BaseException) -> NoReturn:
    """Re-raise a failure from inside a tool body as what the step's caller should see.

    This is the boundary between the tool's code and ours, so it is the one place that
    catches everything a body raises. Cancellation, KeyboardInterrupt and SystemExit are
    never swallowed; our own errors pass through; anything else is `ToolFailed` (LANDED).
    """
    if not isinstance(exc, Exception) or isinstance(exc, ToolError | UserError):
        raise exc
    raise ToolFailed(f"tool '{spec.id}' raised {type(exc).__name__}: {exc}") from exc


__all__ += ["check_argument_payload", "issues_from_validation_error"]
