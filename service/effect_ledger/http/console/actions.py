"""The console's state-changing forms: sign in, sign out, resolve, read an incident with a purpose.

Each POST carries a CSRF token tied to the browser's sealed cookie, and each answers by redirecting
(post/redirect/get) or by showing the same page again with the problem in words.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from effect_ledger.db import diagnostics as diagnostics_repo
from effect_ledger.db.pools import Pools
from effect_ledger.domain.diagnostics import INCIDENT_ID, check_purpose
from effect_ledger.domain.errors import LedgerError, not_found
from effect_ledger.http.auth import DIAG_READ, RECONCILE
from effect_ledger.http.console.access import checked_form, safe_next, signed_in
from effect_ledger.http.console.forms import FORM_FIELDS, field_problems, resolve_body, resolve_message
from effect_ledger.http.console.pages import operation_context, operation_page
from effect_ledger.http.console.render import page
from effect_ledger.http.console.session import (
    ConsoleSession,
    current_session,
    forget_login_form,
    login_csrf,
    login_csrf_matches,
    sign_in,
    sign_out,
)
from effect_ledger.http.context import audit_ledger_of, refuse_while_log_behind
from effect_ledger.http.reconciler import resolve_operation

_FORM_STATUS = {
    "validation_failed": 422,
    "conflicting_outcome": 409,
    "invalid_transition": 409,
    "forbidden": 403,
}


def _login_page(
    request: Request[Any, Any, Any],
    *,
    status: int = 200,
    message: str | None = None,
    next_path: str = "",
    notice: str | None = None,
) -> Template:
    csrf, cookie = login_csrf(request)
    response = page(
        request,
        "login.html",
        None,
        status=status,
        title="Sign in",
        login_csrf=csrf,
        message=message,
        next_path=safe_next(next_path),
        notice=notice,
    )
    if cookie is not None:
        response.set_cookie(cookie)
    return response


def _has_session(request: Request[Any, Any, Any]) -> bool:
    try:
        current_session(request)
    except LedgerError:
        return False
    return True


def incident_page(
    request: Request[Any, Any, Any],
    session: ConsoleSession,
    incident: str,
    *,
    status: int = 200,
    record: dict[str, Any] | None = None,
    purpose: str = "",
    problems: list[tuple[str, str]] | None = None,
) -> Template:
    """The incident page: the purpose prompt, or (after a recorded read) the record."""
    return page(
        request,
        "incident.html",
        session,
        status=status,
        title=f"Incident {incident}",
        incident_id=incident,
        record=record,
        purpose=purpose,
        problems=problems or [],
    )


class ConsoleActions(Controller):
    """Sign-in, sign-out, and the forms that write (each with its CSRF token)."""

    path = "/console"
    include_in_schema = False

    @get("/login")
    async def login_form(
        self, request: Request[Any, Any, Any], signed_out: FromQuery[str | None] = None
    ) -> Response[Any]:
        """The sign-in form: paste a bearer token (it goes in the POST body, never the URL)."""
        if "token" in request.query_params:
            # Someone put a token in a URL: never use it, and drop it from the address bar.
            return Redirect("/console/login", status_code=303)
        next_path = request.query_params.get("next") or ""
        if _has_session(request):
            return Redirect(safe_next(next_path), status_code=303)
        notice = "You are signed out." if signed_out else None
        return _login_page(request, next_path=next_path, notice=notice)

    @post("/login", status_code=303)
    async def login(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Verify the token exactly like the API, then keep it in a sealed, HttpOnly session cookie."""
        form = await request.form()
        token = str(form.get("token") or "").strip()
        next_path = str(form.get("next") or "")
        if not login_csrf_matches(request, str(form.get("csrf") or "")):
            return _login_page(
                request,
                status=403,
                next_path=next_path,
                message="The sign-in form had expired. Paste your token again.",
            )
        if not token:
            return _login_page(
                request, status=422, next_path=next_path, message="Paste a bearer token to sign in."
            )
        if token.lower().startswith("bearer "):
            token = token[7:].strip()
        try:
            _, cookie = sign_in(request, token)
        except LedgerError as error:
            return _login_page(request, status=401, next_path=next_path, message=error.detail)
        response = Redirect(safe_next(next_path), status_code=303)
        response.set_cookie(cookie)
        forget_login_form(request, response)
        return response

    @get("/logout")
    async def logout_form(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Confirm signing out (a GET never changes state)."""
        return page(request, "logout.html", signed_in(request), title="Sign out")

    @post("/logout", status_code=303)
    async def logout(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """End the session: the browser drops its cookie."""
        session = signed_in(request)
        await checked_form(request, session)
        response = Redirect("/console/login?signed_out=1", status_code=303)
        sign_out(request, response)
        return response

    @post("/operations/{operation_id:str}/resolve", status_code=303)
    async def resolve(self, request: Request[Any, Any, Any], operation_id: FromPath[str]) -> Response[Any]:
        """Resolve from the form through the API's own resolve path; refusals come back as sentences."""
        session = signed_in(request, RECONCILE)
        form = await checked_form(request, session)
        try:
            body = resolve_body(form)
            refuse_while_log_behind(request)
            op = await resolve_operation(audit_ledger_of(request), session.caller, operation_id, body)
        except LedgerError as error:
            if error.code not in _FORM_STATUS:
                raise
            op, events, chain = await operation_context(request, session, operation_id)
            problems = field_problems(error) if error.code == "validation_failed" else []
            return operation_page(
                request,
                session,
                op,
                events,
                chain,
                status=_FORM_STATUS[error.code],
                error_message=resolve_message(error),
                error_code=error.code,
                problems=problems,
                form={name: form.get(name, "") for name in FORM_FIELDS},
                notice=None,
            )
        outcome = "unresolved" if body.outcome == "unresolved" else "recorded"
        return Redirect(f"/console/operations/{op.operation_id}?resolved={outcome}", status_code=303)

    @get("/incidents/{incident:str}")
    async def incident_prompt(self, request: Request[Any, Any, Any], incident: FromPath[str]) -> Template:
        """Ask why before reading: the read is recorded with its purpose in the access log."""
        session = signed_in(request, DIAG_READ)
        if not INCIDENT_ID.match(incident):
            raise not_found("incident")
        return incident_page(request, session, incident)

    @post("/incidents/{incident:str}")
    async def read_incident(self, request: Request[Any, Any, Any], incident: FromPath[str]) -> Template:
        """Read an incident for a stated purpose; the read and the purpose are recorded in one commit."""
        session = signed_in(request, DIAG_READ)
        form = await checked_form(request, session)
        if not INCIDENT_ID.match(incident):
            raise not_found("incident")
        purpose = form.get("purpose", "").strip()
        try:
            stated = check_purpose(purpose)
        except LedgerError as error:
            problems = (
                field_problems(error)
                if error.code == "validation_failed"
                else [("Purpose", "looks like a credential: describe your reason without secrets")]
            )
            return incident_page(request, session, incident, status=422, problems=problems)
        pools: Pools = request.app.state.pools
        record = await diagnostics_repo.read_incident(
            pools.reader,
            pools.acquire_timeout,
            session.caller.tenant,
            session.caller.principal,
            incident,
            stated,
        )
        return incident_page(request, session, incident, record=record, purpose=stated)
