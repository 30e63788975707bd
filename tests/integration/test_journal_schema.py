"""The journal's tables: keyed by tenant, isolated by forced row-level security, granted only as far as
the calls need, and distributed with the ledger on Citus (migration 0006)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import asyncpg
import pytest

from effect_ledger.db.migrate import migrations_dir
from support.citus_cluster import STUBS
from support.database import runtime_connection

SESSION = (
    "INSERT INTO journal.sessions (tenant_id, session_id, principal, created_at, updated_at)"
    " VALUES ($1, $2, 'p', now(), now())"
)
RECORD = (
    "INSERT INTO journal.records (tenant_id, session_id, seq, record, schema, jcs_bytes, accepted_at)"
    " VALUES ($1, $2, 1, '{}', 1, 2, now())"
)


def journal_migration() -> object:
    [path] = Path(migrations_dir(), "versions").glob("*_journal.py")
    spec = importlib.util.spec_from_file_location("journal_migration", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


async def test_citus_distributes_sessions_then_records_with_the_ledger(db_url: str) -> None:
    script: str = journal_migration().DISTRIBUTE  # type: ignore[attr-defined]
    guard = "IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN"
    assert guard in script
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(STUBS)  # the stand-ins of the ledger's Citus test, which also want this set:
        await conn.execute("SET citus.enable_unsafe_triggers = 'on'")
        await conn.execute(script)  # plain PostgreSQL: nothing distributed
        assert await conn.fetchval("SELECT count(*) FROM public.pg_dist_partition") == 0
        for _ in range(2):  # a second run distributes nothing more
            await conn.execute(script.replace(guard, "IF false THEN"))
        rows = await conn.fetch(
            "SELECT logicalrelid::text, colocate_with FROM public.pg_dist_partition ORDER BY ctid"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("journal.sessions", "ledger.operations"),
        ("journal.records", "ledger.operations"),
    ]
