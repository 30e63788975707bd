"""Protected diagnostics (docs/api.md section 9): the incident record, its allow-list and its screening."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.errors import LedgerError, validation_failed
from effect_ledger.domain.screening import find_credentials
from effect_ledger.domain.timefmt import format_ts

Phase = Literal[
    "connect", "request", "first_byte", "stream", "tool_execution", "policy", "approval", "reconcile"
]
Cause = Literal[
    "timeout", "rate_limited", "auth", "invalid_request", "upstream", "aborted", "protocol", "unknown"
]
Source = Literal["report", "error", "outcome"]

# Header names worth keeping for diagnosis: none of them ever carries a credential by design.
ALLOWED_HEADERS: Final = frozenset({"retry-after", "request-id", "x-request-id"})
ALLOWED_HEADER_PREFIX: Final = "x-ratelimit-"
HEADER_PROBLEM: Final = "name is not one of retry-after, request-id, x-request-id, x-ratelimit-*"
INCIDENT_ID = re.compile(r"^inc_[A-Za-z0-9_-]{16,64}\Z")
PURPOSE_MIN, PURPOSE_MAX = 3, 200


def new_incident_id() -> str:
    """An unguessable incident reference (144 random bits)."""
    return "inc_" + secrets.token_urlsafe(18)


def new_access_id() -> str:
    """An access-log row's id."""
    return "acc_" + secrets.token_urlsafe(12)


_REPORTED: Final = {"reported": True}  # a field a caller may report (docs/api.md section 9)


@dataclass(frozen=True, slots=True)
class Incident:
    """One row of diagnostics.incidents: reported fields, or the controlled facts of a failure.

    The one definition of the incident's fields, in the table's column order: the catalogue's
    statements, the migrations' functions, the request body, the client's structs and the reader's
    view follow it (derived here, or checked by tests/unit/test_incident_fields.py)."""

    tenant: str
    incident_id: str
    source: Source
    principal: str | None = None
    operation_id: str | None = field(default=None, metadata=_REPORTED)
    attempt: int | None = field(default=None, metadata=_REPORTED)
    phase: str | None = field(default=None, metadata=_REPORTED)
    cause: str | None = field(default=None, metadata=_REPORTED)
    http_status: int | None = field(default=None, metadata=_REPORTED)
    provider: str | None = field(default=None, metadata=_REPORTED)
    provider_request_id: str | None = field(default=None, metadata=_REPORTED)
    retryable_hint: bool | None = field(default=None, metadata=_REPORTED)
    elapsed_ms: int | None = field(default=None, metadata=_REPORTED)
    detail_code: str | None = field(default=None, metadata=_REPORTED)
    headers: dict[str, str] | None = field(default=None, metadata=_REPORTED)
    route: str | None = None
    method: str | None = None
    exception_type: str | None = None
    created_at: datetime | None = None  # None: the database clock at insert


INCIDENT_COLUMNS: Final = tuple(f.name for f in fields(Incident))  # insert_incident's parameters, in order
# The fields a caller may report, in contract order (store_report's parameters after the key); nothing
# else ever reaches the table.
REPORT_FIELDS: Final = tuple(f.name for f in fields(Incident) if f.metadata.get("reported"))
# What a reader sees (incident_view): the reference as `incident`, then every stored field but the tenant.
VIEW_FIELDS: Final = (
    "incident",
    "created_at",
    *(c for c in INCIDENT_COLUMNS if c not in ("tenant", "incident_id", "created_at")),
)


def incident_values(incident: Incident) -> tuple[Any, ...]:
    """The incident's values in INCIDENT_COLUMNS order (the parameters of insert_incident)."""
    return tuple(getattr(incident, name) for name in INCIDENT_COLUMNS)


def reported_values(incident: Incident) -> tuple[Any, ...]:
    """The reported fields' values in REPORT_FIELDS order."""
    return tuple(getattr(incident, name) for name in REPORT_FIELDS)


@dataclass(frozen=True, slots=True)
class ReportKey:
    """What makes a report idempotent: the SHA-256 of its report_id (the ID itself is never stored)
    and a fingerprint of its fields, which tells a retried report from a different one."""

    key: bytes
    fingerprint: bytes


def report_key(report_id: str, fields_reported: Mapping[str, Any]) -> ReportKey:
    """The stored key of a report_id and the fingerprint of the (normalised) fields sent with it."""
    return ReportKey(
        hashlib.sha256(report_id.encode()).digest(),
        hashlib.sha256(canonical_json(dict(fields_reported))).digest(),
    )


def report_conflict() -> LedgerError:
    """The same report_id from the same principal with different fields."""
    return LedgerError(
        "conflicting_outcome", "This report_id was already used for a report with different fields."
    )


def allowed_header(name: str) -> bool:
    """Whether a header name is on the diagnostics allow-list (case-insensitive)."""
    lowered = name.lower()
    return lowered in ALLOWED_HEADERS or (
        lowered.startswith(ALLOWED_HEADER_PREFIX) and len(lowered) > len(ALLOWED_HEADER_PREFIX)
    )


def normalise_headers(headers: Mapping[str, str] | None, field: str = "headers") -> dict[str, str] | None:
    """Lower-cased allowed headers; any other name is refused (by position: a name may itself be a secret)."""
    if headers is None:
        return None
    errors: list[tuple[str, str]] = []
    normalised: dict[str, str] = {}
    for position, (name, value) in enumerate(headers.items()):
        if not allowed_header(name):
            errors.append((f"{field}[{position}]", HEADER_PROBLEM))
        elif name.lower() in normalised:
            errors.append((f"{field}[{position}]", "repeats a header name (names are case-insensitive)"))
        else:
            normalised[name.lower()] = value
    if errors:
        raise validation_failed(errors)
    return normalised


def screen(values: Mapping[str, Any], prefix: str = "") -> None:
    """Refuse (422 sensitive_value_rejected) any value or key shaped like a credential; store nothing."""
    found = find_credentials(dict(values))
    if found:
        named = [prefix + path.removeprefix("$").removeprefix(".") for path in found]
        raise LedgerError(
            "sensitive_value_rejected",
            "A diagnostics value looks like a credential; nothing was stored.",
            {"errors": [{"field": name, "problem": "looks like a credential"} for name in named]},
        )


def check_purpose(purpose: str | None) -> str:
    """A read's stated purpose: required, 3-200 characters once surrounding space is trimmed."""
    if purpose is None:
        raise validation_failed([("purpose", "required")])
    trimmed = purpose.strip()
    if not PURPOSE_MIN <= len(trimmed) <= PURPOSE_MAX:
        raise validation_failed([("purpose", f"must be {PURPOSE_MIN}-{PURPOSE_MAX} characters")])
    screen({"purpose": trimmed})
    return trimmed


def incident_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An incident as a reader sees it (VIEW_FIELDS): every stored field, the reference named `incident`."""
    view: dict[str, Any] = {"incident": row["incident_id"], "created_at": format_ts(row["created_at"])}
    view.update((name, row[name]) for name in VIEW_FIELDS[2:])
    return view
