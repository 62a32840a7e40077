"""`Telemetry`: which OpenTelemetry providers a run reports to, and what goes with its spans."""

from __future__ import annotations

import sys
from typing import Any

from handrail.errors import UserError
from handrail.otel._instrumentation import Instrumentation

__all__ = ["Telemetry", "telemetry_from"]

# The classes OpenTelemetry's API hands out while nobody has configured a provider: reporting
# to them records nothing, so a run treats them as "off".
_NOOP_TRACER_PROVIDERS = frozenset({"ProxyTracerProvider", "NoOpTracerProvider"})
_NOOP_METER_PROVIDERS = frozenset({"_ProxyMeterProvider", "NoOpMeterProvider"})


class Telemetry:
    """Where an agent's runs report their traces and metrics (docs/observability.md).

    ```python
    agent = hr.Agent(model, tools, telemetry=hr.Telemetry(tracer_provider=provider))
    ```

    The default (`Agent(telemetry=None)`, the same as `hr.Telemetry()`) follows the global
    OpenTelemetry providers (`opentelemetry.trace.set_tracer_provider`, and the metrics one),
    looked up when each run starts: with none configured, or `opentelemetry` not installed,
    a run reports nothing and costs one check per hook site. `telemetry=False` turns it off
    whatever is configured.

    Args:
        tracer_provider: The tracer provider for spans; default the global one.
        meter_provider: The meter provider for metrics; default the global one.
        capture_content: Put contents on the spans: the messages of each model request, the
            arguments and result of each call whose tool ran. Off by default (they may hold
            secrets and personal data). A call that was refused, denied or is still waiting
            for a person never has its arguments captured, whatever this says; nor does the
            tool-call part of a model's message (its arguments are those of a call that may be
            refused).

    Raises:
        UserError: a provider is given but `opentelemetry` is not installed, or
            `capture_content` is not a bool.
    """

    __slots__ = ("_cached", "capture_content", "meter_provider", "tracer_provider")

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None,
                 capture_content: bool = False) -> None:
        if not isinstance(capture_content, bool):
            raise UserError(f"capture_content is True or False, not {capture_content!r}")
        if tracer_provider is not None or meter_provider is not None:
            # Checked here, not when a run starts: a run is already recorded by then.
            try:
                import opentelemetry.metrics
                import opentelemetry.trace  # noqa: F401
            except ImportError as exc:
                raise UserError(f"hr.Telemetry was given a provider, but OpenTelemetry's API "
                                f"cannot be imported ({exc}); install it with "
                                "pip install 'handrail[otel]'") from None
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.capture_content = capture_content
        self._cached: tuple[Any, Any, Instrumentation] | None = None

    def __repr__(self) -> str:
        return (f"Telemetry(tracer_provider={self.tracer_provider!r}, meter_provider="
                f"{self.meter_provider!r}, capture_content={self.capture_content!r})")

    def start(self) -> Instrumentation | None:
        """What a run starting now reports to, or None when nothing would record it.

        Called once per run segment, never per span: the providers are looked up here, and
        their tracer and instruments are made once per pair of providers and reused.
        """
        tracer_provider = self.tracer_provider
        meter_provider = self.meter_provider
        if tracer_provider is None:
            tracer_provider = _configured("opentelemetry.trace", "get_tracer_provider",
                                          _NOOP_TRACER_PROVIDERS)
        if meter_provider is None:
            meter_provider = _configured("opentelemetry.metrics", "get_meter_provider",
                                         _NOOP_METER_PROVIDERS)
        if tracer_provider is None and meter_provider is None:
            return None
        cached = self._cached
        if cached is not None and cached[0] is tracer_provider and cached[1] is meter_provider:
            return cached[2]
        made = Instrumentation(tracer_provider, meter_provider,
                               capture_content=self.capture_content)
        self._cached = (tracer_provider, meter_provider, made)
        return made


def _configured(module: str, getter: str, noop: frozenset[str]) -> Any:
    """The global provider of `module`, or None when none is configured.

    Nobody can have configured one unless OpenTelemetry was imported, so a program that never
    imports it pays one dictionary lookup here (and handrail never imports it itself).
    """
    api = sys.modules.get(module)
    if api is None:
        return None
    provider = getattr(api, getter)()
    return None if type(provider).__name__ in noop else provider


def telemetry_from(value: object) -> Telemetry | None:
    """What an `Agent(telemetry=)` or `Gateway(telemetry=)` argument means.

    None follows the global providers (a default `Telemetry`, looked up at each run start);
    False reports nothing; a `Telemetry` is taken as given.

    Raises:
        UserError: anything else, naming what was given.
    """
    if value is None:
        return Telemetry()
    if value is False:
        return None
    if not isinstance(value, Telemetry):
        raise UserError(f"telemetry= takes hr.Telemetry(...), None or False, not "
                        f"{type(value).__name__}")
    return value
