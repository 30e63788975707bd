"""The PostgreSQL the bench runs on: an embedded one in a temp dir, or EFFECT_LEDGER_DATABASE_URL's server."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

from effect_ledger.db.embedded import start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.db.urls import RUNTIME_ROLE, derived_password
from effect_ledger.settings import Settings
from effect_ledger_bench import citus
from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.procs import postmaster_pid

LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")
SETTLE_SECONDS = 30.0  # the longest settle waits for autovacuum before it checkpoints anyway
SETTLE_POLL_SECONDS = 0.2


def with_database(url: str, name: str) -> str:
    """The same server URL naming another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass(frozen=True)
class Endpoint:
    """How a libpq client (pgbench) reaches one database as the runtime role."""

    host: str | None  # a host name, or the unix-socket directory of the embedded server
    port: int | None
    dbname: str
    user: str
    password: str

    @classmethod
    def runtime(cls, owner_url: str) -> Endpoint:
        """The runtime role's endpoint for the database `owner_url` names."""
        parts = urlsplit(owner_url)
        socket_dir = parse_qs(parts.query).get("host", [None])[0]
        return cls(
            socket_dir or parts.hostname,
            parts.port,
            parts.path.lstrip("/") or "postgres",
            RUNTIME_ROLE,
            derived_password(owner_url, RUNTIME_ROLE),
        )


@dataclass
class Cluster:
    """One PostgreSQL server and the benchmark databases created on it (dropped by close())."""

    owner_url: str
    version: str = "unknown"
    postmaster: int | None = None  # pid, when the server runs on this machine (a coordinator's only)
    citus: bool = False  # a Citus coordinator: each database made on every node (effect_ledger_bench.citus)
    _server: Any = None
    _tempdir: Path | None = None
    _databases: list[str] = field(default_factory=list)

    @classmethod
    async def open(cls, configured_url: str | None) -> Cluster:
        """An embedded server in a temp dir, or the configured one (its URL must allow CREATE DATABASE)."""
        if configured_url:
            cluster = cls(configured_url)
        else:
            tempdir = Path(tempfile.mkdtemp(prefix="effect-ledger-bench-"))
            server, url = await asyncio.to_thread(start_embedded, tempdir)
            cluster = cls(url, _server=server, _tempdir=tempdir)
            cluster.postmaster = postmaster_pid(tempdir / "pgdata")
        conn = await asyncpg.connect(cluster.owner_url)
        try:
            row = await conn.fetchrow(sql("bench_server"))
        finally:
            await conn.close()
        cluster.version = str(row["version"])
        if cluster.postmaster is None and (urlsplit(configured_url or "").hostname or "") in LOCAL_HOSTS:
            cluster.postmaster = _parent_of(int(row["backend_pid"]))
        cluster.citus = bool(configured_url) and await citus.is_citus(cluster.owner_url)
        return cluster

    async def create(self, name: str) -> str:
        """A fresh, migrated database; returns its owner URL. On a Citus coordinator, on every node of
        its cluster (Citus's 32 shards a table), migrated as the service's migrations distribute it."""
        if self.citus:
            url = await citus.create_database(self.owner_url, name)
            self._databases.append(name)
            await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
            return url
        conn = await asyncpg.connect(self.owner_url)
        try:
            ddl = await conn.fetchrow(sql("bench_database_ddl"), name)
            await conn.execute(ddl["drop_database"])
            await conn.execute(ddl["create_database"])
        finally:
            await conn.close()
        self._databases.append(name)
        url = with_database(self.owner_url, name)
        await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
        return url

    async def settle(self, wait: float = SETTLE_SECONDS) -> str:
        """Before a layer: the bench's databases' changed tables vacuumed and analysed now (never an
        empty one: bench_vacuum_statement says why), no autovacuum worker left running (waited for at
        most `wait` s), then a CHECKPOINT; answers what it did. A layer then
        pays for its own writes only: not for the vacuum of an earlier layer's dead rows, which
        autovacuum would start within its next naptime, inside whichever window came next (round 13: the
        lean row after the service wrote 8,690 - 9,254 WAL bytes a cycle against 4,016 before it, and
        cost 0.54 - 0.55 against 0.42 - 0.47 ms of PostgreSQL, even on fresh tables of its own), nor for
        a time-based checkpoint (the CHECKPOINT restarts checkpoint_timeout)."""
        started = time.monotonic()
        await self._in_each_database(sql("bench_vacuum_statement"))
        vacuumed = time.monotonic() - started
        conn = await asyncpg.connect(self.owner_url)
        try:
            deadline = time.monotonic() + wait
            for _ in range(int(wait / SETTLE_POLL_SECONDS) + 1):  # polling a server: no event to wait on
                if not await conn.fetchval(sql("bench_autovacuum_workers")) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(SETTLE_POLL_SECONDS)
            waited = time.monotonic() - started - vacuumed
            note = f"{len(self._databases)} databases vacuumed in {vacuumed:.1f} s"
            note += f", autovacuum waited {waited:.1f} s"
            try:
                await conn.execute(sql("bench_checkpoint"))
            except asyncpg.InsufficientPrivilegeError:  # a configured server's role without pg_checkpoint
                return f"{note}, no CHECKPOINT (not permitted)"
            return f"{note}, checkpoint in {time.monotonic() - started - vacuumed - waited:.1f} s"
        finally:
            await conn.close()

    async def analyze(self) -> str:
        """After a layer's warm-up, before its window: the bench's databases' tables that the warm-up
        changed are analysed, so that the measured part runs on plans made from their statistics.
        Without it a layer on fresh tables (the lean rows, the HTTP floor, every layer of a new database)
        ran on generic plans that each connection cached at its sixth execution for tables never
        analysed, planned from whatever size they had then: round 22's first HTTP floor row chose the
        (tenant, principal, created_at) index for the submit's and complete's UPDATE, read 15 M index
        entries in 5 s and ran at 323 against ~2,000 cycles/s (5.4 ms of PostgreSQL a cycle). ANALYZE
        invalidates the cached plans of a connection that stays open. Answers what it did."""
        started = time.monotonic()
        analysed = await self._in_each_database(sql("bench_analyze_statement"))
        return f"{analysed} tables analysed after the warm-up in {time.monotonic() - started:.1f} s"

    async def _in_each_database(self, generator: str) -> int:
        """In each of the bench's databases, the statement that the query `generator` writes for its
        tables (`statement`, NULL: none to run) and how many it names (`tables`); answers their sum."""
        tables = 0
        for name in self._databases:
            db = await asyncpg.connect(with_database(self.owner_url, name))
            try:
                row = await db.fetchrow(generator)
                if row["statement"] is not None:
                    await db.execute(row["statement"])
                    tables += row["tables"]
            finally:
                await db.close()
        return tables

    async def close(self) -> None:
        """Drop the benchmark databases and stop an embedded server."""
        try:
            if self._databases and self.citus:
                for name in self._databases:
                    await citus.drop_database(self.owner_url, name)
            elif self._databases:
                conn = await asyncpg.connect(self.owner_url)
                try:
                    for name in self._databases:
                        ddl = await conn.fetchrow(sql("bench_database_ddl"), name)
                        await conn.execute(ddl["drop_database"])
                finally:
                    await conn.close()
        finally:
            if self._server is not None:
                stop_embedded(self._server)
            if self._tempdir is not None:
                shutil.rmtree(self._tempdir, ignore_errors=True)


def _parent_of(pid: int) -> int | None:
    """The postmaster is the parent of the backend serving our connection (when it runs here)."""
    import psutil  # type: ignore[import-untyped]

    try:
        parent = psutil.Process(pid).parent()
    except psutil.Error:
        return None
    if parent is None or "postgres" not in parent.name():
        return None
    return int(parent.pid)
