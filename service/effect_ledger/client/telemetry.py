"""What the client tells about itself: its retry counts, and the trace context it propagates."""

from __future__ import annotations

from dataclasses import dataclass

try:  # opentelemetry is optional: without it, or without a current span, nothing is propagated
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - the [otel] extra is not installed
    _PROPAGATOR = None


@dataclass
class CallStats:
    """What this client sent: its calls, the requests they took, and how many were retries.

    `retries` counts re-sent requests (every request after a call's first); `retried_calls` the
    calls that needed at least one. The ledger counts its side as effect_ledger_claim_attempts.
    """

    calls: int = 0
    requests: int = 0
    retries: int = 0
    retried_calls: int = 0


def trace_headers() -> dict[str, str]:
    """The current OpenTelemetry span's W3C `traceparent` (and `tracestate`), when there is one.

    Only the trace context is propagated, never baggage: baggage may carry what a tenant put in it.
    """
    if _PROPAGATOR is None:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier
