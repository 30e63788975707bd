"""Scenario 7: tenant context through a pool of ONE connection. Tenants interleave; requests fail
inside their transaction (conflicts, stale tokens), are cancelled by the client mid-flight, and have
their query cancelled or their connection terminated by the database. No answer ever shows a row of
another tenant."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import httpx
import pytest

from support.auth import auth
from support.harness import chaos_settings, check_ledger, read_state, scale, scenario, timeout
from support.recording import History, check_answers
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(120, 900)]

TENANTS = ("t1", "t2", "t3", "t4")
SHARED = [f"shared-{n}" for n in range(6)]  # the same IDs in every tenant, bound differently
OWN = 6  # IDs only one tenant has: `<tenant>-only-<n>`
REQUESTS = scale(3000, 12000)
CONCURRENCY = 16
ALL = "ledger:execute ledger:reconcile ledger:audit"


def _principal(tenant: str) -> str:
    return f"{tenant}-exec"


def _claim_body(tenant: str, operation_id: str, intent: Any = None) -> dict[str, Any]:
    return {
        "tool": "t",
        "tool_version": "1",
        "intent": intent or {"tenant": tenant, "id": operation_id},
        "lease_seconds": 3600,
    }


async def _seed(http: httpx.AsyncClient) -> dict[tuple[str, str], str]:
    """Every tenant claims the shared IDs and its own; returns the claim tokens."""
    tokens = {}
    for tenant in TENANTS:
        headers = auth(tenant, _principal(tenant), ALL)
        for operation_id in [*SHARED, *(f"{tenant}-only-{n}" for n in range(OWN))]:
            body = _claim_body(tenant, operation_id)
            r = await http.post(f"/v1/operations/{operation_id}/claim", json=body, headers=headers)
            assert r.status_code == 201, r.text
            tokens[(tenant, operation_id)] = r.json()["claim"]["token"]
    return tokens


Request = tuple[str, str, Any, bool]  # method, path, body, whether it names another tenant's ID


def _request(rng: random.Random, tenant: str, tokens: dict[tuple[str, str], str]) -> Request:
    """One request of the mix."""
    other = rng.choice([t for t in TENANTS if t != tenant])
    op = rng.choice(SHARED)
    roll = rng.random()
    if roll < 0.25:
        return "GET", f"/v1/operations/{op}", None, False
    if roll < 0.35:
        return "GET", f"/v1/operations/{other}-only-{rng.randrange(OWN)}", None, True
    if roll < 0.45:
        return "GET", f"/v1/operations/{tenant}-only-{rng.randrange(OWN)}", None, False
    if roll < 0.6:
        return "GET", "/v1/operations?limit=50", None, False
    if roll < 0.7:
        return "GET", f"/v1/operations/{op}/events", None, False
    if roll < 0.8:  # refused inside the transaction: another intent for a bound ID
        return "POST", f"/v1/operations/{op}/claim", _claim_body(tenant, op, {"other": rng.random()}), False
    beat = {"token": tokens[(other, op)], "lease_seconds": 3600}
    if roll < 0.9:  # refused inside the transaction: another tenant's token is stale here
        return "POST", f"/v1/operations/{op}/heartbeat", beat, False
    return "POST", f"/v1/operations/{op}/heartbeat", {**beat, "token": tokens[(tenant, op)]}, False


def foreign_rows(tenant: str, body: Any) -> tuple[int, list[str]]:
    """Rows in an answer, and those that are not the tenant's (by principal, actor and ID)."""
    views: list[dict[str, Any]] = []
    if isinstance(body, dict) and "items" in body:
        views = list(body["items"])
    elif isinstance(body, dict) and "operation_id" in body:
        views = [body]
    mine = _principal(tenant)
    bad = []
    for view in views:
        if "seq" in view:  # an event
            if view["actor"] not in (mine, "effect-ledger"):
                bad.append(f"event by {view['actor']}")
            continue
        if view["principal"] != mine or not (
            view["operation_id"] in SHARED or view["operation_id"].startswith(f"{tenant}-only-")
        ):
            bad.append(f"{view['operation_id']} of {view['principal']}")
    return len(views), bad


async def _database_faults(db_url: str, rng: random.Random, done: asyncio.Event) -> dict[str, int]:
    """Cancel the service's running query every 20-100 ms; now and then terminate its connection."""
    counts = {"queries_cancelled": 0, "connections_terminated": 0}
    owner = await asyncpg.connect(db_url)
    try:
        while not done.is_set():
            await asyncio.sleep(rng.uniform(0.02, 0.1))
            terminate = rng.random() < 0.1
            pids = await owner.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'effect-ledger' "
                "AND datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()"
            )
            for row in pids:
                if await owner.fetchval(
                    "SELECT pg_terminate_backend($1)" if terminate else "SELECT pg_cancel_backend($1)",
                    row["pid"],
                ):
                    counts["connections_terminated" if terminate else "queries_cancelled"] += 1
    finally:
        await owner.close()
    return counts


async def test_tenant_context_never_leaks_through_one_pooled_connection(
    request: pytest.FixtureRequest, db_url: str
) -> None:
    history = History()
    settings = chaos_settings(db_url, pool_size=1, pool_acquire_timeout_ms=5000)
    rng = random.Random(17)
    rows = 0
    cancelled_by_client = 0
    with scenario(request, "tenant_isolation") as figures:
        async with (
            Service(settings) as service,
            httpx.AsyncClient(base_url=service.base_url, transport=history.transport(), timeout=30) as http,
        ):
            tokens = await _seed(http)
            headers = {t: auth(t, _principal(t), ALL) for t in TENANTS}
            done = asyncio.Event()
            faults = asyncio.create_task(_database_faults(db_url, random.Random(5), done))
            remaining = iter(range(REQUESTS))

            async def worker() -> None:
                nonlocal rows, cancelled_by_client
                for _ in remaining:
                    tenant = rng.choice(TENANTS)
                    method, path, body, foreign = _request(rng, tenant, tokens)
                    # one request in eight gives up after a few ms: the client disconnects mid-transaction
                    patience = rng.uniform(0.001, 0.02) if rng.random() < 0.125 else 30
                    try:
                        r = await http.request(
                            method, path, json=body, headers=headers[tenant], timeout=patience
                        )
                    except httpx.TimeoutException:
                        cancelled_by_client += 1
                        continue
                    counted, bad = foreign_rows(tenant, r.json() if r.is_success else None)
                    rows += counted
                    figures.violations.extend(f"{tenant} {method} {path}: {b}" for b in bad)
                    if foreign and r.status_code not in (404, 503):
                        figures.violations.append(f"{tenant} {path}: {r.status_code}, not 404")

            try:
                await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            finally:
                done.set()
                injected = await faults
            state = await read_state(db_url)
        figures.operations = len(history.calls)
        figures.faults = cancelled_by_client + sum(injected.values())
        figures.extra = {
            "requests": REQUESTS,
            "rows_checked": rows,
            "client_cancellations": cancelled_by_client,
            **injected,
            "answers": dict(sorted(history.statuses().items())),
        }
        figures.check(check_answers(history))
        figures.check(check_ledger(state))
    figures.assert_clean()
    assert len(history.calls) >= REQUESTS and rows > REQUESTS
    assert injected["queries_cancelled"] > 0 and cancelled_by_client > 0
