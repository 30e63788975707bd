"""Alembic migrations (run with psycopg 3) and the role passwords the service logs in with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from effect_ledger.db.catalogue import sql
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE, derived_password, writable_url
from effect_ledger.settings import Settings

if TYPE_CHECKING:  # Alembic (with SQLAlchemy) and psycopg load only to migrate: serve starts without them
    import psycopg
    from alembic.config import Config

_REVISION = re.compile(
    r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(?:\"([^\"]*)\"|'([^']*)'|None)", re.MULTILINE
)


def migrations_dir() -> Path:
    """The migrations inside the package: effect_ledger/migrations (a link to alembic/ in the source tree)."""
    return Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic config for one database, built in code (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("effect_ledger.url", database_url)
    return cfg


def head_revision() -> str:
    """The newest migration: the one revision no other migration names as its down_revision, read from
    the files' text (the app checks it at start-up: Alembic's ScriptDirectory imported Alembic,
    SQLAlchemy and every migration module, half a second of each serve process's start)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in sorted((migrations_dir() / "versions").glob("*.py")):
        for name, double, single in _REVISION.findall(script.read_text("utf-8")):
            value = double or single
            if value:
                (revisions if name == "revision" else parents).add(value)
    heads = revisions - parents
    assert len(heads) == 1, f"migrations with no successor: {sorted(heads)}"
    return heads.pop()


async def _set_passwords(conn: asyncpg.Connection, settings: Settings) -> None:
    assert settings.database_url
    await conn.execute(sql("grant_migration_state"))
    for role, explicit in (
        (RUNTIME_ROLE, settings.runtime_database_url),
        (READER_ROLE, settings.reader_database_url),
    ):
        if explicit:
            continue  # the operator manages this role's password (e.g. CloudNativePG managed roles)
        await conn.fetchrow(sql("set_role_password"), role, derived_password(settings.database_url, role))
        await conn.execute(sql("apply_role_password"))


async def _at_head(conn: asyncpg.Connection) -> bool:
    """Whether the database's Alembic version is exactly the package's head (no table yet: not)."""
    try:
        versions = {r["version_num"] for r in await conn.fetch(sql("migration_head"))}
    except asyncpg.UndefinedTableError:
        return False
    return versions == {head_revision()}


async def migrate(settings: Settings) -> None:
    """Upgrade the database to head, then give the service roles their login passwords. A database
    already at head is left as it is without loading Alembic (with SQLAlchemy and psycopg: about a
    CPU second of every serve start, which migrates first)."""
    assert settings.database_url
    conn = await asyncpg.connect(writable_url(settings.database_url))
    try:
        if not await _at_head(conn):
            from alembic import command

            command.upgrade(alembic_config(settings.database_url), "head")
        await _set_passwords(conn, settings)
    finally:
        await conn.close()


def _dbapi_connection() -> psycopg.Connection[Any]:
    import psycopg
    from alembic import op

    conn = op.get_bind().connection.dbapi_connection
    assert isinstance(conn, psycopg.Connection)
    return conn


def execute_script(script: str) -> None:
    """Run a migration's SQL as written: no parameters, so psycopg leaves `%` and `:` alone.

    On Citus, keep `SET LOCAL` and `ALTER TABLE ... ADD CONSTRAINT` alone in their script: Citus forwards
    them to the workers with the script's whole text, which a worker refuses as several commands."""
    with _dbapi_connection().cursor() as cursor:
        cursor.execute(script)


def function_files() -> list[Path]:
    """The write path's function definitions, one file each, in the order they are applied."""
    return sorted((migrations_dir() / "functions").glob("*.sql"))


def apply_functions() -> None:
    """(Re)create every function of alembic/functions/ from its file (CREATE OR REPLACE): migration
    0009, and any later migration that changes one of them, calls this after its own DDL."""
    for path in function_files():
        execute_script(path.read_text("utf-8"))


def _catalogue(name: str, *params: object) -> Any:
    """Run a catalogue statement ($n parameters, as asyncpg takes them) on the migration's connection."""
    import psycopg

    with psycopg.RawCursor(_dbapi_connection()) as cursor:
        cursor.execute(sql(name), params)
        return cursor.fetchone() if cursor.description else None


def on_citus() -> bool:
    """Whether the database being migrated is a Citus coordinator (the citus extension is installed)."""
    row = _catalogue("citus_installed")
    return bool(row and row[0])


def isolate_by_tenant(*tables: str) -> None:
    """Row-level security on new tables with a tenant_id, as every tenant table has it: enabled and
    forced (the owner too), rows of the tenant bound in effect_ledger.tenant only, and every row
    under the maintenance switch (effect_ledger.maintenance = 'on', 0002) for the owner's sweeps.
    Call it before distribute_by_tenant (Citus then carries the policies to the shards)."""
    statements = []
    for table in tables:
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY",
            f"CREATE POLICY tenant_isolation ON {table}"
            " USING (tenant_id = current_setting('effect_ledger.tenant', true))"
            " WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true))",
            f"CREATE POLICY maintenance ON {table} TO CURRENT_USER"
            " USING (current_setting('effect_ledger.maintenance', true) = 'on')",
        ]
    execute_script(";\n".join(statements) + ";")


def distribute_by_tenant(*tables: str) -> None:
    """Citus: distribute new tables by tenant_id, co-located with ledger.operations (parents first);
    plain PostgreSQL: nothing. Call it right after creating the tables, while they are empty."""
    if not on_citus():
        return
    for setting, value in (
        ("citus.multi_shard_modify_mode", "sequential"),
        ("citus.enable_unsafe_triggers", "on"),
    ):
        _catalogue("citus_local_setting", setting, value)
    for table in tables:
        _catalogue("citus_distribute_table", table)


def reference_tables(*tables: str) -> None:
    """Citus: make tables without a tenant (small, read everywhere) reference tables, copied to every node;
    plain PostgreSQL: nothing."""
    if not on_citus():
        return
    for table in tables:
        _catalogue("citus_reference_table", table)


def distribute_functions(
    *signatures: str, tenant_argument: str = "tenant", force_delegation: bool = False
) -> None:
    """Citus: distribute functions by their tenant argument, co-located with ledger.operations, so that a
    call in autocommit runs on the worker holding that tenant's rows (inside a transaction block too with
    force_delegation, which then binds the whole transaction to that worker); plain PostgreSQL: nothing.
    `signatures` as regprocedure text, e.g. 'ledger.sweep(text, text)'."""
    if not on_citus():
        return
    for signature in signatures:
        _catalogue("citus_distribute_function", signature, tenant_argument, force_delegation)
