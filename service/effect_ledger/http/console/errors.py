"""Console answers for failures (pages in the console's style, never problem JSON or a trace), and
the security headers every console response carries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.response import Redirect
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from effect_ledger.domain.errors import DatabaseUnavailable, LedgerError
from effect_ledger.http.console.access import CsrfRejected
from effect_ledger.http.console.forms import field_problems
from effect_ledger.http.console.render import page
from effect_ledger.http.console.session import ConsoleSession, current_session
from effect_ledger.http.incidents import record_incident

CONSOLE_PREFIX = "/console"
# No inline script or style anywhere; forms post only to this origin; nobody may frame the console.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
)
NO_STORE = (b"cache-control", b"no-store")
Handler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


def is_console(path: str) -> bool:
    """True for the console's own paths."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


class ConsoleHeaders:
    """ASGI wrapper: security headers on every console answer (pages, redirects, errors, assets)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console(scope["path"]):  # type: ignore[comparison-overlap]
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith(CONSOLE_PREFIX + "/static/")

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS} | (set() if static else {NO_STORE[0]})
                kept = [h for h in message.get("headers", ()) if h[0].lower() not in names]
                extra = SECURITY_HEADERS if static else (*SECURITY_HEADERS, NO_STORE)
                message = {**message, "headers": [*kept, *extra]}
            await send(message)

        await self.app(scope, receive, send_secured)


def _session_or_none(request: Request[Any, Any, Any]) -> ConsoleSession | None:
    try:
        return current_session(request)
    except LedgerError:
        return None


def _error_page(
    request: Request[Any, Any, Any], status: int, heading: str, message: str, **extra: Any
) -> Response[Any]:
    return page(
        request,
        "error.html",
        _session_or_none(request),
        status=status,
        title=heading,
        heading=heading,
        message=message,
        **extra,
    )


def console_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The console's answer to any failure on a console path."""
    if isinstance(exc, LedgerError):
        return _ledger_error(request, exc)
    if isinstance(exc, CsrfRejected):
        return _error_page(
            request,
            403,
            "This form has expired",
            "The form's security token did not match your session, so nothing was changed. "
            "Go back, reload the page and try again.",
        )
    if isinstance(exc, NotFoundException):
        return _error_page(request, 404, "Page not found", "There is no console page at this address.")
    if isinstance(exc, MethodNotAllowedException):
        return _error_page(request, 405, "Not allowed here", "This page cannot be used that way.")
    if isinstance(exc, HTTPException) and exc.status_code < 500:
        return _error_page(
            request,
            exc.status_code,
            "Request not understood",
            "The browser sent something this page cannot use. Go back and try again.",
        )
    status, phase, kind = 500, "handler", type(exc).__name__
    if isinstance(exc, DatabaseUnavailable):
        status, phase, kind = 503, exc.phase, exc.exception_type
    incident, store = record_incident(request, kind, phase, status)
    response = _error_page(
        request,
        status,
        "Something went wrong" if status == 500 else "The ledger is unavailable",
        "Nothing on this page is lost. Try again in a moment; if it keeps happening, give your operators "
        "this incident reference.",
        incident=incident,
    )
    response.background = store
    return response


def _ledger_error(request: Request[Any, Any, Any], exc: LedgerError) -> Response[Any]:
    if exc.code == "unauthenticated":
        # Signed out, or the token inside the session has expired: back to the sign-in page.
        target = request.url.path if request.method == "GET" else "/console/"
        target = "/console/" if target == "/console/logout" else target
        return Redirect(f"/console/login?next={quote(target, safe='/')}", status_code=303)
    if exc.code == "forbidden":
        return _error_page(request, 403, "Not allowed with this token", exc.detail)
    if exc.code == "not_found":
        return _error_page(
            request, 404, "Not found", f"{exc.detail} It may not exist, or it is not your tenant's."
        )
    if exc.code == "validation_failed":
        return _error_page(
            request,
            422,
            "Check what you asked for",
            "Some values were not accepted.",
            problems=field_problems(exc),
        )
    if exc.code == "rate_limited":
        return _error_page(request, 429, "Too many requests", "Wait a moment and try again.")
    return _error_page(request, exc.status, exc.title, exc.detail)


def console_aware(handlers: dict[Any, Handler]) -> dict[Any, Handler]:
    """The API's exception handlers, each answering with a console page on console paths."""

    def wrap(api_handler: Handler) -> Handler:
        def handler(request: Request[Any, Any, Any], exc: Any) -> Response[Any]:
            if is_console(request.url.path):
                return console_error(request, exc)
            return api_handler(request, exc)

        return handler

    wrapped = {kind: wrap(api_handler) for kind, api_handler in handlers.items()}
    wrapped[CsrfRejected] = wrap(lambda request, exc: console_error(request, exc))
    return wrapped
