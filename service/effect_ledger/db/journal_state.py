"""Continuation payloads (docs/api.md section 12): sealed at append in the append's transaction, read
back only by context replay, purged when they expire. Never logged, never in a session read.

Round trips: an append with continuation records adds 2 (read the prefix records, insert the
payloads); a context answer that hands a continuation back adds 1 (read its payload).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from effect_ledger.db.catalogue import sql
from effect_ledger.domain.journal_continuations import (
    KeyRing,
    Sealed,
    associated_data,
    expiry_of,
    prefix_digest,
)


@dataclass(frozen=True, slots=True)
class Payloads:
    """A batch's continuation payloads (batch index -> bytes), taken out of the records, and the key
    ring that seals them."""

    ring: KeyRing
    by_index: Mapping[int, bytes]


async def bind_and_seal(
    conn: asyncpg.Connection,
    tenant: str,
    session_id: str,
    base_revision: int,
    records: Sequence[dict[str, Any]],
    payloads: Payloads,
) -> list[tuple[int, Sealed, Any]]:
    """Bind each continuation record of the batch to its prefix digest (written into the record, so it
    is stored with it) and seal its payload; returns (seq, sealed, expires_at) to store."""
    continuations = [(i, r) for i, r in enumerate(records) if r["type"] == "continuation"]
    longest = max(r["covers_to_seq"] for _, r in continuations)
    rows = await conn.fetch(sql("journal_prefix_records"), tenant, session_id, longest) if longest else []
    stored = [r["record"] for r in rows]
    sealed: list[tuple[int, Sealed, Any]] = []
    for index, record in continuations:
        digest = prefix_digest(stored[: record["covers_to_seq"]])
        record["prefix_digest"] = digest
        seq = base_revision + index + 1
        aad = associated_data(tenant, session_id, seq, digest)
        sealed.append((seq, payloads.ring.seal(payloads.by_index[index], aad), expiry_of(record)))
    return sealed


async def store_sealed(
    conn: asyncpg.Connection, tenant: str, session_id: str, sealed: Sequence[tuple[int, Sealed, Any]]
) -> None:
    """Insert the sealed payloads (after their records)."""
    await conn.execute(
        sql("journal_store_payloads"),
        tenant,
        session_id,
        [seq for seq, _, _ in sealed],
        [s.key_id for _, s, _ in sealed],
        [s.nonce for _, s, _ in sealed],
        [s.ciphertext for _, s, _ in sealed],
        [expires for _, _, expires in sealed],
    )


async def open_payload(
    conn: asyncpg.Connection, ring: KeyRing, tenant: str, session_id: str, seq: int, digest: str
) -> bytes | None:
    """A continuation's payload, or None: expired (or purged), its key rotated out, or tampered with."""
    row = await conn.fetchrow(sql("journal_read_payload"), tenant, session_id, seq)
    if row is None:
        return None
    sealed = Sealed(row["key_id"], bytes(row["nonce"]), bytes(row["ciphertext"]))
    return ring.open_sealed(sealed, associated_data(tenant, session_id, seq, digest))


async def purge_expired_payloads(conn: asyncpg.Connection) -> int:
    """Retention (owner connection): delete payloads past their expiry; how many."""
    async with conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        status: str = await conn.execute(sql("journal_purge_payloads"))
    return int(status.split()[-1])
