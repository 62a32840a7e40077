"""The spans and metrics of one pair of providers: what the loop and the gate call.

Span names and attributes follow the OpenTelemetry GenAI semantic conventions:

- `invoke_agent {agent}`: one segment of a run (a run paused for a person and resumed, maybe
  in another process, is two segments; the second links to the first, whose span context the
  run keeps in its events as `{"kind": "trace", "traceparent": ...}`);
- `chat {model}`: one model request, a child of its segment;
- `execute_tool {tool}`: one call through the gate (planned, decided, run or refused), a child
  of its segment and the parent of whatever the tool's body traces.

handrail's own attributes say what the gate decided: `handrail.verdict`, `handrail.rule`,
`handrail.layer`, `handrail.decision`, `handrail.decided_by`, `handrail.disposition`,
`handrail.run_id`. Everything here runs only when a run reports; `opentelemetry` is imported
by the first `Instrumentation`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from handrail.models import ModelResponse, ToolCall, dump_messages
from handrail.store import CallRecord, CallStatus, PendingItem, RunRecord

__all__ = ["MAX_CONTENT_CHARS", "CallState", "Instrumentation", "resumed_from"]

MAX_CONTENT_CHARS = 32 * 1024
"""The most characters of captured content one attribute holds (a model or a tool decides how
much it writes; a span exporter should not have to carry megabytes of it)."""

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
"""`gen_ai.client.token.usage` boundaries, as the semantic conventions advise."""
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
"""`gen_ai.client.operation.duration` boundaries (seconds), as the conventions advise."""
WAIT_BUCKETS = (0.1, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400)
"""`handrail.approval.wait` boundaries (seconds): a person answers in seconds or in days."""

_T = TypeVar("_T")
_SETTLED = (CallStatus.FINISHED, CallStatus.REFUSED)


class CallState(Protocol):
    """What the gate's per-call state shows the instrumentation (`gate._Call`)."""

    call: ToolCall
    record: CallRecord
    began: bool
    span: Any
    """The call's `execute_tool` span while it is open; None otherwise."""

    @property
    def result(self) -> Any:
        """The call's `ToolResult` once it has one."""


def resumed_from(events: Sequence[dict[str, Any]]) -> str | None:
    """The traceparent of the segment that ran last (the one that paused), if it reported."""
    for event in reversed(events):
        if event.get("kind") == "trace":
            value = event.get("traceparent")
            return value if isinstance(value, str) else None
    return None


class Instrumentation:
    """A tracer and the metric instruments of one pair of providers.

    Shared by every run reporting to them; its methods are the other half of the hook sites.
    """

    def __init__(self, tracer_provider: Any, meter_provider: Any, *,
                 capture_content: bool) -> None:
        from opentelemetry import metrics, trace

        self.capture_content = capture_content
        tracer_provider = tracer_provider or trace.get_tracer_provider()
        meter_provider = meter_provider or metrics.get_meter_provider()
        self.tracer = tracer_provider.get_tracer("handrail", _version())
        meter = meter_provider.get_meter("handrail", _version())
        self.calls = meter.create_counter(
            "handrail.calls", unit="{call}",
            description="Tool calls settled by the gate (refused or finished), by verdict, "
                        "decision and disposition")
        self.wait = meter.create_histogram(
            "handrail.approval.wait", unit="s",
            description="How long a call waited for a person's decision (approval, answer "
                        "or recovery)", explicit_bucket_boundaries_advisory=WAIT_BUCKETS)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)

    # ------------------------------------------------------------ a run's segment

    async def agent_segment(self, run: RunRecord, agent: str | None, model: str,
                            body: Callable[[], Awaitable[_T]]) -> _T:
        """Drive `body` (one segment of `run`) inside its `invoke_agent` span.

        The span's context goes into the run's events (written with the run's next write),
        so a resume in any process can link its segment to this one.
        """
        from opentelemetry import trace

        provider, model_name = split_model(model)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": provider,
            "gen_ai.request.model": model_name, "gen_ai.conversation.id": run.id,
            "handrail.run_id": run.id}
        if agent:
            attributes["gen_ai.agent.name"] = agent
        links = []
        previous = resumed_from(run.events)
        if previous is not None:
            context = _span_context(previous)
            if context is not None:
                links.append(trace.Link(context, {"handrail.link": "resumed_from"}))
        attributes["handrail.resumed"] = previous is not None or any(
            e.get("kind") == "resumed" for e in run.events)
        name = f"invoke_agent {agent}" if agent else "invoke_agent"
        with self.tracer.start_as_current_span(name, kind=trace.SpanKind.INTERNAL,
                                               attributes=attributes, links=links) as span:
            traceparent = _traceparent(span.get_span_context())
            if traceparent is not None:
                run.events.append({"kind": "trace", "traceparent": traceparent,
                                   "at": time.time()})
            tokens = (run.input_tokens, run.output_tokens)
            result = await body()
            outcome: Any = getattr(result, "outcome", None)
            usage: Any = getattr(result, "usage", None)
            span.set_attribute("handrail.run.outcome", str(getattr(outcome, "kind", "")))
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens - tokens[0])
                span.set_attribute("gen_ai.usage.output_tokens",
                                   usage.output_tokens - tokens[1])
            if getattr(outcome, "kind", None) == "failed":
                span.set_status(trace.StatusCode.ERROR, str(getattr(outcome, "error", ""))[:1000])
                span.set_attribute("error.type", "run_failed")
            return result

    # ------------------------------------------------------------ a model request

    async def chat(self, model: str, messages: Sequence[Any],
                   request: Callable[[], Awaitable[ModelResponse]]) -> ModelResponse:
        """One model request inside its `chat {model}` span; records its tokens and time."""
        from opentelemetry import trace

        provider, model_name = split_model(model)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat",
                                      "gen_ai.provider.name": provider,
                                      "gen_ai.request.model": model_name}
        metric: dict[str, Any] = dict(attributes)
        started = time.perf_counter()
        with self.tracer.start_as_current_span(f"chat {model_name}", kind=trace.SpanKind.CLIENT,
                                               attributes=attributes) as span:
            if self.capture_content and span.is_recording():
                span.set_attribute("gen_ai.input.messages", _messages_json(messages))
            try:
                response = await request()
            except BaseException as exc:
                metric["error.type"] = type(exc).__qualname__
                span.set_attribute("error.type", metric["error.type"])
                self.duration.record(time.perf_counter() - started, metric)
                raise
            if response.model:
                metric["gen_ai.response.model"] = response.model
                span.set_attribute("gen_ai.response.model", response.model)
            if response.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
            counts = {"input": _count(getattr(response.usage, "input_tokens", None)),
                      "output": _count(getattr(response.usage, "output_tokens", None))}
            for kind, count in counts.items():
                if count is not None:
                    span.set_attribute(f"gen_ai.usage.{kind}_tokens", count)
                    self.tokens.record(count, {**metric, "gen_ai.token.type": kind})
            if self.capture_content and span.is_recording():
                span.set_attribute("gen_ai.output.messages", _messages_json(
                    [response.message], finish_reason=response.finish_reason))
        self.duration.record(time.perf_counter() - started, metric)
        return response

    # ------------------------------------------------------------ the gate's calls

    def calls_started(self, states: Sequence[CallState]) -> None:
        """Open each call's `execute_tool` span (a child of the current segment)."""
        from opentelemetry import trace

        for state in states:
            if state.record.result is not None:
                continue  # settled by an earlier segment: reused, nothing happens to it now
            call = state.call
            state.span = self.tracer.start_span(
                f"execute_tool {call.name}", kind=trace.SpanKind.INTERNAL,
                attributes={"gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id,
                            "gen_ai.tool.type": "function",
                            "handrail.run_id": state.record.run_id})

    def traced(self, act: Callable[[Any], Awaitable[None]]
               ) -> Callable[[Any], Awaitable[None]]:
        """`act` run with its call's span as the current one (the tool's own spans nest)."""
        from opentelemetry.trace import use_span

        async def act_in_span(state: Any) -> None:
            span = state.span
            if span is None:
                await act(state)
                return
            with use_span(span, end_on_exit=False, record_exception=False,
                          set_status_on_exception=False):
                await act(state)

        return act_in_span

    def calls_ended(self, states: Sequence[CallState]) -> None:
        """Close each call's span with what the gate decided; count the settled calls."""
        from opentelemetry.trace import StatusCode

        for state in states:
            span, state.span = state.span, None
            if span is None:
                continue
            record = state.record
            attributes = call_attributes(record)
            if record.tool:  # resolved: the tool's id rather than its model-facing spelling
                attributes["gen_ai.tool.name"] = record.tool
                span.update_name(f"execute_tool {record.tool}")
            span.set_attributes(attributes)
            result = state.result
            failed = _failure(record, result)
            if failed is not None:
                span.set_attribute("error.type", failed)
                span.set_status(StatusCode.ERROR, (record.error or failed)[:1000])
            # Only a call whose body was entered was sent as asked: a refused call's
            # arguments (a write's content) never leave the process.
            if self.capture_content and state.began and span.is_recording():
                span.set_attribute("gen_ai.tool.call.arguments", _capped(
                    record.performed_arguments if record.performed_arguments is not None
                    else record.arguments))
                if record.result is not None:
                    span.set_attribute("gen_ai.tool.call.result", _capped(record.result))
            span.end()
            if result is not None and record.status in _SETTLED:
                self.calls.add(1, {k: v for k, v in attributes.items() if k in _CALL_METRIC})

    async def decide(self, state: CallState, approver: Any, request: Any) -> Any:
        """An approver's live decision, its waiting time recorded (a deferral is not one)."""
        started = time.monotonic()
        decision = await approver.decide(request)
        kind = getattr(decision, "kind", None)
        if kind in ("approve", "deny"):
            decided_by = getattr(approver, "name", None) or type(approver).__name__
            self._waited(state, time.monotonic() - started, "approval", kind, str(decided_by))
        return decision

    def waited(self, state: CallState, item: PendingItem | None) -> None:
        """A resumed call whose pending item a person has decided: how long it waited."""
        if item is None or item.state == "open" or item.decided_at is None:
            return
        if state.record.status not in (CallStatus.AWAITING_APPROVAL, CallStatus.AWAITING_ANSWER,
                                       CallStatus.IN_DOUBT):
            return  # its decision was applied by an earlier segment: counted there
        kind = (item.decision or {}).get("kind") or ("answer" if item.kind == "question" else "")
        self._waited(state, max(0.0, item.decided_at - item.created_at), item.kind, str(kind),
                     item.decided_by or "operator")

    def _waited(self, state: CallState, seconds: float, kind: str, decision: str,
                decided_by: str) -> None:
        self.wait.record(seconds, {"handrail.pending.kind": kind, "handrail.decision": decision,
                                   "gen_ai.tool.name": state.record.tool or state.call.name})
        span = state.span
        if span is not None:
            span.set_attribute("handrail.wait_seconds", seconds)


_CALL_METRIC = frozenset({"gen_ai.tool.name", "handrail.verdict", "handrail.decision",
                          "handrail.disposition", "handrail.call.status"})
"""The attributes `handrail.calls` is counted by (the rest would make a series per call)."""


def call_attributes(record: CallRecord) -> dict[str, Any]:
    """What the gate decided about a call, as `handrail.*` attributes."""
    out: dict[str, Any] = {"handrail.call.status": record.status.value}
    if record.tool:
        out["handrail.tool.id"] = record.tool
    verdict = record.verdict or {}
    effect = verdict.get("effect")
    if isinstance(effect, str):
        out["handrail.verdict"] = effect
    rule = verdict.get("rule")
    if isinstance(rule, dict):
        out["handrail.rule"] = " ".join(str(rule.get(k, "")) for k in ("effect", "act",
                                                                         "pattern"))
    layer = verdict.get("layer")
    if isinstance(layer, str):
        out["handrail.layer"] = layer
    if verdict.get("taint"):
        out["handrail.tainted"] = True
    control = verdict.get("control")
    if isinstance(control, dict) and isinstance(control.get("decision"), str):
        out["handrail.control"] = control["decision"]
        if "handrail.verdict" not in out and control["decision"] == "refuse":
            out["handrail.verdict"] = "refuse"
    decision = (record.decision or {}).get("kind")
    if isinstance(decision, str):
        out["handrail.decision"] = decision
    if record.decided_by:
        out["handrail.decided_by"] = record.decided_by
    if record.disposition:
        out["handrail.disposition"] = record.disposition
    return out


def _failure(record: CallRecord, result: Any) -> str | None:
    """The `error.type` of a call that failed; None when it did not, or a guard refused it.

    A refusal by the policy, a person, the tool control or the manifest is the gate working,
    not an error; an unknown tool, invalid arguments or a tool that failed are errors.
    """
    if result is None or not getattr(result, "is_error", False):
        return None
    if record.status is CallStatus.FINISHED:
        return record.disposition or "tool_error"
    verdict = record.verdict or {}
    if verdict.get("effect") == "deny" or (record.decision or {}).get("kind") == "deny" \
            or (verdict.get("control") or {}).get("decision") == "refuse" \
            or (record.error or "").endswith("is not granted by the manifest"):
        return None
    return "refused"


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("handrail")
    except PackageNotFoundError:
        return None


def split_model(name: str) -> tuple[str, str]:
    """`"openai:gpt-4.1-mini"` -> (`"openai"`, `"gpt-4.1-mini"`); a bare name is both."""
    provider, sep, model = name.partition(":")
    return (provider, model) if sep and provider and model else (name, name)


def _count(value: Any) -> int | None:
    # A model reports its own usage: only a plausible count becomes an attribute.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53:
        return value
    return None


def _capped(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                            default=str)
    if len(text) <= MAX_CONTENT_CHARS:
        return text
    return text[:MAX_CONTENT_CHARS] + f"... [{len(text) - MAX_CONTENT_CHARS} more characters]"


_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool_result": "tool"}


def _messages_json(messages: Sequence[Any], finish_reason: str | None = None) -> str:
    """Messages in the conventions' JSON shape (`gen_ai.input.messages` / `output.messages`).

    A tool-call part keeps its id and name, never its arguments: they are those of a call the
    gate may yet refuse (a write's content), and a performed call's arguments are on its own
    `execute_tool` span.
    """
    out: list[dict[str, Any]] = []
    for message in dump_messages(messages):
        kind = message["kind"]
        parts: list[dict[str, Any]]
        if kind in ("system", "user"):
            parts = [{"type": "text", "content": message["text"]}]
        elif kind == "tool_result":
            parts = [{"type": "tool_call_response", "id": message["call_id"],
                      "response": message["result"]}]
        else:
            parts = []
            for part in message["parts"]:
                if part["kind"] == "text":
                    parts.append({"type": "text", "content": part["text"]})
                elif part["kind"] == "tool_call":
                    parts.append({"type": "tool_call", "id": part["id"], "name": part["name"]})
                elif part["kind"] == "thinking" and not part.get("redacted"):
                    parts.append({"type": "reasoning", "content": part["text"]})
        entry: dict[str, Any] = {"role": _ROLES.get(kind, kind), "parts": parts}
        if finish_reason is not None:
            entry["finish_reason"] = finish_reason
        out.append(entry)
    return _capped(out)


def _traceparent(context: Any) -> str | None:
    """A span context as a W3C `traceparent` (what the run keeps; None if invalid)."""
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _span_context(traceparent: str) -> Any:
    """The inverse of `_traceparent`, or None for anything malformed (a record is data)."""
    from opentelemetry.trace import SpanContext, TraceFlags

    parts = traceparent.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16 \
            or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
