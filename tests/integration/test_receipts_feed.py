"""API.md section 8: a follower asking again and again with `after` = the last position it saw gets
every committed receipt exactly once, in increasing position, while writers commit and while some
transactions commit long after they stamped their resolution time (the trap of a sequence or a
timestamp assigned before commit)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
import pytest

from support.database import runtime_connection
from support.ledger import AUDITOR, RECEIPT, committed, get, owner, pending

pytestmark = pytest.mark.storage  # the Citus lane of .ci/run runs it again on a cluster

WRITERS = 6
PER_WRITER = 15
HELD = 4
HOLD_SECONDS = 2.5


async def _commit_in_a_held_transaction(db_url: str, op: str, started: asyncio.Event) -> None:
    """Complete a pending operation as committed in a transaction kept open for seconds: its
    resolved_at (and any pre-commit number) is older than what others commit meanwhile."""
    conn = await runtime_connection(db_url)
    try:
        async with conn.transaction():
            # bound as the service binds (SET LOCAL, which Citus forwards to the worker's shard)
            await conn.execute("SELECT tenancy.bind_setting('effect_ledger.tenant', 't1')")
            receipt = json.dumps(
                {
                    **RECEIPT,
                    "result_digest": None,
                    "result": None,
                    "observed_at": None,
                    "recorded_by": "exec-1",
                    "recorded_at": None,
                }
            )
            status = await conn.execute(
                "UPDATE ledger.operations SET status = 'committed', receipt = $2::jsonb, lease_expires_at = NULL,"
                " resolved_at = statement_timestamp(), resolved_by = 'exec-1', updated_at = statement_timestamp()"
                " WHERE tenant_id = 't1' AND operation_id = $1",
                op,
                receipt,
            )
            assert status == "UPDATE 1"
            # and, as ledger.complete does in the same transaction, the commit waits for its position
            await conn.execute(
                "INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id)"
                " SELECT tenant_id, resolved_at, operation_id FROM ledger.operations"
                " WHERE tenant_id = 't1' AND operation_id = $1",
                op,
            )
            started.set()
            await asyncio.sleep(HOLD_SECONDS)
    finally:
        await conn.close()


async def _writer(client: httpx.AsyncClient, w: int) -> list[str]:
    done = []
    for i in range(PER_WRITER):
        op = f"w{w}-{i:03d}"
        await committed(client, op, sub=f"exec-{w}")
        done.append(op)
    return done


async def _follow(client: httpx.AsyncClient, stop: asyncio.Event, seen: list[dict[str, Any]]) -> int:
    """Poll the tail with `after`; returns how many polls came back empty."""
    after: str | None = None
    empty = 0
    quiet_after_stop = 0
    while quiet_after_stop < 2:
        params = {"limit": "7", **({"after": after} if after else {})}
        r = await get(client, "/v1/receipts", params, **AUDITOR)
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        for item in items:
            seen.append(
                {"id": item["operation_id"], "position": item["position"], "resolved_at": item["resolved_at"]}
            )
        if items:
            after = items[-1]["position"]
        else:
            empty += 1
            assert r.json() == {"items": [], "next_cursor": None}
            if stop.is_set():
                quiet_after_stop += 1
            await asyncio.sleep(0.05)
    return empty


@pytest.mark.timeout(240)
async def test_a_follower_sees_every_receipt_once_in_order(client: httpx.AsyncClient, db_url: str) -> None:
    held_ops = [f"held-{n}" for n in range(HELD)]
    for op in held_ops:
        await pending(client, op, lease_seconds=600)
    stop = asyncio.Event()
    seen: list[dict[str, Any]] = []
    follower = asyncio.create_task(_follow(client, stop, seen))
    starts = [asyncio.Event() for _ in held_ops]
    holders = [
        asyncio.create_task(_commit_in_a_held_transaction(db_url, op, ev))
        for op, ev in zip(held_ops, starts, strict=True)
    ]
    await asyncio.gather(*(ev.wait() for ev in starts))  # every held transaction has stamped its time
    written = await asyncio.gather(*(_writer(client, w) for w in range(WRITERS)))
    await asyncio.gather(*holders)
    stop.set()
    await follower

    async with owner(db_url) as conn:
        expected = {
            r["operation_id"]
            for r in await conn.fetch(
                "SELECT operation_id FROM ledger.operations WHERE tenant_id = 't1' AND status = 'committed'"
            )
        }
    assert expected == set(held_ops) | {op for ops in written for op in ops}
    ids = [s["id"] for s in seen]
    assert len(ids) == len(set(ids)), "a receipt was delivered twice"
    assert set(ids) == expected, f"missed: {sorted(expected - set(ids))}"
    positions = [s["position"] for s in seen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [int(p) for p in positions] == sorted(int(p) for p in positions)
    # the trap was really set: each held receipt reached the follower after receipts resolved later
    # than it, so a follower keyed on resolution time (or a pre-commit sequence) would have skipped it
    for op in held_ops:
        index = ids.index(op)
        assert any(s["resolved_at"] > seen[index]["resolved_at"] for s in seen[:index]), op


async def test_positions_survive_paging_filters_and_bad_input(client: httpx.AsyncClient) -> None:
    for n in range(5):
        await committed(client, f"p-{n}", sub="exec-1" if n % 2 == 0 else "exec-2")
    whole = (await get(client, "/v1/receipts", **AUDITOR)).json()["items"]
    positions = [i["position"] for i in whole]
    assert len(positions) == 5 and positions == sorted(positions) and all(len(p) == 20 for p in positions)
    after_two = (await get(client, "/v1/receipts", {"after": positions[1]}, **AUDITOR)).json()
    assert [i["position"] for i in after_two["items"]] == positions[2:] and after_two["next_cursor"] is None
    by_cursor = (await get(client, "/v1/receipts", {"limit": "2"}, **AUDITOR)).json()
    assert by_cursor["next_cursor"] == positions[1]
    filtered = await get(client, "/v1/receipts", {"principal": "exec-2", "after": positions[0]}, **AUDITOR)
    assert [i["operation_id"] for i in filtered.json()["items"]] == ["p-1", "p-3"]
    tail = await get(client, "/v1/receipts", {"after": positions[-1]}, **AUDITOR)
    assert tail.json() == {"items": [], "next_cursor": None}
    for bad in (
        {"after": "abc"},
        {"after": "0"},
        {"after": "1" * 21},
        {"cursor": "x"},
        {"after": positions[0], "cursor": positions[1]},
    ):
        r = await get(client, "/v1/receipts", bad, **AUDITOR)
        assert r.status_code == 422 and r.json()["code"] == "validation_failed", bad


async def test_two_sequencers_never_hand_out_a_position_twice(client: httpx.AsyncClient, db_url: str) -> None:
    for n in range(30):
        await committed(client, f"s-{n}")
    # eight feed reads at once: each runs the sequencer first, and they all agree
    answers = await asyncio.gather(
        *(get(client, "/v1/receipts", {"limit": "500"}, **AUDITOR) for _ in range(8))
    )
    lists = [[i["position"] for i in a.json()["items"]] for a in answers]
    assert all(lst == lists[0] for lst in lists) and len(lists[0]) == 30
    async with owner(db_url) as conn:
        assert (
            await conn.fetchval("SELECT last_position FROM ledger.feed_counters WHERE tenant_id = 't1'") == 30
        )
        assert await conn.fetchval("SELECT count(*) FROM ledger.feed_pending") == 0
        assert await conn.fetchval("SELECT count(*) FROM ledger.feed WHERE tenant_id = 't1'") == 30


async def test_the_runtime_role_only_adds_feed_positions_and_only_sees_its_tenant(
    client: httpx.AsyncClient, db_url: str
) -> None:
    """Migration 0019's tables under the runtime role: a position, once handed out, is never changed
    or removed by the service (no UPDATE or DELETE on ledger.feed; only log-recover, as the owner,
    moves one), and another tenant's positions and waiting commits are invisible and unwritable."""
    await committed(client, "mine")
    await committed(client, "theirs", tenant="t2")
    assert [i["operation_id"] for i in (await get(client, "/v1/receipts", **AUDITOR)).json()["items"]] == [
        "mine"
    ]
    conn = await runtime_connection(db_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT tenancy.bind_setting('effect_ledger.tenant', 't1')")
            feed = await conn.fetch("SELECT tenant_id, feed_position, operation_id FROM ledger.feed")
            assert [tuple(r) for r in feed] == [("t1", 1, "mine")]
            assert await conn.fetchval("SELECT count(*) FROM ledger.feed_pending") == 0  # t2's is hidden
            refused = {
                "UPDATE ledger.feed SET feed_position = 7": "permission denied",
                "DELETE FROM ledger.feed": "permission denied",
                "INSERT INTO ledger.feed VALUES ('t2', 5, 'theirs')": "row-level security",
                "INSERT INTO ledger.feed_pending VALUES ('t2', now(), 'theirs')": "row-level security",
            }
            for statement, reason in refused.items():
                with pytest.raises(asyncpg.InsufficientPrivilegeError, match=reason):
                    async with conn.transaction():
                        await conn.execute(statement)
    finally:
        await conn.close()
    async with owner(db_url) as conn:
        kept = await conn.fetch("SELECT tenant_id, operation_id FROM ledger.feed_pending")
        assert [tuple(r) for r in kept] == [("t2", "theirs")]
        assert await conn.fetchval("SELECT count(*) FROM ledger.feed WHERE tenant_id = 't2'") == 0
