"""Tests on a Citus cluster: one database made on every node (effect_ledger_bench.citus, which the
bench's Cluster uses too), wiped between tests, and extra workers.

When the server under test (EFFECT_LEDGER_DATABASE_URL) is a Citus coordinator, conftest migrates a
database created here on the coordinator and on every worker, and each test gets it wiped rather than a
fresh clone (a Citus database cannot be cloned from a template: every node holds part of it).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import asyncpg
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import create_engine, pool

from effect_ledger.db.catalogue import sql
from effect_ledger.db.urls import sqlalchemy_url
from effect_ledger_bench import citus
from effect_ledger_bench.citus import create_on_node, drop_database, is_citus, node_url, nodes

__all__ = [
    "create_database",
    "create_on_node",
    "drop_database",
    "in_migration",
    "is_citus",
    "node_url",
    "nodes",
    "scripts_dir",
    "start_node",
    "stop_node",
    "wipe",
]

# Tests use 4 shards per table (production keeps Citus's 32): quicker DDL and wipes, shards still on
# every worker.
TEST_SHARD_COUNT = 4


async def create_database(admin_url: str, name: str) -> str:
    """An empty Citus database called name on every node of admin_url's cluster, TEST_SHARD_COUNT shards
    a table."""
    return await citus.create_database(admin_url, name, TEST_SHARD_COUNT)


async def wipe(url: str) -> None:
    """Delete every row of every distributed table, referencing tables first, as a purge would."""
    conn = await asyncpg.connect(url)
    try:
        tables = [
            r[0]
            for r in await conn.fetch(
                "SELECT logicalrelid::regclass::text FROM pg_dist_partition ORDER BY logicalrelid"
            )
        ]
        edges = await conn.fetch(
            "SELECT conrelid::regclass::text AS child, confrelid::regclass::text AS parent"
            " FROM pg_constraint WHERE contype = 'f' AND conrelid <> confrelid"
        )
        order: list[str] = []
        remaining = set(tables)
        while remaining:
            # a table nothing remaining references goes first
            free = sorted(
                t for t in remaining if not any(e["parent"] == t and e["child"] in remaining for e in edges)
            )
            order += free
            remaining -= set(free)
        async with conn.transaction():
            await conn.fetchval(sql("maintenance_scope"), "on")
            await conn.fetchval(sql("purge_mode"))
            for table in order:
                await conn.execute(f"DELETE FROM {table}")
    finally:
        await conn.close()


def scripts_dir() -> Path | None:
    """../shared/citus beside the repository (or EFFECT_LEDGER_CITUS_SCRIPTS), when it is there."""
    configured = os.environ.get("EFFECT_LEDGER_CITUS_SCRIPTS")
    candidate = Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared" / "citus"
    return candidate if (candidate / "cluster.sh").exists() else None


def start_node(data_dir: Path, port: int) -> None:
    """One more Citus node (a cluster.sh "coordinator" with no workers) on 127.0.0.1:port."""
    scripts = scripts_dir()
    assert scripts is not None
    data_dir.mkdir(parents=True, exist_ok=True)
    for folder in (data_dir.parent, data_dir):
        folder.chmod(0o755)  # the postgres user runs the node
    done = subprocess.run(
        [str(scripts / "cluster.sh"), "start", str(data_dir), str(port), "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def stop_node(data_dir: Path) -> None:
    """Stop a node started by start_node."""
    scripts = scripts_dir()
    assert scripts is not None
    subprocess.run(
        [str(scripts / "cluster.sh"), "stop", str(data_dir)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )


def in_migration(url: str, step: Callable[[], None]) -> None:
    """Run a migration step (code that uses alembic's `op`) on url, in one transaction, as Alembic would."""
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.begin() as connection, Operations.context(MigrationContext.configure(connection)):
            step()
    finally:
        engine.dispose()


# Stand-ins for Citus's catalogue and create_distributed_table on plain PostgreSQL: the migrations'
# Citus branches run against them and record what they would distribute (in pg_dist_partition).
STUBS = """
CREATE TABLE public.pg_dist_partition (logicalrelid regclass PRIMARY KEY, colocate_with text);
CREATE FUNCTION public.create_distributed_table(
    table_name regclass, distribution_column text, colocate_with text DEFAULT 'default'
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF distribution_column <> 'tenant_id' THEN
        RAISE EXCEPTION 'distributed by %', distribution_column;
    END IF;
    IF current_setting('citus.enable_unsafe_triggers', true) IS DISTINCT FROM 'on'
       OR current_setting('citus.multi_shard_modify_mode', true) IS DISTINCT FROM 'sequential' THEN
        RAISE EXCEPTION 'settings missing';
    END IF;
    INSERT INTO public.pg_dist_partition VALUES (table_name, colocate_with);
END
$$;
"""
