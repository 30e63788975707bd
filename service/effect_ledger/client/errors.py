"""problem+json answers as typed exceptions: one class per code under one base carrying the members."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import msgspec

from effect_ledger.client.models import OperationView
from effect_ledger.domain.errors import PROBLEMS

__all__ = [
    "CLASSES",
    "ConflictingOutcome",
    "EffectUsageError",
    "Forbidden",
    "HeadersTooLarge",
    "IntentConflict",
    "InternalError",
    "InvalidTransition",
    "LedgerClientError",
    "LedgerProblem",
    "LedgerUnreachable",
    "MalformedRequest",
    "MethodNotAllowed",
    "NotFound",
    "OperationInProgress",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "RateLimited",
    "RequestTimeout",
    "SensitiveValueRejected",
    "StaleClaim",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationFailed",
    "parse_retry_after",
    "problem_from_response",
]


class LedgerClientError(Exception):
    """Root of everything the client raises."""


class LedgerUnreachable(LedgerClientError):
    """No answer came back (connection refused, reset, timed out) within the retry budget."""

    def __init__(self, attempts: int, cause: httpx.TransportError) -> None:
        super().__init__(f"the ledger did not answer after {attempts} attempt(s): {type(cause).__name__}")
        self.attempts = attempts


class EffectUsageError(LedgerClientError):
    """The effect() helper was used against its protocol (a programming error, not a ledger answer)."""


class LedgerProblem(LedgerClientError):
    """A problem+json answer; subclasses name the code. `operation` is the view where the code has one."""

    advice = ""  # what the caller should do next, appended to the message

    def __init__(
        self,
        *,
        code: str,
        status: int,
        detail: str,
        operation: OperationView | None = None,
        incident: str | None = None,
        retry_after: float | None = None,
        members: dict[str, Any] | None = None,
        attempts: int = 1,
    ) -> None:
        advice = type(self).advice
        super().__init__(f"{code} ({status}): {detail}" + (f" {advice}" if advice else ""))
        self.code = code
        self.status = status
        self.detail = detail
        self.operation = operation
        self.incident = incident
        self.retry_after = retry_after  # seconds, from the Retry-After header
        self.members = members or {}  # every member of the problem document, as sent
        self.attempts = attempts  # how many times the client sent the request before giving up


class MalformedRequest(LedgerProblem):
    """400: the body is not JSON, or not an object."""


class Unauthenticated(LedgerProblem):
    """401: the bearer token is missing, invalid or expired."""


class Forbidden(LedgerProblem):
    """403: the token lacks the scope this call needs."""


class NotFound(LedgerProblem):
    """404: no such operation or incident in the caller's tenant."""


class MethodNotAllowed(LedgerProblem):
    """405: the method is not allowed on this path."""


class OperationInProgress(LedgerProblem):
    """409: a live lease holds the operation. Wait `retry_after` seconds, then claim again."""

    advice = "Another attempt holds a live lease: wait (retry_after seconds), then claim again."


class OutcomeUnknown(LedgerProblem):
    """409: the outcome is unknown. Reconcile it from evidence; never repeat the effect."""

    advice = "Reconcile it from evidence (client.reconcile or resolve); do not repeat the effect."


class StaleClaim(LedgerProblem):
    """409: the token is not the current attempt's; another attempt owns the operation now."""


class InvalidTransition(LedgerProblem):
    """409: the operation's state does not allow this call."""


class ConflictingOutcome(LedgerProblem):
    """409: a different outcome or receipt is already recorded; the disagreement was recorded."""


class PayloadTooLarge(LedgerProblem):
    """413: the body is over the server's limit."""


class UnsupportedMediaType(LedgerProblem):
    """415: the body must be application/json."""


class IntentConflict(LedgerProblem):
    """422: the operation ID is bound to another principal, tool, version or intent."""

    @property
    def mismatched(self) -> list[str]:
        """The binding fields that differ."""
        return list(self.members.get("mismatched") or [])


class ValidationFailed(LedgerProblem):
    """422: the request does not satisfy the contract."""

    @property
    def errors(self) -> list[dict[str, str]]:
        """[{"field": …, "problem": …}] as the server listed them."""
        return list(self.members.get("errors") or [])


class SensitiveValueRejected(LedgerProblem):
    """422: a diagnostics value looks like a credential; nothing was stored."""


class RevisionConflict(LedgerProblem):
    """409: the journal session is at another revision. Not transient: re-read and decide."""

    advice = "Read the session again and decide; do not re-send the batch blindly."

    @property
    def revision(self) -> int | None:
        """The session's current revision."""
        value = self.members.get("revision")
        return value if isinstance(value, int) else None


class InvalidHistory(LedgerProblem):
    """422: a journal batch breaks the causal rules or a cap; nothing of it was stored."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        """[{"index": …, "problem": …}] as the server listed them."""
        return list(self.members.get("errors") or [])


class UnsupportedSchema(LedgerProblem):
    """422: a journal record names a schema version newer than the service knows; nothing was stored."""


class ApprovalRequired(LedgerProblem):
    """403: the tool needs an approval of this exact binding and none is valid. `approval` is the
    request (pending): wait for a decision (effect() does, within its deadline), then claim again."""

    advice = "An approver must decide the request first; claim again once it is approved."

    @property
    def approval(self) -> dict[str, Any]:
        """The approval request's view, as sent."""
        value = self.members.get("approval")
        return value if isinstance(value, dict) else {}

    @property
    def approval_id(self) -> str | None:
        """The request's ID."""
        value = self.approval.get("approval_id")
        return value if isinstance(value, str) else None


class ApprovalDenied(ApprovalRequired):
    """403: the approval request for this binding was denied (until it expires)."""

    advice = "Do not run the effect."


class NotYetLogged(LedgerProblem):
    """409: the receipt is committed but not yet in the tenant's verifiable log; `retry_after` says when
    to ask for its proof again (API.md section 14)."""


class RequestTimeout(LedgerProblem):
    """408: the request did not arrive in time (the server's HTTP layer; a slow or stalled client)."""


class HeadersTooLarge(LedgerProblem):
    """431: the request line and headers are over the server's limit (16 KiB, 100 fields)."""


class RateLimited(LedgerProblem):
    """429: the per tenant+principal limit was hit; `retry_after` says when to come back."""


class InternalError(LedgerProblem):
    """500: the server failed; `incident` names the protected record."""


class Unavailable(LedgerProblem):
    """503: the ledger's database is unreachable or overloaded; `incident` and `retry_after` set."""


CLASSES: dict[str, type[LedgerProblem]] = {
    "malformed_request": MalformedRequest,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "operation_in_progress": OperationInProgress,
    "outcome_unknown": OutcomeUnknown,
    "stale_claim": StaleClaim,
    "invalid_transition": InvalidTransition,
    "conflicting_outcome": ConflictingOutcome,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "intent_conflict": IntentConflict,
    "validation_failed": ValidationFailed,
    "sensitive_value_rejected": SensitiveValueRejected,
    "revision_conflict": RevisionConflict,
    "invalid_history": InvalidHistory,
    "unsupported_schema": UnsupportedSchema,
    "approval_required": ApprovalRequired,
    "approval_denied": ApprovalDenied,
    "not_yet_logged": NotYetLogged,
    "rate_limited": RateLimited,
    "request_timeout": RequestTimeout,
    "headers_too_large": HeadersTooLarge,
    "internal": InternalError,
    "unavailable": Unavailable,
}
# A body without a known code (a proxy's 502 page, a WAF's bare 403) is mapped by its status alone, to
# the status's general code: its only code in the service's table, or, where several share the status,
# the general one named here (a new shared status without one fails at import). Until round 24 the last
# code listed for a status won: a bare 403 raised ApprovalDenied ("do not run the effect"), a bare 422
# UnsupportedSchema, a bare 409 NotYetLogged.
_GENERAL_OF_SHARED = {403: "forbidden", 409: "invalid_transition", 422: "validation_failed"}


def _general_codes() -> dict[int, str]:
    codes: dict[int, list[str]] = {}
    for code, (status, _) in PROBLEMS.items():
        codes.setdefault(status, []).append(code)
    return {
        status: listed[0] if len(listed) == 1 else _GENERAL_OF_SHARED[status]
        for status, listed in codes.items()
    }


_BY_STATUS = _general_codes()


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (RFC 9110: delta-seconds or an HTTP-date); None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():  # ASCII digits only, and few of them: int() raises on "²" (a digit to isdigit)
        # and on more than 4,300 digits, which made the client raise ValueError until round 24
        return float(int(text)) if text.isascii() and len(text) <= 12 else None
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


def problem_from_response(response: httpx.Response) -> LedgerProblem:
    """Map an error answer to its typed exception (a non-problem body is mapped by its status)."""
    try:
        body = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = body.get("code")
    if not isinstance(code, str) or code not in CLASSES:
        fallback = "internal" if response.status_code >= 500 else "malformed_request"
        code = _BY_STATUS.get(response.status_code, fallback)
    operation = None
    if isinstance(body.get("operation"), dict):
        try:
            operation = msgspec.convert(body["operation"], OperationView, strict=False)
        except msgspec.ValidationError:
            operation = None
    detail = body.get("detail")
    incident = body.get("incident")
    return CLASSES[code](
        code=code,
        status=response.status_code,
        detail=detail if isinstance(detail, str) else f"HTTP {response.status_code}",
        operation=operation,
        incident=incident if isinstance(incident, str) else None,
        retry_after=parse_retry_after(response.headers.get("retry-after")),
        members=body,
    )
