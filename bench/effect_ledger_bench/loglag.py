"""Integration lag of the receipts log under load (issue 22): from a receipt's commit to its leaf in
the tenant's log. Sampled every `every` seconds on an owner connection during the measured window:
the k-th receipt counts as committed at the first sample with at least k committed operations, and
as logged at the first sample whose log size is at least k; its lag is the difference (so the figures
have the sampling interval's resolution). Receipts not logged within `drain` seconds after the load
stopped count as lagging by more than that."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import asyncpg

from effect_ledger_bench.catalogue import sql


@dataclass
class LagSampler:
    url: str
    tenant: str
    every: float = 0.1
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, committed, logged)
    _task: asyncio.Task[None] | None = None
    _conn: asyncpg.Connection | None = None

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self.url)
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        assert self._conn is not None
        while True:
            row = await self._conn.fetchrow(sql("bench_log_progress"), self.tenant)
            self.samples.append((time.monotonic(), int(row["committed"]), int(row["logged"])))
            await asyncio.sleep(self.every)

    async def finish(self, drain: float = 10.0) -> list[float]:
        """Keep sampling until the log holds every receipt committed so far (at most `drain` s), stop,
        and answer the lag of each receipt committed after the first sample (inf: not logged)."""
        target = self.samples[-1][1] if self.samples else 0
        for _ in range(max(1, round(drain / self.every))):
            if self.samples and self.samples[-1][2] >= target:
                break
            await asyncio.sleep(self.every)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()
        return lags(self.samples, target)


async def settle(url: str, tenant: str, limit: float = 60.0, every: float = 0.1) -> tuple[float, bool]:
    """Wait until the tenant's log holds every receipt committed so far (the integrator caught up on
    receipts committed while it was not running), at most `limit` seconds: (seconds waited, caught up)."""
    conn = await asyncpg.connect(url)
    started = time.monotonic()
    try:
        while True:
            row = await conn.fetchrow(sql("bench_log_progress"), tenant)
            if int(row["logged"]) >= int(row["committed"]):
                return time.monotonic() - started, True
            if time.monotonic() - started >= limit:
                return time.monotonic() - started, False
            await asyncio.sleep(every)
    finally:
        await conn.close()


async def settled_note(url: str, tenant: str) -> str:
    """settle(), as the note a measured row carries: how long the log took to catch up first."""
    waited, done = await settle(url, tenant)
    return f"; log caught up in {waited:.1f} s first" if done else f"; log NOT caught up after {waited:.0f} s"


def lags(samples: list[tuple[float, int, int]], upto: int) -> list[float]:
    """Per receipt k in (first committed, upto]: first time logged >= k minus first time committed >= k."""
    if not samples:
        return []
    out: list[float] = []
    c = lg = 0
    for k in range(samples[0][1] + 1, upto + 1):
        while c < len(samples) and samples[c][1] < k:
            c += 1
        while lg < len(samples) and samples[lg][2] < k:
            lg += 1
        if c == len(samples):
            break
        out.append(samples[lg][0] - samples[c][0] if lg < len(samples) else float("inf"))
    return out
