"""Every client call against the real service on real PostgreSQL, and a lost claim answer recovered."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest

from effect_ledger.client import (
    ClaimResult,
    Diagnostics,
    Event,
    Evidence,
    Forbidden,
    IntentConflict,
    LedgerClient,
    NotAppliedReason,
    NotFound,
    OperationInProgress,
    OperationView,
    OutcomeUnknown,
    Receipt,
    StaleClaim,
    Unauthenticated,
    ValidationFailed,
    Verdict,
    committed,
    not_applied,
    unresolved,
)
from effect_ledger.domain.canonical import intent_digest
from effect_ledger.http.auth import ALL_SCOPES
from support.auth import token
from support.ledger import owner
from support.server import Service

ALL = " ".join(ALL_SCOPES)
TOOL: dict[str, Any] = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}}


def client_for(service: Service, sub: str = "exec-1", scope: str = ALL, **kwargs: Any) -> LedgerClient:
    return LedgerClient(service.base_url, token(sub=sub, scope=scope), **kwargs)


class LoseFirstClaimAnswer(httpx.AsyncBaseTransport):
    """Forwards every request; the first claim's answer is read and then lost, as on a dropped connection."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost: list[dict[str, Any]] = []
        self.claims_sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/claim"):
            return response
        self.claims_sent += 1
        if self.lost:
            return response
        await response.aread()
        body = httpx.Response(200, content=response.content).json()
        self.lost.append({"status": response.status_code, "body": body})
        await response.aclose()
        raise httpx.ReadError("connection reset before the answer arrived", request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_lost_claim_answer_is_replayed_not_a_second_attempt(service: Service) -> None:
    transport = LoseFirstClaimAnswer()
    async with client_for(service, transport=transport) as ledger:
        result = await ledger.claim("op-lost", **TOOL)
        assert transport.claims_sent == 2
        assert transport.lost[0]["status"] == 201  # the server did grant the first one
        assert result.replayed is True and result.action == "execute"
        assert result.claim is not None and result.claim.attempt == 1
        assert result.claim.token == transport.lost[0]["body"]["claim"]["token"]
        events = await ledger.events("op-lost")
        assert [e.kind for e in events] == ["claimed"]
        view = await ledger.submit("op-lost", result.claim.token, effect_ref="r-1")
        assert view.status == "submitted" and view.attempt == 1


async def test_executor_calls_are_typed(service: Service) -> None:
    async with client_for(service) as ledger:
        first = await ledger.claim("op-t", **TOOL, lease_seconds=20)
        assert isinstance(first, ClaimResult) and first.action == "execute" and first.replayed is False
        assert first.claim is not None and first.operation.intent_digest == intent_digest(TOOL["intent"])
        tok = first.claim.token
        submitted = await ledger.submit("op-t", tok, effect_ref="remote-19")
        assert isinstance(submitted, OperationView) and submitted.status == "submitted"
        beat = await ledger.heartbeat("op-t", tok, lease_seconds=60)
        assert beat.lease_expires_at is not None and submitted.lease_expires_at is not None
        assert beat.lease_expires_at > submitted.lease_expires_at
        receipt = Receipt(external_ref="m-7", result={"v": 1})
        done = await ledger.complete("op-t", tok, "committed", receipt=receipt)
        assert done.status == "committed" and done.receipt is not None
        assert done.receipt.external_ref == "m-7" and done.receipt.result == {"v": 1}
        assert done.receipt.recorded_by == "exec-1"
        again = await ledger.claim("op-t", **TOOL)
        assert again.action == "reuse_receipt" and again.claim is None
        assert again.operation.receipt == done.receipt
        assert await ledger.get_operation("op-t") == done

        digest = intent_digest({"x": 1})
        na = await ledger.claim("op-na", intent_digest=digest, tool="measure", tool_version="1")
        assert na.claim is not None
        view = await ledger.complete(
            "op-na",
            na.claim.token,
            "not_applied",
            reason=NotAppliedReason(category="rejected", detail_code="quota"),
        )
        assert view.not_applied_reason == NotAppliedReason(category="rejected", detail_code="quota")


async def test_problems_are_typed_and_not_retried(service: Service) -> None:
    async with client_for(service) as ledger:
        first = await ledger.claim("op-p", **TOOL)
        assert first.claim is not None
        with pytest.raises(OperationInProgress) as busy:
            await ledger.claim("op-p", **TOOL)
        assert busy.value.status == 409 and busy.value.attempts == 1
        assert busy.value.retry_after is not None and 1 <= busy.value.retry_after <= 30
        assert busy.value.operation is not None and busy.value.operation.status == "pending"
        with pytest.raises(IntentConflict) as conflict:
            await ledger.claim("op-p", **{**TOOL, "tool_version": "9"})
        assert conflict.value.mismatched == ["tool_version"]
        with pytest.raises(StaleClaim):
            await ledger.submit("op-p", "clt_" + "A" * 40)
        with pytest.raises(NotFound):
            await ledger.get_operation("nobody-here")
        with pytest.raises(ValidationFailed) as invalid:
            await ledger.claim("op-p", tool="measure", tool_version="2.1.0")  # neither intent nor digest
        assert invalid.value.errors and invalid.value.errors[0]["field"] == "intent"
        await ledger.submit("op-p", first.claim.token)
        await ledger.complete("op-p", first.claim.token, "unknown")
        with pytest.raises(OutcomeUnknown) as unknown:
            await ledger.claim("op-p", **TOOL)
        assert unknown.value.operation is not None and unknown.value.operation.status == "unknown"
        assert "do not repeat" in str(unknown.value)
    async with client_for(service, scope="ledger:audit") as auditor:
        with pytest.raises(Forbidden):
            await auditor.claim("op-q", **TOOL)
    async with LedgerClient(service.base_url, "not-a-jwt") as stranger:
        with pytest.raises(Unauthenticated) as refused:
            await stranger.get_operation("op-p")
        assert refused.value.attempts == 1


async def test_reconciler_and_audit_calls_are_typed(service: Service) -> None:
    async with client_for(service) as ledger:
        for n in range(5):
            granted = await ledger.claim(f"op-u{n}", **TOOL)
            assert granted.claim is not None
            await ledger.submit(f"op-u{n}", granted.claim.token, effect_ref=f"req-{n}")
            await ledger.complete(f"op-u{n}", granted.claim.token, "unknown")
        page = await ledger.list_operations(status="unknown", limit=2)
        assert [op.operation_id for op in page.items] == ["op-u0", "op-u1"] and page.next_cursor
        everything = [op.operation_id async for op in ledger.iter_operations(status="unknown", limit=2)]
        assert everything == [f"op-u{n}" for n in range(5)]

        evidence = Evidence(source="measurement-service", checked_at=_now(), lookup_ref="req-0")
        resolved = await ledger.resolve("op-u0", "committed", evidence, receipt=Receipt(external_ref="m-0"))
        assert resolved.status == "committed" and resolved.resolved_by == "exec-1"
        still = await ledger.resolve("op-u1", "unresolved", evidence)
        assert still.status == "unknown"

        events = await ledger.events("op-u0")
        assert all(isinstance(e, Event) for e in events)
        assert [e.kind for e in events] == ["claimed", "submitted", "completed", "resolved"]
        assert events[-1].data["evidence"]["lookup_ref"] == "req-0"
        receipts = await ledger.receipts(limit=10)
        assert [op.operation_id for op in receipts.items] == ["op-u0"] and receipts.next_cursor is None
        verdict = await ledger.verify("op-u0")
        assert verdict.ok is True and verdict.checked == 4 and verdict.first_bad_seq is None
        assert (await ledger.verify()).ok is True

        report = Diagnostics(operation_id="op-u1", phase="request", cause="timeout")
        incident = await ledger.report_incident(report)
        assert incident.startswith("inc_")
        record = await ledger.read_incident(incident, purpose="client test")
        assert record.incident == incident and record.cause == "timeout" and record.operation_id == "op-u1"
        log = await ledger.access_log()
        seen = [(e.incident, e.purpose, e.principal) for e in log.items]
        assert seen == [(incident, "client test", "exec-1")]

        keyed = Diagnostics(
            operation_id="op-u1", phase="request", cause="timeout", report_id="rep-client-000001"
        )
        first = await ledger.report_incident(keyed)
        assert await ledger.report_incident(keyed) == first != incident  # a retried report: the same incident


async def test_dot_segment_ids_stay_opaque(service: Service) -> None:
    async with client_for(service) as ledger:
        for odd in (".", "..", "a:b~c.d"):
            granted = await ledger.claim(odd, **TOOL)
            assert granted.operation.operation_id == odd
            assert (await ledger.get_operation(odd)).operation_id == odd


async def test_probes_metrics_and_openapi(service: Service) -> None:
    async with client_for(service) as ledger:
        assert await ledger.live() is True
        assert await ledger.ready() is True
        assert "# TYPE" in await ledger.metrics()
        assert "/v1/recovery/decide" in (await ledger.openapi())["paths"]
    async with LedgerClient("http://127.0.0.1:9", "t") as nowhere:
        assert await nowhere.live() is False


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


async def test_reconcile_resolves_every_unknown_across_pages(service: Service) -> None:
    async with client_for(service) as ledger, client_for(service, sub="reconciler-2") as rival:
        for n in range(7):
            granted = await ledger.claim(f"op-r{n}", **TOOL)
            assert granted.claim is not None
            await ledger.submit(f"op-r{n}", granted.claim.token, effect_ref=f"req-{n}")
            await ledger.complete(f"op-r{n}", granted.claim.token, "unknown")
        await ledger.claim("op-pending", **TOOL)  # not unknown: never looked up
        looked_up: Counter[str] = Counter()

        async def lookup(op: OperationView) -> Verdict:
            looked_up[op.operation_id] += 1
            n = int(op.operation_id.removeprefix("op-r"))
            if n <= 2:
                return committed({"external_ref": f"m-{n}", "result": {"n": n}}, lookup_ref=f"m-{n}")
            if n == 3:
                return not_applied("rejected", "never_arrived", lookup_ref=op.effect_ref)
            if n == 4:
                return unresolved(lookup_ref=op.effect_ref)
            if n == 5:
                raise LookupError("the effect system is down")
            # Another reconciler settles it first, differently: this pass meets a conflict.
            evidence = Evidence(source="elsewhere", checked_at=_now())
            await rival.resolve(
                op.operation_id, "not_applied", evidence, reason=NotAppliedReason(category="other")
            )
            return committed(Receipt(external_ref="m-6"))

        report = await ledger.reconcile(lookup, source="effect-system", page_size=2)
        assert looked_up == Counter({f"op-r{n}": 1 for n in range(7)})  # each once, none skipped
        assert report.committed == ["op-r0", "op-r1", "op-r2"]
        assert report.not_applied == ["op-r3"] and report.unresolved == ["op-r4"]
        assert report.failed == {"op-r5": "lookup raised LookupError"}
        assert report.conflicts == ["op-r6"] and report.seen == 7
        r0 = await ledger.get_operation("op-r0")
        assert r0.status == "committed" and r0.receipt is not None and r0.receipt.result == {"n": 0}
        assert (await ledger.events("op-r4"))[-1].kind == "reconcile_unresolved"
        assert (await ledger.events("op-r4"))[-1].data["evidence"]["source"] == "effect-system"
        assert (await ledger.get_operation("op-r6")).status == "not_applied"
        looked_up.clear()
        again = await ledger.reconcile(lookup, source="effect-system", page_size=2)
        assert sorted(looked_up) == ["op-r4", "op-r5"] and again.seen == 2


class LoseFirstReportAnswer(httpx.AsyncBaseTransport):
    """Forwards every request; the first diagnostics report's answer is lost after the server stored it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.reports = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/v1/diagnostics" and request.method == "POST":
            self.reports += 1
            if self.reports == 1:
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset after the server answered", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_report_whose_answer_was_lost_is_stored_once(service: Service) -> None:
    """The client retries a report whose answer was lost; without a `report_id` of the caller's it makes
    one, so the retry answers the first incident (API.md section 9). Until round 24 it stored two."""
    transport = LoseFirstReportAnswer()
    async with client_for(service, transport=transport) as ledger:
        incident = await ledger.report_incident(Diagnostics(operation_id="op-1", cause="timeout"))
        assert transport.reports == 2  # the report was sent again after the lost answer
        again = await ledger.report_incident(Diagnostics(operation_id="op-1", cause="timeout"))
    assert incident.startswith("inc_") and again != incident  # a new call is a new report
    async with owner(service.settings.database_url or "") as conn:
        stored = await conn.fetch("SELECT incident_id FROM diagnostics.incidents WHERE source = 'report'")
    assert sorted(r["incident_id"] for r in stored) == sorted([incident, again])
