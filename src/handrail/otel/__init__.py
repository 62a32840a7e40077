"""OpenTelemetry traces and metrics for runs, model requests and tool calls (docs/observability.md).

`Telemetry` says where a run reports (the global OpenTelemetry providers by default, or ones
given) and whether message and argument contents go with the spans (never by default).
`Instrumentation` is what the loop and the gate call at their hook sites; with no provider
configured a run gets none, and every hook site costs one `is not None` check.

Nothing here imports `opentelemetry` until a run actually reports: handrail imports and runs
without it (`handrail[otel]` installs the API).
"""

from handrail.otel._instrumentation import (
    CallState,
    Instrumentation,
    resumed_from,
)
from handrail.otel._telemetry import Telemetry, telemetry_from

__all__ = ["CallState", "Instrumentation", "Telemetry", "resumed_from", "telemetry_from"]
