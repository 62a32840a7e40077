"""A traced run with an allowed, a denied and a deferred call, driven by separate processes.

    python traced.py DB WORKSPACE start [--global] [--capture]
    python traced.py DB WORKSPACE decide REQUEST_ID approve|deny [--global] [--capture]

Turn 0 asks for three calls: `read_file notes.txt` (READ: allowed, it runs), `write_file .env`
(the secrets layer denies it: a refused write, its content `REFUSED-SECRET`) and `write_file
out.txt` (WRITE asks; the default approver defers: the run pauses, its content
`DEFERRED-CONTENT`). `decide` decides that request and resumes the run in this process; the
model then answers "done".

Each process reports to the OpenTelemetry SDK with in-memory exporters: `--global` installs
them as the global providers (what `Agent(telemetry=None)` follows), otherwise they are given
in `hr.Telemetry(...)`. Prints one JSON line: the outcome, every span, every metric point.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import handrail as hr
from handrail.builtin import workspace_tools
from handrail.models import Scripted, calls, reply

CALLS = [("workspace/read_file", {"path": "notes.txt"}),
         ("workspace/write_file", {"path": ".env", "content": "REFUSED-SECRET"}),
         ("workspace/write_file", {"path": "out.txt", "content": "DEFERRED-CONTENT"})]


def build(workspace: str, telemetry: hr.Telemetry | None) -> hr.Agent:
    return hr.Agent(Scripted([calls(CALLS), reply("done")]), workspace_tools(),
                    workspace=workspace, name="traced", telemetry=telemetry)


def dump_spans(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    out = []
    for span in exporter.get_finished_spans():
        context = span.get_span_context()
        assert context is not None
        out.append({
            "name": span.name, "kind": span.kind.name,
            "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}",
            "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
            "links": [{"trace_id": f"{link.context.trace_id:032x}",
                       "span_id": f"{link.context.span_id:016x}",
                       "attributes": dict(link.attributes or {})} for link in span.links],
            "attributes": {k: list(v) if isinstance(v, tuple) else v
                           for k, v in (span.attributes or {}).items()},
            "status": span.status.status_code.name, "description": span.status.description,
        })
    return out


def dump_metrics(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    data = reader.get_metrics_data()
    if data is None:
        return out
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    out.append({"name": metric.name, "unit": metric.unit,
                                "attributes": dict(point.attributes or {}),
                                "value": value, "count": getattr(point, "count", None),
                                "sum": getattr(point, "sum", None)})
    return out


async def main(argv: list[str]) -> None:
    flags = {a for a in argv if a.startswith("--")}
    db, workspace, mode, *rest = [a for a in argv if not a.startswith("--")]
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    if "--global" in flags:
        from opentelemetry import metrics, trace

        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        telemetry = hr.Telemetry(capture_content=True) if "--capture" in flags else None
    else:
        telemetry = hr.Telemetry(tracer_provider=tracer_provider,
                                 meter_provider=meter_provider,
                                 capture_content="--capture" in flags)
    agent = build(workspace, telemetry)
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await agent.run("note things", store=store)
        elif mode == "decide":
            decision = (hr.Decision.approve() if rest[1] == "approve"
                        else hr.Decision.deny("not today"))
            result = await hr.resume_with_decision(store, rest[0], decision, agent=agent,
                                                   decided_by="alice")
        else:
            raise SystemExit(f"unknown mode {mode}")
        run = await store.run(result.run_id)
    outcome = result.outcome
    print(json.dumps({"pid": os.getpid(), "run_id": result.run_id, "outcome": outcome.kind,
                      "request_id": getattr(outcome, "request_id", None),
                      "events": run.events,
                      "spans": dump_spans(exporter), "metrics": dump_metrics(reader)}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
