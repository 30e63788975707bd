"""RFC 9457 problem+json for every failure, framework-level ones included."""

from __future__ import annotations

import re
from typing import Any

import structlog
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import (
    ClientException,
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE
from litestar.utils.scope.state import ScopeState

from effect_ledger.domain.errors import PROBLEMS, DatabaseUnavailable, LedgerError, validation_failed
from effect_ledger.domain.model import Operation, operation_view
from effect_ledger.http.incidents import record_incident

PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_UNAVAILABLE = 1
log = structlog.get_logger("effect_ledger.http")


def problem_body(error: LedgerError) -> dict[str, Any]:
    """The problem document: fixed members from the taxonomy plus controlled extensions."""
    body: dict[str, Any] = {
        "type": f"urn:effect-ledger:problem:{error.code}",
        "title": error.title,
        "status": error.status,
        "code": error.code,
        "detail": error.detail,
    }
    for name, value in error.extensions.items():
        body[name] = operation_view(value) if isinstance(value, Operation) else value
    return body


def problem_headers(error: LedgerError, headers: dict[str, str] | None = None) -> dict[str, str]:
    """The headers a problem's code calls for (Retry-After, WWW-Authenticate), after `headers`."""
    all_headers = dict(headers or {})
    if error.retry_after is not None:
        all_headers["Retry-After"] = str(error.retry_after)
    if error.code == "unauthenticated":
        all_headers["WWW-Authenticate"] = "Bearer"
    return all_headers


def problem_response(
    error: LedgerError, headers: dict[str, str] | None = None, background: BackgroundTask | None = None
) -> Response[Any]:
    """A problem+json response with the headers the code calls for."""
    return Response(
        problem_body(error),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=problem_headers(error, headers),
        background=background,
    )


def on_ledger_error(_: Request[Any, Any, Any], exc: LedgerError) -> Response[Any]:
    """Domain and auth errors: their code says everything."""
    return problem_response(exc)


_FIELD_IN_MESSAGE = re.compile(r"field `([^`]+)`")
_EXPECTED = re.compile(r"^Expected `([^`]+)`(.*?)(?:, got `([^`]+)`)?(?: - at `\$(.*)`)?$")


def _field_problem(message: str, key: str) -> tuple[str, str]:
    """Turn a msgspec message into (field, problem) text built from controlled pieces only."""
    named = _FIELD_IN_MESSAGE.search(message)
    if message.startswith("Object contains unknown field") and named:
        field = named.group(1) if key in ("data", "") else f"{key}.{named.group(1)}"
        return field, "unknown field"
    if message.startswith("Object missing required field") and named:
        field = named.group(1) if key in ("data", "") else f"{key}.{named.group(1)}"
        return field, "required"
    field = key if key not in ("", "data") else "body"
    expected = _EXPECTED.match(message)
    if expected:
        constraint = expected.group(2).strip()
        kind = expected.group(1)
        if constraint:
            return field, f"must be {kind} {constraint}"[:120]
        return field, f"must be {kind}"
    if message.startswith("Invalid enum value"):
        return field, "is not one of the allowed values"
    return field, "is invalid"


def on_validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    """Body decoding: not an object -> 400 malformed_request; wrong fields or types -> 422."""
    cached = ScopeState.from_scope(request.scope).body
    if isinstance(cached, bytes) and not cached.strip():
        return problem_response(LedgerError("malformed_request", "The body is empty; send a JSON object."))
    extra = exc.extra if isinstance(exc.extra, list) else []
    errors: list[tuple[str, str]] = []
    for item in extra:
        if not isinstance(item, dict):
            continue
        message, key = str(item.get("message", "")), str(item.get("key", ""))
        if key == "data" and message.startswith("Expected `object`"):
            return problem_response(LedgerError("malformed_request", "The body must be a JSON object."))
        if item.get("source") == "query":
            errors.append((key, "is invalid"))
            continue
        errors.append(_field_problem(message, key))
    return problem_response(validation_failed(errors or [("body", "is invalid")]))


def on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Framework errors (404 route, 405, 413, malformed JSON) in the same problem form."""
    if isinstance(exc, NotFoundException):
        return problem_response(LedgerError("not_found", "No such resource."))
    if isinstance(exc, MethodNotAllowedException):
        headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
        return problem_response(
            LedgerError("method_not_allowed", "This method is not allowed here."), headers
        )
    if exc.status_code == HTTP_413_REQUEST_ENTITY_TOO_LARGE:
        return problem_response(LedgerError("payload_too_large", "The request body is over the size limit."))
    if isinstance(exc, ClientException) and exc.status_code == 400:
        return problem_response(LedgerError("malformed_request", "The body is not valid JSON."))
    if exc.status_code == 415:
        return problem_response(LedgerError("unsupported_media_type", "The body must be application/json."))
    codes = {status: code for code, (status, _) in PROBLEMS.items()}
    code = codes.get(exc.status_code, "malformed_request" if exc.status_code < 500 else "internal")
    return problem_response(LedgerError(code, PROBLEMS[code][1] + "."))


def on_unavailable(request: Request[Any, Any, Any], exc: DatabaseUnavailable) -> Response[Any]:
    """Database unreachable or overloaded: 503 with Retry-After and an incident reference."""
    incident, store = record_incident(request, exc.exception_type, exc.phase, 503)
    error = LedgerError(
        "unavailable",
        "The ledger's database is unavailable; retry later.",
        {"incident": incident},
        RETRY_AFTER_UNAVAILABLE,
    )
    return problem_response(error, background=store)


def on_too_deep(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """JSON nested beyond what the decoder follows: a bad body, not a server fault."""
    return problem_response(validation_failed([("body", "is nested too deeply")]))


def on_internal(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Anything else: 500 with only an incident reference; the details go to protected diagnostics."""
    incident, store = record_incident(request, type(exc).__name__, "handler", 500)
    error = LedgerError("internal", "An internal error occurred.", {"incident": incident})
    return problem_response(error, background=store)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    LedgerError: on_ledger_error,
    ValidationException: on_validation,
    HTTPException: on_http_exception,
    DatabaseUnavailable: on_unavailable,
    RecursionError: on_too_deep,
    Exception: on_internal,
}
