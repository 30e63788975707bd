"""The operation as the ledger holds it, its effective status, and the public view of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec

from effect_ledger.domain.canonical import (
    canonical_json,
    digest_of_canonical,
    encode_members,
    intent_digest,
    plain_scalar,
    sorted_encoding,
)
from effect_ledger.domain.errors import Refusal
from effect_ledger.domain.timefmt import format_ts

PENDING: Final = "pending"
SUBMITTED: Final = "submitted"
COMMITTED: Final = "committed"
NOT_APPLIED: Final = "not_applied"
UNKNOWN: Final = "unknown"
STATUSES: Final = (PENDING, SUBMITTED, COMMITTED, NOT_APPLIED, UNKNOWN)
TERMINAL: Final = frozenset({COMMITTED, NOT_APPLIED})
BINDING_FIELDS: Final = ("principal", "tool", "tool_version", "intent_digest")
DEFAULT_LEASE_SECONDS: Final = 30
# An operation ID: 1 - 200 characters of [A-Za-z0-9._:~-]. `$(?!\n)`: Python's `$` also matches before a
# final newline (`op%0A` in a path passed, and the database's check answered 500 until round 24); the
# lookahead keeps the pattern ECMA-262 for the OpenAPI schema. The service, the journal's records and the
# MCP gateway all check this one pattern.
OPERATION_ID_PATTERN: Final = r"^[A-Za-z0-9._:~-]{1,200}$(?!\n)"
RECEIPT_FIELDS: Final = (
    "external_ref",
    "result_digest",
    "result",
    "observed_at",
    "recorded_by",
    "recorded_at",
)


@dataclass(frozen=True, slots=True)
class Binding:
    """What an operation ID is bound to at its first claim; it never changes."""

    principal: str
    tool: str
    tool_version: str
    intent_digest: str

    def mismatched(self, other: Binding) -> list[str]:
        """Names of the binding fields on which two bindings differ, in contract order."""
        return [name for name in BINDING_FIELDS if getattr(self, name) != getattr(other, name)]


@dataclass(frozen=True, slots=True)
class Operation:
    """One row of the operations table plus the database clock at which it was read."""

    operation_id: str
    binding: Binding
    status: str
    attempt: int
    claim_token_hash: bytes
    client_nonce_hash: bytes | None
    sealed_token: bytes | None
    lease_seconds: int
    lease_expires_at: datetime | None
    effect_ref: str | None
    receipt: dict[str, Any] | None
    not_applied_reason: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    resolved_at: datetime | None
    resolved_by: str | None
    last_seq: int
    last_hash: str
    now: datetime = field(compare=False)
    receipt_digest: str | None = None  # kept by a purge when it dropped the receipt body
    # Reads (GET /v1/operations/{id}) look the receipt up in the tenant's log (API.md section 14):
    # the view then carries `log_index`, the leaf index, or null while no checkpoint covers it.
    log_index: int | None = None
    shows_log_index: bool = False

    @property
    def purged(self) -> bool:
        """A tombstone (API.md section 9a): terminal, with its receipt body or reason purged."""
        return self.status in TERMINAL and self.receipt is None and self.not_applied_reason is None

    @property
    def lease_live(self) -> bool:
        """Whether a lease is held at the database clock `now`."""
        return self.lease_expires_at is not None and self.lease_expires_at > self.now

    @property
    def lease_expired(self) -> bool:
        """Whether the operation has a lease and that lease has run out."""
        return self.lease_expires_at is not None and self.lease_expires_at <= self.now

    @property
    def effective_status(self) -> str:
        """A submitted operation whose lease has expired *is* unknown, swept or not."""
        if self.status == SUBMITTED and not self.lease_live:
            return UNKNOWN
        return self.status

    def retry_after_seconds(self) -> int:
        """Whole seconds until the lease runs out, at least 1."""
        if self.lease_expires_at is None:
            return 1
        remaining = (self.lease_expires_at - self.now) / timedelta(seconds=1)
        return max(1, math.ceil(remaining))


def receipt_view(receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored receipt as the operation view shows it."""
    return None if receipt is None else {k: receipt.get(k) for k in RECEIPT_FIELDS}


class _Shown(msgspec.Struct, gc=False):
    """RECEIPT_FIELDS in JCS order (sorted), for canonical.encode_members."""

    external_ref: Any
    observed_at: Any
    recorded_at: Any
    recorded_by: Any
    result: msgspec.Raw
    result_digest: Any


def receipt_digest(receipt: dict[str, Any] | None) -> str | None:
    """What a tombstone keeps of a receipt: `sha256:` of the JCS form of the receipt as it was shown.
    The receipts log computes one per receipt it logs and per receipt its checkpointer re-checks: the
    members written straight from the receipt when they are plain (no view built, no walk)."""
    if receipt is None:
        return None
    get = receipt.get
    ref, observed, at, by, digest = (
        get("external_ref"), get("observed_at"), get("recorded_at"), get("recorded_by"), get("result_digest")
    )  # fmt: skip
    if (
        plain_scalar(ref)
        and plain_scalar(observed)
        and plain_scalar(at)
        and plain_scalar(by)
        and plain_scalar(digest)
    ):
        result = msgspec.Raw(canonical_json(get("result")))
        body = encode_members(_Shown(ref, observed, at, by, result, digest))
        if body is not None:
            return digest_of_canonical(body)
    return intent_digest(receipt_view(receipt))


def receipt_digest_is(receipt: dict[str, Any], expected: str) -> bool:
    """Whether a stored receipt (a database row's, decoded by msgspec from jsonb) has the digest
    `expected`: tried first on msgspec's sorted encoding of its members, unchecked (as chain.link_holds
    tries an event: a match is a match), then by receipt_digest. The checkpointer compares every new
    leaf's receipt digest with its operation's receipt this way."""
    if type(receipt) is not dict:
        return receipt_digest(receipt) == expected
    get = receipt.get
    result = sorted_encoding(get("result"))
    body = None if result is None else encode_members(
        _Shown(
            get("external_ref"), get("observed_at"), get("recorded_at"), get("recorded_by"),
            msgspec.Raw(result), get("result_digest"),
        )
    )  # fmt: skip
    if body is not None and digest_of_canonical(body) == expected:
        return True
    return receipt_digest(receipt) == expected


def operation_view(op: Operation) -> dict[str, Any]:
    """The operation view of docs/api.md section 5 (section 9a: a tombstone also says `purged` and shows
    the purged receipt's digest)."""
    view = {
        "operation_id": op.operation_id,
        "principal": op.binding.principal,
        "tool": op.binding.tool,
        "tool_version": op.binding.tool_version,
        "intent_digest": op.binding.intent_digest,
        "status": op.effective_status,
        "attempt": op.attempt,
        "lease_expires_at": format_ts(op.lease_expires_at),
        "lease_expired": op.lease_expired,
        "effect_ref": op.effect_ref,
        "receipt": receipt_view(op.receipt),
        "not_applied_reason": op.not_applied_reason,
        "created_at": format_ts(op.created_at),
        "updated_at": format_ts(op.updated_at),
        "submitted_at": format_ts(op.submitted_at),
        "resolved_at": format_ts(op.resolved_at),
        "resolved_by": op.resolved_by,
    }
    if op.purged:
        view["purged"] = True
        view["receipt_digest"] = op.receipt_digest
    if op.shows_log_index:
        view["log_index"] = op.log_index
    return view


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event to append in the same transaction as the state change it records."""

    kind: str
    actor: str
    from_status: str | None
    to_status: str | None
    attempt: int
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """The new state of an operation (None: unchanged) and the events that record the change."""

    state: Operation | None
    events: tuple[EventDraft, ...]


NO_CHANGE: Final = Change(None, ())


@dataclass(frozen=True, slots=True)
class Decision:
    """A command decided against the current row: what to write, and the answer or the refusal.

    `outcome` is the word the write path's database functions report for the same case (migration
    0005): a claim verdict (created, new_attempt, replay, reuse_receipt), submitted, extended,
    completed, resolved, unchanged, or the refusal's code. A refusal may still write (a
    `discrepancy` event records a conflicting outcome).
    """

    outcome: str
    change: Change = NO_CHANGE
    refusal: Refusal | None = None
