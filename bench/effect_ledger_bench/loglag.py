"""Integration lag of the receipts log under load (issue 22): from a receipt's commit to its leaf in
the tenant's log. During the measured window a sampler reads only the log's size and the database's
clock, every `every` seconds, on an owner connection (a primary-key read of `ledger.log_state`); once
the load stopped, each receipt's commit time (`resolved_at`, the same clock) is read by its feed
position. Receipt k's lag is the first sample with the log at >= k minus its commit time (so the figures
have the sampling interval's resolution). Receipts not logged within `drain` seconds after the load
stopped count as lagging by more than that.

Until round 12 the sampler counted the tenant's committed operations at every sample: 7.6 ms of
PostgreSQL a count at 30,000 operations, ten times a second, charged to the full-service row it measured
(~0.07 ms of PostgreSQL per cycle, ~4 % of two cores)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from effect_ledger_bench.catalogue import sql


@dataclass
class LagSampler:
    url: str
    tenant: str
    every: float = 0.1
    samples: list[tuple[datetime, int]] = field(default_factory=list)  # (database clock, log size)
    _task: asyncio.Task[None] | None = None
    _conn: asyncpg.Connection | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self.url)
        self._task = asyncio.create_task(self._sample())

    async def _sample_once(self) -> int:
        assert self._conn is not None
        row = await self._conn.fetchrow(sql("bench_log_size"), self.tenant)
        self.samples.append((row["at"], int(row["logged"])))
        return int(row["logged"])

    async def _sample(self) -> None:
        while not self._stop.is_set():
            await self._sample_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.every)

    async def finish(self, drain: float = 10.0) -> list[float]:
        """Once the load stopped: the receipts committed so far, then samples (on this connection,
        the sampling task stopped) until the log holds them all, at most `drain` s; then the lag of
        each receipt committed after the first sample, in seconds (inf: not logged)."""
        assert self._conn is not None
        self._stop.set()  # the task ends after its current sample: the connection is free again
        if self._task is not None:
            await self._task
        try:
            target = int(await self._conn.fetchval(sql("bench_committed_count"), self.tenant))
            for _ in range(max(1, round(drain / self.every))):
                if await self._sample_once() >= target:
                    break
                await asyncio.sleep(self.every)
            rows = await self._conn.fetch(sql("bench_commit_times"), self.tenant, self.samples[0][0])
            return lags(self.samples, [(r["feed_position"], r["resolved_at"]) for r in rows])
        finally:
            await self._conn.close()


async def settle(url: str, tenant: str, limit: float = 60.0, every: float = 0.1) -> tuple[float, bool]:
    """Wait until the tenant's log holds every receipt committed so far (the integrator caught up on
    receipts committed while it was not running) and a checkpoint covers them all (the checkpointer
    checked and signed them), at most `limit` seconds: (seconds waited, caught up). Until round 29 it
    waited for the integrator only: the checkpoint over the backlog (after a log-off row ~20,000 leaves,
    each compared with its operation's row) came within LOG_CHECKPOINT_SECONDS, in the warm-up or the
    window of the row it was meant to leave clean."""
    conn = await asyncpg.connect(url)
    started = time.monotonic()
    try:
        # nothing commits while it waits (no load): one count, then the log's size and checkpoint
        committed = int(await conn.fetchval(sql("bench_committed_count"), tenant))
        while True:
            row = await conn.fetchrow(sql("bench_log_size"), tenant)
            if int(row["logged"]) >= committed and int(row["signed"]) >= committed:
                return time.monotonic() - started, True
            if time.monotonic() - started >= limit:
                return time.monotonic() - started, False
            await asyncio.sleep(every)
    finally:
        await conn.close()


async def settled_note(url: str, tenant: str) -> str:
    """settle(), as the note a measured row carries: how long the log took to catch up first."""
    waited, done = await settle(url, tenant)
    return (
        f"; log caught up and signed in {waited:.1f} s first"
        if done
        else f"; log NOT caught up and signed after {waited:.0f} s"
    )


def lags(
    samples: Sequence[tuple[datetime, int]], commits: Sequence[tuple[int | None, datetime]]
) -> list[float]:
    """Per committed receipt (feed position, commit time): the first sample with the log at >= its
    position minus its commit time, in seconds, in position order; inf for a receipt no sample saw
    logged, or never positioned on the feed (None), last."""
    out: list[float] = []
    s = 0
    for position, committed in sorted((p, c) for p, c in commits if p is not None):
        while s < len(samples) and samples[s][1] < position:
            s += 1
        out.append((samples[s][0] - committed).total_seconds() if s < len(samples) else math.inf)
    return out + [math.inf for p, _ in commits if p is None]
