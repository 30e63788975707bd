"""Alembic migrations (run with psycopg 3) and the role passwords the service logs in with."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from effect_ledger.db.catalogue import sql
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE, derived_password
from effect_ledger.settings import Settings


def migrations_dir() -> Path:
    """Where alembic/ is: EFFECT_LEDGER_MIGRATIONS_DIR, else beside the source tree (or /app in the image)."""
    configured = os.environ.get("EFFECT_LEDGER_MIGRATIONS_DIR")
    candidates = [Path(configured)] if configured else []
    candidates += [Path(__file__).resolve().parents[3] / "alembic", Path("/app/alembic")]
    for candidate in candidates:
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("alembic/ not found; set EFFECT_LEDGER_MIGRATIONS_DIR")


def alembic_config(database_url: str) -> Config:
    """An Alembic config for one database, built in code (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("effect_ledger.url", database_url)
    return cfg


def head_revision() -> str:
    """The newest migration in alembic/."""
    head = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
    assert head is not None
    return head


async def _set_passwords(settings: Settings) -> None:
    assert settings.database_url
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(sql("grant_migration_state"))
        for role, explicit in ((RUNTIME_ROLE, settings.runtime_database_url),
                               (READER_ROLE, settings.reader_database_url)):
            if explicit:
                continue  # the operator manages this role's password (e.g. CloudNativePG managed roles)
            await conn.fetchrow(sql("set_role_password"), role, derived_password(settings.database_url, role))
            await conn.execute(sql("apply_role_password"))
    finally:
        await conn.close()


async def migrate(settings: Settings) -> None:
    """Upgrade the database to head, then give the service roles their login passwords."""
    assert settings.database_url
    command.upgrade(alembic_config(settings.database_url), "head")
    await _set_passwords(settings)


def execute_script(script: str) -> None:
    """Run a migration's SQL as written: no parameters, so psycopg leaves `%` and `:` alone."""
    from alembic import op

    cursor = op.get_bind().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(script)
    finally:
        cursor.close()
