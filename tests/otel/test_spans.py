"""OpenTelemetry spans and metrics of runs, model requests and tool calls (issue 20).

The cross-process tests drive `traced.py` (an allowed, a denied and a deferred call) in one
process and decide the deferred call in another, each reporting to the SDK's in-memory
exporters; the rest run in this process with providers given to `hr.Telemetry`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import handrail as hr
from handrail.models import (
    AssistantMessage,
    ModelResponse,
    Scripted,
    TextPart,
    Usage,
    call,
    calls,
    reply,
)

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("traced.py")
SECRETS = ("REFUSED-SECRET", "DEFERRED-CONTENT", "hello from notes")


def _drive(tmp_path: Path, *args: str) -> dict[str, Any]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text("hello from notes")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "runs.db"),
                           str(workspace), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _paused_and_resumed(tmp_path: Path, decision: str, *flags: str,
                        first: Sequence[str] = ("--global",)) -> tuple[dict[str, Any],
                                                                        dict[str, Any]]:
    paused = _drive(tmp_path, "start", *first, *flags)
    assert paused["outcome"] == "awaiting_approval", paused
    resumed = _drive(tmp_path, "decide", paused["request_id"], decision, *flags)
    assert resumed["pid"] != paused["pid"]
    return paused, resumed


def _one(spans: list[dict[str, Any]], name: str, **attributes: Any) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (name, attributes, [s["name"] for s in spans])
    return found[0]


def _points(metrics: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [m for m in metrics if m["name"] == name]


def test_a_deferred_call_resumed_in_another_process_gives_the_expected_span_tree(
        tmp_path: Path) -> None:
    paused, resumed = _paused_and_resumed(tmp_path, "approve")
    run_id = paused["run_id"]
    assert resumed["run_id"] == run_id and resumed["outcome"] == "completed"

    # The first segment: the run's span, its model request and its three calls under it.
    spans = paused["spans"]
    agent = _one(spans, "invoke_agent traced")
    assert agent["parent"] is None and agent["links"] == []
    assert agent["attributes"] | {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "traced",
        "handrail.run_id": run_id, "gen_ai.provider.name": "scripted",
        "handrail.run.outcome": "awaiting_approval", "handrail.resumed": False,
    } == agent["attributes"]
    chat = _one(spans, "chat scripted")
    assert chat["parent"] == agent["span_id"] and chat["kind"] == "CLIENT"
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.request.model"] == "scripted"
    assert chat["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert chat["attributes"]["gen_ai.usage.input_tokens"] == 0
    read = _one(spans, "execute_tool workspace/read_file")
    denied = _one(spans, "execute_tool workspace/write_file", **{"handrail.verdict": "deny"})
    deferred = _one(spans, "execute_tool workspace/write_file", **{"handrail.verdict": "ask"})
    for span in (read, denied, deferred):
        assert span["parent"] == agent["span_id"]
        assert span["trace_id"] == agent["trace_id"]
        assert span["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert span["attributes"]["handrail.run_id"] == run_id
    assert read["attributes"] | {"gen_ai.tool.name": "workspace/read_file",
                                 "gen_ai.tool.call.id": "call_0_0", "handrail.verdict": "allow",
                                 "handrail.call.status": "finished"} == read["attributes"]
    assert denied["attributes"] | {
        "gen_ai.tool.call.id": "call_0_1", "handrail.rule": "deny write .env",
        "handrail.layer": "secrets", "handrail.disposition": "not_sent",
        "handrail.call.status": "refused"} == denied["attributes"]
    assert denied["status"] == "UNSET"  # a guard refusing is the gate working, not an error
    assert deferred["attributes"] | {
        "gen_ai.tool.call.id": "call_0_2", "handrail.decision": "defer",
        "handrail.decided_by": "defer", "handrail.call.status": "awaiting_approval",
    } == deferred["attributes"]
    assert "handrail.disposition" not in deferred["attributes"]
    assert len(spans) == 5

    # The second segment, another process: a new trace whose root links to the paused span.
    spans = resumed["spans"]
    again = _one(spans, "invoke_agent traced")
    assert again["parent"] is None
    assert again["links"] == [{"trace_id": agent["trace_id"], "span_id": agent["span_id"],
                               "attributes": {"handrail.link": "resumed_from"}}]
    assert again["attributes"]["handrail.resumed"] is True
    assert again["attributes"]["handrail.run.outcome"] == "completed"
    approved = _one(spans, "execute_tool workspace/write_file")
    assert approved["parent"] == again["span_id"]
    assert approved["attributes"] | {
        "gen_ai.tool.call.id": "call_0_2", "handrail.verdict": "ask",
        "handrail.decision": "approve", "handrail.decided_by": "alice",
        "handrail.call.status": "finished"} == approved["attributes"]
    assert approved["attributes"]["handrail.wait_seconds"] > 0
    assert _one(spans, "chat scripted")["parent"] == again["span_id"]
    # The calls settled in the first segment are reused, not traced again.
    assert len(spans) == 3
    # The run keeps each segment's span context, so any process can link to it.
    traces = [e["traceparent"][:-3] for e in resumed["events"] if e["kind"] == "trace"]
    assert traces == [f"00-{agent['trace_id']}-{agent['span_id']}",
                      f"00-{again['trace_id']}-{again['span_id']}"]


def test_metrics_count_calls_by_verdict_and_disposition_and_time_the_wait(
        tmp_path: Path) -> None:
    paused, resumed = _paused_and_resumed(tmp_path, "approve")
    calls = {tuple(sorted(p["attributes"].items())): p["value"]
             for p in _points(paused["metrics"], "handrail.calls")}
    assert calls == {
        (("gen_ai.tool.name", "workspace/read_file"), ("handrail.call.status", "finished"),
         ("handrail.verdict", "allow")): 1,
        (("gen_ai.tool.name", "workspace/write_file"), ("handrail.call.status", "refused"),
         ("handrail.disposition", "not_sent"), ("handrail.verdict", "deny")): 1,
    }  # the deferred call is counted once it settles, in the process that settles it
    assert _points(paused["metrics"], "handrail.approval.wait") == []
    calls = {tuple(sorted(p["attributes"].items())): p["value"]
             for p in _points(resumed["metrics"], "handrail.calls")}
    assert calls == {
        (("gen_ai.tool.name", "workspace/write_file"), ("handrail.call.status", "finished"),
         ("handrail.decision", "approve"), ("handrail.verdict", "ask")): 1}
    [wait] = _points(resumed["metrics"], "handrail.approval.wait")
    assert wait["unit"] == "s" and wait["count"] == 1
    assert wait["attributes"] == {"handrail.pending.kind": "approval",
                                  "handrail.decision": "approve",
                                  "gen_ai.tool.name": "workspace/write_file"}
    event_times = [e["at"] for e in resumed["events"] if e["kind"] in ("trace", "resumed")]
    assert 0 < wait["sum"] < event_times[-1] - event_times[0] + 1


def test_no_content_is_captured_by_default(tmp_path: Path) -> None:
    paused, resumed = _paused_and_resumed(tmp_path, "approve", first=())
    text = json.dumps([paused["spans"], resumed["spans"]])
    for secret in SECRETS:
        assert secret not in text
    for key in ("gen_ai.input.messages", "gen_ai.output.messages",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"):
        assert key not in text


def test_captured_content_never_holds_a_refused_write(tmp_path: Path) -> None:
    paused, resumed = _paused_and_resumed(tmp_path, "approve", "--capture")
    first, second = json.dumps(paused["spans"]), json.dumps(resumed["spans"])
    # Captured: the messages, and the arguments and result of each call that ran.
    read = _one(paused["spans"], "execute_tool workspace/read_file")
    assert json.loads(read["attributes"]["gen_ai.tool.call.arguments"])["path"] == "notes.txt"
    assert "hello from notes" in read["attributes"]["gen_ai.tool.call.result"]
    chat = _one(paused["spans"], "chat scripted")
    assert json.loads(chat["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "note things"}]}]
    approved = _one(resumed["spans"], "execute_tool workspace/write_file")
    assert "DEFERRED-CONTENT" in approved["attributes"]["gen_ai.tool.call.arguments"]
    # Never: the refused write's content, nor a deferred one's before it was performed.
    assert "REFUSED-SECRET" not in first + second
    assert "DEFERRED-CONTENT" not in first
    output = json.loads(chat["attributes"]["gen_ai.output.messages"])
    assert output[0]["parts"][1] == {"type": "tool_call", "id": "call_0_1",
                                     "name": "workspace--write_file"}


def test_a_write_a_person_denies_is_never_captured(tmp_path: Path) -> None:
    paused, resumed = _paused_and_resumed(tmp_path, "deny", "--capture")
    assert resumed["outcome"] == "completed"
    denied = _one(resumed["spans"], "execute_tool workspace/write_file")
    assert denied["attributes"]["handrail.decision"] == "deny"
    assert denied["attributes"]["handrail.decided_by"] == "alice"
    assert denied["status"] == "UNSET"
    text = json.dumps([paused["spans"], resumed["spans"]])
    assert "REFUSED-SECRET" not in text and "DEFERRED-CONTENT" not in text


# ------------------------------------------------------------------ in this process


class _Reporting:
    def __init__(self, *, capture_content: bool = False) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.telemetry = hr.Telemetry(tracer_provider=self.tracer_provider,
                                      meter_provider=self.meter_provider,
                                      capture_content=capture_content)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        [found] = [s for s in self.spans() if s.name == name]
        return found

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [p for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
                if m.name == name for p in m.data.data_points]


class _Counting:
    """A model that reports usage (the scripted one reports none)."""

    name = "acme:counter-1"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.turn = 0

    async def request(self, messages: Sequence[Any], tools: Sequence[Any],
                      settings: Any = None) -> ModelResponse:
        if self.fail:
            raise hr.ModelError("the provider is down")
        self.turn += 1
        return ModelResponse(AssistantMessage((TextPart("done"),)), Usage(120, 7),
                             "stop", "counter-1-2026")


async def test_a_model_request_reports_its_tokens_and_provider() -> None:
    reporting = _Reporting()
    agent = hr.Agent(_Counting(), [], telemetry=reporting.telemetry)
    result = await agent.run("count")
    assert result.output == "done"
    chat = reporting.span("chat counter-1")
    attributes = dict(chat.attributes or {})
    assert attributes | {"gen_ai.provider.name": "acme", "gen_ai.request.model": "counter-1",
                         "gen_ai.response.model": "counter-1-2026",
                         "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 7,
                         "gen_ai.response.finish_reasons": ("stop",)} == attributes
    tokens = {p.attributes["gen_ai.token.type"]: (p.count, p.sum)
              for p in reporting.points("gen_ai.client.token.usage")}
    assert tokens == {"input": (1, 120), "output": (1, 7)}
    agent_span = reporting.span("invoke_agent")
    assert dict(agent_span.attributes or {})["gen_ai.usage.input_tokens"] == 120


async def test_errors_set_the_status_of_their_span() -> None:
    reporting = _Reporting()
    result = await hr.Agent(_Counting(fail=True), [], telemetry=reporting.telemetry).run("x")
    assert result.outcome.kind == "failed"
    chat = reporting.span("chat counter-1")
    assert chat.status.status_code is trace.StatusCode.ERROR
    assert dict(chat.attributes or {})["error.type"] == "ModelError"
    run = reporting.span("invoke_agent")
    assert run.status.status_code is trace.StatusCode.ERROR
    assert "the provider is down" in (run.status.description or "")

    @hr.tool(mutates=False)
    async def broken() -> str:
        """Fail."""
        raise hr.ToolFailed("the disk is full")

    reporting = _Reporting()
    agent = hr.Agent(Scripted([call("local/broken", {}), call("local/nope", {}), reply("ok")]),
                     [broken], telemetry=reporting.telemetry)
    await agent.run("break")
    failed = reporting.span("execute_tool local/broken")
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "landed"
    unknown = reporting.span("execute_tool nope")
    assert unknown.status.status_code is trace.StatusCode.ERROR
    assert dict(unknown.attributes or {})["error.type"] == "refused"


async def test_a_tools_own_spans_nest_under_its_call() -> None:
    reporting = _Reporting()
    tracer = reporting.tracer_provider.get_tracer("tool")

    @hr.tool(mutates=False)
    async def look(n: int) -> int:
        """Look."""
        with tracer.start_as_current_span(f"inner {n}"):
            await anyio.lowlevel.checkpoint()
        return n

    agent = hr.Agent(Scripted([call("local/look", {"n": 1}),
                               calls([("local/look", {"n": 2}), ("local/look", {"n": 3})]),
                               reply("ok")]), [look], telemetry=reporting.telemetry)
    await agent.run("look")
    looked = {dict(s.attributes or {})["gen_ai.tool.call.id"]: s for s in reporting.spans()
              if s.name == "execute_tool local/look"}
    assert len(looked) == 3
    for n, call_id in ((1, "call_0_0"), (2, "call_1_0"), (3, "call_1_1")):
        inner = reporting.span(f"inner {n}")
        assert inner.parent is not None
        assert inner.parent.span_id == looked[call_id].context.span_id


async def test_telemetry_false_reports_nothing_even_with_a_provider_configured() -> None:
    reporting = _Reporting()
    agent = hr.Agent(Scripted([reply("ok")]), [], telemetry=False)
    assert agent.telemetry is None
    await agent.run("x")
    assert reporting.spans() == []
    with pytest.raises(hr.UserError, match="telemetry= takes"):
        hr.Agent(Scripted([reply("ok")]), [], telemetry=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("traceparent", [
    "00-zz-12-01", f"00-{'g' * 32}-{'1' * 16}-01", f"00-{'0' * 32}-{'0' * 16}-01", 17])
async def test_a_malformed_trace_record_is_not_linked(tmp_path: Path, traceparent: Any) -> None:
    reporting = _Reporting()
    store = hr.Store.memory()
    agent = hr.Agent(Scripted([call("workspace/write_file", {"path": "a", "content": "x"}),
                               reply("ok")]), hr.builtin.workspace_tools(),
                     telemetry=reporting.telemetry, workspace=tmp_path)
    result = await agent.run("write", store=store)
    run = await store.run(result.run_id)
    run.events = [*run.events, {"kind": "trace", "traceparent": traceparent}]
    await store.write(hr.store.Batch(run=run))
    resumed = await hr.resume_with_decision(store, result.outcome.request_id,  # type: ignore[union-attr]
                                            hr.Decision.deny("no"), agent=agent)
    assert resumed.output == "ok"
    [first, second] = [s for s in reporting.spans() if s.name == "invoke_agent"]
    assert first.links == () or list(first.links) == []
    assert list(second.links) == []


# ------------------------------------------------------------------ without OpenTelemetry

_RUN = """
import sys
{block}
import anyio
import handrail as hr
from handrail.models import Scripted, call, reply

@hr.tool(mutates=False)
async def add(a: int, b: int) -> int:
    '''Add.'''
    return a + b

agent = hr.Agent(Scripted([call("local/add", {{"a": 1, "b": 2}}), reply("ok")]), [add],
                 telemetry={telemetry})
result = anyio.run(agent.run, "add")
assert result.output == "ok", result.outcome
print(sorted(m for m, v in sys.modules.items() if m.split(".")[0] == "opentelemetry" and v))
"""


@pytest.mark.parametrize("telemetry", ["None", "hr.Telemetry(capture_content=True)"])
def test_handrail_runs_without_opentelemetry_installed(telemetry: str) -> None:
    # Every `import opentelemetry...` fails, as on a machine without the package.
    block = ("for name in ('opentelemetry', 'opentelemetry.trace', 'opentelemetry.metrics'):\n"
             "    sys.modules[name] = None\n")
    proc = subprocess.run([sys.executable, "-c", _RUN.format(block=block, telemetry=telemetry)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_run_with_nothing_configured_never_imports_opentelemetry() -> None:
    proc = subprocess.run([sys.executable, "-c", _RUN.format(block="", telemetry="None")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


async def test_a_live_approvers_decision_is_timed_and_a_deferral_is_not(
        tmp_path: Path) -> None:
    decided = anyio.Event()

    async def person(request: hr.Request) -> hr.Decision:
        decided.set()
        return hr.Decision.approve()

    reporting = _Reporting()
    agent = hr.Agent(Scripted([call("workspace/write_file", {"path": "a.txt", "content": "x"}),
                               reply("ok")]), hr.builtin.workspace_tools(), workspace=tmp_path,
                     telemetry=reporting.telemetry)
    with anyio.fail_after(30):
        result = await agent.run("write", approver=hr.CallbackApprover(person))
    assert result.output == "ok" and decided.is_set()
    [wait] = reporting.points("handrail.approval.wait")
    assert wait.count == 1 and wait.sum >= 0
    assert dict(wait.attributes) == {"handrail.pending.kind": "approval",
                                     "handrail.decision": "approve",
                                     "gen_ai.tool.name": "workspace/write_file"}

    reporting = _Reporting()
    agent = hr.Agent(Scripted([call("workspace/write_file", {"path": "a.txt", "content": "x"}),
                               reply("ok")]), hr.builtin.workspace_tools(), workspace=tmp_path,
                     telemetry=reporting.telemetry)
    paused = await agent.run("write")
    assert paused.outcome.kind == "awaiting_approval"
    assert reporting.points("handrail.approval.wait") == []


def test_capture_content_is_a_bool() -> None:
    with pytest.raises(hr.UserError, match="capture_content is True or False"):
        hr.Telemetry(capture_content="yes")  # type: ignore[arg-type]


def test_a_provider_given_without_opentelemetry_installed_is_a_clear_error() -> None:
    block = ("for name in ('opentelemetry', 'opentelemetry.trace', 'opentelemetry.metrics'):\n"
             "    sys.modules[name] = None\n")
    code = _RUN.format(block=block, telemetry="hr.Telemetry(tracer_provider=object())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "install it with pip install 'handrail[otel]'" in proc.stderr, proc.stderr
    assert "UserError" in proc.stderr


async def test_a_call_cut_off_by_a_cancel_still_ends_its_span(tmp_path: Path) -> None:
    started, cancel = anyio.Event(), anyio.Event()

    @hr.tool
    async def slow() -> str:
        """Wait for ever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    async def stop_when_started() -> None:
        await started.wait()
        cancel.set()

    reporting = _Reporting()
    agent = hr.Agent(Scripted([call("local/slow", {}), reply("ok")]), [slow],
                     telemetry=reporting.telemetry)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_when_started)
            result = await agent.run("wait", cancel=cancel, approver=hr.ApproveAll())
    assert result.outcome.kind == "cancelled"
    cut = reporting.span("execute_tool local/slow")
    assert dict(cut.attributes or {})["handrail.call.status"] in ("in_doubt", "started")
    assert dict(cut.attributes or {})["handrail.disposition"] == "in_doubt"
    run = reporting.span("invoke_agent")
    assert dict(run.attributes or {})["handrail.run.outcome"] == "cancelled"


async def test_an_answered_question_is_timed_as_a_wait() -> None:
    @hr.tool(interactions={"question"}, mutates=False)
    async def pick(ctx: hr.CallContext) -> str:
        """Ask which."""
        return str(await ctx.ask(hr.Question("which?", choices=["a", "b"])))

    reporting = _Reporting()
    store = hr.Store.memory()

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("local/pick", {}), reply("ok")]), [pick],
                        telemetry=reporting.telemetry)

    first = await build().run("pick", store=store)
    assert first.outcome.kind == "awaiting_answer"
    asked = reporting.span("execute_tool local/pick")
    assert dict(asked.attributes or {})["handrail.call.status"] == "awaiting_answer"
    assert reporting.points("handrail.approval.wait") == []
    done = await hr.resume_with_answer(store, first.outcome.question_id,  # type: ignore[union-attr]
                                       "b", agent=build())
    assert done.output == "ok"
    [wait] = reporting.points("handrail.approval.wait")
    assert wait.count == 1
    assert dict(wait.attributes) == {"handrail.pending.kind": "question",
                                     "handrail.decision": "answer",
                                     "gen_ai.tool.name": "local/pick"}
    answered = [s for s in reporting.spans() if s.name == "execute_tool local/pick"][-1]
    assert dict(answered.attributes or {})["handrail.call.status"] == "finished"
    assert "handrail.wait_seconds" in dict(answered.attributes or {})


_LATE = """
import anyio
import handrail as hr
from handrail.models import Scripted, reply
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

agent = hr.Agent(Scripted([reply("ok"), reply("ok")]), [], name="late")
anyio.run(agent.run, "before any provider")
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # after the agent was built: its next run reports
anyio.run(agent.run, "after")
print(sorted(s.name for s in exporter.get_finished_spans()))
"""


def test_the_global_provider_is_looked_up_when_each_run_starts() -> None:
    proc = subprocess.run([sys.executable, "-c", _LATE], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "['chat scripted', 'invoke_agent late']"


# ------------------------------------------------------------------ handrail serve


@hr.tool(mutates=False)
async def echo(text: str) -> str:
    """Echo."""
    return text


async def test_a_gateway_call_reports_an_execute_tool_span_with_the_gates_word(
        tmp_path: Path) -> None:
    from handrail.mcp import Gateway

    reporting = _Reporting()
    store = hr.Store.open(tmp_path / "runs.db")
    try:
        policy = hr.Policy.default().layer("serve").deny(hr.Act.CALL, "local/echo")
        refused = Gateway(hr.Toolbox([echo]), store=store, policy=policy,
                          telemetry=reporting.telemetry)
        session = await (refused.open_session("client"))
        assert (await session.call("echo", {"text": "no"})).is_error
        gateway = Gateway(hr.Toolbox([echo]), store=store, workspace=tmp_path,
                          telemetry=reporting.telemetry)
        session = await gateway.open_session("client")
        assert (await session.call("echo", {"text": "hi"})).render_text() == "hi"
        off = Gateway(hr.Toolbox([echo]), store=store, telemetry=False)
        assert (await (await off.open_session("client")).call("echo", {"text": "x"})
                ).render_text() == "x"
    finally:
        await store.close()
    spans = [s for s in reporting.spans() if s.name == "execute_tool local/echo"]
    assert len(spans) == 2, [s.name for s in reporting.spans()]
    denied, allowed = (dict(s.attributes or {}) for s in spans)
    assert denied["handrail.verdict"] == "deny" and denied["handrail.layer"] == "serve"
    assert denied["handrail.run_id"] == (await _first_run_id(tmp_path))
    assert allowed["handrail.verdict"] == "allow" and allowed["gen_ai.tool.name"] == "local/echo"
    assert allowed["handrail.call.status"] == "finished", allowed
    assert "hi" not in json.dumps([dict(s.attributes or {}) for s in spans])
    counted = reporting.points("handrail.calls")
    assert sum(p.value for p in counted) == 2
    with pytest.raises(hr.UserError, match="telemetry="):
        Gateway(hr.Toolbox([echo]), store=hr.Store.memory(),
                telemetry="yes")  # type: ignore[arg-type]


async def _first_run_id(tmp_path: Path) -> str:
    store = hr.Store.open(tmp_path / "runs.db")
    try:
        runs = await store.runs()
        return min(runs, key=lambda r: r.created_at).id
    finally:
        await store.close()


class _Crash(BaseException):
    """Stands in for the process dying inside a tool's body (nothing below catches it)."""


async def test_a_wait_is_counted_once_even_when_the_call_is_resumed_again_after_a_crash(
        tmp_path: Path) -> None:
    # The answer is applied by the first resume, whose process "dies" in the tool's body;
    # the recovery resume re-enters the same call, whose pending item is still the answered
    # question: that wait was counted already and must not be counted twice.
    crashes = [True]

    @hr.tool(interactions={"question"}, mutates=False)
    async def pick(ctx: hr.CallContext) -> str:
        """Ask which."""
        answer = str(await ctx.ask(hr.Question("which?", choices=["a", "b"])))
        if crashes:
            crashes.pop()
            raise _Crash
        return answer

    reporting = _Reporting()
    store = hr.Store.open(tmp_path / "runs.db")

    def build() -> hr.Agent:
        return hr.Agent(Scripted([call("local/pick", {}), reply("ok")]), [pick],
                        telemetry=reporting.telemetry)

    try:
        first = await build().run("pick", store=store)
        assert first.outcome.kind == "awaiting_answer"
        with pytest.raises(_Crash):
            await hr.resume_with_answer(store, first.outcome.question_id,  # type: ignore[union-attr]
                                        "b", agent=build())
        [wait] = reporting.points("handrail.approval.wait")
        assert wait.count == 1
        # The recovery resume re-enters the call (STARTED, its item the answered question).
        doubt = await hr.resume(store, first.run_id, agent=build())
        assert doubt.outcome.kind == "awaiting_recovery"
        [wait] = reporting.points("handrail.approval.wait")
        assert wait.count == 1
        # The operator's recovery decision is a wait of its own, counted once.
        done = await hr.resume_with_recovery(store, doubt.outcome.call_id,  # type: ignore[union-attr]
                                             hr.Recovery.retry(), agent=build())
        assert done.output == "ok", done.outcome
        waits = {dict(p.attributes)["handrail.pending.kind"]: p.count
                 for p in reporting.points("handrail.approval.wait")}
        assert waits == {"question": 1, "recovery": 1}
    finally:
        await store.close()
