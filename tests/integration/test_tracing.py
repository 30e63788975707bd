"""OpenTelemetry: the span tree of a claim -> submit -> complete cycle, joined to the executor's span
through the W3C traceparent our client sends, with the telemetry contract's attributes and no tenant
data. An in-memory exporter stands in for the collector."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from effect_ledger import tracing
from effect_ledger.client import LedgerClient, OperationInProgress, Receipt
from effect_ledger.settings import Settings
from support.auth import token
from support.server import Service

TENANT, PRINCIPAL, OP = "tenant-zq8", "exec-zq8", "op-zq8-secret"
INTENT = {"amount": 4711, "card": "zq8-card"}
OPERATION_ROUTE = "/v1/operations/{operation_id}"


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield provider, exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def children(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_claim_submit_complete_span_tree(
    settings: Settings, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer = provider[0].get_tracer("executor")
    bearer = token(TENANT, PRINCIPAL, "ledger:execute")
    async with Service(settings) as service, LedgerClient(service.base_url, bearer) as client:
        with tracer.start_as_current_span("executor.cycle") as root:
            grant = await client.claim(OP, tool="payments.charge", tool_version="1", intent=INTENT)
            assert grant.claim is not None
            await client.submit(OP, grant.claim.token, effect_ref="psp-zq8")
            await client.complete(OP, grant.claim.token, "committed", receipt=Receipt(external_ref="ch-zq8"))
        with pytest.raises(OperationInProgress):  # a refusal: a new ID claimed twice
            await client.claim(f"{OP}-2", tool="t", tool_version="1", intent={})
            await client.claim(f"{OP}-2", tool="t", tool_version="1", intent={})
        async with httpx.AsyncClient(base_url=service.base_url) as http:
            assert (await http.get("/livez")).status_code == 200  # no traceparent: a root span
    spans = provider[1].get_finished_spans()

    servers = children(spans, next(s for s in spans if s.name == "executor.cycle"))
    assert [s.name for s in servers] == [
        f"POST {OPERATION_ROUTE}/claim",
        f"POST {OPERATION_ROUTE}/submit",
        f"POST {OPERATION_ROUTE}/complete",
    ]
    assert all(
        s.kind == SpanKind.SERVER and s.context.trace_id == root.get_span_context().trace_id for s in servers
    )
    facts = [dict(s.attributes or {}) for s in servers]
    assert facts[0] == {
        "http.request.method": "POST",
        "http.route": f"{OPERATION_ROUTE}/claim",
        "http.response.status_code": 201,
        "effect_ledger.call": "claim",
        "effect_ledger.outcome": "granted",
        "effect_ledger.attempt_kind": "first",
        "effect_ledger.effect_knowledge": "none",
        "effect_ledger.operation.attempt": 1,
    }
    assert {k: facts[1][k] for k in ("effect_ledger.outcome", "effect_ledger.effect_knowledge")} == {
        "effect_ledger.outcome": "submitted",
        "effect_ledger.effect_knowledge": "unknown",
    }
    assert {
        k: facts[2][k]
        for k in ("effect_ledger.outcome", "effect_ledger.effect_knowledge", "http.response.status_code")
    } == {
        "effect_ledger.outcome": "committed",
        "effect_ledger.effect_knowledge": "committed",
        "http.response.status_code": 200,
    }
    # each request made exactly one database call, a client span under its server span
    for server, phase in zip(servers, ("claim", "submit", "complete"), strict=True):
        [db] = children(spans, server)
        assert (db.name, db.kind) == (f"db {phase}", SpanKind.CLIENT)
        assert dict(db.attributes or {}) == {
            "db.system.name": "postgresql",
            "db.operation.name": phase,
            "effect_ledger.db.pool": "runtime",
        }

    refused = [s for s in spans if s.name == f"POST {OPERATION_ROUTE}/claim" and s not in servers]
    assert [dict(s.attributes or {}).get("effect_ledger.refusal_code") for s in refused] == [
        None,
        "operation_in_progress",
    ]
    assert dict(refused[1].attributes or {})["effect_ledger.attempt_kind"] == "retry"
    [probe] = [s for s in spans if s.name == "GET /livez"]
    assert probe.parent is None

    # nothing of the tenant, the caller, the operation, the intent or a token is in any span
    secrets = (TENANT, PRINCIPAL, OP, "4711", "zq8-card", "psp-zq8", "ch-zq8", grant.claim.token, bearer)
    for span in spans:
        text = span.name + " ".join(f"{k}={v}" for k, v in (span.attributes or {}).items())
        assert not [s for s in secrets if s in text], span.name


async def test_tracing_is_off_by_default(settings: Settings) -> None:
    assert tracing.enabled_by_env({}) is None and not tracing.active()
    assert (
        tracing.enabled_by_env(
            {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        )
        is None
    )
    assert tracing.enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == "otlp"
    assert tracing.enabled_by_env({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert tracing.enabled_by_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None
    async with Service(settings) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        assert (await http.get("/livez")).status_code == 200
    assert not tracing.active()
