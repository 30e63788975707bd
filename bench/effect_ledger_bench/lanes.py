"""Where serve's write lanes are, sampled from `pg_stat_activity` (`repeat --lanes`).

A worker keeps at most WRITE_CONCURRENCY write-path statements in flight (db/batching.py: its lanes),
each on a runtime connection, whose backends `serve` names `effect-ledger`. Every SAMPLE_SECONDS the
sampler reads the state of those backends that are running a statement: on a CPU (no wait event), in
the WAL's flush (`WalSync`), waiting for another backend's flush (the `WALWrite` lock), behind a row
lock, or elsewhere. Each sample is one combination ("one lane on a CPU, one in the WAL's flush"; "none
in flight"), and the shares of the combinations say whether the lanes wait for PostgreSQL's CPU, for
the disk, or for the worker to send them something (round 28: none in flight a quarter of the time).

The sampler is a connection of its own polling ~200 times a second: it costs PostgreSQL and the
bench's process a little CPU, so rounds measured with it are compared with each other, not with rounds
measured without it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable

import asyncpg

from effect_ledger_bench.catalogue import sql

SAMPLE_SECONDS = 0.005
LANE_APPLICATION = "effect-ledger"  # serve's runtime pool (the log process's is effect-ledger-maintenance)
IDLE = "none in flight"

_NAMES = {
    (None, None): "CPU",
    ("IO", "WalSync"): "WAL flush",
    ("LWLock", "WALWrite"): "WAL write lock",
    ("IO", "WalWrite"): "WAL write",
    ("LWLock", "WALInsert"): "WAL insert lock",
    ("Client", "ClientRead"): "client read",
    ("Client", "ClientWrite"): "client write",
}


def lane_state(wait_event_type: str | None, wait_event: str | None) -> str:
    """A running statement's state by its wait event (`CPU` when it waits for nothing)."""
    named = _NAMES.get((wait_event_type, wait_event))
    if named is not None:
        return named
    if wait_event_type == "Lock":
        return f"lock ({wait_event})"
    return f"{wait_event_type}: {wait_event}"


Combination = tuple[str, ...]  # one sample: the states of the lanes in flight, sorted


def combination(states: Iterable[str]) -> Combination:
    """One sample's lanes, sorted (the same lanes in any order are one combination)."""
    return tuple(sorted(states))


def label(lanes: Combination) -> str:
    """A combination as the line shows it: `none in flight`, `CPU`, `CPU + WAL flush`, ..."""
    return " + ".join(lanes) if lanes else IDLE


def summary(counts: Counter[Combination], top: int = 6) -> str:
    """The most frequent combinations with their shares of the samples, and the mean of lanes in
    flight; `no samples` when there were none."""
    samples = sum(counts.values())
    if not samples:
        return "lanes: no samples"
    in_flight = sum(len(lanes) * n for lanes, n in counts.items())
    shares = ", ".join(f"{label(lanes)} {n / samples:.0%}" for lanes, n in counts.most_common(top))
    return f"lanes ({samples:,} samples, {in_flight / samples:.2f} in flight on average): {shares}"


class LaneSampler:
    """Samples the lanes of one database from a task of its own, between start() and stop()."""

    def __init__(self, url: str, application: str = LANE_APPLICATION, every: float = SAMPLE_SECONDS) -> None:
        self.url = url
        self.application = application
        self.every = every
        self.counts: Counter[Combination] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._running = False

    async def start(self) -> None:
        conn = await asyncpg.connect(self.url)
        self._running = True
        self._task = asyncio.get_running_loop().create_task(self._run(conn))

    async def stop(self) -> Counter[Combination]:
        """Stop sampling; the combinations counted."""
        self._running = False
        if self._task is not None:
            await self._task
            self._task = None
        return self.counts

    async def _run(self, conn: asyncpg.Connection) -> None:
        try:
            statement = await conn.prepare(sql("bench_active_lanes"))
            next_at = time.monotonic()
            while self._running:
                rows = await statement.fetch(self.application)
                self.counts[combination(lane_state(r[0], r[1]) for r in rows)] += 1
                next_at = max(next_at + self.every, time.monotonic())  # behind: no catching up
                await asyncio.sleep(next_at - time.monotonic())
        finally:
            await conn.close()
