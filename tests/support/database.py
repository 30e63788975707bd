"""URLs and connections of the PostgreSQL under test."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psycopg
from psycopg import sql

from effect_ledger.db.urls import RUNTIME_ROLE, derived_password

# The tests' own throw-away server needs no crash safety; the product's defaults are never changed.
FAST_SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def with_database(url: str, name: str) -> str:
    """The same server URL naming another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def runtime_connection(url: str, role: str = RUNTIME_ROLE) -> asyncpg.Connection:
    """A direct connection as a service role, with the password `migrate` gave it."""
    return await asyncpg.connect(url, user=role, password=derived_password(url, role))


def trade_durability_for_speed(url: str, **more: str) -> None:
    """Turn off a test server's flushes to disk, and set `more` of its reloadable settings (the Citus
    lane's nodes: autovacuum=off, .ci/run); reloadable, so no restart."""
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in {**FAST_SERVER_SETTINGS, **more}.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
