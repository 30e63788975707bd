"""log-recover's repositioning against the feed tables (migration 0019), as the owner and at the SQL
level: a committed operation the database numbered differently from the signed log moves to the
logged position (its feed row freed, re-queued, then placed, its pending row gone again); a logged
receipt the database lost comes back as a tombstone at its position; an operation the database has as
not committed becomes the committed tombstone the log proves; a commit the log never saw keeps waiting
and is numbered after the recovered log."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.db.receipt_log import _mirror_root, recover_tenant
from effect_ledger.domain.receipt_log import LeafFacts, leaf_data
from effect_ledger.signer import Signed
from support.ledger import Seed, owner, seed

pytestmark = pytest.mark.storage  # the Citus lane of .ci/run runs it again on a cluster

START = datetime(2026, 11, 1, tzinfo=UTC)


def leaf(operation_id: str, index: int) -> bytes:
    facts = LeafFacts(
        tenant="t1",
        operation_id=operation_id,
        principal="exec-1",
        tool="measure",
        tool_version="1.0",
        intent_digest="sha256:" + "0" * 64,
        attempt=1,
        receipt_digest="sha256:" + f"{index}" * 64,
        chain_hash=f"{index + 1}" * 64,
        committed_at=START + timedelta(seconds=index),
    )
    return leaf_data(facts, index, os.urandom(32))


async def test_recovery_places_every_logged_receipt_at_its_position_and_queues_the_rest(db_url: str) -> None:
    mirror = [leaf("a", 0), leaf("b", 1), leaf("c", 2)]
    signed = Signed(3, _mirror_root(mirror, 3))
    async with owner(db_url) as conn:
        await seed(
            conn,
            [
                Seed("t1", "a", "committed", START),  # logged at 1; the database numbered it 2
                Seed("t1", "c", "pending", START),  # logged as committed at 3
                Seed("t1", "d", "committed", START + timedelta(seconds=5)),  # never logged: waits
            ],
        )
        await conn.execute("INSERT INTO ledger.feed VALUES ('t1', 2, 'a')")
        await conn.execute(
            "INSERT INTO ledger.feed_pending SELECT tenant_id, resolved_at, operation_id FROM ledger.operations"
            " WHERE operation_id = 'd'"
        )
        await conn.execute("INSERT INTO ledger.feed_counters VALUES ('t1', 2)")

        counts = await recover_tenant(conn, "t1", signed, mirror, "test.example/log")
        assert counts == {"tombstones": 1, "repositioned": 2, "overwritten": 1, "leaves": 3}

        feed = await conn.fetch("SELECT feed_position, operation_id FROM ledger.feed ORDER BY 1")
        assert [tuple(r) for r in feed] == [(1, "a"), (2, "b"), (3, "c")]
        waiting = await conn.fetch("SELECT operation_id FROM ledger.feed_pending ORDER BY 1")
        assert [r["operation_id"] for r in waiting] == ["d"]  # a's re-queued row left when it was placed
        ops = await conn.fetch(
            "SELECT operation_id, status, receipt IS NULL AS tombstone FROM ledger.operations ORDER BY 1"
        )
        assert [tuple(r) for r in ops] == [
            ("a", "committed", False),
            ("b", "committed", True),
            ("c", "committed", True),
            ("d", "committed", False),
        ]
        # a tombstone keeps its leaf's chain hash as its commit's (migration 0023): the checkpointer
        # compares the leaf with it; c's own chain (pending, never committed here) names another head
        kept = await conn.fetch(
            "SELECT operation_id, commit_hash, chain_hash FROM ledger.operations"
            " WHERE operation_id IN ('b', 'c') ORDER BY 1"
        )
        assert [(r["operation_id"], r["commit_hash"]) for r in kept] == [("b", "2" * 64), ("c", "3" * 64)]
        assert kept[1]["chain_hash"] != "3" * 64
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), "t1")
            last = await conn.fetchval(sql("feed_lock"), "t1")
            assert (last, await conn.fetchval(sql("feed_assign"), "t1", last, 1000)) == (3, 1)
        assert await conn.fetchval("SELECT feed_position FROM ledger.feed WHERE operation_id = 'd'") == 4
