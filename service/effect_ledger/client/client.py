"""LedgerClient: every endpoint of docs/api.md as a typed async call over httpx, retried in one place."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from effect_ledger import __version__
from effect_ledger.client.approvals import Approvals, Cancelled
from effect_ledger.client.errors import LedgerClientError, LedgerProblem, LedgerUnreachable
from effect_ledger.client.executor import Effect
from effect_ledger.client.journal import Journal
from effect_ledger.client.models import (
    AccessLogEntry,
    ClaimResult,
    Diagnostics,
    Event,
    Evidence,
    IncidentRecord,
    NotAppliedReason,
    OperationView,
    Page,
    Receipt,
    RecoveryDecision,
    VerifyResult,
)
from effect_ledger.client.receipts_log import ReceiptsLog
from effect_ledger.client.reconciler import Lookup, ReconcileReport, reconcile_unknown
from effect_ledger.client.retry import RetryPolicy, send_with_retries
from effect_ledger.client.telemetry import CallStats, trace_headers
from effect_ledger.domain.timefmt import format_ts

T = TypeVar("T")
_NO_INTENT: Any = object()  # `intent` may legitimately be JSON null, so None cannot mean "absent"
JSON_HEADERS = {"Content-Type": "application/json"}


class UnexpectedAnswer(LedgerClientError):
    """A 2xx answer whose body does not have the shape docs/api.md promises."""


def new_client_nonce() -> str:
    """A fresh claim nonce (192 random bits, 32 characters): lets a lost claim answer be replayed."""
    return secrets.token_urlsafe(24)


def _path_segment(value: str) -> str:
    """One path segment, percent-encoded, so that no ID can reach another route."""
    # "." and ".." are valid operation IDs but dot segments in a URL path, which httpx would
    # normalise away; percent-encoding them keeps them opaque.
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe=":~")


def _query(**params: Any) -> dict[str, str | int]:
    """Query parameters without the absent ones; datetimes as RFC 3339 UTC with milliseconds."""
    query: dict[str, str | int] = {}
    for name, value in params.items():
        if value is None:
            continue
        query[name] = (format_ts(value) or "") if isinstance(value, datetime) else value
    return query


class LedgerClient:
    """An async client of one effect-ledger service, acting with one bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], str],
        *,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http: httpx.AsyncClient | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.stats = CallStats()
        self._token = token
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=20),
            headers={"User-Agent": f"effect-ledger-client/{__version__}"},
        )

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (unless it was handed in by the caller)."""
        if self._owns_http:
            await self._http.aclose()

    # -- the one place every request goes through --------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int] | None = None,
        retry: RetryPolicy | None = None,
        authenticated: bool = True,
    ) -> httpx.Response:
        """Send one API call with the client's retry policy; raise its typed problem on an error answer."""
        content = None if body is None else msgspec.json.encode(body)
        stats = self.stats
        stats.calls += 1
        sent = 0

        async def send(seconds: float) -> httpx.Response:
            nonlocal sent
            sent += 1
            stats.requests += 1
            if sent > 1:
                stats.retries += 1
                if sent == 2:
                    stats.retried_calls += 1
            headers = dict(JSON_HEADERS) if content is not None else {}
            headers.update(trace_headers())
            if authenticated:
                token = self._token() if callable(self._token) else self._token
                headers["Authorization"] = f"Bearer {token}"
            return await self._http.request(
                method, path, content=content, params=params, headers=headers, timeout=seconds
            )

        return await send_with_retries(retry or self.retry, send)

    @staticmethod
    def decode(response: httpx.Response, kind: type[T]) -> T:
        """The answer's body as `kind`; a body of another shape is an UnexpectedAnswer."""
        try:
            return msgspec.json.decode(response.content, type=kind)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise UnexpectedAnswer(f"{response.request.method} {response.request.url.path}: {exc}") from None

    # -- executor calls (docs/api.md section 6) --------------------------------------------------

    async def claim(
        self,
        operation_id: str,
        *,
        tool: str,
        tool_version: str,
        intent: Any = _NO_INTENT,
        intent_digest: str | None = None,
        lease_seconds: int | None = None,
        client_nonce: str | None = None,
        submit: bool = False,
        effect_ref: str | None = None,
        approval_note: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> ClaimResult:
        """Claim an operation ID; a client_nonce is always sent, so a lost answer is replayed, not refused.

        With `submit`, a granted attempt is submitted in the same call (with `effect_ref`): for an
        executor that sends the effect right after its claim (API.md section 6)."""
        body: dict[str, Any] = {
            "tool": tool,
            "tool_version": tool_version,
            "client_nonce": client_nonce or new_client_nonce(),
        }
        if submit:
            body["submit"] = {"effect_ref": effect_ref}
        if intent is not _NO_INTENT:
            body["intent"] = intent
        if intent_digest is not None:
            body["intent_digest"] = intent_digest
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        if approval_note is not None:
            body["approval_note"] = approval_note
        response = await self.request(
            "POST", f"/v1/operations/{_path_segment(operation_id)}/claim", body=body, retry=retry
        )
        result = self.decode(response, ClaimResult)
        result.replayed = response.headers.get("idempotent-replayed", "").lower() == "true"
        return result

    async def submit(
        self,
        operation_id: str,
        token: str,
        *,
        effect_ref: str | None = None,
        lease_seconds: int | None = None,
    ) -> OperationView:
        """pending -> submitted: call it before sending the effect."""
        body = {"token": token, "effect_ref": effect_ref, "lease_seconds": lease_seconds}
        return await self._post_view(operation_id, "submit", body)

    async def heartbeat(
        self,
        operation_id: str,
        token: str,
        *,
        lease_seconds: int | None = None,
        retry: RetryPolicy | None = None,
    ) -> OperationView:
        """Extend the current attempt's lease to the database's now + lease_seconds."""
        body = {"token": token, "lease_seconds": lease_seconds}
        return await self._post_view(operation_id, "heartbeat", body, retry)

    async def complete(
        self,
        operation_id: str,
        token: str,
        outcome: str,
        *,
        receipt: Receipt | None = None,
        reason: NotAppliedReason | None = None,
        diagnostics: Diagnostics | None = None,
    ) -> OperationView:
        """Record committed (with a receipt), not_applied (with a reason) or unknown (with diagnostics)."""
        body = {
            "token": token,
            "outcome": outcome,
            "receipt": receipt,
            "reason": reason,
            "diagnostics": diagnostics,
        }
        return await self._post_view(operation_id, "complete", body)

    async def get_operation(self, operation_id: str) -> OperationView:
        """One operation's view."""
        return self.decode(await self._operation(operation_id), OperationView)

    async def get_operation_json(self, operation_id: str) -> dict[str, Any]:
        """One operation's view exactly as the ledger sent it (for a caller that passes it on)."""
        document: dict[str, Any] = (await self._operation(operation_id)).json()
        return document

    async def _operation(self, operation_id: str) -> httpx.Response:
        return await self.request("GET", f"/v1/operations/{_path_segment(operation_id)}")

    async def _post_view(
        self, operation_id: str, call: str, body: dict[str, Any], retry: RetryPolicy | None = None
    ) -> OperationView:
        response = await self.request(
            "POST", f"/v1/operations/{_path_segment(operation_id)}/{call}", body=body, retry=retry
        )
        return self.decode(response, OperationView)

    def effect(
        self,
        operation_id: str,
        *,
        tool: str,
        tool_version: str,
        intent: Any = _NO_INTENT,
        intent_digest: str | None = None,
        lease_seconds: int = 30,
        send_at_once: bool = False,
        effect_ref: str | None = None,
        approval_wait_seconds: float = 0.0,
        approval_note: str | None = None,
        cancelled: Cancelled = None,
    ) -> Effect:
        """The executor helper: `async with client.effect(...) as effect:` (see client/executor.py).

        `send_at_once=True` (with the `effect_ref` the effect will carry) claims and submits in one call:
        for a body that sends the effect first thing. The block then starts submitted, so leaving it
        without an outcome records unknown, never not_applied.

        A tool that needs an approval (403 approval_required): the helper waits up to
        `approval_wait_seconds` for the decision, then checks `cancelled` (an asyncio.Event or a
        callable) before the claim that would consume the approval; cancelled → EffectCancelled, and
        nothing was claimed or run. Past the wait: ApprovalRequired; denied: ApprovalDenied."""
        from effect_ledger.client.executor import Effect

        claim_body: dict[str, Any] = {
            "tool": tool,
            "tool_version": tool_version,
            "lease_seconds": lease_seconds,
        }
        if send_at_once:
            claim_body["submit"] = True
            claim_body["effect_ref"] = effect_ref
        if intent is not _NO_INTENT:
            claim_body["intent"] = intent
        if intent_digest is not None:
            claim_body["intent_digest"] = intent_digest
        if approval_note is not None:
            claim_body["approval_note"] = approval_note
        return Effect(self, operation_id, claim_body, approval_wait_seconds, cancelled)

    @property
    def approvals(self) -> Approvals:
        """The approval calls (docs/api.md section 15) over this client (see client/approvals.py)."""
        return Approvals(self)

    @property
    def log(self) -> ReceiptsLog:
        """The receipts log's calls and offline checks (API.md section 14; client/receipts_log.py)."""
        return ReceiptsLog(self)

    @property
    def journal(self) -> Journal:
        """The run journal's calls (docs/api.md section 12) over this client (see client/journal.py)."""
        return Journal(self)

    # -- reconciler calls (docs/api.md section 7) ------------------------------------------------

    async def list_operations(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[OperationView]:
        """One page of operations, oldest first."""
        params = _query(status=status, tool=tool, updated_before=updated_before, limit=limit, cursor=cursor)
        response = await self.request("GET", "/v1/operations", params=params)
        return self.decode(response, Page[OperationView])

    async def iter_operations(self, **filters: Any) -> AsyncIterator[OperationView]:
        """Every operation matching the filters of list_operations, across all pages."""
        cursor: str | None = None
        while True:
            page = await self.list_operations(**filters, cursor=cursor)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def resolve(
        self,
        operation_id: str,
        outcome: str,
        evidence: Evidence,
        *,
        receipt: Receipt | None = None,
        reason: NotAppliedReason | None = None,
    ) -> OperationView:
        """Resolve an unknown operation from evidence: committed, not_applied, or unresolved (a try)."""
        body = {"outcome": outcome, "receipt": receipt, "reason": reason, "evidence": evidence}
        return await self._post_view(operation_id, "resolve", body)

    async def reconcile(
        self, lookup: Lookup, *, source: str, tool: str | None = None, page_size: int = 100
    ) -> ReconcileReport:
        """Resolve every unknown operation with `lookup` (see client/reconciler.py)."""
        return await reconcile_unknown(self, lookup, source=source, tool=tool, page_size=page_size)

    # -- audit calls (docs/api.md section 8) -----------------------------------------------------

    async def events(self, operation_id: str) -> list[Event]:
        """An operation's hash-chained history, oldest first."""
        response = await self.request("GET", f"/v1/operations/{_path_segment(operation_id)}/events")
        return self.decode(response, Page[Event]).items

    async def receipts(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        tool: str | None = None,
        principal: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        after: str | None = None,
    ) -> Page[OperationView]:
        """One page of committed operations with their receipts, in feed position order; `after`: the
        last `position` seen (a follower asks again with it and misses nothing)."""
        params = _query(
            since=since, until=until, tool=tool, principal=principal, limit=limit, cursor=cursor, after=after
        )
        response = await self.request("GET", "/v1/receipts", params=params)
        return self.decode(response, Page[OperationView])

    async def verify(self, operation_id: str | None = None) -> VerifyResult:
        """Recompute an operation's hash chain on the server."""
        response = await self.request("GET", "/v1/audit/verify", params=_query(operation_id=operation_id))
        return self.decode(response, VerifyResult)

    async def access_log(
        self, *, since: datetime | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Page[AccessLogEntry]:
        """One page of the diagnostics access log: who read which incident, when, and why."""
        params = _query(since=since, limit=limit, cursor=cursor)
        response = await self.request("GET", "/v1/diagnostics/access-log", params=params)
        return self.decode(response, Page[AccessLogEntry])

    # -- protected diagnostics (docs/api.md section 9) -------------------------------------------

    async def report_incident(self, diagnostics: Diagnostics) -> str:
        """Store a diagnostics record; returns its incident reference. Without a `report_id` one is made
        here, so that the client's retry of a report whose answer was lost stores nothing twice (API.md
        section 9; until round 24 such a retry stored the incident again)."""
        if diagnostics.report_id is None:
            diagnostics = msgspec.structs.replace(diagnostics, report_id=secrets.token_urlsafe(24))
        response = await self.request("POST", "/v1/diagnostics", body=diagnostics)
        return self.decode(response, _IncidentRef).incident

    async def read_incident(self, incident: str, *, purpose: str) -> IncidentRecord:
        """Read one incident; the read and its purpose are recorded in the access log."""
        path = f"/v1/diagnostics/{_path_segment(incident)}"
        response = await self.request("GET", path, params={"purpose": purpose})
        return self.decode(response, IncidentRecord)

    # -- recovery decision (section 10) and operations endpoints (section 11) ---------------

    async def decide_recovery(self, **facts: Any) -> RecoveryDecision:
        """POST /v1/recovery/decide with the section 10 fields as keyword arguments."""
        response = await self.request("POST", "/v1/recovery/decide", body=facts)
        return self.decode(response, RecoveryDecision)

    async def live(self) -> bool:
        """Whether the process answers /livez (one attempt, no retries)."""
        return await self._probe("/livez")

    async def ready(self) -> bool:
        """Whether /readyz says the database is reachable and migrated (one attempt, no retries)."""
        return await self._probe("/readyz")

    async def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        response = await self.request("GET", "/metrics", authenticated=False)
        return response.text

    async def openapi(self) -> dict[str, Any]:
        """The service's OpenAPI document."""
        response = await self.request("GET", "/schema/openapi.json", authenticated=False)
        return self.decode(response, dict[str, Any])

    async def _probe(self, path: str) -> bool:
        try:
            await self.request("GET", path, retry=_ONE_ATTEMPT, authenticated=False)
        except (LedgerProblem, LedgerUnreachable):
            return False
        return True


class _IncidentRef(msgspec.Struct):
    incident: str


_ONE_ATTEMPT = RetryPolicy(maximum_attempts=1, deadline_seconds=5.0)
