"""The bench's settle step between layers (effect_ledger_bench.database.Cluster.settle): it vacuums the
bench's databases and checkpoints the server, so no layer's window pays for another layer's vacuum or
for a checkpoint that another layer's writes made due."""

from __future__ import annotations

import asyncio

import asyncpg

from effect_ledger_bench.database import Cluster, with_database


async def requested(conn: asyncpg.Connection) -> int:
    """Checkpoints requested since the statistics were reset (pg_stat_checkpointer from 17 on)."""
    if int(await conn.fetchval("SHOW server_version_num")) >= 170000:
        return int(await conn.fetchval("SELECT num_requested FROM pg_stat_checkpointer"))
    return int(await conn.fetchval("SELECT checkpoints_req FROM pg_stat_bgwriter"))


async def test_settle_checkpoints_and_says_what_it_did(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        before = await requested(conn)
        note = await Cluster(db_url).settle(wait=5.0)
        after = await requested(conn)
    finally:
        await conn.close()
    # at least its own: a test beside this one on the same server may checkpoint too (bench smoke)
    assert after - before >= 1
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


async def test_settle_vacuums_every_database_of_the_bench(db_url: str) -> None:
    admin = await asyncpg.connect(db_url)
    name = "effect_ledger_bench_settle_probe"
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.execute(f"CREATE DATABASE {name}")
        probe = await asyncpg.connect(with_database(db_url, name))
        try:
            await probe.execute(
                "CREATE TABLE dirty (n int); INSERT INTO dirty SELECT generate_series(1, 100)"
            )
            await probe.execute("DELETE FROM dirty WHERE n % 2 = 0")
            await probe.execute("CREATE TABLE empty (n int)")
        finally:
            await probe.close()  # its table counts reach the statistics when it ends, as a layer's do
        await counted_dead_rows(with_database(db_url, name))
        note = await Cluster(db_url, _databases=[name]).settle(wait=5.0)
        probe = await asyncpg.connect(with_database(db_url, name))
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
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.close()
