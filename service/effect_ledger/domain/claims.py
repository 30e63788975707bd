"""Who gets to execute: the claim rules of docs/api.md section 6, as pure decisions."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from effect_ledger.domain.chain import GENESIS_HASH
from effect_ledger.domain.errors import LedgerError
from effect_ledger.domain.model import (
    COMMITTED,
    NOT_APPLIED,
    PENDING,
    SUBMITTED,
    Binding,
    Change,
    EventDraft,
    Operation,
)
from effect_ledger.domain.timefmt import format_ts, to_ms


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """A claim as the executor asked for it, with tenant and principal already from the token."""

    operation_id: str
    binding: Binding
    lease_seconds: int
    nonce_hash: bytes | None


@dataclass(frozen=True, slots=True)
class AttemptMaterial:
    """The new attempt's secrets as stored: the token's hash and, with a nonce, the sealed token."""

    token_hash: bytes
    sealed_token: bytes | None


ClaimVerdict = Literal["reuse_receipt", "replay", "new_attempt"]


def operation_error(code: str, detail: str, op: Operation, retry_after: int | None = None) -> LedgerError:
    """A 409-family problem that carries the operation it is about."""
    return LedgerError(code, detail, {"operation": op}, retry_after)


def decide_claim(op: Operation, req: ClaimRequest) -> ClaimVerdict:
    """What a claim of an existing operation gets; raises the refusals of the claim table."""
    mismatched = op.binding.mismatched(req.binding)
    if mismatched:  # checked before everything else, so a foreign intent learns nothing about state
        raise LedgerError(
            "intent_conflict",
            "The operation ID is bound to a different principal, tool, version or intent.",
            {"mismatched": mismatched},
        )
    if op.status == COMMITTED:
        return "reuse_receipt"
    if op.status in (PENDING, SUBMITTED) and op.lease_live:
        if (
            req.nonce_hash is not None
            and op.client_nonce_hash is not None
            and hmac.compare_digest(op.client_nonce_hash, req.nonce_hash)
        ):
            return "replay"
        raise operation_error(
            "operation_in_progress",
            "A live lease holds this operation; retry after it expires.",
            op,
            op.retry_after_seconds(),
        )
    if op.status != PENDING and op.status != NOT_APPLIED:
        # submitted with an expired lease, or unknown: the effect may have happened
        raise operation_error(
            "outcome_unknown", "The outcome of this operation is unknown: reconcile it, do not repeat it.", op
        )
    return "new_attempt"


def lease_until(now: datetime, seconds: int) -> datetime:
    """The lease end for `seconds` from the database clock."""
    return to_ms(now + timedelta(seconds=seconds))


def _fresh_attempt(req: ClaimRequest, material: AttemptMaterial, now: datetime) -> dict[str, Any]:
    """What every granted attempt starts from: pending, a new token and lease, no outcome recorded."""
    return {
        "status": PENDING,
        "claim_token_hash": material.token_hash,
        "client_nonce_hash": req.nonce_hash,
        "sealed_token": material.sealed_token,
        "lease_seconds": req.lease_seconds,
        "lease_expires_at": lease_until(now, req.lease_seconds),
        "effect_ref": None,
        "receipt": None,
        "not_applied_reason": None,
        "updated_at": now,
        "submitted_at": None,
        "resolved_at": None,
        "resolved_by": None,
    }


def first_attempt(req: ClaimRequest, material: AttemptMaterial, now: datetime) -> Operation:
    """The row a granted first claim inserts (its event is `claim_event`)."""
    now = to_ms(now)
    return Operation(
        operation_id=req.operation_id,
        binding=req.binding,
        attempt=1,
        created_at=now,
        last_seq=0,
        last_hash=GENESIS_HASH,
        now=now,
        **_fresh_attempt(req, material, now),
    )


def claim_event(op: Operation) -> EventDraft:
    """The event that records a first claim."""
    return EventDraft(
        "claimed",
        op.binding.principal,
        None,
        PENDING,
        1,
        {"lease_expires_at": format_ts(op.lease_expires_at)},
    )


def next_attempt(op: Operation, req: ClaimRequest, material: AttemptMaterial) -> Change:
    """A new attempt after an expired pending lease or a not_applied outcome; the old token goes stale."""
    now = to_ms(op.now)
    state = replace(op, attempt=op.attempt + 1, **_fresh_attempt(req, material, now))
    event = EventDraft(
        "reclaimed",
        req.binding.principal,
        op.status,
        PENDING,
        state.attempt,
        {"previous_attempt": op.attempt, "lease_expires_at": format_ts(state.lease_expires_at)},
    )
    return Change(state, (event,))
