"""Shared fixtures: one real PostgreSQL per run, a migrated template, a fresh clone per test."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psycopg
import pytest
import uvicorn
from psycopg import sql

import citus_cluster
from effect_ledger.db.embedded import start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.db.urls import RUNTIME_ROLE, derived_password
from effect_ledger.http.app import create_app
from effect_ledger.http.auth import ALL_SCOPES, mint_token
from effect_ledger.settings import Settings

TEST_SECRET = "test-secret-for-effect-ledger-tests-only-0123456789-abcdefghijklmnopqrstuvwxyz"
_counter = itertools.count()


def with_database(url: str, name: str) -> str:
    """The same server URL naming another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def runtime_connection(url: str, role: str = RUNTIME_ROLE) -> asyncpg.Connection:
    """A direct connection as a service role, with the password `migrate` gave it."""
    return await asyncpg.connect(url, user=role, password=derived_password(url, role))


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The tests' own throw-away server needs no crash safety; the product's defaults are never changed.
FAST_SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _trade_durability_for_speed(url: str) -> None:
    """Turn off the embedded test server's flushes to disk (reloadable settings, so no restart)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in FAST_SERVER_SETTINGS.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """The owner URL of the server under test: EFFECT_LEDGER_DATABASE_URL, or an embedded PostgreSQL."""
    configured = os.environ.get("EFFECT_LEDGER_DATABASE_URL")
    if configured:
        yield configured
        return
    data_dir = Path(tempfile.mkdtemp(prefix="effect-ledger-tests-"))
    server, url = start_embedded(data_dir)
    try:
        _trade_durability_for_speed(url)
        yield url
    finally:
        stop_embedded(server)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
async def on_citus(pg_admin_url: str) -> bool:
    """Whether the server under test is a Citus coordinator (the Citus lane of .ci/run)."""
    return await citus_cluster.is_citus(pg_admin_url)


@pytest.fixture(scope="session")
async def template_url(pg_admin_url: str, on_citus: bool) -> AsyncIterator[str]:
    """A database migrated once by Alembic, cloned by every test that needs one (on Citus: shared)."""
    name = f"el_template_{os.getpid()}"
    admin = await asyncpg.connect(pg_admin_url)
    if on_citus:
        url = await citus_cluster.create_database(pg_admin_url, name)
    else:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = with_database(pg_admin_url, name)
    await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
    try:
        yield url
    finally:
        if on_citus:
            await citus_cluster.drop_database(pg_admin_url, name)
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def db_url(pg_admin_url: str, template_url: str, on_citus: bool) -> AsyncIterator[str]:
    """A fresh database for one test, cloned from the migrated template (on Citus: the template, wiped)."""
    if on_citus:
        await citus_cluster.wipe(template_url)
        yield template_url
        return
    template = urlsplit(template_url).path.lstrip("/")
    name = f"el_test_{os.getpid()}_{next(_counter)}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        yield with_database(pg_admin_url, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Settings for a service on the test's database, with the test secret and no background sweep."""
    return Settings(database_url=db_url, jwt_secret=TEST_SECRET, background_sweep=False, pool_size=20)


def token(tenant: str = "t1", sub: str = "exec-1", scope: str = " ".join(ALL_SCOPES), ttl: int = 600) -> str:
    """A valid test token."""
    return mint_token(TEST_SECRET, tenant, sub, scope, Settings(), ttl)


def auth(tenant: str = "t1", sub: str = "exec-1", scope: str = " ".join(ALL_SCOPES)) -> dict[str, str]:
    """Authorization headers for a test caller."""
    return {"Authorization": f"Bearer {token(tenant, sub, scope)}"}


class LoopServer:
    """A uvicorn server running an ASGI app in this event loop, on a free loopback port."""

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "on") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan=lifespan,
            access_log=False,
            interface="asgi3",  # a bound method's signature would make uvicorn guess ASGI 2
        )
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


class Service(LoopServer):
    """The effect-ledger app served for real over loopback HTTP."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__(create_app(settings, jwt_secret=TEST_SECRET))

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An HTTP client for this service."""
        return httpx.AsyncClient(base_url=self.base_url, timeout=30, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    """The service over real HTTP on the test's own database."""
    async with Service(settings) as running:
        yield running


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the running service."""
    async with service.client() as http:
        yield http
