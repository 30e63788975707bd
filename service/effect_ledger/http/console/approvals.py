"""The console's Approvals page (docs/api.md section 15): the pending queue, each request with its
intent (escaped), note, requester and age, and approve / deny forms (CSRF-checked) that go through
the API's own decide path, so the console can never decide what the token could not."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from effect_ledger.db import approvals as approval_repo
from effect_ledger.domain.approvals import MAX_REASON
from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.approvals import decide_request
from effect_ledger.http.auth import APPROVE
from effect_ledger.http.console.access import checked_form, signed_in
from effect_ledger.http.console.render import page
from effect_ledger.http.console.session import ConsoleSession
from effect_ledger.http.context import audit_ledger_of
from effect_ledger.http.paging import QueryProblems, encode_cursor

QUEUE_CURSOR = "approvals"
PAGE_SIZE = 50
NOTICES = {
    "approved": "Your approval was recorded.",
    "denied": "Your denial was recorded: the claim stays refused until the request expires.",
}
# Refusals of a decision, in words for the person who pressed the button.
REFUSALS = {
    "forbidden": (403, "You asked for this approval yourself: someone else must decide it."),
    "conflicting_outcome": (409, "You already decided this request the other way; each decides once."),
    "invalid_transition": (409, "This request is no longer pending (decided, expired, revoked or consumed)."),
    "not_found": (404, "No such approval request in your tenant."),
    "validation_failed": (422, f"Choose approve or deny; a reason is at most {MAX_REASON} characters."),
}


async def queue_page(
    request: Request[Any, Any, Any],
    session: ConsoleSession,
    *,
    cursor: str | None = None,
    status: int = 200,
    **context: Any,
) -> Template:
    """The pending requests, oldest first, with the shared page context."""
    q = QueryProblems(request, ("cursor", "decided"))
    after = q.cursor(cursor, QUEUE_CURSOR)
    q.check()
    items, last = await approval_repo.list_approvals(
        audit_ledger_of(request), session.caller.tenant, "pending", PAGE_SIZE, after
    )
    return page(
        request,
        "approvals.html",
        session,
        status=status,
        title="Approvals",
        items=items,
        next_cursor=encode_cursor(QUEUE_CURSOR, last),
        first_page=after is None,
        max_reason=MAX_REASON,
        **context,
    )


class ConsoleApprovals(Controller):
    """GET the queue, POST a decision."""

    path = "/console/approvals"
    include_in_schema = False

    @get("/")
    async def queue(
        self,
        request: Request[Any, Any, Any],
        cursor: FromQuery[str | None] = None,
        decided: FromQuery[str | None] = None,
    ) -> Template:
        """The approvers' queue: pending requests of the tenant, oldest first."""
        session = signed_in(request, APPROVE)
        return await queue_page(request, session, cursor=cursor, notice=NOTICES.get(decided or ""))

    @post("/{approval_id:str}/decide", status_code=303)
    async def decide(self, request: Request[Any, Any, Any], approval_id: FromPath[str]) -> Response[Any]:
        """Approve or deny through the API's decide; a refusal comes back as the queue with a sentence."""
        session = signed_in(request, APPROVE)
        form = await checked_form(request, session)
        decision = form.get("decision", "")
        reason = form.get("reason", "").strip() or None
        try:
            if decision not in ("approve", "deny") or (reason is not None and len(reason) > MAX_REASON):
                raise LedgerError("validation_failed", "The decision form is not valid.")
            await decide_request(request, session.caller, approval_id, decision, reason)
        except LedgerError as error:
            if error.code not in REFUSALS:
                raise
            status, sentence = REFUSALS[error.code]
            return await queue_page(
                request, session, status=status, error_message=sentence, error_code=error.code
            )
        done = "approved" if decision == "approve" else "denied"
        return Redirect(f"/console/approvals?decided={done}", status_code=303)
