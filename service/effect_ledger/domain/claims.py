"""Who gets to execute: the claim rules of API.md section 6, as pure decisions (refusals returned)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from effect_ledger.domain.chain import GENESIS_HASH
from effect_ledger.domain.errors import Refusal
from effect_ledger.domain.model import (
    COMMITTED,
    NO_CHANGE,
    NOT_APPLIED,
    PENDING,
    SUBMITTED,
    Binding,
    Change,
    Decision,
    EventDraft,
    Operation,
)
from effect_ledger.domain.timefmt import format_ts, to_ms


@dataclass(frozen=True, slots=True)
class AttemptMaterial:
    """The new attempt's secrets as stored: the token's hash and, with a nonce, the sealed token."""

    token_hash: bytes
    sealed_token: bytes | None


NO_MATERIAL = AttemptMaterial(b"", None)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The claim command: what the executor asked for, with tenant and principal from the token.

    `material` is the token the claim grants if it grants one (made before the one round trip);
    `submit` asks for pending -> submitted in the same transaction when an attempt is granted.
    """

    operation_id: str
    binding: Binding
    lease_seconds: int
    nonce_hash: bytes | None
    material: AttemptMaterial = NO_MATERIAL
    submit: bool = False
    effect_ref: str | None = None


def operation_refusal(code: str, detail: str, op: Operation, retry_after: int | None = None) -> Refusal:
    """A 409-family refusal that carries the operation it is about."""
    return Refusal(code, detail, {"operation": op}, retry_after)


def refused(refusal: Refusal, change: Change = NO_CHANGE) -> Decision:
    """A decision that refuses (and may still record something, e.g. a discrepancy)."""
    return Decision(refusal.code, change, refusal)


def decide_claim(op: Operation, req: ClaimRequest) -> Decision:
    """What a claim of an existing operation gets: reuse_receipt, replay, new_attempt or a refusal."""
    mismatched = op.binding.mismatched(req.binding)
    if mismatched:  # checked before everything else, so a foreign intent learns nothing about state
        return refused(Refusal(
            "intent_conflict",
            "The operation ID is bound to a different principal, tool, version or intent.",
            {"mismatched": mismatched},
        ))
    if op.status == COMMITTED:
        return Decision("reuse_receipt")
    if op.status in (PENDING, SUBMITTED) and op.lease_live:
        if (
            req.nonce_hash is not None
            and op.client_nonce_hash is not None
            and hmac.compare_digest(op.client_nonce_hash, req.nonce_hash)
        ):
            return Decision("replay")
        return refused(operation_refusal(
            "operation_in_progress",
            "A live lease holds this operation; retry after it expires.",
            op,
            op.retry_after_seconds(),
        ))
    if op.status != PENDING and op.status != NOT_APPLIED:
        # submitted with an expired lease, or unknown: the effect may have happened
        return refused(operation_refusal(
            "outcome_unknown", "The outcome of this operation is unknown: reconcile it, do not repeat it.", op
        ))
    return Decision("new_attempt", next_attempt(op, req, req.material))


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


def submitted_state(op: Operation, effect_ref: str | None, lease_seconds: int | None) -> Change:
    """pending -> submitted at the row's clock, lease renewed, with its `submitted` event."""
    now = to_ms(op.now)
    seconds = lease_seconds or op.lease_seconds
    state = replace(
        op,
        status=SUBMITTED,
        effect_ref=effect_ref,
        lease_seconds=seconds,
        lease_expires_at=lease_until(now, seconds),
        submitted_at=now,
        updated_at=now,
    )
    event = EventDraft(
        "submitted",
        op.binding.principal,
        PENDING,
        SUBMITTED,
        op.attempt,
        {"effect_ref": effect_ref, "lease_expires_at": format_ts(state.lease_expires_at)},
    )
    return Change(state, (event,))


def _then_submit(granted: Change, req: ClaimRequest) -> Change:
    """Claim-and-submit: a granted attempt is submitted in the same transaction (API.md section 6)."""
    if not req.submit or granted.state is None:
        return granted
    submitted = submitted_state(granted.state, req.effect_ref, None)
    return Change(submitted.state, (*granted.events, *submitted.events))


def decide_first_claim(req: ClaimRequest, now: datetime) -> Decision:
    """A claim of a new ID: attempt 1 with its `claimed` event (and `submitted`, when asked)."""
    fresh = first_attempt(req, req.material, now)
    return Decision("created", _then_submit(Change(fresh, (claim_event(fresh),)), req))


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
    return _then_submit(Change(state, (event,)), req)
