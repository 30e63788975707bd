"""Audit calls of docs/api.md section 8: events, the receipts feed, chain verification, the access log."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get
from litestar.params import FromQuery

from effect_ledger.db import ledger as repo
from effect_ledger.db import reads
from effect_ledger.domain.model import operation_view
from effect_ledger.http.auth import AUDIT, RECONCILE, requires
from effect_ledger.http.context import audit_ledger_of, caller_of
from effect_ledger.http.paging import QueryProblems, encode_cursor, format_position
from effect_ledger.http.schemas import OperationId, check_operation_id

ACCESS_CURSOR = "access_log"


class AuditController(Controller):
    """What auditors read: the history of every operation, proof that it is intact, and receipts."""

    path = "/v1"
    tags = ("audit",)

    @get("/operations/{operation_id:str}/events", guards=[requires(RECONCILE, AUDIT)])
    async def events(self, request: Request[Any, Any, Any], operation_id: OperationId) -> Response[Any]:
        """An operation's events in chain order, each with prev_hash and hash."""
        items = await repo.list_events(audit_ledger_of(request), caller_of(request).tenant, operation_id)
        return Response({"items": items})

    @get("/receipts", guards=[requires(AUDIT)])
    async def receipts(
        self,
        request: Request[Any, Any, Any],
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        tool: FromQuery[str | None] = None,
        principal: FromQuery[str | None] = None,
        limit: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """Committed operations with their receipts in commit (feed position) order; `after` or
        `cursor`: continue after that position."""
        q = QueryProblems(request, ("since", "until", "tool", "principal", "limit", "cursor", "after"))
        start, end = q.timestamp("since", since), q.timestamp("until", until)
        tool_name, who = q.text("tool", tool), q.text("principal", principal)
        from_cursor, from_after = q.position("cursor", cursor), q.position("after", after)
        if cursor and after:
            q.errors.append(("cursor", "send at most one of cursor and after"))
        page_size = q.limit(limit)
        q.check()
        page = await reads.list_receipts(
            audit_ledger_of(request),
            caller_of(request).tenant,
            since=start,
            until=end,
            tool=tool_name,
            principal=who,
            after=from_cursor or from_after,
            limit=page_size,
        )
        return Response(
            {
                "items": [{**operation_view(op), "position": format_position(pos)} for op, pos in page.items],
                "next_cursor": None if page.next_after is None else format_position(page.next_after),
            }
        )

    @get("/audit/verify", guards=[requires(AUDIT)])
    async def verify(
        self, request: Request[Any, Any, Any], operation_id: FromQuery[str | None] = None
    ) -> Response[Any]:
        """Recompute one operation's hash chain, or every chain of the tenant."""
        QueryProblems(request, ("operation_id",)).check()
        ledger, tenant = audit_ledger_of(request), caller_of(request).tenant
        if operation_id:
            check_operation_id(operation_id)
            verdict = await reads.verify_operation(ledger, tenant, operation_id)
            body = {"ok": verdict.ok, "checked": verdict.checked, "first_bad_seq": verdict.first_bad_seq}
            return Response(body)
        whole = await reads.verify_tenant(ledger, tenant)
        return Response(
            {
                "ok": whole.first_bad_seq is None,
                "checked": whole.checked,
                "first_bad_seq": whole.first_bad_seq,
                "first_bad_operation_id": whole.first_bad_operation_id,
            }
        )

    @get("/diagnostics/access-log", guards=[requires(AUDIT)])
    async def access_log(
        self,
        request: Request[Any, Any, Any],
        since: FromQuery[str | None] = None,
        limit: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """Who read which incident, when and why, oldest first."""
        q = QueryProblems(request, ("since", "limit", "cursor"))
        start, after, page_size = q.timestamp("since", since), q.cursor(cursor, ACCESS_CURSOR), q.limit(limit)
        q.check()
        page = await reads.list_access_log(
            audit_ledger_of(request), caller_of(request).tenant, since=start, after=after, limit=page_size
        )
        return Response(
            {
                "items": [reads.access_view(row) for row in page.items],
                "next_cursor": encode_cursor(ACCESS_CURSOR, page.next_key),
            }
        )
