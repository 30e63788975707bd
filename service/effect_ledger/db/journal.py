"""Repository functions of the run journal: each runs one tenant transaction around a pure decision.

Round trips (besides BEGIN/COMMIT and the tenant binding every transaction has): create 1; append 2
(lock and read the session, then advance it and insert the batch in one statement); read 2 and
projection 3, each in one read-only REPEATABLE READ snapshot; delete 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from effect_ledger.db import journal_state
from effect_ledger.db.catalogue import sql
from effect_ledger.db.ledger import Ledger, row_to_operation
from effect_ledger.db.pools import tenant_tx
from effect_ledger.domain.errors import LedgerError, not_found
from effect_ledger.domain.journal_continuations import KeyRing
from effect_ledger.domain.journal_history import (
    Accepted,
    AppendCommand,
    AppendDecision,
    Caps,
    SessionState,
    calls_from_json,
    calls_to_json,
    continuations_from_json,
    decide_append,
)
from effect_ledger.domain.model import Operation

SESSION = "session"


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A session and its records (after some seq) as one consistent snapshot read them."""

    session_id: str
    principal: str
    revision: int
    schema: int
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    records: list[tuple[int, datetime, dict[str, Any]]]
    sizes: dict[int, int]  # seq -> the record's JCS bytes, as measured at append


async def create_session(
    ledger: Ledger, tenant: str, principal: str, session_id: str, labels: Mapping[str, str]
) -> Mapping[str, Any]:
    """Insert a new session at revision 0, owned by (tenant, principal)."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "journal_create") as (conn, now):
        row: Mapping[str, Any] = await conn.fetchrow(
            sql("journal_create_session"), tenant, session_id, principal, dict(labels), now
        )
    return row


async def append(
    ledger: Ledger,
    tenant: str,
    principal: str,
    session_id: str,
    cmd: AppendCommand,
    caps: Caps,
    payloads: journal_state.Payloads | None = None,
) -> AppendDecision:
    """Lock the owner's session, decide the batch, store it when accepted; all in one transaction.
    Continuation records are bound to their prefix and their `payloads` sealed and stored with them.

    Refusals come back as values (the transaction then writes nothing); a missing or foreign session
    raises not_found."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "journal_append") as (conn, now):
        row = await conn.fetchrow(sql("journal_lock_session"), tenant, session_id, principal)
        if row is None:
            raise not_found(SESSION)
        state = SessionState(
            revision=row["revision"],
            calls=calls_from_json(row["causal"]),
            continuations=continuations_from_json(row["causal"]),
            last_nonce_hash=None if row["last_nonce_hash"] is None else bytes(row["last_nonce_hash"]),
            last_base_revision=row["last_base_revision"],
            last_batch_digest=row["last_batch_digest"],
        )
        decision = decide_append(state, cmd, caps)
        if isinstance(decision, Accepted):
            sealed = []
            if payloads is not None and payloads.by_index:
                sealed = await journal_state.bind_and_seal(
                    conn, tenant, session_id, decision.base_revision, decision.records, payloads
                )
            await _store(conn, tenant, session_id, decision, cmd.nonce_hash, now)
            if sealed:
                await journal_state.store_sealed(conn, tenant, session_id, sealed)
    return decision


async def _store(
    conn: asyncpg.Connection,
    tenant: str,
    session_id: str,
    accepted: Accepted,
    nonce_hash: bytes | None,
    now: datetime,
) -> None:
    stored = await conn.fetch(
        sql("journal_append"),
        tenant,
        session_id,
        accepted.base_revision,
        accepted.revision,
        calls_to_json(accepted.calls, tuple(accepted.continuations)),
        nonce_hash,
        accepted.digest,
        now,
        list(accepted.records),
        [r["schema"] for r in accepted.records],
        list(accepted.sizes),
    )
    if len(stored) != len(accepted.records):  # the row lock makes this unreachable; never half-store
        raise LedgerError("internal", "The journal append did not store its whole batch.")


async def _snapshot(
    conn: asyncpg.Connection, tenant: str, session_id: str, principal: str | None, after_seq: int
) -> SessionSnapshot:
    row = await conn.fetchrow(sql("journal_read_session"), tenant, session_id, principal)
    if row is None:
        raise not_found(SESSION)
    records = await conn.fetch(sql("journal_read_records"), tenant, session_id, after_seq)
    return SessionSnapshot(
        row["session_id"],
        row["principal"],
        row["revision"],
        row["schema"],
        row["labels"],
        row["created_at"],
        row["updated_at"],
        [(r["seq"], r["accepted_at"], r["record"]) for r in records],
        {r["seq"]: r["jcs_bytes"] for r in records},
    )


async def read_session(
    ledger: Ledger, tenant: str, session_id: str, principal: str | None, after_seq: int = 0
) -> SessionSnapshot:
    """The session and its records after `after_seq`, from one snapshot; principal None: any owner."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "journal_read", snapshot=True) as (
        conn,
        _,
    ):
        return await _snapshot(conn, tenant, session_id, principal, after_seq)


@dataclass(frozen=True, slots=True)
class ContextRead:
    """A session snapshot, the database clock it was read at, and the continuation handed back (its
    seq and payload) with the seqs of compatible ones whose payload could not be opened."""

    snapshot: SessionSnapshot
    now: datetime
    handed: tuple[int, bytes] | None
    unreadable: list[int]


async def read_for_context(
    ledger: Ledger,
    tenant: str,
    session_id: str,
    principal: str | None,
    ring: KeyRing | None,
    candidates: Callable[[SessionSnapshot, datetime], list[tuple[int, str]]],
) -> ContextRead:
    """The whole session from one snapshot; then, newest first among `candidates(snapshot, now)`
    ((seq, prefix digest) of compatible continuations), the first whose payload opens."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "journal_context", snapshot=True) as (
        conn,
        now,
    ):
        snap = await _snapshot(conn, tenant, session_id, principal, 0)
        unreadable: list[int] = []
        for seq, digest in candidates(snap, now) if ring is not None else []:
            assert ring is not None
            payload = await journal_state.open_payload(conn, ring, tenant, session_id, seq, digest)
            if payload is not None:
                return ContextRead(snap, now, (seq, payload), unreadable)
            unreadable.append(seq)
    return ContextRead(snap, now, None, unreadable)


async def read_with_effects(
    ledger: Ledger, tenant: str, session_id: str, principal: str | None
) -> tuple[SessionSnapshot, dict[str, Operation]]:
    """The whole session and the ledger's operations its tool calls name, from one read-only snapshot.

    Reads only: the ledger is neither locked nor written."""
    async with tenant_tx(
        ledger.pool, tenant, ledger.acquire_timeout, "journal_projection", snapshot=True
    ) as (conn, _):
        snap = await _snapshot(conn, tenant, session_id, principal, 0)
        wanted = sorted({r["operation_id"] for _, _, r in snap.records if r.get("operation_id")})
        rows = await conn.fetch(sql("journal_effects"), tenant, wanted) if wanted else []
    return snap, {r["operation_id"]: row_to_operation(r) for r in rows}


async def delete_session(ledger: Ledger, tenant: str, principal: str, session_id: str) -> None:
    """Delete the owner's session and its records; not_found when there is none."""
    async with tenant_tx(ledger.pool, tenant, ledger.acquire_timeout, "journal_delete") as (conn, _):
        deleted = await conn.fetchval(sql("journal_delete_session"), tenant, session_id, principal)
    if deleted is None:
        raise not_found(SESSION)


async def purge_idle_sessions(conn: asyncpg.Connection, retention_days: int, batch_size: int) -> int:
    """Owner connection: delete idle sessions (and their records) in batches; how many sessions.

    Each batch is chosen across tenants without a lock, then locked and deleted tenant by tenant (one
    shard group at a time on Citus); a full batch that deleted nothing (all held) ends the run."""
    total = 0
    while True:
        deleted = 0
        async with conn.transaction():
            await conn.fetchval(sql("maintenance_scope"), "on")
            keys = await conn.fetch(sql("journal_idle_candidates"), retention_days, batch_size)
            by_tenant: dict[str, list[str]] = {}
            for tenant, session_id in keys:
                by_tenant.setdefault(tenant, []).append(session_id)
            for tenant, candidates in by_tenant.items():
                status = await conn.execute(sql("journal_purge_idle"), tenant, candidates, retention_days)
                deleted += int(status.split()[-1])
        total += deleted
        if len(keys) < batch_size or deleted == 0:
            return total
