"""One ledger service for every MCP gateway test (session-scoped): each test keeps to a tenant of its own."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from effect_ledger.settings import Settings
from support import citus_cluster
from support.auth import TEST_SECRET
from support.database import with_database
from support.server import Service


@pytest.fixture(scope="session")
async def mcp_ledger(pg_admin_url: str, template_url: str, on_citus: bool) -> AsyncIterator[Service]:
    """The ledger over loopback HTTP on a database of its own, cloned once from the migrated template."""
    if on_citus:
        await citus_cluster.wipe(template_url)
        url = template_url
    else:
        name = f"el_mcp_{os.getpid()}"
        admin = await asyncpg.connect(pg_admin_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{urlsplit(template_url).path.lstrip("/")}"')
        await admin.close()
        url = with_database(pg_admin_url, name)
    settings = Settings(database_url=url, jwt_secret=TEST_SECRET, background_sweep=False, pool_size=10)
    try:
        async with Service(settings) as service:
            assert service.base_url.startswith("http://127.0.0.1:")
            yield service
    finally:
        if not on_citus:
            admin = await asyncpg.connect(pg_admin_url)
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()


@pytest.fixture
async def ledger(mcp_ledger: Service) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the session's ledger, in process, for the tests' own checks."""
    async with mcp_ledger.client() as http:
        yield http
