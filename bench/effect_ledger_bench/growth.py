"""Ledger history for the growth rows: COPY-loaded operations and events, and the tables' sizes."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.workload import BULK_TENANT

BATCH = 1_000_000  # rows per COPY (one transaction each), so progress shows and memory stays flat


@dataclass(frozen=True)
class TableSize:
    """One ledger table's size."""

    name: str
    total_bytes: int  # heap, TOAST and indexes
    index_bytes: int
    estimated_rows: int

    @property
    def heap_bytes(self) -> int:
        """The table without its indexes."""
        return self.total_bytes - self.index_bytes


async def _pipe(
    source: asyncpg.Connection, target: asyncpg.Connection, query: str, table: str, first: int, last: int
) -> None:
    """COPY a catalogue query's rows out of the server and straight back into a ledger table."""
    columns = [attr.name for attr in (await source.prepare(query)).get_attributes()]
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=32)

    async def collect(chunk: bytes) -> None:
        await chunks.put(chunk)

    async def produce() -> None:
        try:
            await source.copy_from_query(query, BULK_TENANT, first, last, output=collect, format="binary")
        finally:
            await chunks.put(None)

    async def feed() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    await asyncio.gather(
        produce(),
        target.copy_to_table(table, schema_name="ledger", source=feed(), columns=columns, format="binary"),
    )


async def load_history(owner_url: str, have: int, want: int) -> float:
    """Bring the bulk tenant from `have` to `want` operations (one event each); returns seconds taken."""
    started = time.monotonic()
    source, target = await asyncpg.connect(owner_url), await asyncpg.connect(owner_url)
    try:
        for first in range(have + 1, want + 1, BATCH):
            last = min(want, first + BATCH - 1)
            # COPY FROM works here because the owner of the bench databases is a superuser, which
            # row-level security never applies to (COPY FROM refuses tables where it does).
            await _pipe(source, target, sql("bench_bulk_operations"), "operations", first, last)
            await _pipe(source, target, sql("bench_bulk_events"), "events", first, last)
            print(f"bench: loaded {last:,} of {want:,} operations", file=sys.stderr, flush=True)
        await target.execute(sql("bench_analyze"))
        try:
            await target.execute(sql("bench_checkpoint"))
        except asyncpg.InsufficientPrivilegeError:
            pass  # only superusers and pg_checkpoint may; the measurement is then noisier, not wrong
    finally:
        await source.close()
        await target.close()
    return time.monotonic() - started


async def table_sizes(owner_url: str) -> list[TableSize]:
    """Sizes of ledger.operations and ledger.events."""
    conn = await asyncpg.connect(owner_url)
    try:
        rows = await conn.fetch(sql("bench_relation_sizes"))
    finally:
        await conn.close()
    return [
        TableSize(r["name"], r["total_bytes"], r["index_bytes"], max(0, r["estimated_rows"])) for r in rows
    ]
