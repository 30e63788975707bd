"""Alembic environment: migrations are raw SQL run through psycopg 3, one transaction per run."""

from __future__ import annotations

import functools

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

from effect_ledger.db.urls import libpq_url
from effect_ledger.settings import Settings

config = context.config
url = config.get_main_option("effect_ledger.url") or Settings.from_env().database_url
if not url:
    raise SystemExit("EFFECT_LEDGER_DATABASE_URL is not set")

# libpq reads the URL itself: several hosts (the writable one is taken) work as they do for the service.
engine = create_engine(
    "postgresql+psycopg://",
    creator=functools.partial(psycopg.connect, libpq_url(url)),
    poolclass=pool.NullPool,
)
with engine.connect() as connection:
    context.configure(connection=connection, transaction_per_migration=False)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
