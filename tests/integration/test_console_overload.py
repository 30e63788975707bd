"""The console under overload (issue 21 item 3): its pages read through the audit pool, so an executor
flood that fills the runtime pool and sheds executors with 503 leaves operators served; and every
console request takes a token from the same rate-limit bucket as the API.

The flood is made the way tests/integration/test_load_shedding.py makes it (support/flood.py): another session holds the
row locks of every operation of the tenant, so each executor heartbeat holds its pooled connection,
the queue fills, and further executor calls are shed at once.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import asyncpg
import httpx

from effect_ledger.settings import Settings
from support.auth import auth, token
from support.console import signed_in
from support.flood import LOCK_ALL, OPERATIONS, POOL, QUEUE, claim_all, heartbeat, slow, until_waiting
from support.server import Service
from support.waiting import until

OPERATOR = token("t1", "oper-1", "ledger:reconcile ledger:audit")
PAGES = ("/console/", "/console/operations", "/console/operations/op-0", "/console/unknown")


async def test_an_executor_flood_does_not_shed_the_console(settings: Settings, db_url: str) -> None:
    config = slow(settings, pool_max_waiting=QUEUE, pool_shed_wait_ms=600_000)
    async with Service(config) as service, httpx.AsyncClient(base_url=service.base_url, timeout=120) as http:
        tokens = await claim_all(http)
        operator = httpx.AsyncClient(base_url=service.base_url, timeout=120)
        await signed_in(operator, OPERATOR)
        owner = await asyncpg.connect(db_url)
        try:
            async with owner.transaction():
                await owner.execute(LOCK_ALL)
                tasks = [heartbeat(http, op, t) for op, t in tokens.items()]
                await until_waiting(http, QUEUE)  # POOL heartbeats hold connections, QUEUE wait
                # the rest are shed at once, but their 503s may still be on the way when the queue is
                # full (two of them were, in a loaded CI run): wait for the answers, not a moment
                await until(
                    lambda: sum(t.done() for t in tasks),
                    f"{OPERATIONS - POOL - QUEUE} heartbeats shed",
                    holds=lambda done: done >= OPERATIONS - POOL - QUEUE,
                    within=60,
                )
                shed = [t for t in tasks if t.done()]
                assert len(shed) == OPERATIONS - POOL - QUEUE
                assert {t.result().status_code for t in shed} == {503}
                # the same tenant's next executor call is shed at once...
                again = await http.post(
                    "/v1/operations/op-0/heartbeat",
                    json={"token": tokens["op-0"]},
                    headers=auth("t1", "exec-1", "ledger:execute"),
                )
                assert again.status_code == 503 and again.json()["code"] == "unavailable"
                # ...while its operators' pages are served from the audit pool
                answers = [await operator.get(path) for path in PAGES]
                assert [a.status_code for a in answers] == [200] * len(PAGES), [a.text[:300] for a in answers]
                assert "op-0" in answers[2].text
                assert not any(t.done() for t in tasks if t not in shed)  # the flood still holds the pool
        finally:
            await owner.close()
            await operator.aclose()
        statuses = [r.status_code for r in await asyncio.gather(*tasks)]
        assert statuses.count(200) == POOL + QUEUE and statuses.count(503) == OPERATIONS - POOL - QUEUE


async def test_console_requests_take_from_the_api_rate_limit(settings: Settings) -> None:
    # t1 may make 4 requests and then one every 100 s: the bucket is the same for the console and the API
    limits = json.dumps({"t1": {"per_second": 0.01, "burst": 4}})
    config = replace(settings, rate_limit_per_second=1000, rate_limit_burst=1000, rate_limit_overrides=limits)
    async with (
        Service(config) as service,
        httpx.AsyncClient(base_url=service.base_url, timeout=30) as operator,
    ):
        await signed_in(operator, OPERATOR)  # 1: the sign-in (its form is not a signed-in request)
        first = [
            await operator.get(path) for path in ("/console/", "/console/operations", "/console/unknown")
        ]
        assert [a.status_code for a in first] == [200, 200, 200]  # 2, 3, 4
        refused = await operator.get("/console/operations")
        assert refused.status_code == 429 and "Too many requests" in refused.text
        assert refused.headers["content-type"].startswith("text/html")  # a page, never problem JSON
        # the API call of the same tenant and principal finds the same empty bucket
        api = await operator.get("/v1/operations", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert api.status_code == 429 and api.json()["code"] == "rate_limited"
        # another principal of the tenant has its own bucket, in the console as in the API
        other = httpx.AsyncClient(base_url=service.base_url, timeout=30)
        try:
            await signed_in(other, token("t1", "oper-2", "ledger:reconcile ledger:audit"))
            assert (await other.get("/console/operations")).status_code == 200
        finally:
            await other.aclose()
