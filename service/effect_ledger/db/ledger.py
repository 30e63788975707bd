"""Repository functions of the ledger: each runs one tenant transaction around a pure domain decision."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

import asyncpg

from effect_ledger.db.catalogue import sql
from effect_ledger.db.pools import tenant_tx
from effect_ledger.domain.chain import GENESIS_HASH, event_hash
from effect_ledger.domain.claims import (
    AttemptMaterial,
    ClaimRequest,
    claim_event,
    decide_claim,
    first_attempt,
    next_attempt,
)
from effect_ledger.domain.errors import DatabaseUnavailable, LedgerError, not_found
from effect_ledger.domain.model import Binding, Change, EventDraft, Operation
from effect_ledger.domain.timefmt import format_ts, to_ms
from effect_ledger.domain.tokens import TOKEN_BYTES, encode_token, seal, token_hash, unseal
from effect_ledger.domain.transitions import Decision

# Writes that must commit with a transition (e.g. complete's incident); run after the change is
# applied, inside the same transaction, and only when the decision is not a refusal.
ExtraWrites = Callable[[asyncpg.Connection, Operation, Decision], Awaitable[None]]


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
class ClaimResult:
    """What a claim got: the verdict, the operation after it, and the claim token when one is granted."""

    verdict: str  # created | new_attempt | replay | reuse_receipt
    operation: Operation
    token: str | None
    events: tuple[EventDraft, ...] = ()  # what the claim appended


def row_to_operation(row: Mapping[str, Any]) -> Operation:
    """Map a catalogue row (operation plus chain head and clock) to the domain object."""
    return Operation(
        operation_id=row["operation_id"],
        binding=Binding(row["principal"], row["tool"], row["tool_version"], row["intent_digest"]),
        status=row["status"],
        attempt=row["attempt"],
        claim_token_hash=bytes(row["claim_token_hash"]),
        client_nonce_hash=None if row["client_nonce_hash"] is None else bytes(row["client_nonce_hash"]),
        sealed_token=None if row["sealed_token"] is None else bytes(row["sealed_token"]),
        lease_seconds=row["lease_seconds"],
        lease_expires_at=row["lease_expires_at"],
        effect_ref=row["effect_ref"],
        receipt=row["receipt"],
        not_applied_reason=row["not_applied_reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        submitted_at=row["submitted_at"],
        resolved_at=row["resolved_at"],
        resolved_by=row["resolved_by"],
        last_seq=row["chain_seq"],
        last_hash=row["chain_hash"],
        now=row["db_now"],
        receipt_digest=row.get("receipt_digest"),
    )


def _new_material(
    tenant: str, operation_id: str, attempt: int, nonce: str | None
) -> tuple[str, AttemptMaterial]:
    raw = secrets.token_bytes(TOKEN_BYTES)
    token = encode_token(raw)
    sealed = seal(raw, nonce, tenant, operation_id, attempt) if nonce is not None else None
    return token, AttemptMaterial(token_hash(token), sealed)


def _event_columns(op: Operation, change: Change) -> list[list[Any]]:
    """Number and hash the change's events onto the chain head that was read under the row lock."""
    columns: list[list[Any]] = [[] for _ in range(10)]
    prev, seq, at = op.last_hash, op.last_seq, to_ms(op.now)
    for draft in change.events:
        seq += 1
        content = {
            "operation_id": op.operation_id, "seq": seq, "at": format_ts(at), "kind": draft.kind,
            "actor": draft.actor, "from_status": draft.from_status, "to_status": draft.to_status,
            "attempt": draft.attempt, "data": draft.data,
        }
        digest = event_hash(prev, content)
        row = [seq, at, draft.kind, draft.actor, draft.from_status, draft.to_status, draft.attempt,
               draft.data, prev, digest]
        for column, value in zip(columns, row, strict=True):
            column.append(value)
        prev = digest
    return columns


async def lock_for_change(conn: asyncpg.Connection, tenant: str, operation_id: str) -> asyncpg.Record | None:
    """Lock the operation row and read it, chain head and clock included, in one statement."""
    row: asyncpg.Record | None = await conn.fetchrow(sql("lock_operation"), tenant, operation_id)
    return row


async def apply_change(conn: asyncpg.Connection, tenant: str, op: Operation, change: Change) -> None:
    """Write a decided change (state and events) in one statement; nothing to write, no round trip."""
    if change.state is None and not change.events:
        return
    s = change.state or op
    events = _event_columns(op, change)
    head_seq = events[0][-1] if change.events else op.last_seq
    head_hash = events[9][-1] if change.events else op.last_hash
    await conn.execute(
        sql("apply_change"), tenant, op.operation_id,
        s.status, s.attempt, s.claim_token_hash, s.client_nonce_hash, s.sealed_token, s.lease_seconds,
        s.lease_expires_at, s.effect_ref, s.receipt, s.not_applied_reason, s.updated_at, s.submitted_at,
        s.resolved_at, s.resolved_by, *events, head_seq, head_hash,
    )


async def claim(ledger: Ledger, tenant: str, req: ClaimRequest, nonce: str | None) -> ClaimResult:
    """Claim an operation ID: insert-or-learn-who-won, then the claim table of API.md section 6."""
    try:
        result = await _claim(ledger, tenant, req, nonce)
    except LedgerError as exc:
        ledger.observer.observe("claim", exc.code, ())
        raise
    ledger.observer.observe("claim", result.verdict, result.events)
    return result


class _Vanished(Exception):
    """The row our insert conflicted with was purged before we could read it: insert again."""


async def _claim(ledger: Ledger, tenant: str, req: ClaimRequest, nonce: str | None) -> ClaimResult:
    for _ in range(3):
        try:
            return await _claim_once(ledger, tenant, req, nonce)
        except _Vanished:
            continue
    raise DatabaseUnavailable("claim", "OperationVanished")


async def _claim_once(ledger: Ledger, tenant: str, req: ClaimRequest, nonce: str | None) -> ClaimResult:
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "claim") as (conn, db_now):
        created = await _insert_first_attempt(conn, tenant, req, nonce, db_now)
        if created is not None:
            return created
        row = await conn.fetchrow(sql("read_operation"), tenant, req.operation_id)
        if row is None:
            raise _Vanished
        op = row_to_operation(row)
        verdict = decide_claim(op, req)
        if verdict == "new_attempt":
            # decide again under the row lock: someone may have moved it since the unlocked read
            locked = await lock_for_change(conn, tenant, req.operation_id)
            if locked is None:
                raise _Vanished
            op = row_to_operation(locked)
            verdict = decide_claim(op, req)
        if verdict == "reuse_receipt":
            return ClaimResult(verdict, op, None)
        if verdict == "replay":
            assert nonce is not None and op.sealed_token is not None
            raw = unseal(op.sealed_token, nonce, tenant, op.operation_id, op.attempt)
            return ClaimResult(verdict, op, encode_token(raw))
        token, material = _new_material(tenant, req.operation_id, op.attempt + 1, nonce)
        change = next_attempt(op, req, material)
        await apply_change(conn, tenant, op, change)
        assert change.state is not None
        return ClaimResult("new_attempt", change.state, token, change.events)


async def _insert_first_attempt(
    conn: asyncpg.Connection, tenant: str, req: ClaimRequest, nonce: str | None, db_now: datetime
) -> ClaimResult | None:
    """Insert attempt 1 with its `claimed` event; None when the ID already exists (someone else won)."""
    token, material = _new_material(tenant, req.operation_id, 1, nonce)
    fresh = first_attempt(req, material, db_now)  # chain head: genesis, so seq 1 is numbered onto it
    event = claim_event(fresh)
    digest = _event_columns(fresh, Change(None, (event,)))[9][0]
    b = req.binding
    inserted = await conn.fetchval(
        sql("insert_first_attempt"), tenant, req.operation_id, b.principal, b.tool, b.tool_version,
        b.intent_digest, material.token_hash, req.nonce_hash, material.sealed_token, req.lease_seconds,
        fresh.lease_expires_at, fresh.created_at, event.data, GENESIS_HASH, digest,
    )
    if inserted is None:
        return None
    # what the row now holds: the chain head moved to the `claimed` event
    return ClaimResult("created", replace(fresh, last_seq=1, last_hash=digest), token, (event,))


async def transition(
    ledger: Ledger, tenant: str, operation_id: str, decide: Callable[[Operation], Decision], phase: str,
    *, extra_writes: ExtraWrites | None = None,
) -> Operation:
    """Lock the operation, decide, write the change; a recorded refusal is raised after the commit."""
    try:
        async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, phase) as (conn, _):
            row = await lock_for_change(conn, tenant, operation_id)
            if row is None:
                raise not_found()
            op = row_to_operation(row)
            decision = decide(op)
            await apply_change(conn, tenant, op, decision.change)
            if extra_writes is not None and decision.error is None:
                await extra_writes(conn, op, decision)
    except LedgerError as exc:
        ledger.observer.observe(phase, exc.code, ())
        raise
    after = decision.change.state or op
    outcome = after.effective_status if decision.error is None else decision.error.code
    ledger.observer.observe(phase, outcome, decision.change.events)
    if decision.error is not None:
        raise decision.error
    return after


async def get_operation(ledger: Ledger, tenant: str, operation_id: str) -> Operation:
    """One operation of the tenant, or not_found (also for another tenant's)."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        row = await conn.fetchrow(sql("read_operation"), tenant, operation_id)
    if row is None:
        raise not_found()
    return row_to_operation(row)


def event_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the API shows it (and as its hash covers it)."""
    return {
        "seq": row["seq"], "at": format_ts(row["at"]), "kind": row["kind"], "actor": row["actor"],
        "from_status": row["from_status"], "to_status": row["to_status"], "attempt": row["attempt"],
        "data": row["data"], "prev_hash": row["prev_hash"], "hash": row["hash"],
    }


async def list_events(ledger: Ledger, tenant: str, operation_id: str) -> list[dict[str, Any]]:
    """The operation's events in chain order; not_found when the operation is not the tenant's."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "read") as (conn, _):
        rows = await conn.fetch(sql("list_events"), tenant, operation_id)
        # a tombstone's events were purged: an empty history, not a missing operation
        if not rows and await conn.fetchrow(sql("read_operation"), tenant, operation_id) is None:
            raise not_found()
    return [event_view(r) for r in rows]
