"""OpenTelemetry traces: a span per request and per database call; off unless OTEL_* switches them on.

opentelemetry is an optional extra (`pip install 'effect-ledger[otel]'`). Without it, or without
the switch, every function here is a no-op and costs one `None` check. The switch is the standard
exporter variable: `OTEL_TRACES_EXPORTER=otlp` (or `console`), or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, which then implies `otlp`);
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off. The SDK reads the rest itself
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
`OTEL_EXPORTER_OTLP_*`).

Attributes are bounded and carry no tenant data: no tenant, principal, operation ID, token, body
or SQL parameter is ever set on a span (tests/integration/test_tracing.py checks every attribute).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog

log = structlog.get_logger("effect_ledger.tracing")

Span = Any  # an opentelemetry Span when tracing is on, else None
Attributes = Mapping[str, str | int | bool]

_tracer: Any = None
_configured = False
INSTRUMENTATION = "effect_ledger"


def enabled_by_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The exporter the OTEL_* variables ask for ("otlp", "console"), or None when tracing is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return None if exporter == "none" else exporter.split(",")[0].strip()
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return None


def configure_from_env() -> None:
    """Once per process: install a tracer provider with the exporter the environment names."""
    global _configured
    if _configured:
        return
    _configured = True
    exporter_name = enabled_by_env()
    if exporter_name is None:
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning("tracing_unavailable", reason="opentelemetry is not installed: the [otel] extra")
        return
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("tracing_unavailable", reason="the OTLP exporter is not installed")
            return
        exporter = OTLPSpanExporter()
    else:
        log.warning("tracing_unavailable", reason="unsupported OTEL_TRACES_EXPORTER", exporter=exporter_name)
        return
    default_name = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "effect-ledger"}
    provider = TracerProvider(resource=Resource.create(default_name))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use_provider(provider)
    log.info("tracing_enabled", exporter=exporter_name)


def use_provider(provider: Any) -> None:
    """Trace through `provider` (None: stop tracing). Tests pass one with an in-memory exporter."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(INSTRUMENTATION)


def active() -> bool:
    """Whether spans are being recorded."""
    return _tracer is not None


@contextmanager
def server_span(method: str, headers: Mapping[str, str]) -> Iterator[Span]:
    """The request's span, a child of the caller's W3C `traceparent` when it sent a valid one."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(carrier=dict(headers))
    with _tracer.start_as_current_span(
        method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method},
        record_exception=False,
        set_status_on_exception=True,
    ) as span:
        yield span


@contextmanager
def database_span(phase: str) -> Iterator[Span]:
    """One database call (a tenant transaction): a client span named by its phase ("claim", "read"...)."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        f"db {phase}",
        kind=SpanKind.CLIENT,
        attributes={"db.system.name": "postgresql", "db.operation.name": phase},
        record_exception=False,
        set_status_on_exception=True,
    ) as span:
        yield span


def set_attributes(span: Span, attributes: Attributes) -> None:
    """Set bounded attributes on `span` (no-op when tracing is off)."""
    if span is not None:
        span.set_attributes(dict(attributes))


def annotate_current(attributes: Attributes) -> None:
    """Set bounded attributes on the current span (the request's, outside database calls)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(dict(attributes))
