"""Migration 0019 on a database with receipts: the positions already handed out move to ledger.feed
unchanged, the commits still waiting for one move to ledger.feed_pending with their resolution time,
nothing else is queued, the column and its indexes are gone, and the feed numbers on from where it was."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from alembic import command

from effect_ledger.db.catalogue import sql
from effect_ledger.db.migrate import alembic_config
from support.ledger import Seed, owner, seed

START = datetime(2026, 11, 1, tzinfo=UTC)


async def test_0019_moves_positions_and_waiting_commits_out_of_the_operation_row(empty_db: str) -> None:
    config = alembic_config(empty_db)
    await asyncio.to_thread(command.upgrade, config, "0018")
    rows = [Seed("t1", f"c-{i}", "committed", START + timedelta(seconds=i)) for i in range(1, 6)] + [
        Seed("t1", "n-1", "not_applied", START),
        Seed("t1", "p-1", "pending", START),
        Seed("t2", "c-1", "committed", START + timedelta(seconds=9)),
    ]
    async with owner(empty_db) as conn:
        await seed(conn, rows)
        # what 0018's sequencer had handed out: t1's first three commits, t2's one
        await conn.execute(
            "UPDATE ledger.operations SET feed_position = CASE operation_id WHEN 'c-1' THEN 1"
            " WHEN 'c-2' THEN 2 WHEN 'c-3' THEN 3 END WHERE tenant_id = 't1' AND operation_id IN ('c-1', 'c-2', 'c-3')"
        )
        await conn.execute("UPDATE ledger.operations SET feed_position = 1 WHERE tenant_id = 't2'")
        await conn.execute("INSERT INTO ledger.feed_counters VALUES ('t1', 3), ('t2', 1)")

    await asyncio.to_thread(command.upgrade, config, "head")

    async with owner(empty_db) as conn:
        feed = await conn.fetch(
            "SELECT tenant_id, feed_position, operation_id FROM ledger.feed ORDER BY 1, 2"
        )
        assert [tuple(r) for r in feed] == [
            ("t1", 1, "c-1"),
            ("t1", 2, "c-2"),
            ("t1", 3, "c-3"),
            ("t2", 1, "c-1"),
        ]
        waiting = await conn.fetch(
            "SELECT p.tenant_id, p.operation_id, p.resolved_at = o.resolved_at AS same_time"
            " FROM ledger.feed_pending AS p JOIN ledger.operations AS o USING (tenant_id, operation_id)"
            " ORDER BY 1, 2"
        )
        assert [tuple(r) for r in waiting] == [("t1", "c-4", True), ("t1", "c-5", True)]
        column = "SELECT count(*) FROM information_schema.columns WHERE table_name = 'operations' AND column_name = 'feed_position'"
        assert await conn.fetchval(column) == 0
        indexes = "SELECT count(*) FROM pg_indexes WHERE indexname IN ('operations_feed', 'operations_unpositioned')"
        assert await conn.fetchval(indexes) == 0
        # the sequencer goes on from the counter: the waiting commits get 4 and 5, in resolution order
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), "t1")
            last = await conn.fetchval(sql("feed_lock"), "t1")
            assert (last, await conn.fetchval(sql("feed_assign"), "t1", last, 1000)) == (3, 2)
        positions = await conn.fetch(
            "SELECT operation_id, feed_position FROM ledger.feed WHERE tenant_id = 't1' ORDER BY feed_position"
        )
        assert [tuple(r) for r in positions] == [(f"c-{i}", i) for i in range(1, 6)]
        assert await conn.fetchval("SELECT count(*) FROM ledger.feed_pending") == 0
