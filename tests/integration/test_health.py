"""/livez never needs the database; /readyz follows the database and the migration head."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg
import httpx
import pytest

from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE
from effect_ledger.settings import Settings
from support.auth import token
from support.dbproxy import DatabaseProxy
from support.server import Service

# What /readyz says of the tests' server (a unix socket, never promoted).
SERVING = {"database": "ok", "migrations": "at_head", "server": "local", "timeline": 1, "primary_switches": 0}


@pytest.fixture
async def outage(db_url: str) -> AsyncIterator[DatabaseProxy]:
    proxy = DatabaseProxy(db_url)
    await proxy.up()
    try:
        yield proxy
    finally:
        with contextlib.suppress(AssertionError):
            await proxy.down()


async def test_livez_answers_through_a_database_outage_and_readyz_follows_it(
    settings: Settings, outage: DatabaseProxy
) -> None:
    proxied = replace(
        settings,
        runtime_database_url=outage.role_url(RUNTIME_ROLE),
        reader_database_url=outage.role_url(READER_ROLE),
        pool_acquire_timeout_ms=500,
    )
    async with Service(proxied) as service, service.client() as http:
        assert (await http.get("/livez")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ok", "checks": SERVING}  # the proxy reaches a unix socket

        await outage.down()
        for _ in range(3):  # the cut connection, then refused reconnects
            down = await http.get("/readyz")
            assert down.status_code == 503
            assert down.json()["status"] == "unavailable"
            assert down.json()["checks"]["database"] == "unreachable"
            live = await http.get("/livez")
            assert live.status_code == 200 and live.json() == {"status": "ok"}

        await outage.up()
        assert (await http.get("/readyz")).status_code == 200


async def test_readyz_is_503_until_migrations_reach_head(client: httpx.AsyncClient, db_url: str) -> None:
    owner = await asyncpg.connect(db_url)
    try:
        head = await owner.fetchval("SELECT version_num FROM alembic_version")
        await owner.execute("UPDATE alembic_version SET version_num = '0001'")
        behind = await client.get("/readyz")
        assert behind.status_code == 503
        assert behind.json() == {
            "status": "unavailable",
            "checks": {**SERVING, "migrations": "behind"},
        }
        await owner.execute("UPDATE alembic_version SET version_num = $1", head)
        assert (await client.get("/readyz")).status_code == 200
    finally:
        await owner.close()


async def test_health_and_metrics_need_no_token(client: httpx.AsyncClient) -> None:
    for path in ("/livez", "/readyz", "/metrics"):
        r = await client.get(path, headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 200, path


async def test_the_metrics_content_type_names_each_parameter_once(client: httpx.AsyncClient) -> None:
    """Prometheus reads the header with Go's mime.ParseMediaType, which refuses a parameter named twice
    (until round 36: `...; charset=utf-8; charset=utf-8`)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    r = await client.get("/metrics")
    names = [p.split("=", 1)[0].strip() for p in r.headers["content-type"].split(";")[1:]]
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST and len(names) == len(set(names)), r.headers


async def test_a_server_turned_read_only_is_answered_503_and_left_until_writable(
    service: Service, pg_admin_url: str
) -> None:
    """A primary that turns read-only (demoted, fenced): writes get 503 with Retry-After and an incident,
    never a 500 nor a stale answer; the pools drop its connections and look for a writable server;
    once it is writable again, the same process serves without a restart."""
    owner = await asyncpg.connect(pg_admin_url)
    tok = token("t1", "exec-1", "ledger:execute")
    body = {"tool": "t", "tool_version": "1", "intent": {}}
    try:
        async with service.client(headers={"Authorization": f"Bearer {tok}"}) as http:
            assert (await http.post("/v1/operations/ro-0/claim", json=body)).status_code == 201
            await owner.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            await owner.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(0.3)  # backends read the reloaded file before their next command
            refused = await http.post("/v1/operations/ro-1/claim", json=body)
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "unavailable" and refused.json()["incident"].startswith("inc_")
            assert refused.headers["retry-after"] == "1"
            # its connections expired: new ones find no writable host (asyncpg's read-write check)
            again = await http.post("/v1/operations/ro-1/claim", json=body)
            assert again.status_code == 503 and again.json()["code"] == "unavailable"
            ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"]["database"] == "unreachable"
            assert ready.json()["checks"]["lost_at"]
            assert ready.json()["checks"]["error"] == "TargetServerAttributeNotMatched"
            await owner.execute("ALTER SYSTEM RESET default_transaction_read_only")
            await owner.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(0.3)
            assert (await http.post("/v1/operations/ro-1/claim", json=body)).status_code == 201
            back = await http.get("/readyz")
            assert back.status_code == 200 and back.json()["checks"] == SERVING
    finally:
        await owner.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await owner.execute("SELECT pg_reload_conf()")
        await owner.close()
