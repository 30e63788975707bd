"""An executor flood that fills the runtime pool: every operation of tenant t1 claimed, their rows locked
from another session, and one heartbeat per operation sent, so POOL heartbeats hold a connection, QUEUE
wait for one and the rest are shed at once (test_load_shedding.py and test_console_overload.py use it)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx

from effect_ledger.settings import Settings
from support.auth import auth
from support.metrics import by_label, samples
from support.waiting import until

OPERATIONS = 12
POOL, QUEUE = 2, 3
CLAIM = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}
EXECUTOR = auth("t1", "exec-1", "ledger:execute")
LOCK_ALL = "SELECT 1 FROM ledger.operations WHERE tenant_id = 't1' FOR UPDATE"


def slow(settings: Settings, **bounds: int) -> Settings:
    """A small pool, and timeouts long enough that nothing but shedding answers while rows are locked."""
    return replace(
        settings,
        pool_size=POOL,
        audit_pool_size=2,
        pool_acquire_timeout_ms=60_000,
        lock_timeout_ms=60_000,
        statement_timeout_ms=90_000,
        rate_limit_per_second=0,
        **bounds,
    )


async def claim_all(http: httpx.AsyncClient) -> dict[str, str]:
    """Claim op-0 … op-11 as t1's executor; their claim tokens, once every runtime connection is back
    in the pool. The batcher answers a call before it gives its connection back, so a heartbeat sent
    at once could find POOL - 1 free and one more of them shed than the flood counts on: most likely
    (not reproduced) the one extra 503 a loaded full run met in round 19."""
    tokens = {}
    for n in range(OPERATIONS):
        r = await http.post(f"/v1/operations/op-{n}/claim", json=CLAIM, headers=EXECUTOR)
        assert r.status_code == 201, r.text
        tokens[f"op-{n}"] = r.json()["claim"]["token"]

    async def in_use() -> float:
        found = samples((await http.get("/metrics")).text)
        return found[
            ("effect_ledger_db_pool_connections", frozenset({("pool", "runtime"), ("state", "in_use")}))
        ]

    await until(in_use, "the claims' connections back in the runtime pool", holds=lambda n: n == 0)
    return tokens


def heartbeat(http: httpx.AsyncClient, op: str, token: str) -> asyncio.Task[httpx.Response]:
    """One executor heartbeat, in flight."""
    body = {"token": token, "lease_seconds": 600}
    return asyncio.create_task(http.post(f"/v1/operations/{op}/heartbeat", json=body, headers=EXECUTOR))


async def until_waiting(http: httpx.AsyncClient, count: int) -> None:
    """Until `count` requests queue for a runtime connection (a wait for a state, not a timed check)."""

    async def waiting() -> float:
        return by_label(samples((await http.get("/metrics")).text), "effect_ledger_db_pool_waiting", "pool")[
            "runtime"
        ]

    await until(
        waiting,
        f"{count} requests queued for a runtime connection",
        holds=lambda queued: queued == count,
        within=60,
    )
