"""The console's read pages (docs/api.md section 13): each calls the same repository functions as the API.

Every page first asks for the signed-in session with the scopes the matching API call needs, so the
console never shows more than the token could fetch through `/v1`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from effect_ledger.db import ledger as repo
from effect_ledger.db import reads, receipt_log
from effect_ledger.domain.diagnostics import INCIDENT_ID
from effect_ledger.domain.errors import LedgerError, not_found
from effect_ledger.domain.model import STATUSES, UNKNOWN, Operation, operation_view
from effect_ledger.domain.note import b64
from effect_ledger.domain.receipt_log import ProofInvalid, origin_of, verify_proof
from effect_ledger.http.audit import ACCESS_CURSOR
from effect_ledger.http.auth import AUDIT, DIAG_READ, EXECUTE, JOURNAL_READ, RECONCILE
from effect_ledger.http.console.access import holds, signed_in
from effect_ledger.http.console.forms import field_problems
from effect_ledger.http.console.render import page
from effect_ledger.http.console.session import ConsoleSession
from effect_ledger.http.context import audit_ledger_of
from effect_ledger.http.journal import session_projection
from effect_ledger.http.paging import QueryProblems, encode_cursor, format_position
from effect_ledger.http.reconciler import LIST_CURSOR
from effect_ledger.http.schemas import OPERATION_ID

PAGE_SIZE = "50"


def _problems(error: LedgerError) -> list[tuple[str, str]]:
    return field_problems(error) if error.code == "validation_failed" else [("", error.detail)]


async def readable_operation(
    request: Request[Any, Any, Any], session: ConsoleSession, operation_id: str
) -> Operation:
    """The operation as the API's read gives it; an executor-only token sees only its own principal's."""
    if not OPERATION_ID.match(operation_id):
        raise not_found()
    op = await repo.get_operation(audit_ledger_of(request), session.caller.tenant, operation_id)
    if not holds(session, RECONCILE, AUDIT) and op.binding.principal != session.caller.principal:
        raise not_found()
    return op


def operation_page(
    request: Request[Any, Any, Any],
    session: ConsoleSession,
    op: Operation,
    events: list[dict[str, Any]] | None,
    chain: Any,
    *,
    status: int = 200,
    **context: Any,
) -> Template:
    """The operation page: the view, the timeline, the chain check, and the resolve form where allowed."""
    return page(
        request,
        "operation.html",
        session,
        status=status,
        title=f"Operation {op.operation_id}",
        op=operation_view(op),
        events=events,
        chain=chain,
        can_resolve=holds(session, RECONCILE),
        resolvable=op.effective_status == UNKNOWN,
        **context,
    )


async def operation_context(
    request: Request[Any, Any, Any], session: ConsoleSession, operation_id: str
) -> tuple[Operation, list[dict[str, Any]] | None, Any]:
    """The operation, its events (reconcile/audit) and its chain verdict (audit), as the API reads them."""
    op = await readable_operation(request, session, operation_id)
    ledger, tenant = audit_ledger_of(request), session.caller.tenant
    events = (
        await repo.list_events(ledger, tenant, operation_id) if holds(session, RECONCILE, AUDIT) else None
    )
    chain = await reads.verify_operation(ledger, tenant, operation_id) if holds(session, AUDIT) else None
    return op, events, chain


async def log_facts(
    request: Request[Any, Any, Any], session: ConsoleSession, op: Operation
) -> dict[str, Any] | None:
    """The operation's place in the receipts log (API.md section 14), for holders of ledger:audit: its
    leaf index and whether its proof verifies against the current checkpoint, checked here with the
    same offline verifier as effect-ledger-verify (None: not shown)."""
    signer = request.app.state.log_signer
    if not holds(session, AUDIT) or signer is None or op.status != "committed":
        return None
    settings = request.app.state.settings
    tenant = session.caller.tenant
    config: receipt_log.Witnesses = request.app.state.log_witnesses
    try:
        text = await receipt_log.proof_of(audit_ledger_of(request), tenant, op.operation_id, 1, config)
    except LedgerError as error:
        if error.code == "not_yet_logged":
            return {"index": None, "state": "pending", "detail": error.detail.lower().rstrip(".")}
        raise
    except receipt_log.LogTampered:  # the index the read found stays shown beside the failure (round 36)
        return {"index": op.log_index, "state": "bad", "detail": "the stored entry no longer matches the log"}
    vkey = await signer.vkey(origin_of(settings.log_origin, tenant))
    witnesses = [w.vkey for w in config.items]
    try:
        verified = verify_proof(text, vkey, witnesses, config.quorum, op.receipt)
    except ProofInvalid as invalid:
        return {"index": op.log_index, "state": "bad", "detail": str(invalid)}
    return {"index": verified.index, "size": verified.size, "state": "ok", "detail": verified.line}


async def log_overview(request: Request[Any, Any, Any], session: ConsoleSession) -> dict[str, Any] | None:
    """The tenant's latest checkpoint, its size and the witnesses that cosigned it (ledger:audit)."""
    if not holds(session, AUDIT) or request.app.state.log_signer is None:
        return None
    settings = request.app.state.settings
    config: receipt_log.Witnesses = request.app.state.log_witnesses
    latest = await receipt_log.latest_checkpoint(audit_ledger_of(request), session.caller.tenant, config)
    cosigned = [] if latest is None else list(latest.cosigned_by)
    return {
        "origin": origin_of(settings.log_origin, session.caller.tenant),
        "size": None if latest is None else latest.size,
        "root": None if latest is None else b64(latest.root),
        "note": None if latest is None else latest.note,
        "witnesses": [w.name for w in config.items],
        "cosigned": cosigned,
        "quorum": config.quorum,
    }


async def filtered_list(
    request: Request[Any, Any, Any],
    session: ConsoleSession,
    template: str,
    title: str,
    q: QueryProblems,
    filters: dict[str, str],
    fetch: Callable[[], Awaitable[ListPage]],
    **extra: Any,
) -> Template:
    """A paged list of operations behind filters: bad filters answer the same page with their problems.
    `fetch` gives the page's operation views and the cursor of the next page."""
    try:
        q.check()
    except LedgerError as error:
        return page(
            request,
            template,
            session,
            status=422,
            title=title,
            items=[],
            filters=filters,
            problems=_problems(error),
            next_cursor=None,
            **extra,
        )
    items, next_cursor = await fetch()
    return page(
        request,
        template,
        session,
        title=title,
        filters=filters,
        problems=[],
        items=items,
        next_cursor=next_cursor,
        **extra,
    )


ListPage = tuple[list[dict[str, Any]], str | None]


async def operations_page(listing: Awaitable[reads.Page[Operation]]) -> ListPage:
    """A page of the operations list as views, with its keyset cursor."""
    result = await listing
    return [operation_view(op) for op in result.items], encode_cursor(LIST_CURSOR, result.next_key)


async def receipts_page(listing: Awaitable[reads.FeedPage]) -> ListPage:
    """A page of the receipts feed as views with their positions; the cursor is the last position."""
    result = await listing
    items = [{**operation_view(op), "position": format_position(pos)} for op, pos in result.items]
    return items, None if result.next_after is None else format_position(result.next_after)


class ConsolePages(Controller):
    """Pages that read: overview, unknown queue, operations, one operation, receipts, access log."""

    path = "/console"
    include_in_schema = False

    @get("/")
    async def overview(self, request: Request[Any, Any, Any]) -> Template:
        """Who is signed in, what the token allows, and where to go."""
        session = signed_in(request)
        return page(
            request, "overview.html", session, title="Overview", log=await log_overview(request, session)
        )

    @get("/unknown")
    async def unknown_queue(
        self, request: Request[Any, Any, Any], cursor: FromQuery[str | None] = None
    ) -> Template:
        """Unknown (and expired-submitted) operations, oldest first: the reconcilers' work list."""
        session = signed_in(request, RECONCILE, AUDIT)
        q = QueryProblems(request, ("cursor",))
        after = q.cursor(cursor, LIST_CURSOR)
        q.check()
        result = await reads.list_operations(
            audit_ledger_of(request),
            session.caller.tenant,
            status=UNKNOWN,
            tool=None,
            updated_before=None,
            after=after,
            limit=int(PAGE_SIZE),
        )
        return page(
            request,
            "unknown.html",
            session,
            title="Unknown queue",
            items=[operation_view(op) for op in result.items],
            next_cursor=encode_cursor(LIST_CURSOR, result.next_key),
            first_page=after is None,
        )

    @get("/operations")
    async def search(
        self,
        request: Request[Any, Any, Any],
        status: FromQuery[str | None] = None,
        tool: FromQuery[str | None] = None,
        updated_before: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        operation_id: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """Operations by status, tool and last update, oldest first; or straight to one by its ID."""
        session = signed_in(request, RECONCILE, AUDIT)
        if operation_id:
            target = operation_id.strip()
            if OPERATION_ID.match(target):
                return Redirect(f"/console/operations/{target}", status_code=303)
        filters = {"status": status or "", "tool": tool or "", "updated_before": updated_before or ""}
        q = QueryProblems(request, ("status", "tool", "updated_before", "cursor", "operation_id"))
        wanted, tool_name = q.choice("status", status, STATUSES), q.text("tool", tool)
        before, after = q.timestamp("updated_before", updated_before), q.cursor(cursor, LIST_CURSOR)
        if operation_id and not OPERATION_ID.match(operation_id.strip()):
            q.errors.append(("operation_id", "must be 1-200 characters of [A-Za-z0-9._:~-]"))
        return await filtered_list(
            request,
            session,
            "operations.html",
            "Operations",
            q,
            filters,
            lambda: operations_page(
                reads.list_operations(
                    audit_ledger_of(request),
                    session.caller.tenant,
                    status=wanted,
                    tool=tool_name,
                    updated_before=before,
                    after=after,
                    limit=int(PAGE_SIZE),
                )
            ),
            statuses=STATUSES,
        )

    @get("/operations/{operation_id:str}")
    async def operation(
        self,
        request: Request[Any, Any, Any],
        operation_id: FromPath[str],
        resolved: FromQuery[str | None] = None,
    ) -> Template:
        """One operation: the view, its event timeline with hashes, the chain check, the resolve form."""
        session = signed_in(request, EXECUTE, RECONCILE, AUDIT)
        op, events, chain = await operation_context(request, session, operation_id)
        notice = {
            "recorded": "Your resolution was recorded.",
            "unresolved": "Your look-up was recorded; the operation stays unknown.",
        }.get(resolved or "")
        logged = await log_facts(request, session, op)
        return operation_page(
            request, session, op, events, chain, notice=notice, form={}, problems=[], logged=logged
        )

    @get("/receipts")
    async def receipts(
        self,
        request: Request[Any, Any, Any],
        tool: FromQuery[str | None] = None,
        principal: FromQuery[str | None] = None,
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Template:
        """Committed operations with their receipts, in commit order."""
        session = signed_in(request, AUDIT)
        filters = {
            "tool": tool or "",
            "principal": principal or "",
            "since": since or "",
            "until": until or "",
        }
        q = QueryProblems(request, ("tool", "principal", "since", "until", "cursor"))
        tool_name, who = q.text("tool", tool), q.text("principal", principal)
        start, end = q.timestamp("since", since), q.timestamp("until", until)
        after = q.position("cursor", cursor)
        return await filtered_list(
            request,
            session,
            "receipts.html",
            "Receipts",
            q,
            filters,
            lambda: receipts_page(
                reads.list_receipts(
                    audit_ledger_of(request),
                    session.caller.tenant,
                    since=start,
                    until=end,
                    tool=tool_name,
                    principal=who,
                    after=after,
                    limit=int(PAGE_SIZE),
                )
            ),
        )

    @get("/access-log")
    async def access_log(
        self, request: Request[Any, Any, Any], cursor: FromQuery[str | None] = None
    ) -> Template:
        """Who read which incident, when and why (ledger:audit)."""
        session = signed_in(request, AUDIT)
        q = QueryProblems(request, ("cursor",))
        after = q.cursor(cursor, ACCESS_CURSOR)
        q.check()
        result = await reads.list_access_log(
            audit_ledger_of(request), session.caller.tenant, since=None, after=after, limit=int(PAGE_SIZE)
        )
        return page(
            request,
            "access_log.html",
            session,
            title="Access log",
            items=[reads.access_view(row) for row in result.items],
            next_cursor=encode_cursor(ACCESS_CURSOR, result.next_key),
        )

    @get("/incidents")
    async def incidents(
        self, request: Request[Any, Any, Any], ref: FromQuery[str | None] = None
    ) -> Response[Any]:
        """Look an incident up by its reference (the purpose is asked on the next page)."""
        session = signed_in(request, DIAG_READ)
        if ref and INCIDENT_ID.match(ref.strip()):
            return Redirect(f"/console/incidents/{ref.strip()}", status_code=303)
        problems = (
            [("Incident reference", "looks like inc_ followed by 16-64 letters, digits, _ or -")]
            if ref
            else []
        )
        return page(
            request,
            "incidents.html",
            session,
            status=422 if ref else 200,
            title="Incidents",
            problems=problems,
            ref=ref or "",
        )

    @get("/sessions/{session_id:str}")
    async def journal_session(self, request: Request[Any, Any, Any], session_id: FromPath[str]) -> Template:
        """A journal session's projection: each call's ledger status and `resume` (docs/api.md section 12).

        Same rules as the API: journal:read reads the user's own sessions, ledger:audit any of the tenant's;
        anything else is the same not-found page. Reading dispatches nothing."""
        session = signed_in(request, JOURNAL_READ, AUDIT)
        view = await session_projection(request, session.caller, session_id, audit_ledger_of(request))
        return page(request, "session.html", session, title="Journal session", view=view)
