"""Approval calls of docs/api.md section 15: the approvers' list, one request, decide, revoke, and the
request's hash-chained events for auditors. The gate itself is in the claim (http/executor.py)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import Meta, Struct

from effect_ledger.db import approvals as repo
from effect_ledger.db.approvals import ApprovalObserver
from effect_ledger.domain.approvals import MAX_REASON, STATUSES
from effect_ledger.domain.errors import not_found
from effect_ledger.http.auth import APPROVE, AUDIT, EXECUTE, Caller, requires
from effect_ledger.http.context import audit_ledger_of, caller_of, reading_ledger_of
from effect_ledger.http.paging import QueryProblems, encode_cursor
from effect_ledger.http.schemas import strict

APPROVAL_PATH = "/v1/approvals"
LIST_CURSOR = "approvals"
LIST_PARAMS = ("status", "limit", "cursor")
_APPROVAL_ID = re.compile(r"apr_[0-9a-f]{32}")

Reason = Annotated[str, Meta(max_length=MAX_REASON)]


class DecideBody(Struct, forbid_unknown_fields=True):
    """POST /v1/approvals/{id}/decide."""

    decision: Literal["approve", "deny"]
    reason: Reason | None = None


class RevokeBody(Struct, forbid_unknown_fields=True):
    """POST /v1/approvals/{id}/revoke."""

    reason: Reason | None = None


def checked_id(approval_id: str) -> str:
    """A request ID that is not even well-formed is not found, like a missing one."""
    if not _APPROVAL_ID.fullmatch(approval_id):
        raise not_found()
    return approval_id


def observer_of(request: Request[Any, Any, Any]) -> ApprovalObserver:
    """The metrics, as the approval observer."""
    observer: ApprovalObserver = request.app.state.metrics
    return observer


async def decide_request(
    request: Request[Any, Any, Any], caller: Caller, approval_id: str, decision: str, reason: str | None
) -> dict[str, Any]:
    """Decide one request (the API's and the console's one path); refusals raised as their problems."""
    done = await repo.decide(
        audit_ledger_of(request),
        caller.tenant,
        checked_id(approval_id),
        caller.principal,
        decision,
        reason,
        observer_of(request),
    )
    refusal = repo.refusal_of(done.outcome)
    if refusal is not None:
        raise refusal
    assert done.view is not None
    return done.view


class ApprovalsController(Controller):
    """Approvers list, read and decide requests of their tenant, never their own."""

    path = APPROVAL_PATH
    tags = ("approvals",)

    @get("/", guards=[requires(APPROVE)])
    async def list_requests(
        self,
        request: Request[Any, Any, Any],
        status: FromQuery[str | None] = None,
        limit: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        """The tenant's approval requests, oldest first (status: the effective one)."""
        caller = caller_of(request)
        problems = QueryProblems(request, LIST_PARAMS)
        wanted = problems.choice("status", status, STATUSES)
        size = problems.limit(limit)
        after = problems.cursor(cursor, LIST_CURSOR)
        problems.check()
        items, last = await repo.list_approvals(audit_ledger_of(request), caller.tenant, wanted, size, after)
        return {"items": items, "next_cursor": encode_cursor(LIST_CURSOR, last)}

    @get("/{approval_id:str}", guards=[requires(APPROVE, EXECUTE)])
    async def read(self, request: Request[Any, Any, Any], approval_id: FromPath[str]) -> dict[str, Any]:
        """One request; an executor without ledger:approve reads only its own (others: not found)."""
        caller = caller_of(request)
        view = await repo.get_approval(reading_ledger_of(request), caller.tenant, checked_id(approval_id))
        if APPROVE not in caller.scopes and view["principal"] != caller.principal:
            raise not_found()
        return view

    @get("/{approval_id:str}/events", guards=[requires(AUDIT)])
    async def events(self, request: Request[Any, Any, Any], approval_id: FromPath[str]) -> dict[str, Any]:
        """The request's hash-chained events (requested, approved, denied, revoked, expired, consumed)."""
        caller = caller_of(request)
        items = await repo.list_events(audit_ledger_of(request), caller.tenant, checked_id(approval_id))
        return {"items": list(items)}

    @post("/{approval_id:str}/decide", guards=[requires(APPROVE)], status_code=200, **strict(DecideBody))
    async def decide(
        self, request: Request[Any, Any, Any], approval_id: FromPath[str], data: JSONBody[DecideBody]
    ) -> Response[Any]:
        """Approve or deny: distinct approvers, never the requester; `required` yeses approve, a no denies."""
        view = await decide_request(request, caller_of(request), approval_id, data.decision, data.reason)
        return Response(view, status_code=200)

    @post("/{approval_id:str}/revoke", guards=[requires(APPROVE)], status_code=200, **strict(RevokeBody))
    async def revoke(
        self, request: Request[Any, Any, Any], approval_id: FromPath[str], data: JSONBody[RevokeBody]
    ) -> Response[Any]:
        """Revoke a request unless an attempt already consumed it."""
        caller = caller_of(request)
        done = await repo.revoke(
            audit_ledger_of(request),
            caller.tenant,
            checked_id(approval_id),
            caller.principal,
            data.reason,
            observer_of(request),
        )
        refusal = repo.refusal_of(done.outcome)
        if refusal is not None:
            raise refusal
        return Response(done.view, status_code=200)
