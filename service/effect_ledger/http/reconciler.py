"""Reconciler calls of docs/api.md section 7: the keyset-paged operations list, and resolve from evidence."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response, get, post
from litestar.params import FromQuery, JSONBody
from msgspec import Meta, Struct

from effect_ledger.db import ledger as repo
from effect_ledger.db import reads
from effect_ledger.db.ledger import Ledger
from effect_ledger.domain.errors import validation_failed
from effect_ledger.domain.model import STATUSES, Operation, operation_view
from effect_ledger.domain.timefmt import format_ts, parse_ts
from effect_ledger.domain.transitions import Report
from effect_ledger.http.auth import AUDIT, RECONCILE, Caller, requires
from effect_ledger.http.context import audit_ledger_of, caller_of, refuse_while_log_behind
from effect_ledger.http.executor import view_response
from effect_ledger.http.paging import QueryProblems, encode_cursor
from effect_ledger.http.schemas import (
    OperationId,
    ReasonBody,
    ReceiptBody,
    reason_content,
    receipt_content,
    strict,
)

LIST_CURSOR = "operations"
LIST_PARAMS = ("status", "tool", "updated_before", "limit", "cursor")


class EvidenceBody(Struct, forbid_unknown_fields=True):
    """Where the reconciler looked and when."""

    source: Annotated[str, Meta(min_length=1, max_length=200)]
    checked_at: str
    lookup_ref: Annotated[str, Meta(min_length=1, max_length=512)] | None = None


class ResolveBody(Struct, forbid_unknown_fields=True):
    """POST /v1/operations/{id}/resolve."""

    outcome: Literal["committed", "not_applied", "unresolved"]
    evidence: EvidenceBody
    receipt: ReceiptBody | None = None
    reason: ReasonBody | None = None


def evidence_content(evidence: EvidenceBody) -> dict[str, Any]:
    """The evidence as recorded in the resolution's event, its time normalised."""
    try:
        checked_at = format_ts(parse_ts(evidence.checked_at))
    except ValueError:
        raise validation_failed([("evidence.checked_at", "must be an RFC 3339 timestamp")]) from None
    return {"source": evidence.source, "lookup_ref": evidence.lookup_ref, "checked_at": checked_at}


async def resolve_operation(
    ledger: Ledger, caller: Caller, operation_id: str, data: ResolveBody
) -> Operation:
    """Resolve one operation from evidence: the one path the API and the console both take.

    One round trip (db/ledger.resolve); a refusal is raised here, as the problem it answers with.
    """
    report = Report(
        data.outcome,
        receipt_content(data.receipt, data.outcome),
        reason_content(data.reason, data.outcome),
        evidence_content(data.evidence),
    )
    outcome = await repo.resolve(ledger, caller.tenant, operation_id, caller.principal, report)
    if outcome.refusal is not None:
        raise outcome.refusal.error()
    assert outcome.operation is not None
    return outcome.operation


class ReconcilerController(Controller):
    """Find operations whose outcome is unknown and settle them from evidence."""

    path = "/v1/operations"
    tags = ("reconciler",)

    @get("/", guards=[requires(RECONCILE, AUDIT)])
    async def list_operations(
        self,
        request: Request[Any, Any, Any],
        status: FromQuery[str | None] = None,
        tool: FromQuery[str | None] = None,
        updated_before: FromQuery[str | None] = None,
        limit: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """Operations oldest first; status=unknown includes submitted ones whose lease has expired."""
        q = QueryProblems(request, LIST_PARAMS)
        wanted, tool_name = q.choice("status", status, STATUSES), q.text("tool", tool)
        before, page_size = q.timestamp("updated_before", updated_before), q.limit(limit)
        after = q.cursor(cursor, LIST_CURSOR)
        q.check()
        page = await reads.list_operations(
            audit_ledger_of(request),
            caller_of(request).tenant,
            status=wanted,
            tool=tool_name,
            updated_before=before,
            after=after,
            limit=page_size,
        )
        return Response(
            {
                "items": [operation_view(op) for op in page.items],
                "next_cursor": encode_cursor(LIST_CURSOR, page.next_key),
            }
        )

    @post("/{operation_id:str}/resolve", guards=[requires(RECONCILE)], status_code=200, **strict(ResolveBody))
    async def resolve(
        self, request: Request[Any, Any, Any], operation_id: OperationId, data: JSONBody[ResolveBody]
    ) -> Response[Any]:
        """Settle an unknown operation as committed or not_applied, or record an unresolved look-up."""
        refuse_while_log_behind(request)
        op = await resolve_operation(audit_ledger_of(request), caller_of(request), operation_id, data)
        return view_response(op)
