"""repeat --lanes: the sampler of serve's write lanes reads, from pg_stat_activity, the running statements
of the backends named as serve's runtime pool names them, and only those."""

from __future__ import annotations

import asyncio

import asyncpg

from effect_ledger_bench.lanes import LANE_APPLICATION, LaneSampler, summary


async def test_the_sampler_counts_a_lanes_statement_and_the_time_nothing_runs(empty_db: str) -> None:
    lane = await asyncpg.connect(empty_db, server_settings={"application_name": LANE_APPLICATION})
    idle_lane = await asyncpg.connect(empty_db, server_settings={"application_name": LANE_APPLICATION})
    other = await asyncpg.connect(empty_db, server_settings={"application_name": "someone-else"})
    sampler = LaneSampler(empty_db)
    try:
        await sampler.start()
        await asyncio.sleep(0.2)  # nothing runs: every sample is "none in flight"
        # one lane asleep in a statement for 0.6 s; another program's statement beside it is not a lane,
        # and a lane's connection that runs nothing is not in flight
        await asyncio.gather(lane.execute("SELECT pg_sleep(0.6)"), other.execute("SELECT pg_sleep(0.6)"))
        await asyncio.sleep(0.2)
        counts = await sampler.stop()
    finally:
        for conn in (lane, idle_lane, other):
            await conn.close()
    asleep, on_cpu = ("Timeout: PgSleep",), ("CPU",)
    # the lane's statement runs on a CPU around its sleep (parse, plan, the answer): a sample may land
    # there, and on a slow machine did (round 31's CI: one of 197); never more than a few
    assert set(counts) <= {(), asleep, on_cpu} and {(), asleep} <= set(counts), counts
    assert counts[on_cpu] <= 5, counts
    # at one sample per 5 ms: ~120 while the statement ran and ~80 around it; far fewer on a busy machine
    assert counts[asleep] >= 20 and counts[()] >= 10, counts
    assert summary(counts).startswith(f"lanes ({sum(counts.values()):,} samples, ")
