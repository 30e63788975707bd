"""The one error taxonomy: every failure the service reports has a stable code mapped to one status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# code -> (HTTP status, title). The only place a code meets a status.
PROBLEMS: dict[str, tuple[int, str]] = {
    "malformed_request": (400, "Malformed request"),
    "unauthenticated": (401, "Unauthenticated"),
    "forbidden": (403, "Forbidden"),
    "not_found": (404, "Not found"),
    "method_not_allowed": (405, "Method not allowed"),
    "operation_in_progress": (409, "Operation in progress"),
    "outcome_unknown": (409, "Outcome unknown"),
    "stale_claim": (409, "Stale claim"),
    "invalid_transition": (409, "Invalid transition"),
    "conflicting_outcome": (409, "Conflicting outcome"),
    "request_timeout": (408, "Request timeout"),
    "payload_too_large": (413, "Payload too large"),
    "unsupported_media_type": (415, "Unsupported media type"),
    "intent_conflict": (422, "Intent conflict"),
    "validation_failed": (422, "Validation failed"),
    "sensitive_value_rejected": (422, "Sensitive value rejected"),
    "revision_conflict": (409, "Revision conflict"),
    "invalid_history": (422, "Invalid history"),
    "unsupported_schema": (422, "Unsupported schema"),
    "not_yet_logged": (409, "Not yet logged"),
    "approval_required": (403, "Approval required"),
    "approval_denied": (403, "Approval denied"),
    "rate_limited": (429, "Rate limited"),
    "headers_too_large": (431, "Request header fields too large"),
    "internal": (500, "Internal error"),
    "unavailable": (503, "Service unavailable"),
}


@dataclass
class LedgerError(Exception):
    """Root of every error the service reports; `detail` is written from controlled fields only."""

    code: str
    detail: str
    extensions: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None

    def __post_init__(self) -> None:
        if self.code not in PROBLEMS:
            raise ValueError(f"unknown problem code {self.code!r}")
        super().__init__(self.code)

    @property
    def status(self) -> int:
        """The HTTP status that this code always maps to."""
        return PROBLEMS[self.code][0]

    @property
    def title(self) -> str:
        """The fixed, human-readable title of this code."""
        return PROBLEMS[self.code][1]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A command the rules refuse, as a value: the domain returns refusals and never raises them."""

    code: str
    detail: str
    extensions: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None

    def error(self) -> LedgerError:
        """The problem to answer with (raised only at the HTTP edge)."""
        return LedgerError(self.code, self.detail, dict(self.extensions), self.retry_after)


def validation_failed(errors: list[tuple[str, str]]) -> LedgerError:
    """A 422 listing each offending field and what is wrong with it."""
    return LedgerError(
        "validation_failed",
        "The request does not satisfy the contract; see errors.",
        {"errors": [{"field": f, "problem": p} for f, p in errors]},
    )


def not_found(what: str = "operation") -> LedgerError:
    """A 404 that reads the same whether the thing is absent or belongs to another tenant."""
    return LedgerError("not_found", f"No such {what}.")


def revision_conflict(revision: int) -> LedgerError:
    """A 409: the journal append's expected_revision is not the session's; re-read and decide."""
    return LedgerError(
        "revision_conflict",
        "The session is at another revision; read it again and decide, do not re-send blindly.",
        {"revision": revision},
    )


def invalid_history(errors: list[tuple[int, str]]) -> LedgerError:
    """A 422: a journal batch breaks the causal rules or a cap; each error names its batch index."""
    return LedgerError(
        "invalid_history",
        "The records break the journal's causal rules or caps; see errors.",
        {"errors": [{"index": i, "problem": p} for i, p in errors]},
    )


def unsupported_schema(indexes: list[int], newest: int) -> LedgerError:
    """A 422: a journal record names a schema version newer than this service knows."""
    return LedgerError(
        "unsupported_schema",
        f"A record names a schema version newer than {newest}; nothing was stored.",
        {"errors": [{"index": i, "problem": f"schema is newer than {newest}"} for i in indexes]},
    )


class DatabaseUnavailable(Exception):
    """The database could not be reached or is overloaded; raised by db/, mapped to 503."""

    def __init__(self, phase: str, exception_type: str) -> None:
        super().__init__(phase)
        self.phase = phase
        self.exception_type = exception_type
