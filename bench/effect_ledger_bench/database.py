"""The PostgreSQL the bench runs on: an embedded one in a temp dir, or EFFECT_LEDGER_DATABASE_URL's server."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

from effect_ledger.db.embedded import start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.db.urls import RUNTIME_ROLE, derived_password
from effect_ledger.settings import Settings
from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.procs import postmaster_pid

LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


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
    postmaster: int | None = None  # pid, when the server runs on this machine
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
        return cluster

    async def create(self, name: str) -> str:
        """A fresh, migrated database; returns its owner URL."""
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

    async def close(self) -> None:
        """Drop the benchmark databases and stop an embedded server."""
        try:
            if self._databases:
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
