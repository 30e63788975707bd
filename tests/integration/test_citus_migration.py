"""The Citus migration: a no-op on plain PostgreSQL, and (with Citus's functions stubbed) the right calls."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
from alembic import command

from effect_ledger.db.migrate import alembic_config, migrations_dir
from effect_ledger.db.schema_dump import dump_schema
from support.citus_cluster import STUBS

ROLE_SETTINGS = (
    "SELECT r.rolname, s.setconfig FROM pg_db_role_setting AS s JOIN pg_roles AS r ON r.oid = s.setrole"
    " ORDER BY r.rolname, s.setdatabase"
)


def citus_migration() -> object:
    """The migration module itself (its file name starts with a digit, so it is loaded by path)."""
    [path] = Path(migrations_dir(), "versions").glob("*_citus_distribution.py")
    spec = importlib.util.spec_from_file_location("citus_distribution", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def role_settings(url: str) -> list[tuple[str, list[str]]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch(ROLE_SETTINGS)]
    finally:
        await conn.close()


async def test_is_a_no_op_on_plain_postgresql(empty_db: str) -> None:
    migration = citus_migration()
    before_revision = migration.down_revision  # type: ignore[attr-defined]
    config = alembic_config(empty_db)
    await asyncio.to_thread(command.upgrade, config, before_revision)
    schema_before = await asyncio.to_thread(dump_schema, empty_db)
    settings_before = await role_settings(empty_db)

    await asyncio.to_thread(command.upgrade, config, migration.revision)  # type: ignore[attr-defined]

    assert await asyncio.to_thread(dump_schema, empty_db) == schema_before
    assert await role_settings(empty_db) == settings_before
    conn = await asyncpg.connect(empty_db)
    try:
        revision = await conn.fetchval("SELECT version_num FROM alembic_version")
        assert revision == migration.revision  # type: ignore[attr-defined]
        assert await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'citus'") == 0
    finally:
        await conn.close()


async def test_distributes_each_table_by_tenant_once_parents_first(db_url: str) -> None:
    """Citus's branch, run against stand-ins for pg_dist_partition and create_distributed_table."""
    script: str = citus_migration().DISTRIBUTE  # type: ignore[attr-defined]
    database = urlsplit(db_url).path.lstrip("/")
    guard = "IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN"
    assert guard in script
    script = script.replace(guard, "IF false THEN")
    # role settings scoped to this database, which the test drops (role settings are cluster-wide)
    script = script.replace(" SET citus.", f' IN DATABASE "{database}" SET citus.')
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(STUBS)
        for _ in range(2):  # a second run distributes nothing more
            await conn.execute(script)
        rows = await conn.fetch(
            "SELECT logicalrelid::text, colocate_with FROM public.pg_dist_partition ORDER BY ctid"
        )
        settings = await conn.fetch(
            "SELECT r.rolname, s.setconfig FROM pg_db_role_setting AS s"
            " JOIN pg_roles AS r ON r.oid = s.setrole JOIN pg_database AS d ON d.oid = s.setdatabase"
            " WHERE d.datname = current_database()"
        )
        user = await conn.fetchval("SELECT current_user")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("ledger.operations", "default"),
        ("ledger.events", "ledger.operations"),
        ("diagnostics.incidents", "ledger.operations"),
        ("diagnostics.access_log", "ledger.operations"),
    ]
    assert {r["rolname"]: r["setconfig"] for r in settings} == {
        role: ["citus.propagate_set_commands=local"]
        for role in ("effect_ledger_runtime", "effect_ledger_diag_reader", user)
    }


async def test_the_migration_helpers_do_nothing_on_plain_postgresql(db_url: str) -> None:
    from effect_ledger.db.migrate import distribute_by_tenant, distribute_functions, reference_tables
    from support.citus_cluster import in_migration

    def helpers() -> None:
        # names that do not even exist: on plain PostgreSQL the helpers look at nothing but pg_extension
        distribute_by_tenant("scratch.missing")
        reference_tables("scratch.missing_too")
        distribute_functions("scratch.missing(text)")

    before = await asyncio.to_thread(dump_schema, db_url)
    await asyncio.to_thread(in_migration, db_url, helpers)
    assert await asyncio.to_thread(dump_schema, db_url) == before
