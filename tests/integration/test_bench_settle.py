"""The bench's settle step between layers (effect_ledger_bench.database.Cluster.settle): it vacuums the
bench's databases and checkpoints the server, so no layer's window pays for another layer's vacuum or
for a checkpoint that another layer's writes made due."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from effect_ledger_bench.database import Cluster, with_database
from support.waiting import until


async def redo_point(conn: asyncpg.Connection) -> int:
    """The last checkpoint's redo position (pg_control, written before CHECKPOINT returns)."""
    return int(await conn.fetchval("SELECT redo_lsn - '0/0'::pg_lsn FROM pg_control_checkpoint()"))


async def test_settle_checkpoints_and_says_what_it_did(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        # WAL since the last checkpoint, so that settle's is not skipped as having nothing to do (a test
        # beside this one may have checkpointed the server a moment ago: counting requested checkpoints
        # in the statistics missed settle's own once, in round 14's README run)
        await conn.execute("CREATE TABLE settle_wal (n int); DROP TABLE settle_wal")
        written = int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
        note = await Cluster(db_url).settle(wait=5.0)
        # what a layer's window starts from: every write before settle is behind the last checkpoint
        assert await redo_point(conn) >= written
    finally:
        await conn.close()
    assert note.startswith("0 databases vacuumed in ") and ", checkpoint in " in note


async def counted_dead_rows(url: str) -> None:
    """Wait until the statistics show the deleted rows (a backend reports them as it exits)."""
    conn = await asyncpg.connect(url)
    try:
        for _ in range(100):
            dead = await conn.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dirty'")
            if dead:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the deleted rows never reached the statistics")
    finally:
        await conn.close()


async def changed_rows(url: str, table: str) -> int:
    """Rows of `table` changed since its last analyse, as the statistics show them."""
    conn = await asyncpg.connect(url)
    try:
        changed = await conn.fetchval(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = $1", table
        )
    finally:
        await conn.close()
    return int(changed or 0)


@asynccontextmanager
async def probe_database(db_url: str, name: str, setup: str) -> AsyncIterator[str]:
    """A database of the bench's own (created fresh, dropped after) where `setup` ran on a connection
    that has ended (its table counts reach the statistics when it ends, as a layer's do); its URL."""
    admin = await asyncpg.connect(db_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.execute(f"CREATE DATABASE {name}")
        probe = await asyncpg.connect(with_database(db_url, name))
        try:
            await probe.execute(setup)
        finally:
            await probe.close()
        yield with_database(db_url, name)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.close()


async def test_settle_vacuums_every_database_of_the_bench(db_url: str) -> None:
    name = "effect_ledger_bench_settle_probe"
    setup = (
        "CREATE TABLE dirty (n int); INSERT INTO dirty SELECT generate_series(1, 100);"
        "DELETE FROM dirty WHERE n % 2 = 0; CREATE TABLE empty (n int)"
    )
    async with probe_database(db_url, name, setup) as url:
        await counted_dead_rows(url)
        note = await Cluster(db_url, _databases=[name]).settle(wait=5.0)
        probe = await asyncpg.connect(url)
        try:
            row = await probe.fetchrow(
                "SELECT last_vacuum IS NOT NULL AS vacuumed, last_analyze IS NOT NULL AS analysed, n_dead_tup"
                " FROM pg_stat_user_tables WHERE relname = 'dirty'"
            )
            # an empty table keeps the planner's never-vacuumed size guess (reltuples -1)
            empty = await probe.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'empty'")
        finally:
            await probe.close()
        assert (row["vacuumed"], row["analysed"], row["n_dead_tup"]) == (True, True, 0)
        assert empty == -1
        assert note.startswith("1 databases vacuumed in ")


async def test_analyze_after_a_warm_up_analyses_the_tables_it_filled(db_url: str) -> None:
    """Cluster.analyze (after a layer's warm-up): the tables the warm-up filled get statistics, so the
    measured part plans from them; an empty table is left alone; the answer says how many."""
    name = "effect_ledger_bench_analyze_probe"
    setup = (
        "CREATE TABLE warmed (n int PRIMARY KEY); INSERT INTO warmed SELECT generate_series(1, 500);"
        "CREATE TABLE untouched (n int)"
    )
    async with probe_database(db_url, name, setup) as url:
        await until(
            lambda: changed_rows(url, "warmed"),
            "the filled table's changes in the statistics",
            holds=lambda changed: changed > 0,
            within=10,
            every=0.05,
        )
        note = await Cluster(db_url, _databases=[name]).analyze()
        probe = await asyncpg.connect(url)
        try:
            rows = {
                r["relname"]: (r["analysed"], r["reltuples"])
                for r in await probe.fetch(
                    "SELECT s.relname, s.last_analyze IS NOT NULL AS analysed, c.reltuples"
                    " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
                )
            }
        finally:
            await probe.close()
        assert rows == {"warmed": (True, 500.0), "untouched": (False, -1.0)}
        assert note.startswith("1 tables analysed after the warm-up in ")
