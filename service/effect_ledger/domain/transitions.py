"""Fenced transitions (submit, heartbeat, complete) and reconciler resolution, as pure decisions."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from typing import Any

from effect_ledger.domain.claims import lease_until, operation_error
from effect_ledger.domain.errors import LedgerError, not_found
from effect_ledger.domain.model import (
    COMMITTED,
    NOT_APPLIED,
    PENDING,
    SUBMITTED,
    TERMINAL,
    UNKNOWN,
    Change,
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


@dataclass(frozen=True, slots=True)
class Decision:
    """What to write (maybe nothing) and, for a refusal that is itself recorded, the error to answer."""

    change: Change
    error: LedgerError | None = None


NO_CHANGE = Change(None, ())


def check_owner(op: Operation, principal: str, reads_tenant: bool) -> None:
    """API.md section 3: an executor sees only operations bound to its own principal; any other reads
    exactly as a missing one (the token of another principal's attempt cannot be its own anyway)."""
    if not reads_tenant and op.binding.principal != principal:
        raise not_found()


def check_fence(op: Operation, token: str) -> None:
    """Every executor transition must present the current attempt's token."""
    if not hmac.compare_digest(op.claim_token_hash, token_hash(token)):
        raise operation_error("stale_claim", "The claim token is not the current attempt's.", op)


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


def _refuse_unusable(op: Operation, call: str) -> None:
    status = op.effective_status
    if status == UNKNOWN:
        raise operation_error("outcome_unknown", "The outcome is unknown: reconcile, do not repeat.", op)
    if status in TERMINAL:
        raise operation_error("invalid_transition", f"A {status} operation does not accept {call}.", op)


def decide_submit(op: Operation, token: str, effect_ref: str | None, lease_seconds: int | None) -> Change:
    """pending -> submitted with a renewed lease; an identical repeat while submitted changes nothing."""
    check_fence(op, token)
    if op.effective_status == SUBMITTED:
        if effect_ref is None or effect_ref == op.effect_ref:
            return NO_CHANGE
        raise operation_error(
            "invalid_transition", "The operation was submitted with another effect_ref.", op
        )
    _refuse_unusable(op, "submit")
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


def decide_heartbeat(op: Operation, token: str, lease_seconds: int) -> Change:
    """Extend a pending or live submitted lease to database now + lease_seconds; no event."""
    check_fence(op, token)
    if op.effective_status not in (PENDING, SUBMITTED):
        _refuse_unusable(op, "heartbeat")
    now = to_ms(op.now)
    return Change(replace(op, lease_expires_at=lease_until(now, lease_seconds), updated_at=now), ())


def same_outcome(op: Operation, report: Report) -> bool:
    """Whether a report repeats what the terminal operation already records."""
    if report.outcome != op.status:
        return False
    if op.purged:  # the receipt or reason is gone: the outcome is all that can still agree
        return True
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
    error = operation_error(
        "conflicting_outcome", "A different outcome is already recorded; the disagreement was recorded.", op
    )
    return Decision(Change(None, (event,)), error)


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
    check_fence(op, token)
    status = op.effective_status
    if status in TERMINAL:
        if same_outcome(op, report):
            return Decision(NO_CHANGE)
        return _discrepancy(op, actor, report, "complete")
    if report.outcome == UNKNOWN:
        if status == PENDING:
            raise operation_error("invalid_transition", "Only a submitted operation can become unknown.", op)
        if status == UNKNOWN:
            base, expiry = expire_if_due(op)
            return Decision(Change(base if expiry else None, expiry))
    return Decision(_settle(op, actor, report, "completed"))


def decide_resolve(op: Operation, actor: str, report: Report) -> Decision:
    """A reconciler's verdict on an unknown operation, from evidence; `unresolved` only records the try."""
    status = op.effective_status
    if status in TERMINAL:
        # `unresolved` claims no outcome, so it cannot disagree with one: a late look-up changes nothing
        if report.outcome == "unresolved" or same_outcome(op, report):
            return Decision(NO_CHANGE)
        return _discrepancy(op, actor, report, "resolve")
    if status != UNKNOWN:
        raise operation_error("invalid_transition", "Only an unknown operation can be resolved.", op)
    if report.outcome == "unresolved":
        base, expiry = expire_if_due(op)
        event = EventDraft(
            "reconcile_unresolved", actor, UNKNOWN, UNKNOWN, op.attempt, {"evidence": report.evidence}
        )
        state = replace(base, updated_at=to_ms(op.now))
        return Decision(Change(state, (*expiry, event)))
    return Decision(_settle(op, actor, report, "resolved"))


def decide_sweep(op: Operation) -> Change:
    """The sweeper's step for one submitted operation whose lease expired."""
    state, events = expire_if_due(op)
    return Change(state if events else None, events)
