"""The operation and event rows' rules. The one-column rules are domains (migration 0014): they refuse
exactly what the table checks they replaced refused, even for the owner, and accept the boundary values.
The cross-column rules and the events' link to their operation have been kept since migration 0016 by
the write path alone (the functions and the maintenance statements, no second guard in the tables):
a committed outcome keeps its receipt and a not_applied one its reason (ledger.complete and
ledger.resolve refuse a report without, nothing written), a purge point's seq and hash are written
together, and no event outlives its operation."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import httpx
import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.db.maintenance import purge
from effect_ledger.settings import Settings
from support.ledger import REASON, RECEIPT, committed, not_applied, owner, pending, runtime, unknown

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

WHERE = " WHERE tenant_id = 't1' AND operation_id = $1"

# (what is set, on the committed operation `ok-1` unless the name says not_applied) -> refused
REFUSED = {
    "attempt 0": "UPDATE ledger.operations SET attempt = 0",
    "chain_seq -1": "UPDATE ledger.operations SET chain_seq = -1",
    "purged_seq -1": "UPDATE ledger.operations SET purged_seq = -1, purged_hash = repeat('0', 64)",
    "lease_seconds 0": "UPDATE ledger.operations SET lease_seconds = 0",
    "lease_seconds 3601": "UPDATE ledger.operations SET lease_seconds = 3601",
    "status not a state": "UPDATE ledger.operations SET status = 'done'",
}
ACCEPTED = {
    "boundaries": "UPDATE ledger.operations SET attempt = 1, chain_seq = 0, lease_seconds = 3600",
    "lease_seconds 1": "UPDATE ledger.operations SET lease_seconds = 1",
    "a committed tombstone keeps its digest": "UPDATE ledger.operations SET receipt = NULL,"
    " receipt_digest = 'sha256:' || repeat('0', 64), purged_seq = 2, purged_hash = repeat('0', 64)",
    "a not_applied tombstone keeps its purge point": "UPDATE ledger.operations SET not_applied_reason = NULL,"
    " purged_seq = 2, purged_hash = repeat('0', 64)",
}


def _target(name: str) -> str:
    return "na-1" if "not_applied" in name else "ok-1"


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_a_value_outside_the_rules_is_refused(
    client: httpx.AsyncClient, db_url: str, name: str
) -> None:
    await committed(client, "ok-1")
    await not_applied(client, "na-1")
    async with owner(db_url) as conn:
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(REFUSED[name] + WHERE, _target(name))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
async def test_values_inside_the_rules_are_stored(client: httpx.AsyncClient, db_url: str, name: str) -> None:
    await committed(client, "ok-1")
    await not_applied(client, "na-1")
    async with owner(db_url) as conn:
        assert await conn.execute(ACCEPTED[name] + WHERE, _target(name)) == "UPDATE 1"


async def test_an_event_seq_below_one_is_refused(client: httpx.AsyncClient, db_url: str) -> None:
    await committed(client, "ok-1")
    async with owner(db_url) as conn:
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO ledger.events (tenant_id, operation_id, seq, at, kind, actor, attempt, data,"
                " prev_hash, hash) VALUES ('t1', 'ok-1', 0, now(), 'claimed', 'x', 1, '{}',"
                " repeat('0', 64), repeat('0', 64))"
            )


async def test_a_feed_position_below_one_is_refused(client: httpx.AsyncClient, db_url: str) -> None:
    """Feed positions (ledger.feed since migration 0019) keep the domain ledger.feed_position (>= 1)."""
    await committed(client, "ok-1")
    place = "INSERT INTO ledger.feed (tenant_id, feed_position, operation_id) VALUES ('t1', $1, 'ok-1')"
    async with owner(db_url) as conn:
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(place, 0)
        assert await conn.execute(place, 1) == "INSERT 0 1"


# Before migration 0016 these were table checks (operations_outcome_record) and a foreign key
# (events -> operations); now the write path keeps them, and these tests prove it through the calls.
COMPLETE = "SELECT outcome_code FROM ledger.complete($1, $2, $3, $4, $5, $6, $7, NULL)"
RESOLVE = "SELECT outcome_code FROM ledger.resolve($1, $2, 'rec-1', $3, $4, $5, NULL)"
ROW = "SELECT status, receipt, not_applied_reason, chain_seq, claim_token_hash FROM ledger.operations" + WHERE


async def _as_runtime(db_url: str, query: str, *args: object) -> object:
    conn = await runtime(db_url)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("outcome", "receipt", "reason"),
    [("committed", None, None), ("committed", None, '{"category":"rejected"}'), ("not_applied", "{}", None)],
    ids=["committed without receipt", "committed with only a reason", "not_applied without reason"],
)
async def test_complete_refuses_an_outcome_without_its_record(
    client: httpx.AsyncClient, db_url: str, outcome: str, receipt: str | None, reason: str | None
) -> None:
    """What `operations_outcome_record` refused at the UPDATE: the function refuses it (SQLSTATE 23514,
    as the check did) and writes nothing, neither the row nor an event."""
    await pending(client, "op-1")
    async with owner(db_url) as conn:
        before = await conn.fetchrow(ROW, "op-1")
        events = await conn.fetchval("SELECT count(*) FROM ledger.events" + WHERE, "op-1")
    assert before is not None
    with pytest.raises(asyncpg.CheckViolationError, match=f"a {outcome} outcome needs its"):
        await _as_runtime(
            db_url, COMPLETE, "t1", "op-1", "exec-1", before["claim_token_hash"], outcome, receipt, reason
        )
    async with owner(db_url) as conn:
        assert await conn.fetchrow(ROW, "op-1") == before
        assert await conn.fetchval("SELECT count(*) FROM ledger.events" + WHERE, "op-1") == events


async def test_complete_records_each_outcome_with_its_record(client: httpx.AsyncClient, db_url: str) -> None:
    """The accepted side: committed keeps its receipt, not_applied its reason."""
    await committed(client, "ok-1")
    await not_applied(client, "na-1")
    async with owner(db_url) as conn:
        ok = await conn.fetchrow(ROW, "ok-1")
        na = await conn.fetchrow(ROW, "na-1")
    assert (
        ok is not None
        and ok["status"] == "committed"
        and ok["receipt"]["external_ref"] == RECEIPT["external_ref"]
    )
    assert na is not None and na["status"] == "not_applied" and na["not_applied_reason"] == REASON


@pytest.mark.parametrize(
    ("outcome", "receipt", "reason"),
    [("committed", None, None), ("not_applied", None, None)],
    ids=["committed without receipt", "not_applied without reason"],
)
async def test_resolve_refuses_an_outcome_without_its_record(
    client: httpx.AsyncClient, db_url: str, outcome: str, receipt: str | None, reason: str | None
) -> None:
    await unknown(client, "op-1")
    async with owner(db_url) as conn:
        before = await conn.fetchrow(ROW, "op-1")
    with pytest.raises(asyncpg.CheckViolationError, match=f"a {outcome} outcome needs its"):
        await _as_runtime(db_url, RESOLVE, "t1", "op-1", outcome, receipt, reason)
    async with owner(db_url) as conn:
        assert await conn.fetchrow(ROW, "op-1") == before
    # and with its record the same call resolves it
    assert await _as_runtime(db_url, RESOLVE, "t1", "op-1", "committed", '{"external_ref":"m-1"}', None) == (
        "resolved"
    )


PURGE_POINTS = (
    "SELECT operation_id, status, purged_seq, purged_hash, chain_seq, chain_hash, receipt, receipt_digest,"
    " not_applied_reason FROM ledger.operations ORDER BY operation_id"
)
ORPHANS = (
    "SELECT count(*) FROM ledger.events AS e WHERE NOT EXISTS (SELECT 1 FROM ledger.operations AS o"
    " WHERE o.tenant_id = e.tenant_id AND o.operation_id = e.operation_id)"
)


async def test_a_purge_point_is_written_whole_and_no_event_outlives_its_operation(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    """The purge point's seq and hash together (the chain head at the cut), the committed tombstone's
    receipt digest, the not_applied one's purge point; and the events of a purged or expired ID go with
    it (what the foreign key guarded)."""
    await committed(client, "ok-1")
    await not_applied(client, "na-1")
    await committed(client, "live-1")
    async with owner(db_url) as conn:
        for row in await conn.fetch(PURGE_POINTS):
            assert row["purged_seq"] is None and row["purged_hash"] is None, dict(row)
        await conn.execute(
            "UPDATE ledger.operations SET updated_at = now() - interval '31 days'"
            " WHERE operation_id IN ('ok-1', 'na-1')"
        )
    await purge(settings)
    async with owner(db_url) as conn:
        rows = {r["operation_id"]: r for r in await conn.fetch(PURGE_POINTS)}
        assert await conn.fetchval(ORPHANS) == 0
        # the tombstones' events went with their bodies
        assert (
            await conn.fetchval("SELECT count(*) FROM ledger.events WHERE operation_id IN ('ok-1', 'na-1')")
            == 0
        )
    for op in ("ok-1", "na-1"):
        row = rows[op]
        assert (row["purged_seq"], row["purged_hash"]) == (row["chain_seq"], row["chain_hash"]), dict(row)
        assert row["receipt"] is None and row["not_applied_reason"] is None
    assert rows["ok-1"]["receipt_digest"] is not None
    assert rows["live-1"]["purged_seq"] is None and rows["live-1"]["purged_hash"] is None
    async with owner(db_url) as conn:
        # the tombstones expire: the IDs go, and their events with them (none left without its row)
        await conn.execute(
            "UPDATE ledger.operations SET updated_at = now() - interval '401 days'"
            " WHERE operation_id IN ('ok-1', 'na-1')"
        )
    assert (await purge(settings)).counts["tombstones_expired"] == 2
    async with owner(db_url) as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM ledger.operations WHERE operation_id IN ('ok-1', 'na-1')"
            )
            == 0
        )
        assert await conn.fetchval(ORPHANS) == 0
        assert await conn.fetchval("SELECT count(*) FROM ledger.events WHERE operation_id = 'live-1'") == 2


async def test_log_recovers_tombstone_writes_its_purge_point_whole(
    client: httpx.AsyncClient, db_url: str
) -> None:
    """log-recover's tombstone of a commit the signed log proves (`log_make_tombstone`) keeps the
    chain head at the cut as its purge point, seq and hash together (on Citus too since round 14: its
    times are statement_timestamp(), which Citus takes in an UPDATE)."""
    await pending(client, "proven-1")
    async with owner(db_url) as conn:
        await conn.execute(
            sql("log_make_tombstone"), "t1", "proven-1", "sha256:" + "0" * 64, 7, datetime.now(UTC), "c" * 64
        )
        commit_hash = await conn.fetchval(
            "SELECT commit_hash FROM ledger.operations WHERE operation_id = 'proven-1'"
        )
        proven = await conn.fetchrow(
            PURGE_POINTS.replace(" ORDER BY", " WHERE operation_id = 'proven-1' ORDER BY")
        )
    assert proven is not None and proven["status"] == "committed"
    assert (proven["purged_seq"], proven["purged_hash"]) == (proven["chain_seq"], proven["chain_hash"])
    assert commit_hash == "c" * 64  # the proven leaf's chain hash (migration 0023)
