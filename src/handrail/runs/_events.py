"""The events of a run, and `agent.run_stream(...)`: the same events as an async iterator.

Every `RunEvent` has a `kind` and a `detail` dict whose keys depend on the kind:

- `text_delta`: the model streams text (a `StreamingModel`) -- `text`.
- `call_started`: the model starts streaming a call -- `call_id`, `name`.
- `model_turn`: a model turn is complete -- `text`, `calls` (model-facing names).
- `usage`: after each model turn -- `input_tokens`, `output_tokens` (the turn's),
  `total_input_tokens`, `total_output_tokens` (the run's so far).
- `call_planned`: a call of the turn goes to the gate -- `call_id`, `name`, `arguments`
  (JSON text, at most 2000 characters).
- `call_finished`: a call has its verdict and result -- `call_id`, `tool`, `status`,
  `verdict` (allow/ask/deny or None), `decision` (approve/deny or None), `duration`
  (seconds, or None when the body never ran), `result` (text, at most 2000 characters),
  `error`.
- `call_progress`: a running tool reported progress (`ctx.report_progress`; an MCP server's
  progress notifications) -- `call_id`, `tool`, `progress`, `total`, `message`.
- `call_event`: a tool kept an event in the run's record (`ctx.record_event`, e.g. an MCP
  server restarted) -- `call_id`, `tool`, `event` (its kind), and the event's own keys.
- `verification`: a final answer was checked (`verify=`; docs/verify.md) -- the attempt:
  `attempt`, `passed`, `reason`, `exit_code`, `output`, `call_id`, `turn`, `at`.
- `paused`: the run waits for a person -- `outcome` (the outcome as a dict).
- `finished`: the run completed, failed or was cancelled -- `outcome`.

Everything in a detail that a model or a tool wrote is shown as it was written (bounded in
size): a display escapes it (`hr.TerminalPrinter` does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from handrail.errors import UserError
from handrail.runs._program import confinement_note, program_of, result_confinement

if TYPE_CHECKING:
    from handrail.runs._agent import RunEvent
    from handrail.runs._outcome import RunResult

__all__ = ["CallFinishedDetail", "CallPlannedDetail", "EventKind", "RunStream", "UsageDetail",
           "call_detail", "planned_detail"]

EventKind = Literal["text_delta", "call_started", "model_turn", "usage", "call_planned",
                    "call_finished", "call_progress", "call_event", "verification", "paused",
                    "finished"]
"""Every kind of `RunEvent` (see the module docstring for each one's detail)."""

MAX_DETAIL_TEXT = 2000


class CallPlannedDetail(TypedDict):
    """`RunEvent.detail` of a `call_planned` event."""

    call_id: str
    """The model's call id."""
    name: str
    """The tool name as the model sent it."""
    arguments: str | None
    """The arguments as the model wrote them (JSON text, at most 2000 characters)."""


class CallFinishedDetail(TypedDict):
    """`RunEvent.detail` of a `call_finished` event."""

    call_id: str
    """The model's call id."""
    tool: str
    """The resolved tool id (or the model's name for a tool nobody offers)."""
    status: str
    """The call record's status (`finished`, `failed`, `refused`...)."""
    verdict: str | None
    """The policy's effect (`allow`, `ask`, `deny`), None when no policy decided."""
    decision: str | None
    """The approver's decision (`approve`, `deny`), None when nobody was asked."""
    duration: float | None
    """Seconds the body ran, None when it never ran."""
    result: str | None
    """The result's text as the model sees it (at most 2000 characters)."""
    error: str | None
    """The operator-facing error, if any."""
    program: dict[str, Any] | None
    """For a call that ran a program (`exec`): `exit_code`, `timed_out`, `note`, and the
    last lines of `stdout` and `stderr` (at most 2000 characters each); else None."""
    sandbox: str | None
    """A warning when the call's program ran unconfined, or with policy denies the sandbox
    could not enforce (what to install); None when it was confined, or ran no program."""


class UsageDetail(TypedDict):
    """`RunEvent.detail` of a `usage` event."""

    input_tokens: int
    """Tokens the turn's request sent."""
    output_tokens: int
    """Tokens the turn's answer used."""
    total_input_tokens: int
    """The run's input tokens so far."""
    total_output_tokens: int
    """The run's output tokens so far."""





def _bounded(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_DETAIL_TEXT:
        return text
    return text[:MAX_DETAIL_TEXT] + f"... ({len(text)} chars)"


def planned_detail(call: Any) -> CallPlannedDetail:
    """`call_planned` detail of a model's `ToolCall`."""
    return {"call_id": call.id, "name": call.name, "arguments": _bounded(call.arguments)}


def call_detail(record: Any) -> CallFinishedDetail:
    """`call_finished` detail of a `CallRecord`."""
    duration = (record.ended_at - record.started_at
                if record.started_at is not None and record.ended_at is not None else None)
    result = record.result
    text = None
    if isinstance(result, dict):
        text = "".join(str(c.get("text", "")) for c in result.get("content", ())
                       if isinstance(c, dict))
    return {"call_id": record.call_id, "tool": record.tool or record.model_name,
            "status": record.status.value,
            "verdict": (record.verdict or {}).get("effect"),
            "decision": (record.decision or {}).get("kind"),
            "duration": duration, "result": _bounded(text), "error": _bounded(record.error),
            "program": _program_detail(result),
            "sandbox": confinement_note(result_confinement(result))}


def _program_detail(result: Any) -> dict[str, Any] | None:
    program = program_of(result)
    if program is None:
        return None
    # The end of the output is what a person looks at first (the error, the summary).
    return {**program, "stdout": program["stdout"][-MAX_DETAIL_TEXT:],
            "stderr": program["stderr"][-MAX_DETAIL_TEXT:]}


Start = Callable[[Callable[["RunEvent"], Awaitable[None]]], Awaitable["RunResult"]]


class RunStream:
    """A run whose events are read as an async iterator; `result` once it has ended.

    ```python
    async with agent.run_stream("pay the invoice", store=store) as stream:
        async for event in stream:
            print(event.kind, event.detail)
    print(stream.result.outcome)
    ```

    The run waits for the reader (a bounded buffer), so a slow reader slows it rather than
    filling memory. Leaving the block normally lets the run finish (its remaining events
    are dropped); leaving it with an exception cancels the run like any outside
    cancellation (it stays READY in the store; `hr.resume` continues it).
    """

    def __init__(self, start: Start, on_event: Callable[[RunEvent], Any] | None,
                 buffer: int = 256) -> None:
        self._start = start
        self._on_event = on_event
        self._buffer = buffer
        self._result: RunResult | None = None
        self._receive: MemoryObjectReceiveStream[RunEvent] | None = None
        self._group: Any = None

    @property
    def result(self) -> RunResult:
        """The run's result.

        Raises:
            UserError: the run has not ended yet (read every event first).
        """
        if self._result is None:
            raise UserError("the run has not ended yet: read the stream to its end first")
        return self._result

    async def __aenter__(self) -> RunStream:
        send, receive = anyio.create_memory_object_stream["RunEvent"](self._buffer)
        self._receive = receive
        on_event = self._on_event

        async def forward(event: RunEvent) -> None:
            if on_event is not None:
                out = on_event(event)
                if out is not None:
                    await out
            try:
                await send.send(event)
            except anyio.BrokenResourceError:
                pass  # the reader left the block: the run finishes without it

        async def drive() -> None:
            async with send:
                self._result = await self._start(forward)

        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(drive)
        return self

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self

    async def __anext__(self) -> RunEvent:
        if self._receive is None:
            raise UserError("iterate a run stream inside `async with agent.run_stream(...)`")
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        assert self._receive is not None
        self._receive.close()
        try:  # an exception from the block cancels the run (the task group does)
            return bool(await self._group.__aexit__(exc_type, exc, tb))
        except BaseExceptionGroup as group:
            # The loop's own exception, as itself (callers catch ModelError, UserError...).
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

