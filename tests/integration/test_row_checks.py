"""The operation and event rows' value rules (migration 0014: one-column checks as domains, the
cross-column ones as one check) refuse exactly what the table checks they replaced refused, even for
the owner, and accept the boundary values."""

from __future__ import annotations

import asyncpg
import httpx
import pytest

from support.ledger import committed, not_applied, owner

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage

WHERE = " WHERE tenant_id = 't1' AND operation_id = $1"

# (what is set, on the committed operation `ok-1` unless the name says not_applied) -> refused
REFUSED = {
    "attempt 0": "UPDATE ledger.operations SET attempt = 0",
    "chain_seq -1": "UPDATE ledger.operations SET chain_seq = -1",
    "purged_seq -1": "UPDATE ledger.operations SET purged_seq = -1, purged_hash = repeat('0', 64)",
    "feed_position 0": "UPDATE ledger.operations SET feed_position = 0",
    "lease_seconds 0": "UPDATE ledger.operations SET lease_seconds = 0",
    "lease_seconds 3601": "UPDATE ledger.operations SET lease_seconds = 3601",
    "status not a state": "UPDATE ledger.operations SET status = 'done'",
    "committed without receipt or digest": "UPDATE ledger.operations SET receipt = NULL",
    "purge point without its hash": "UPDATE ledger.operations SET purged_seq = 2",
    "purge point without its seq": "UPDATE ledger.operations SET purged_hash = repeat('0', 64)",
    "not_applied without reason or purge point": "UPDATE ledger.operations SET not_applied_reason = NULL",
}
ACCEPTED = {
    "boundaries": "UPDATE ledger.operations SET attempt = 1, chain_seq = 0, feed_position = 1, lease_seconds = 3600",
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
