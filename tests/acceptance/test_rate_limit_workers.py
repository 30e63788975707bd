"""`serve --workers 2`: the per tenant+principal limit holds over both workers (one shared bucket file).

Each request opens its own connection, so the kernel hands them to either worker; with a bucket per
worker the tenant would get up to twice its burst. The override refills one token per 1,000 s, so
the burst is all there is to spend and the counts are exact.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from support.auth import auth
from support.metrics import metric, scraped
from support.serve_process import kill_quietly, spawned_workers, start_serve
from support.waiting import until

pytestmark = pytest.mark.slow

BURST = 6
CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "lease_seconds": 60}


async def test_the_limit_is_shared_by_all_workers(tmp_path: Path) -> None:
    overrides = json.dumps({"t-lim": {"per_second": 0.001, "burst": BURST}})
    served = await start_serve(
        tmp_path, "--workers", "2", pool_size="3", background_sweep="false", rate_limit_overrides=overrides
    )
    try:
        assert len(spawned_workers(served.proc.pid)) == 2
        fresh = httpx.Limits(max_connections=50, max_keepalive_connections=0)  # a new connection each time
        async with httpx.AsyncClient(base_url=served.base_url, timeout=60, limits=fresh) as http:
            await until(
                lambda: scraped(http, "effect_ledger_db_pool_max_connections", pool="runtime"),
                "the second worker's pool published",
                holds=lambda capacity: capacity == 6,
                every=0.2,
            )

            answers = await asyncio.gather(
                *(
                    http.post(f"/v1/operations/w-{n}/claim", json=CLAIM, headers=auth("t-lim", "exec-1"))
                    for n in range(BURST * 4)
                )
            )
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [201] * BURST + [429] * (BURST * 3)
            assert all(a.headers["retry-after"].isdigit() for a in answers if a.status_code == 429)
            # the same tenant's other principal has its own bucket, on whichever worker
            other = await asyncio.gather(
                *(
                    http.post(f"/v1/operations/v-{n}/claim", json=CLAIM, headers=auth("t-lim", "exec-2"))
                    for n in range(BURST)
                )
            )
            assert [a.status_code for a in other] == [201] * BURST
            text = (await http.get("/metrics")).text
            assert (
                metric(text, "effect_ledger_rate_limited_total", route="/v1/operations/{operation_id}/claim")
                == BURST * 3
            )
    finally:
        await kill_quietly(served)
