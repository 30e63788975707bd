"""Typed results and request values of the ledger API (msgspec structs; unknown answer fields are ignored)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from msgspec import Struct

__all__ = [
    "AccessLogEntry",
    "Category",
    "ClaimGrant",
    "ClaimResult",
    "Diagnostics",
    "Event",
    "Evidence",
    "IncidentRecord",
    "NotAppliedReason",
    "OperationView",
    "Page",
    "Receipt",
    "RecordedReceipt",
    "RecoveryDecision",
    "VerifyResult",
]

T = TypeVar("T")
Status = Literal["pending", "submitted", "committed", "not_applied", "unknown"]
Category = Literal["rejected", "validation", "unauthorized", "cancelled_before_submit", "other"]


class Receipt(Struct, omit_defaults=True, kw_only=True):
    """A receipt to record: at least one of external_ref, result_digest, result."""

    external_ref: str | None = None
    result_digest: str | None = None
    result: Any = None
    observed_at: datetime | None = None


class RecordedReceipt(Struct, kw_only=True):
    """A receipt as the ledger holds it: what was reported, plus who recorded it and when."""

    recorded_by: str
    recorded_at: datetime
    external_ref: str | None = None
    result_digest: str | None = None
    result: Any = None
    observed_at: datetime | None = None


class NotAppliedReason(Struct, kw_only=True):
    """Why an effect did not apply."""

    category: Category
    detail_code: str | None = None


class Evidence(Struct, omit_defaults=True, kw_only=True):
    """What a reconciler looked at to resolve an operation."""

    source: str
    checked_at: datetime
    lookup_ref: str | None = None


class Diagnostics(Struct, omit_defaults=True, kw_only=True):
    """The protected diagnostics fields of docs/api.md section 9 (only those; nothing else is accepted)."""

    operation_id: str | None = None
    attempt: int | None = None
    phase: str | None = None
    cause: str | None = None
    http_status: int | None = None
    provider: str | None = None
    provider_request_id: str | None = None
    retryable_hint: bool | None = None
    elapsed_ms: int | None = None
    detail_code: str | None = None
    headers: dict[str, str] | None = None
    report_id: str | None = None  # makes a retried report idempotent: the same ID answers the same incident


class OperationView(Struct, kw_only=True):
    """The operation view of docs/api.md section 5 (`incident` only where one was stored)."""

    operation_id: str
    principal: str
    tool: str
    tool_version: str
    intent_digest: str
    status: Status
    attempt: int
    lease_expired: bool
    created_at: datetime
    updated_at: datetime
    lease_expires_at: datetime | None = None
    effect_ref: str | None = None
    receipt: RecordedReceipt | None = None
    not_applied_reason: NotAppliedReason | None = None
    submitted_at: datetime | None = None
    resolved_at: datetime | None = None
    resolved_by: str | None = None
    incident: str | None = None
    purged: bool = False  # a tombstone (API.md 9a): the receipt body is gone, its digest remains
    receipt_digest: str | None = None
    position: str | None = None  # on receipts-feed items: pass the last one back as `after`
    log_index: int | None = None  # on reads: the receipt's leaf in the tenant's log (API.md 14)


class ClaimGrant(Struct, kw_only=True):
    """A granted attempt: its number, its fencing token and its lease."""

    attempt: int
    token: str
    lease_expires_at: datetime


class ClaimResult(Struct, kw_only=True):
    """A claim's answer: execute (with a grant) or reuse_receipt (with the committed operation)."""

    action: Literal["execute", "reuse_receipt"]
    operation: OperationView
    claim: ClaimGrant | None = None
    replayed: bool = False  # the server answered `Idempotent-Replayed: true`


class Page(Struct, Generic[T], kw_only=True):
    """One page of a keyset-paginated list; next_cursor is None on the last page."""

    items: list[T]
    next_cursor: str | None = None


class Event(Struct, kw_only=True):
    """One hash-chained event of an operation's history."""

    seq: int
    at: datetime
    kind: str
    actor: str
    attempt: int
    prev_hash: str
    hash: str
    from_status: str | None = None
    to_status: str | None = None
    data: dict[str, Any] = {}


class AccessLogEntry(Struct, kw_only=True):
    """One read of a protected incident: who read it, when, and why."""

    access_id: str
    at: datetime
    incident: str
    principal: str
    purpose: str


class IncidentRecord(Struct, kw_only=True):
    """A protected diagnostics record as an authorised reader sees it."""

    incident: str
    created_at: datetime
    source: str | None = None  # "report", or the kind of failure the service recorded
    principal: str | None = None
    operation_id: str | None = None
    attempt: int | None = None
    phase: str | None = None
    cause: str | None = None
    http_status: int | None = None
    provider: str | None = None
    provider_request_id: str | None = None
    retryable_hint: bool | None = None
    elapsed_ms: int | None = None
    detail_code: str | None = None
    headers: dict[str, str] | None = None
    route: str | None = None
    method: str | None = None
    exception_type: str | None = None


class VerifyResult(Struct, kw_only=True):
    """The outcome of recomputing a hash chain (one operation's, or every chain of the tenant)."""

    ok: bool
    checked: int
    first_bad_seq: int | None = None
    first_bad_operation_id: str | None = None  # only when the whole tenant was verified


class RecoveryDecision(Struct, kw_only=True):
    """The answer of POST /v1/recovery/decide."""

    action: Literal["reconcile", "stop", "retry"]
    reason: Literal["cause", "visible", "effects", "budget"] | None = None
    delay_ms: int | None = None
