"""Fenced transitions (submit, heartbeat, complete) and reconciler resolution, as pure decisions.

Each returns a Decision; a refusal is a returned value, never raised. The database functions of
migration 0005 execute the same rules in one round trip; a test runs both over every case.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from typing import Any

from effect_ledger.domain.claims import lease_until, operation_refusal, refused, submitted_state
from effect_ledger.domain.errors import Refusal
from effect_ledger.domain.model import (
    COMMITTED,
    NOT_APPLIED,
    PENDING,
    SUBMITTED,
    TERMINAL,
    UNKNOWN,
    Change,
    Decision,
    EventDraft,
    Operation,
)
from effect_ledger.domain.timefmt import format_ts, to_ms
from effect_ledger.domain.tokens import token_hash

SYSTEM_ACTOR = "effect-ledger"
RECEIPT_CONTENT = ("external_ref", "result_digest", "result", "observed_at")


@dataclass(frozen=True, slots=True)
class Report:
    """An outcome as reported by an executor (complete) or a reconciler (resolve)."""

    outcome: str
    receipt: dict[str, Any] | None = None
    reason: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    incident: str | None = None


def check_fence(op: Operation, token: str) -> Refusal | None:
    """Every executor transition must present the current attempt's token."""
    if not hmac.compare_digest(op.claim_token_hash, token_hash(token)):
        return operation_refusal("stale_claim", "The claim token is not the current attempt's.", op)
    return None


def expire_if_due(op: Operation) -> tuple[Operation, tuple[EventDraft, ...]]:
    """Materialise a submitted operation whose lease ran out as unknown, with its event."""
    if op.status != SUBMITTED or op.lease_live:
        return op, ()
    state = replace(op, status=UNKNOWN, updated_at=to_ms(op.now))
    event = EventDraft(
        "lease_expired",
        SYSTEM_ACTOR,
        SUBMITTED,
        UNKNOWN,
        op.attempt,
        {"lease_expires_at": format_ts(op.lease_expires_at)},
    )
    return state, (event,)


def _unusable(op: Operation, call: str) -> Refusal | None:
    status = op.effective_status
    if status == UNKNOWN:
        return operation_refusal("outcome_unknown", "The outcome is unknown: reconcile, do not repeat.", op)
    if status in TERMINAL:
        return operation_refusal("invalid_transition", f"A {status} operation does not accept {call}.", op)
    return None


def decide_submit(op: Operation, token: str, effect_ref: str | None, lease_seconds: int | None) -> Decision:
    """pending -> submitted with a renewed lease; an identical repeat while submitted changes nothing."""
    refusal = check_fence(op, token)
    if refusal is None and op.effective_status == SUBMITTED:
        if effect_ref is None or effect_ref == op.effect_ref:
            return Decision("unchanged")
        refusal = operation_refusal(
            "invalid_transition", "The operation was submitted with another effect_ref.", op
        )
    refusal = refusal or _unusable(op, "submit")
    if refusal is not None:
        return refused(refusal)
    return Decision("submitted", submitted_state(op, effect_ref, lease_seconds))


def decide_heartbeat(op: Operation, token: str, lease_seconds: int | None) -> Decision:
    """Extend a pending or live submitted lease to database now + lease_seconds (default: the
    attempt's lease length); no event."""
    refusal = check_fence(op, token) or _unusable(op, "heartbeat")
    if refusal is not None:
        return refused(refusal)
    now = to_ms(op.now)
    lease_end = lease_until(now, lease_seconds or op.lease_seconds)
    extended = replace(op, lease_expires_at=lease_end, updated_at=now)
    return Decision("extended", Change(extended, ()))


def same_outcome(op: Operation, report: Report) -> bool:
    """Whether a report repeats what the terminal operation already records."""
    if report.outcome != op.status:
        return False
    if op.status == COMMITTED:
        stored = op.receipt or {}
        given = report.receipt or {}
        return all(stored.get(k) == given.get(k) for k in RECEIPT_CONTENT)
    return op.not_applied_reason == report.reason


def _discrepancy(op: Operation, actor: str, report: Report, source: str) -> Decision:
    data: dict[str, Any] = {
        "source": source,
        "reported_outcome": report.outcome,
        "recorded_outcome": op.status,
    }
    if report.receipt is not None:
        data["reported_receipt"] = report.receipt
    if report.reason is not None:
        data["reported_reason"] = report.reason
    event = EventDraft("discrepancy", actor, op.effective_status, op.effective_status, op.attempt, data)
    refusal = operation_refusal(
        "conflicting_outcome", "A different outcome is already recorded; the disagreement was recorded.", op
    )
    return refused(refusal, Change(None, (event,)))


def _settle(op: Operation, actor: str, report: Report, kind: str) -> Change:
    """Move to the reported outcome, recording who and what (and materialising an expired lease first)."""
    base, expiry = expire_if_due(op)
    now = to_ms(op.now)
    receipt = None
    if report.outcome == COMMITTED and report.receipt is not None:
        receipt = {
            **{k: report.receipt.get(k) for k in RECEIPT_CONTENT},
            "recorded_by": actor,
            "recorded_at": format_ts(now),
        }
    terminal = report.outcome in TERMINAL
    state = replace(
        base,
        status=report.outcome,
        receipt=receipt,
        not_applied_reason=report.reason if report.outcome == NOT_APPLIED else None,
        lease_expires_at=None,
        updated_at=now,
        resolved_at=now if terminal else None,
        resolved_by=actor if terminal else None,
    )
    data: dict[str, Any] = {"outcome": report.outcome}
    for name in ("receipt", "reason", "evidence", "incident"):
        value = getattr(report, name)
        if value is not None:
            data[name] = value
    event = EventDraft(kind, actor, base.status, report.outcome, op.attempt, data)
    return Change(state, (*expiry, event))


def decide_complete(op: Operation, actor: str, token: str, report: Report) -> Decision:
    """The executor's report of committed, not_applied or unknown (also a late report from unknown)."""
    fence = check_fence(op, token)
    if fence is not None:
        return refused(fence)
    status = op.effective_status
    if status in TERMINAL:
        if same_outcome(op, report):
            return Decision("unchanged")
        return _discrepancy(op, actor, report, "complete")
    if report.outcome == UNKNOWN:
        if status == PENDING:
            return refused(
                operation_refusal("invalid_transition", "Only a submitted operation can become unknown.", op)
            )
        if status == UNKNOWN:
            base, expiry = expire_if_due(op)
            if not expiry:
                return Decision("unchanged")
            return Decision("completed", Change(base, expiry))
    return Decision("completed", _settle(op, actor, report, "completed"))


def decide_resolve(op: Operation, actor: str, report: Report) -> Decision:
    """A reconciler's verdict on an unknown operation, from evidence; `unresolved` only records the try."""
    status = op.effective_status
    if status in TERMINAL:
        if same_outcome(op, report):
            return Decision("unchanged")
        return _discrepancy(op, actor, report, "resolve")
    if status != UNKNOWN:
        return refused(
            operation_refusal("invalid_transition", "Only an unknown operation can be resolved.", op)
        )
    if report.outcome == "unresolved":
        base, expiry = expire_if_due(op)
        event = EventDraft(
            "reconcile_unresolved", actor, UNKNOWN, UNKNOWN, op.attempt, {"evidence": report.evidence}
        )
        state = replace(base, updated_at=to_ms(op.now))
        return Decision("resolved", Change(state, (*expiry, event)))
    return Decision("resolved", _settle(op, actor, report, "resolved"))


def decide_sweep(op: Operation) -> Change:
    """The sweeper's step for one submitted operation whose lease expired."""
    state, events = expire_if_due(op)
    return Change(state if events else None, events)
