"""Every pooled connection carries the configured timeouts, whichever pool and connection it is."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from effect_ledger.db.pools import Pools
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE
from effect_ledger.settings import Settings

SHOW = (
    "SELECT current_user, current_setting('statement_timeout'), current_setting('lock_timeout'),"
    " current_setting('idle_in_transaction_session_timeout'), current_setting('application_name'),"
    " current_setting('citus.override_table_visibility')"
)


async def test_every_connection_of_both_pools_has_the_timeouts(settings: Settings) -> None:
    configured = replace(
        settings,
        statement_timeout_ms=4321,
        lock_timeout_ms=1234,
        idle_in_transaction_timeout_ms=5678,
        pool_size=4,
        reader_pool_size=2,
    )
    pools = await Pools.open(configured)
    try:
        for pool, role, size in ((pools.runtime, RUNTIME_ROLE, 4), (pools.reader, READER_ROLE, 2)):
            assert pool is not None
            # hold every connection at once, so each one the pool can open is checked
            held = [await pool.acquire() for _ in range(size)]
            try:
                rows = await asyncio.gather(*(conn.fetchrow(SHOW) for conn in held))
            finally:
                for conn in held:
                    await pool.release(conn)
            assert len({id(conn) for conn in held}) == size
            assert {tuple(row) for row in rows} == {
                (role, "4321ms", "1234ms", "5678ms", "effect-ledger", "off")
            }
            assert pool.get_max_size() == size
    finally:
        await pools.close()


async def test_the_defaults_reach_the_server(settings: Settings) -> None:
    pools = await Pools.open(settings, reader=False)
    try:
        async with pools.runtime.acquire() as conn:
            assert await conn.fetchval("SHOW statement_timeout") == "5s"
            assert await conn.fetchval("SHOW lock_timeout") == "2s"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "10s"
    finally:
        await pools.close()
