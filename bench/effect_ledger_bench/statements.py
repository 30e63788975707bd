"""Where PostgreSQL's time goes under `serve`, statement by statement (`repeat --statements`).

`pgstats` drives pgbench's scripts; this reads pg_stat_statements around a `repeat` round of the real
service, so the receipts log's statements (its integrator, sequencer and checkpointer) are counted
beside the write path's under the same load. The server must preload the library
(`shared_preload_libraries = 'pg_stat_statements'`; the embedded build has no such module, Debian's
PostgreSQL 15 here does): run `repeat` with EFFECT_LEDGER_DATABASE_URL on such a server. Each round
resets the database's entries before its window and prints after it, per cycle, every statement
whose execution time reached SHOWN_SHARE of the top-level total: microseconds of execution, calls,
rows, shared buffers and WAL bytes. With `pg_stat_statements.track = all` a function's nested statements
are listed too, and their time is also inside the function's call: only top-level statements add up
to the total.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from effect_ledger_bench.catalogue import sql

SHOWN_SHARE = 0.01  # statements below 1 % of the top-level execution time are left out of the lines
QUERY_CHARS = 90


class StatementsUnavailable(RuntimeError):
    """The server cannot count statements (the library is not preloaded, or not installed)."""


@dataclass(frozen=True)
class Statement:
    """One pg_stat_statements entry since the reset, per cycle."""

    toplevel: bool
    calls: float
    exec_us: float
    rows: float
    buffers: float
    wal_bytes: float
    query: str

    def line(self) -> str:
        """The entry as one printed line."""
        nested = "" if self.toplevel else " (nested)"
        return (
            f"{self.exec_us:8.1f} us {self.calls:7.3f} calls {self.rows:7.2f} rows"
            f" {self.buffers:7.1f} buffers {self.wal_bytes:7.0f} WAL B  {self.query}{nested}"
        )


def one_line(query: str) -> str:
    """A statement's text on one line, cut to QUERY_CHARS."""
    text = re.sub(r"\s+", " ", query).strip()
    return text if len(text) <= QUERY_CHARS else text[: QUERY_CHARS - 1] + "…"


def per_cycle(rows: Sequence[asyncpg.Record], cycles: int) -> list[Statement]:
    """The view's rows as per-cycle entries, in its order."""
    n = max(cycles, 1)
    return [
        Statement(
            bool(r["toplevel"]),
            r["calls"] / n,
            r["exec_ms"] * 1000 / n,
            r["rows"] / n,
            r["buffers"] / n,
            float(r["wal_bytes"]) / n,
            one_line(r["query"]),
        )
        for r in rows
    ]


def report(entries: Sequence[Statement]) -> list[str]:
    """The printed lines: the top-level total, then every entry of at least SHOWN_SHARE of it."""
    total = sum(e.exec_us for e in entries if e.toplevel)
    wal = sum(e.wal_bytes for e in entries if e.toplevel)
    shown = [e for e in entries if e.exec_us >= SHOWN_SHARE * total]
    head = (
        f"  statements per cycle (pg_stat_statements): top-level {total:.1f} us of execution,"
        f" {wal:,.0f} WAL B; {len(shown)} of {len(entries)} shown"
    )
    return [head] + [f"    {e.line()}" for e in shown]


class Statements:
    """pg_stat_statements of one database, reset before a window and read after it."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def _conn(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.url)

    async def enable(self) -> None:
        """Create the view in the database; StatementsUnavailable when the server cannot count."""
        conn = await self._conn()
        try:
            await conn.execute(sql("bench_statements_enable"))
            await conn.fetch(sql("bench_statements_read"))
        except (asyncpg.FeatureNotSupportedError, asyncpg.ObjectNotInPrerequisiteStateError) as why:
            # not installed (the embedded build), or installed and not preloaded
            raise StatementsUnavailable(
                f"pg_stat_statements cannot count here ({why}): run against a server started with"
                " shared_preload_libraries = 'pg_stat_statements' (EFFECT_LEDGER_DATABASE_URL)"
            ) from None
        finally:
            await conn.close()

    async def reset(self) -> None:
        """Forget the database's counts so far."""
        conn = await self._conn()
        try:
            await conn.fetchval(sql("bench_statements_reset"))
        finally:
            await conn.close()

    async def read(self, cycles: int) -> list[Statement]:
        """The database's counts since the reset, per cycle, the costliest first."""
        conn = await self._conn()
        try:
            rows = await conn.fetch(sql("bench_statements_read"))
        finally:
            await conn.close()
        return per_cycle(rows, cycles)
