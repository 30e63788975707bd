"""The write path: each command runs as one server-side function call, one round trip (migration 0005).

Every call below is exactly one statement in autocommit on a pooled connection: the database function
binds the tenant for its own transaction, locks and reads the row, applies the guards, writes the
state and the hash-chained events, and returns the outcome (domain/outcomes.OutcomeCode) with the
row after it. The decision is the database's alone (alembic/functions/); Python builds the answer from
the outcome and the row: problem details, Retry-After, `mismatched` (domain/outcomes.refusal_for).

Round trips per call (counted by tests/integration/test_round_trips.py): claim 1, claim with submit 1,
submit 1, heartbeat 1, complete 1 (also with diagnostics), resolve 1. Reads (get_operation,
list_events) keep their tenant transaction: 4 round trips.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import asyncpg
import structlog

from effect_ledger.db.catalogue import sql
from effect_ledger.db.pools import run_write, tenant_tx
from effect_ledger.domain.approvals import view_of
from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.claims import AttemptMaterial, ClaimRequest
from effect_ledger.domain.diagnostics import Incident
from effect_ledger.domain.errors import (
    DatabaseUnavailable,
    LedgerError,
    Refusal,
    not_found,
    validation_failed,
)
from effect_ledger.domain.model import Binding, EventDraft, Operation
from effect_ledger.domain.outcomes import REFUSALS, OutcomeCode, outcome_code, refusal_for
from effect_ledger.domain.timefmt import format_ts
from effect_ledger.domain.tokens import SALT_BYTES, TOKEN_BYTES, encode_token, seal, token_hash, unseal
from effect_ledger.domain.transitions import Report

log = structlog.get_logger("effect_ledger.ledger")


class LedgerObserver(Protocol):
    """Told of every ledger decision once its transaction has ended (metrics count these)."""

    def observe(self, call: str, outcome: str, events: Sequence[EventDraft]) -> None:
        """`call` names the operation ("claim", "submit", "sweep"...); `outcome` is a claim verdict,
        the operation's status afterwards, or the refusal's problem code; `events` were committed."""


class _Unobserved:
    def observe(self, call: str, outcome: str, events: Sequence[EventDraft]) -> None:
        return None


UNOBSERVED: LedgerObserver = _Unobserved()


@dataclass(frozen=True, slots=True)
class Ledger:
    """The ledger over one runtime pool, for one tenant per call."""

    pool: asyncpg.Pool
    acquire_timeout: float
    observer: LedgerObserver = UNOBSERVED


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one write-path call did: the operation after it, or the refusal; the events it appended."""

    outcome: OutcomeCode
    operation: Operation | None
    refusal: Refusal | None = None
    events: tuple[EventDraft, ...] = ()
    incident: str | None = None  # complete(unknown) with diagnostics: the incident holding them


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What a claim got: the verdict, the operation after it, and the claim token when one is granted."""

    verdict: OutcomeCode  # created | new_attempt | replay | reuse_receipt | a refusal code
    operation: Operation | None  # None only when an approval refusal met a new ID (nothing created)
    token: str | None
    events: tuple[EventDraft, ...] = ()  # what the claim appended
    refusal: Refusal | None = None
    approval: dict[str, Any] | None = None  # the view of the request the approval gate spoke of
    approvals_expired: int = 0  # requests the gate found past their validity and expired (metrics)


def row_to_operation(row: Mapping[str, Any]) -> Operation:
    """Map a catalogue row (operation plus chain head and clock) to the domain object."""
    return operation_of(row, row["db_now"], row.get("log_index"), "log_index" in row.keys())


def operation_of(
    op: Mapping[str, Any], now: Any, log_index: int | None = None, shows_log_index: bool = False
) -> Operation:
    """Map an operation row (a write-path answer's `op` composite, or a read's columns) read at the
    database clock `now` to the domain object."""
    return Operation(
        operation_id=op["operation_id"],
        binding=Binding(op["principal"], op["tool"], op["tool_version"], op["intent_digest"]),
        status=op["status"],
        attempt=op["attempt"],
        claim_token_hash=bytes(op["claim_token_hash"]),
        client_nonce_hash=None if op["client_nonce_hash"] is None else bytes(op["client_nonce_hash"]),
        sealed_token=None if op["sealed_token"] is None else bytes(op["sealed_token"]),
        lease_seconds=op["lease_seconds"],
        lease_expires_at=op["lease_expires_at"],
        effect_ref=op["effect_ref"],
        receipt=op["receipt"],
        not_applied_reason=op["not_applied_reason"],
        created_at=op["created_at"],
        updated_at=op["updated_at"],
        submitted_at=op["submitted_at"],
        resolved_at=op["resolved_at"],
        resolved_by=op["resolved_by"],
        last_seq=op["chain_seq"],
        last_hash=op["chain_hash"],
        now=now,
        receipt_digest=op.get("receipt_digest"),
        log_index=log_index,
        shows_log_index=shows_log_index,
    )


def returned_events(row: Mapping[str, Any]) -> tuple[EventDraft, ...]:
    """The events a write-path function appended, as it returns them: a hot transition's (claimed,
    submitted, completed) without its actor and data (ledger.event_json: the service reads neither),
    a cold one's (discrepancy, lease_expired, reclaimed) whole."""
    return tuple(
        EventDraft(
            e["kind"],
            e.get("actor", ""),
            e["from_status"],
            e["to_status"],
            e["attempt"],
            e.get("data") or {},
        )
        for e in row["events"] or ()
    )


def _jcs(value: Any) -> str | None:
    """A client-supplied part of an event's data in JCS text (the database hashes it as given)."""
    return None if value is None else canonical_json(value).decode("utf-8")


_APPROVAL_DETAIL = {
    OutcomeCode.APPROVAL_REQUIRED: "This tool needs an approval of this exact binding; none is valid.",
    OutcomeCode.APPROVAL_DENIED: "The approval request for this binding was denied.",
}


def _settle(ledger: Ledger, call: str, row: Mapping[str, Any], binding: Binding | None = None) -> Outcome:
    """The answer to a write-path call from the function's outcome and row (refusals built from them).
    The observer hears the verdict of a claim, the operation's status afterwards, or the refusal's code."""
    code = outcome_code(row["outcome"])
    if code is OutcomeCode.NOT_FOUND:
        ledger.observer.observe(call, code, ())
        return Outcome(code, None, Refusal(code, "No such operation."))
    # every write answer's view carries log_index, as the reads' do (API.md 5, 14; migration 0027)
    op, events = operation_of(row["op"], row["db_now"], row["log_index"], True), returned_events(row)
    if code not in REFUSALS:
        ledger.observer.observe(call, code if call == "claim" else op.effective_status, events)
        return Outcome(code, op, None, events)
    refusal = refusal_for(call, code, op, binding)
    ledger.observer.observe(call, code, events)  # a recorded refusal (discrepancy) has events
    return Outcome(code, op, refusal, events)


async def _call(ledger: Ledger, call: str, query: str, tenant: str, *args: Any) -> Any:
    """Run one write-path function: one statement, one round trip; failures are counted, then raised."""
    try:
        pool, timeout = ledger.pool, ledger.acquire_timeout
        row = await run_write(pool, timeout, call, query, tenant, *args)
    except LedgerError as exc:  # e.g. a value PostgreSQL cannot store (U+0000): 422
        ledger.observer.observe(call, exc.code, ())
        raise
    assert row is not None  # the functions always return one row
    return row  # the asyncpg Record itself: outcome, events, db_now, ..., op (the row as a Record)


def new_material(tenant: str, operation_id: str, nonce: str | None) -> tuple[str, AttemptMaterial]:
    """A fresh claim token and what is stored of it: its hash and, with a nonce, its sealed form."""
    raw = secrets.token_bytes(TOKEN_BYTES)
    token = encode_token(raw)
    sealed = None
    if nonce is not None:
        sealed = seal(raw, nonce, tenant, operation_id, secrets.token_bytes(SALT_BYTES))
    return token, AttemptMaterial(token_hash(token), sealed)


APPROVAL_REFUSALS = frozenset({OutcomeCode.APPROVAL_REQUIRED, OutcomeCode.APPROVAL_DENIED})


async def claim(
    ledger: Ledger,
    tenant: str,
    req: ClaimRequest,
    nonce: str | None,
    approval_ask: Mapping[str, Any] | None = None,
) -> ClaimResult:
    """Claim an operation ID (docs/api.md section 6), submitting too when `req.submit`. One round trip.
    With `approval_ask` (db/approvals.claim_ask: the tool needs approval), an attempt is granted only
    by a valid approval, consumed in the same transaction (section 15)."""
    token, material = new_material(tenant, req.operation_id, nonce)
    b = req.binding
    row = await _call(
        ledger,
        "claim",
        "run_claim",
        tenant,
        req.operation_id,
        b.principal,
        b.tool,
        b.tool_version,
        b.intent_digest,
        req.lease_seconds,
        req.nonce_hash,
        material.token_hash,
        material.sealed_token,
        req.submit,
        req.effect_ref,
        None if approval_ask is None else dict(approval_ask),
    )
    verdict = outcome_code(row["outcome"])
    if verdict is OutcomeCode.VANISHED:  # purged three times between our insert and our read: retryable
        raise DatabaseUnavailable("claim", "OperationVanished")
    if verdict in APPROVAL_REFUSALS:  # no operation created or changed; the gate's request is the answer
        ledger.observer.observe("claim", verdict, ())
        existing = None
        if row["op"] is not None:
            existing = operation_of(row["op"], row["db_now"], row["log_index"], True)
        refusal = Refusal(verdict, _APPROVAL_DETAIL[verdict])
        approval = view_of(row["approval"], row["db_now"])
        expired = int(row["approval"].get("expired_here", 0)) if row["approval"] else 0
        return ClaimResult(
            verdict, existing, None, refusal=refusal, approval=approval, approvals_expired=expired
        )
    outcome = _settle(ledger, "claim", row, req.binding)
    assert outcome.operation is not None
    op = outcome.operation
    if verdict in (OutcomeCode.CREATED, OutcomeCode.NEW_ATTEMPT):
        return ClaimResult(verdict, op, token, outcome.events, approval=view_of(row["approval"], op.now))
    if verdict is OutcomeCode.REPLAY:
        assert nonce is not None and op.sealed_token is not None
        return ClaimResult(verdict, op, encode_token(unseal(op.sealed_token, nonce, tenant, op.operation_id)))
    return ClaimResult(verdict, op, None, refusal=outcome.refusal)


async def submit(
    ledger: Ledger,
    tenant: str,
    operation_id: str,
    token: str,
    effect_ref: str | None,
    lease_seconds: int | None,
) -> Outcome:
    """pending -> submitted (a repeat while submitted changes nothing). One round trip."""
    row = await _call(
        ledger, "submit", "run_submit", tenant, operation_id, token_hash(token), effect_ref, lease_seconds
    )
    return _settle(ledger, "submit", row)


async def heartbeat(
    ledger: Ledger, tenant: str, operation_id: str, token: str, lease_seconds: int | None
) -> Outcome:
    """Extend the current attempt's lease to database now + lease_seconds. One round trip."""
    row = await _call(
        ledger, "heartbeat", "run_heartbeat", tenant, operation_id, token_hash(token), lease_seconds
    )
    return _settle(ledger, "heartbeat", row)


def _incident_record(incident: Incident) -> dict[str, Any]:
    """The incident as the function's jsonb argument (it inserts it when the report is recorded)."""
    record = asdict(incident)
    record["created_at"] = None if incident.created_at is None else incident.created_at.isoformat()
    return record


async def complete(
    ledger: Ledger,
    tenant: str,
    operation_id: str,
    actor: str,
    token: str,
    report: Report,
    incident: Incident | None = None,
) -> Outcome:
    """Record committed, not_applied or unknown; with diagnostics (complete(unknown)) the incident is
    stored in the same transaction, and a repeat answers with the one stored first. One round trip."""
    row = await _call(
        ledger,
        "complete",
        "run_complete",
        tenant,
        operation_id,
        actor,
        token_hash(token),
        report.outcome,
        _jcs(report.receipt),
        _jcs(report.reason),
        None if incident is None else _incident_record(incident),
    )
    if row["outcome"] == OutcomeCode.VALIDATION_FAILED:
        refusal = validation_failed([("diagnostics.attempt", "is not the operation's current attempt")])
        ledger.observer.observe("complete", refusal.code, ())
        code = OutcomeCode.VALIDATION_FAILED
        return Outcome(code, None, Refusal(refusal.code, refusal.detail, refusal.extensions))
    outcome = _settle(ledger, "complete", row)
    if incident is None or outcome.refusal is not None:
        return outcome
    return Outcome(outcome.outcome, outcome.operation, None, outcome.events, row["incident_ref"])


async def resolve(ledger: Ledger, tenant: str, operation_id: str, actor: str, report: Report) -> Outcome:
    """A reconciler's verdict on an unknown operation (or an unresolved look-up). One round trip."""
    row = await _call(
        ledger,
        "resolve",
        "run_resolve",
        tenant,
        operation_id,
        actor,
        report.outcome,
        _jcs(report.receipt),
        _jcs(report.reason),
        _jcs(report.evidence),
    )
    return _settle(ledger, "resolve", row)


async def get_operation(ledger: Ledger, tenant: str, operation_id: str) -> Operation:
    """One operation of the tenant, or not_found (also for another tenant's). Four round trips
    (BEGIN, tenant binding, read, COMMIT): reads are not on the write path."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        row = await conn.fetchrow(sql("read_operation"), tenant, operation_id)
    if row is None:
        raise not_found()
    return row_to_operation(row)


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the API shows it (and as its hash covers it)."""
    return {
        "seq": row["seq"],
        "at": format_ts(row["at"]),
        "kind": row["kind"],
        "actor": row["actor"],
        "from_status": row["from_status"],
        "to_status": row["to_status"],
        "attempt": row["attempt"],
        "data": row["data"],
        "prev_hash": row["prev_hash"],
        "hash": row["hash"],
    }


async def list_events(ledger: Ledger, tenant: str, operation_id: str) -> list[dict[str, Any]]:
    """The operation's events in chain order; not_found when the operation is not the tenant's.
    Four round trips (BEGIN, tenant binding, read, COMMIT)."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        rows = await conn.fetch(sql("list_events"), tenant, operation_id)
        # a tombstone's events were purged: an empty history, not a missing operation
        if not rows and await conn.fetchrow(sql("read_operation"), tenant, operation_id) is None:
            raise not_found()
    return [event_view(r) for r in rows]
