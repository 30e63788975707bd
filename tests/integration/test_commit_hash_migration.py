"""Migration 0023 on a database with receipts: a committed operation's row gets the hash of the event
that committed it (not a later `discrepancy` event's), a committed operation without events (a
tombstone) its chain head, and an operation never committed none."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from alembic import command

from effect_ledger.db.migrate import alembic_config
from support.ledger import Seed, owner, seed

START = datetime(2026, 11, 1, tzinfo=UTC)
EVENTS = (
    # seq, kind, from_status, to_status, hash
    (1, "claimed", None, "pending", "1" * 64),
    (2, "completed", "pending", "committed", "2" * 64),
    (3, "discrepancy", "committed", "committed", "3" * 64),
)


async def test_0023_keeps_each_commits_own_hash(empty_db: str) -> None:
    config = alembic_config(empty_db)
    await asyncio.to_thread(command.upgrade, config, "0022")
    async with owner(empty_db) as conn:
        await seed(
            conn,
            [
                Seed("t1", "disputed", "committed", START),
                Seed("t1", "tombstone", "committed", START),
                Seed("t1", "declined", "not_applied", START),
                Seed("t2", "disputed", "committed", START),  # the same ID, another tenant's chain
            ],
        )
        for tenant, events in (("t1", EVENTS), ("t2", EVENTS[:2])):
            for seq, kind, before, after, digest in events:
                await conn.execute(
                    "INSERT INTO ledger.events (tenant_id, operation_id, seq, at, kind, actor, from_status,"
                    " to_status, attempt, data, prev_hash, hash) VALUES ($1, 'disputed', $2, $3, $4, 'exec-1',"
                    " $5, $6, 1, '{}', $7, $8)",
                    tenant, seq, START, kind, before, after, "0" * 64, digest[:-1] + tenant[-1],
                )  # fmt: skip
        await conn.execute(
            "UPDATE ledger.operations SET chain_hash = CASE operation_id WHEN 'tombstone' THEN $1"
            " WHEN 'declined' THEN $2 ELSE chain_hash END",
            "a" * 64,
            "b" * 64,
        )

    await asyncio.to_thread(command.upgrade, config, "head")

    async with owner(empty_db) as conn:
        rows = await conn.fetch(
            "SELECT tenant_id, operation_id, commit_hash FROM ledger.operations ORDER BY 1, 2"
        )
        assert [tuple(r) for r in rows] == [
            ("t1", "declined", None),
            ("t1", "disputed", "2" * 63 + "1"),
            ("t1", "tombstone", "a" * 64),
            ("t2", "disputed", "2" * 63 + "2"),
        ]
