"""The database Alembic builds is the one schema/ledger.sql describes, and roles are as designed."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from effect_ledger.db.schema_dump import dump_schema, render_ledger_sql
from support.database import runtime_connection, with_database

LEDGER_SQL = Path(__file__).resolve().parents[2] / "schema" / "ledger.sql"


async def test_migrated_database_matches_ledger_sql(pg_admin_url: str, db_url: str) -> None:
    admin = await asyncpg.connect(pg_admin_url)
    name = "el_from_ledger_sql"
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_database(pg_admin_url, name)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(LEDGER_SQL.read_text())
        finally:
            await conn.close()
        assert dump_schema(url) == dump_schema(db_url)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_ledger_sql_is_regenerated_from_the_migrations(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    major = int(await conn.fetchval("SHOW server_version_num")) // 10000
    await conn.close()
    if major != 18:
        pytest.skip(
            "schema/ledger.sql is generated on the embedded PostgreSQL 18; the dump-equality test covers others"
        )
    assert render_ledger_sql(db_url) == LEDGER_SQL.read_text(), "run `effect-ledger schema`"


async def test_runtime_role_is_neither_owner_superuser_nor_rls_bypasser(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        role = await conn.fetchrow(
            "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles"
            " WHERE rolname = 'effect_ledger_runtime'"
        )
        assert tuple(role) == (False, False, False, False)
        owners = await conn.fetch(
            "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner, c.relrowsecurity, c.relforcerowsecurity"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname IN ('ledger', 'diagnostics') AND c.relkind = 'r' ORDER BY 1"
        )
        assert [r["relname"] for r in owners] == [
            "access_log",
            "approval_events",
            "approvals",
            "events",
            "feed",
            "feed_counters",
            "feed_pending",
            "incidents",
            "log_checkpoints",
            "log_decisions",
            "log_state",
            "log_tiles",
            "operations",
        ]
        for r in owners:
            assert r["owner"] != "effect_ledger_runtime"
            assert (r["relrowsecurity"], r["relforcerowsecurity"]) == (True, True)
    finally:
        await conn.close()


async def test_runtime_role_without_tenant_sees_zero_rows(db_url: str) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        owner_name = await owner.fetchval("SELECT current_user")
        await owner.execute(
            "INSERT INTO ledger.operations (tenant_id, operation_id, principal, tool, tool_version, intent_digest,"
            " status, attempt, claim_token_hash, lease_seconds, created_at, updated_at)"
            " SELECT 't' || (g % 3), 'op-' || g, 'p', 'tool', '1', 'sha256:' || repeat('a', 64), 'pending', 1,"
            " '\\x00', 30, now(), now() FROM generate_series(1, 30) g"
        )
    finally:
        await owner.close()
    runtime = await runtime_connection(db_url)
    try:
        assert await runtime.fetchval("SELECT count(*) FROM ledger.operations") == 0
        async with runtime.transaction():
            await runtime.execute("SELECT set_config('effect_ledger.tenant', 't1', true)")
            assert await runtime.fetchval("SELECT count(*) FROM ledger.operations") == 10
            assert (
                await runtime.fetchval("SELECT count(*) FROM ledger.operations WHERE tenant_id = 't2'") == 0
            )
        # the setting was transaction-local: gone again
        assert await runtime.fetchval("SELECT count(*) FROM ledger.operations") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await runtime.execute("DELETE FROM ledger.operations")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await runtime.execute(f'SET ROLE "{owner_name}"')
    finally:
        await runtime.close()


async def test_runtime_role_cannot_write_into_another_tenant(db_url: str) -> None:
    runtime = await runtime_connection(db_url)
    try:
        async with runtime.transaction():
            await runtime.execute("SELECT set_config('effect_ledger.tenant', 't1', true)")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await runtime.execute(
                    "INSERT INTO ledger.operations (tenant_id, operation_id, principal, tool, tool_version,"
                    " intent_digest, status, attempt, claim_token_hash, lease_seconds, created_at, updated_at)"
                    " VALUES ('t2', 'x', 'p', 't', '1', 'sha256:' || repeat('a', 64), 'pending', 1, '\\x00', 30,"
                    " now(), now())"
                )
    finally:
        await runtime.close()
