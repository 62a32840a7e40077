"""Injected tools: a host declares tools with `tools()` and answers their calls with `route()`.

One object does both, so what the model is offered and what the gate grants cannot disagree:
the run reads `tools()` at the start of every turn and that one list is both the offer and
the set the gate resolves against. An injected tool outranks a registered tool of the same
id; `route` returning None falls through to the registered tool (or, with none, to the
model-visible "no such tool"). A routed call has passed all nine stages before `route` sees it.

What is enforced on a router: a sync `route` runs in a worker thread; every routed call is
bounded by its deadline (`InjectedTool.timeout`); a router that raises becomes an IN_DOUBT
error result, never a crashed run; `RoutedCall.stop` is set when the call is cancelled (its
deadline, the run cancelled or torn down).
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread

from handrail.errors import Disposition, InvalidArguments, ToolError, UnknownTool, UserError
from handrail.host._process import ProcessCapture, Projection
from handrail.host._records import current_call
from handrail.tools import (
    Action,
    CallContext,
    SchemaTool,
    Toolbox,
    ToolId,
    ToolImpl,
    ToolResult,
    ToolSpec,
)

__all__ = [
    "DEFAULT_ROUTE_TIMEOUT",
    "InjectedTool",
    "InjectionToolset",
    "RoutedCall",
    "RoutedCapture",
    "Stop",
    "ToolInjection",
    "capture_result",
    "hand_over",
    "merged_toolbox",
]

DEFAULT_ROUTE_TIMEOUT = 60.0
"""Seconds a routed call may take when its `InjectedTool` says nothing."""


class Stop:
    """Set when a routed call is being cancelled (its deadline, the run cancelled or torn down).

    An async router awaits `wait()` (or checks `is_set()`); a sync router, in its worker
    thread, calls `wait_blocking(timeout)`.
    """

    __slots__ = ("_async", "_thread")

    def __init__(self) -> None:
        # The async side is made on first wait: a RoutedCall can be built outside a loop
        # (a host's own tests of its router).
        self._async: anyio.Event | None = None
        self._thread = threading.Event()

    def set(self) -> None:
        """Signal the router to stop (called on the event loop)."""
        self._thread.set()
        if self._async is not None:
            self._async.set()

    def is_set(self) -> bool:
        """Whether the call is being cancelled."""
        return self._thread.is_set()

    async def wait(self) -> None:
        """Return once the call is being cancelled."""
        if self._thread.is_set():
            return
        if self._async is None:
            self._async = anyio.Event()
        await self._async.wait()

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """From a worker thread: block until set (or `timeout`); returns whether it is set."""
        return self._thread.wait(timeout)


@dataclass(frozen=True, init=False)
class InjectedTool:
    """A tool a host puts in front of the model (see `ToolInjection`)."""

    name: str
    """The tool's name on its server."""
    input_schema: Mapping[str, Any]
    """JSON Schema of its arguments (an object schema); validation is against it."""
    description: str | None = None
    """What the model is told it does."""
    server: str = "local"
    """The server part of its id (`server/name`); the default policy action is
    `call server/name`."""
    mutates: bool = True
    """Whether a call may change the world (orders it after earlier calls)."""
    timeout: float = DEFAULT_ROUTE_TIMEOUT
    """The call's deadline in seconds: a router that overruns it is cancelled (IN_DOUBT)."""
    actions: Callable[[dict[str, Any]], list[Action]] | None = None
    """What a call touches, from its input, for the policy; default `call server/name`."""

    def __init__(self, name: str, input_schema: Mapping[str, Any],
                 description: str | None = None, server: str = "local", mutates: bool = True,
                 *, timeout: float = DEFAULT_ROUTE_TIMEOUT,
                 actions: Callable[[dict[str, Any]], list[Action]] | None = None) -> None:
        for key, value in (("name", name), ("input_schema", input_schema),
                           ("description", description), ("server", server),
                           ("mutates", bool(mutates)), ("timeout", timeout),
                           ("actions", actions)):
            object.__setattr__(self, key, value)

    @property
    def id(self) -> str:
        """`server/name`."""
        return f"{self.server}/{self.name}"


@dataclass(frozen=True, kw_only=True)
class RoutedCall:
    """A call that passed the gate, as the router receives it."""

    id: str
    """The model's call id."""
    tool_id: str
    """`server/name`."""
    input: dict[str, Any]
    """The validated arguments (what the policy judged and any approver saw)."""
    workspace: Path | None
    """The agent's workspace."""
    agent: str | None
    """The agent's name."""
    run_id: str | None
    """The run."""
    stop: Stop = field(default_factory=Stop)
    """Set when the call is being cancelled: stop, and return."""


@dataclass(frozen=True, kw_only=True)
class RoutedCapture:
    """What a routed call produced, as a program would: its bytes and an exit code."""

    stdout: bytes
    """The product."""
    stderr: bytes = b""
    """Diagnostics."""
    exit_code: int = 0
    """0 for success; anything else is an `is_error` result."""


@runtime_checkable
class ToolInjection(Protocol):
    """A host's tools: `tools()` declares them, `route()` answers them.

    ```python
    class Host:
        def tools(self) -> list[hr.InjectedTool]: ...
        async def route(self, call: hr.RoutedCall) -> hr.RoutedCapture | None: ...
    ```

    `route` may be sync (run in a worker thread) or async. Its duties: keep its own deadline
    short of the call's, report a vanished endpoint as a non-zero capture rather than hang,
    and watch `call.stop`.
    """

    def tools(self) -> list[InjectedTool]:
        """The tools offered now (read at the start of every turn)."""
        ...

    def route(self, call: RoutedCall) -> Any:
        """A `RoutedCapture`, or None to fall through to the registered tool of that id."""
        ...


def hand_over(capture: ProcessCapture, *, source: str) -> None:
    """Give the running call's disk record the raw bytes and exit status of `capture`."""
    slot = current_call()
    if slot is None:
        return
    slot.stdout = capture.stdout.raw()
    slot.stderr = capture.stderr.raw()
    slot.exit_code = capture.exit_code
    slot.signal = capture.signal
    slot.source = source


def capture_result(capture: ProcessCapture, record: str | None, *, source: str) -> ToolResult:
    """A program's (or a router's) capture as the model's result.

    The text is the envelope; a non-zero exit is `is_error`; `record` is the full record's
    path, named in any marker line.
    """
    content = ToolResult.text(capture.envelope(record)).content
    return ToolResult(content, None, capture.failed, {"handrail.source": source})


def _projection(own: Projection | None) -> Projection | None:
    slot = current_call()
    if own is not None:
        return own
    return slot.projection if slot is not None else None


class _Injected(SchemaTool):
    """One injected tool: validated against its own schema, answered by the router."""

    def __init__(self, tool: InjectedTool, injection: ToolInjection,
                 fallback: ToolImpl | None) -> None:
        spec = ToolSpec(ToolId.of(tool.id), tool.description or "", dict(tool.input_schema),
                        mutates=tool.mutates, timeout=tool.timeout)
        super().__init__(spec, self._route, origin=f"injected by {type(injection).__name__}")
        self.tool = tool
        self.injection = injection
        self.fallback = fallback

    def actions(self, validated: dict[str, Any]) -> list[Action]:
        """`call server/name`, or what the injected tool's `actions(input)` says."""
        if self.tool.actions is None:
            return [self.default_action()]
        acts = list(self.tool.actions(dict(validated)))
        if not acts or not all(isinstance(a, Action) for a in acts):
            raise UserError(f"injected tool '{self.spec.id}': actions() must return a "
                            "non-empty list of hr.Action")
        return acts

    async def _route(self, validated: dict[str, Any], ctx: CallContext) -> ToolResult:
        call = RoutedCall(id=ctx.call_id, tool_id=str(self.spec.id), input=dict(validated),
                          workspace=ctx.workspace, agent=ctx.agent, run_id=ctx.run_id)
        route = self.injection.route
        try:
            if inspect.iscoroutinefunction(route):
                out = await _stoppable(route(call), call.stop)
            else:
                out = await anyio.to_thread.run_sync(route, call, abandon_on_cancel=True)
                if inspect.isawaitable(out):
                    out = await _stoppable(out, call.stop)
        except anyio.get_cancelled_exc_class():
            call.stop.set()
            raise
        except ToolError:
            call.stop.set()
            raise  # the router said what happened (a transport's own disposition)
        except Exception as exc:  # boundary: a broken router is an error result, not a crash
            call.stop.set()
            raise ToolError(f"the router of '{self.spec.id}' raised {type(exc).__name__}: "
                            f"{exc}", disposition=Disposition.IN_DOUBT) from exc
        if out is None:
            return await self._fall_through(validated, ctx)
        if not isinstance(out, RoutedCapture):
            raise ToolError(f"the router of '{self.spec.id}' returned {type(out).__name__}, "
                            "not hr.RoutedCapture or None", disposition=Disposition.IN_DOUBT)
        capture = ProcessCapture.new(_projection(None), keep_full=_keeps_record())
        capture.stdout.feed(bytes(out.stdout))
        capture.stderr.feed(bytes(out.stderr))
        capture.exit_code = int(out.exit_code)
        hand_over(capture, source="injected")
        slot = current_call()
        return capture_result(capture, None if slot is None else slot.output_path,
                              source="injected")

    async def _fall_through(self, validated: dict[str, Any], ctx: CallContext) -> ToolResult:
        registered = self.fallback
        if registered is None:
            return ToolResult.error(f"There is no tool named {self.spec.id.model_name!r}.")
        slot = current_call()
        if slot is not None:
            slot.source = "registered"
        # The registered tool is held to its own schema and its own actions: what the gate
        # decided was about the injected one. Its actions must be what was decided, or be
        # allowed outright by the policy of this moment; anything needing a person is not
        # run from here.
        try:
            theirs = registered.validate(dict(validated))
        except InvalidArguments as exc:
            return ToolResult.error(f"The host declined this call and the registered tool "
                                    f"'{registered.spec.id}' refuses its arguments: {exc}")
        acts = registered.actions(theirs)
        if acts != self.actions(validated) and not all(ctx.permits(a) for a in acts):
            return ToolResult.error(
                f"The host declined this call and the registered tool '{registered.spec.id}' "
                "touches things the policy does not allow outright; nothing was done.")
        bound = registered.bind(theirs, ctx.workspace)
        result = await registered.execute(bound, ctx if registered.needs_context else None)
        return ToolResult(result.content, result.structured, result.is_error,
                          {**result.metadata, "handrail.source": "registered"})


STOP_GRACE_SECONDS = 1.0
"""How long an async router has, once `stop` is set, to return before it is cancelled."""


async def _stoppable(work: Awaitable[Any], stop: Stop) -> Any:
    """Await an async router; on cancellation set `stop` first, then cancel it.

    The router runs in a shielded scope, so a cancellation from outside reaches it as `stop`
    (it can finish what it is doing); after `STOP_GRACE_SECONDS` it is cancelled for real and
    the outside cancellation propagates.
    """
    box: list[Any] = []
    failure: list[BaseException] = []
    done = anyio.Event()
    shielded = anyio.CancelScope(shield=True)

    async def run() -> None:
        with shielded:
            try:
                box.append(await work)
            except Exception as exc:  # handed to the caller as it is
                failure.append(exc)
            finally:
                done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            stop.set()
            with anyio.move_on_after(STOP_GRACE_SECONDS, shield=True):
                await done.wait()
            shielded.cancel()
            raise
    if failure:
        raise failure[0]
    return box[0] if box else None


def _keeps_record() -> bool:
    slot = current_call()
    return slot is not None and slot.path is not None


class InjectionToolset:
    """The tools of one injection as `ToolImpl`s, over a registered toolbox (a `Toolset`).

    Impls are kept while a tool's declaration stays the same, so reading `tools()` every turn
    does not rebuild validators.
    """

    def __init__(self, injection: ToolInjection, registered: Toolbox | None = None) -> None:
        if not callable(getattr(injection, "tools", None)) or \
                not callable(getattr(injection, "route", None)):
            raise UserError(f"injection= takes an object with tools() and route(), not "
                            f"{type(injection).__name__}")
        self.injection = injection
        self.registered = registered if registered is not None else Toolbox()
        self._cache: dict[str, tuple[str, _Injected]] = {}

    def declared(self) -> list[InjectedTool]:
        """`tools()`, checked: InjectedTools with distinct ids."""
        declared = self.injection.tools()
        if isinstance(declared, str | bytes) or not isinstance(declared, Iterable):
            raise UserError(f"{type(self.injection).__name__}.tools() must return a list of "
                            f"hr.InjectedTool, got {type(declared).__name__}")
        out = list(declared)
        seen: set[str] = set()
        for item in out:
            if not isinstance(item, InjectedTool):
                raise UserError(f"{type(self.injection).__name__}.tools() returned "
                                f"{item!r}, not an hr.InjectedTool")
            if item.id in seen:
                raise UserError(f"{type(self.injection).__name__}.tools() declares "
                                f"'{item.id}' twice; each injected tool needs its own id")
            seen.add(item.id)
        return out

    def impls(self) -> list[ToolImpl]:
        """This turn's injected tools (reads `tools()`)."""
        out: list[ToolImpl] = []
        cache: dict[str, tuple[str, _Injected]] = {}
        for tool in self.declared():
            key = json.dumps([tool.name, tool.server, tool.description, tool.mutates,
                              tool.timeout, id(tool.actions), tool.input_schema],
                             sort_keys=True, default=repr)
            hit = self._cache.get(tool.id)
            fallback = _registered(self.registered, tool.id)
            if hit is None or hit[0] != key or hit[1].fallback is not fallback:
                hit = (key, _Injected(tool, self.injection, fallback))
            cache[tool.id] = hit
            out.append(hit[1])
        self._cache = cache
        return out


def _registered(box: Toolbox, tool_id: str) -> ToolImpl | None:
    try:
        return box.get(tool_id)
    except UnknownTool:
        return None


def merged_toolbox(injected: InjectionToolset, registered: Toolbox | None = None) -> Toolbox:
    """This turn's toolbox: the injected tools, and every registered tool they do not shadow.

    `registered` replaces the agent's toolbox when its tools changed (`Toolbox.refreshed`).
    """
    mine = injected.impls()
    ids = {str(i.spec.id) for i in mine}
    registered = registered if registered is not None else injected.registered
    kept = [i for i in registered.impls() if str(i.spec.id) not in ids]
    return Toolbox([*mine, *kept], max_argument_bytes=registered.max_argument_bytes)

