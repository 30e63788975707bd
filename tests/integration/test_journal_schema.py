"""The journal's tables: keyed by tenant, isolated by forced row-level security, granted only as far as
the calls need, and distributed with the ledger on Citus (migration 0006)."""

from __future__ import annotations

import asyncpg
import pytest

from support.database import runtime_connection

SESSION = (
    "INSERT INTO journal.sessions (tenant_id, session_id, principal, created_at, updated_at)"
    " VALUES ($1, $2, 'p', now(), now())"
)
RECORD = (
    "INSERT INTO journal.records (tenant_id, session_id, seq, record, schema, jcs_bytes, accepted_at)"
    " VALUES ($1, $2, 1, '{}', 1, 2, now())"
)


async def test_keys_start_with_tenant_and_rls_is_forced(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,"
            " (SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            "  AND a.attnum = i.indkey[0] WHERE i.indrelid = c.oid AND i.indisprimary) AS first_key"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'journal' AND c.relkind = 'r' ORDER BY c.relname"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("continuation_payloads", True, True, "tenant_id"),
        ("records", True, True, "tenant_id"),
        ("sessions", True, True, "tenant_id"),
    ]


async def test_runtime_role_sees_only_its_tenant_and_cannot_rewrite_records(db_url: str) -> None:
    owner = await asyncpg.connect(db_url)
    sid = "ses_" + "A" * 24
    try:
        for tenant in ("t1", "t2"):
            await owner.execute(SESSION, tenant, sid)
            await owner.execute(RECORD, tenant, sid)
    finally:
        await owner.close()
    runtime = await runtime_connection(db_url)
    try:
        assert await runtime.fetchval("SELECT count(*) FROM journal.records") == 0
        async with runtime.transaction():
            await runtime.execute("SELECT set_config('effect_ledger.tenant', 't1', true)")
            assert await runtime.fetchval("SELECT count(*) FROM journal.sessions") == 1
            assert await runtime.fetchval("SELECT count(*) FROM journal.records") == 1
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await runtime.execute(SESSION, "t2", "ses_" + "B" * 24)
        for statement in ("UPDATE journal.records SET schema = 2", "DELETE FROM journal.records"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await runtime.execute(statement)
        async with runtime.transaction():  # deleting the session takes its records (cascade)
            await runtime.execute("SELECT set_config('effect_ledger.tenant', 't1', true)")
            assert await runtime.execute("DELETE FROM journal.sessions") == "DELETE 1"
            assert await runtime.fetchval("SELECT count(*) FROM journal.records") == 0
    finally:
        await runtime.close()


@pytest.mark.storage
async def test_citus_distributes_sessions_and_records_with_the_ledger(db_url: str, on_citus: bool) -> None:
    # 0006 calls distribute_by_tenant (tested on plain PostgreSQL in test_citus_migration.py); on the
    # cluster (the Citus lane) both tables are distributed by tenant_id in ledger.operations' group
    conn = await asyncpg.connect(db_url)
    try:
        if not on_citus:
            assert await conn.fetchval("SELECT to_regclass('pg_catalog.pg_dist_partition')") is None
            return
        rows = await conn.fetch(
            "SELECT logicalrelid::text AS name, column_to_column_name(logicalrelid, partkey) AS column,"
            " colocationid = (SELECT colocationid FROM pg_dist_partition"
            "                 WHERE logicalrelid = 'ledger.operations'::regclass) AS with_ledger"
            " FROM pg_dist_partition WHERE logicalrelid::text LIKE 'journal.%' ORDER BY 1"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("journal.continuation_payloads", "tenant_id", True),
        ("journal.records", "tenant_id", True),
        ("journal.sessions", "tenant_id", True),
    ]
