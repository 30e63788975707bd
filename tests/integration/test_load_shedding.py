"""Load shedding under a slow database: past the queue bound (or the wait bound) a request is answered
503 unavailable with Retry-After and an incident at once, and reconciler/audit reads keep their pool.

The database is made slow the way tests/chaos/test_slow_database.py does it: another session holds
the row locks of every operation, so each heartbeat holds its pooled connection until they go.
"""

from __future__ import annotations

import asyncio

import asyncpg
import httpx

from effect_ledger.settings import Settings
from support.auth import auth
from support.flood import (
    CLAIM,
    LOCK_ALL,
    OPERATIONS,
    POOL,
    QUEUE,
    claim_all,
    heartbeat,
    slow,
    until_waiting,
)
from support.metrics import by_label, samples
from support.server import Service
from support.waiting import until

RECONCILER = auth("t1", "recon-1", "ledger:reconcile ledger:audit")


async def gauge(http: httpx.AsyncClient, name: str, pool: str) -> float:
    return by_label(samples((await http.get("/metrics")).text), name, "pool")[pool]


async def test_past_the_queue_bound_requests_are_shed_and_reads_keep_their_pool(
    settings: Settings, db_url: str
) -> None:
    config = slow(settings, pool_max_waiting=QUEUE, pool_shed_wait_ms=600_000)
    async with Service(config) as service, httpx.AsyncClient(base_url=service.base_url, timeout=120) as http:
        tokens = await claim_all(http)
        owner = await asyncpg.connect(db_url)
        try:
            async with owner.transaction():
                await owner.execute(LOCK_ALL)
                tasks = [heartbeat(http, op, token) for op, token in tokens.items()]
                # POOL heartbeats hold a connection (waiting for the row lock), QUEUE wait for one,
                # and every other one is answered at once, while the rows are still locked.
                shed_count = OPERATIONS - POOL - QUEUE
                done: set[asyncio.Task[httpx.Response]] = set()
                while len(done) < shed_count:
                    finished, _ = await asyncio.wait(
                        [t for t in tasks if t not in done], return_when=asyncio.FIRST_COMPLETED
                    )
                    done |= finished
                shed = [t.result() for t in done]
                assert [r.status_code for r in shed] == [503] * shed_count
                for r in shed:
                    assert r.json()["code"] == "unavailable" and r.headers["retry-after"] == "1"
                    assert r.json()["incident"].startswith("inc_")
                assert await gauge(http, "effect_ledger_db_pool_waiting", "runtime") == QUEUE
                # the executors' pool is full and queued: reconciler and audit calls have their own
                listed = await http.get("/v1/operations?status=pending", headers=RECONCILER)
                assert listed.status_code == 200 and len(listed.json()["items"]) == OPERATIONS
                verified = await http.get("/v1/audit/verify?operation_id=op-0", headers=RECONCILER)
                assert verified.status_code == 200 and verified.json()["ok"] is True
                events = await http.get("/v1/operations/op-3/events", headers=RECONCILER)
                assert events.status_code == 200
                assert not any(t.done() for t in tasks if t not in done)
                # the queue is full of t1's requests, but a quiet tenant is within its share: it queues
                quiet = asyncio.create_task(
                    http.post(
                        "/v1/operations/op-q/claim",
                        json=CLAIM,
                        headers=auth("t2", "exec-9", "ledger:execute"),
                    )
                )
                await until_waiting(http, QUEUE + 1)
                again = await heartbeat(http, "op-0", tokens["op-0"])  # while t1 is still shed
                assert again.status_code == 503
            # the locks are gone: every admitted request is served
            rest = await asyncio.gather(*(t for t in tasks if t not in done))
            assert [r.status_code for r in rest] == [200] * (POOL + QUEUE)
            assert (await quiet).status_code == 201
            shed_count += 1
        finally:
            await owner.close()
        found = samples((await http.get("/metrics")).text)
        shed_total = {
            (dict(labels)["pool"], dict(labels)["reason"]): value
            for (name, labels), value in found.items()
            if name == "effect_ledger_db_pool_shed_total"
        }
        assert shed_total[("runtime", "queue")] == shed_count
        assert sum(shed_total.values()) == shed_count
        # the shed requests' incidents were spooled, then written once the database had room
        stored = await until(
            lambda: _shed_incidents(db_url),
            "every shed request's incident stored",
            holds=lambda stored: stored >= shed_count,
            within=60,
            every=0.2,
        )
        assert stored == shed_count


async def test_past_the_wait_bound_new_requests_are_shed(settings: Settings, db_url: str) -> None:
    config = slow(settings, pool_max_waiting=100, pool_shed_wait_ms=200)
    async with Service(config) as service, httpx.AsyncClient(base_url=service.base_url, timeout=120) as http:
        tokens = list((await claim_all(http)).items())
        owner = await asyncpg.connect(db_url)
        try:
            async with owner.transaction():
                await owner.execute(LOCK_ALL)
                held = [heartbeat(http, op, token) for op, token in tokens[: POOL + 1]]
                await until_waiting(http, 1)
                await asyncio.sleep(0.3)  # the queued one has now waited longer than the 200 ms bound
                late = await heartbeat(http, *tokens[POOL + 1])
                assert late.status_code == 503 and late.json()["code"] == "unavailable"
            assert [r.status_code for r in await asyncio.gather(*held)] == [200] * (POOL + 1)
        finally:
            await owner.close()
        found = samples((await http.get("/metrics")).text)
    assert (
        found[("effect_ledger_db_pool_shed_total", frozenset({("pool", "runtime"), ("reason", "wait")}))] == 1
    )
    assert (
        found[("effect_ledger_db_pool_shed_total", frozenset({("pool", "runtime"), ("reason", "queue")}))]
        == 0
    )


async def _shed_incidents(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM diagnostics.incidents WHERE phase = 'shed' AND http_status = 503"
            )
        )
    finally:
        await conn.close()
