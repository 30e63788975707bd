"""A noisy neighbour: one tenant floods claims far above its limit while another runs its normal
claim -> submit -> complete cycles. Exact outcomes only (the latency comparison is a bench row): the
quiet tenant loses no request and sees no 5xx; the flooding one gets 201s and 429s, nothing else."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from dataclasses import replace

import httpx
import pytest

from effect_ledger.settings import Settings
from support.auth import auth
from support.metrics import samples
from support.server import Service

pytestmark = pytest.mark.slow

QUIET_EXECUTORS, QUIET_CYCLES = 4, 8
FLOOD_TASKS, FLOOD_MINIMUM = 32, 800
FLOOD_LIMIT = {"per_second": 20, "burst": 40}
CLAIM = {"tool": "payments.charge", "tool_version": "1", "intent": {"amount": 1}, "lease_seconds": 60}


async def quiet_cycles(http: httpx.AsyncClient, executor: int) -> list[int]:
    headers = auth("t-quiet", f"exec-{executor}", "ledger:execute")
    statuses = []
    for n in range(QUIET_CYCLES):
        op = f"q-{executor}-{n}"
        claimed = await http.post(f"/v1/operations/{op}/claim", json=CLAIM, headers=headers)
        statuses.append(claimed.status_code)
        if claimed.status_code != 201:
            continue
        token = claimed.json()["claim"]["token"]
        submitted = await http.post(f"/v1/operations/{op}/submit", json={"token": token}, headers=headers)
        statuses.append(submitted.status_code)
        done = {"token": token, "outcome": "committed", "receipt": {"external_ref": f"r-{op}"}}
        statuses.append(
            (await http.post(f"/v1/operations/{op}/complete", json=done, headers=headers)).status_code
        )
    return statuses


async def flood(http: httpx.AsyncClient, quiet_done: asyncio.Event, ids: itertools.count[int]) -> list[int]:
    """Claims of new IDs, back to back, until the quiet tenant is done and the minimum was sent."""
    headers = auth("t-flood", "exec-loop", "ledger:execute")
    statuses = []
    while True:
        n = next(ids)
        if n >= FLOOD_MINIMUM and quiet_done.is_set():
            return statuses
        r = await http.post(f"/v1/operations/f-{n}/claim", json=CLAIM, headers=headers)
        statuses.append(r.status_code)


async def test_a_flooding_tenant_gets_429s_and_the_quiet_one_loses_nothing(settings: Settings) -> None:
    # The flood's 429s are paced (http.pacing; tests/integration/test_rate_limit_pacing.py), here at
    # 0.1 s so that its FLOOD_MINIMUM requests take about two seconds.
    config = replace(
        settings,
        pool_size=10,
        rate_limit_overrides=json.dumps({"t-flood": FLOOD_LIMIT}),
        rate_limit_pace_ms=100,
    )
    limits = httpx.Limits(max_connections=FLOOD_TASKS + QUIET_EXECUTORS + 4)
    async with (
        Service(config) as service,
        httpx.AsyncClient(base_url=service.base_url, timeout=120, limits=limits) as http,
    ):
        quiet_done = asyncio.Event()
        ids = itertools.count()
        flooding = [asyncio.create_task(flood(http, quiet_done, ids)) for _ in range(FLOOD_TASKS)]
        quiet = await asyncio.gather(*(quiet_cycles(http, e) for e in range(QUIET_EXECUTORS)))
        quiet_done.set()
        flooded = Counter(s for statuses in await asyncio.gather(*flooding) for s in statuses)
        found = samples((await http.get("/metrics")).text)

    quiet_statuses = Counter(s for statuses in quiet for s in statuses)
    assert quiet_statuses == {201: QUIET_EXECUTORS * QUIET_CYCLES, 200: 2 * QUIET_EXECUTORS * QUIET_CYCLES}
    assert set(flooded) == {201, 429}, flooded
    assert flooded[201] >= FLOOD_LIMIT["burst"] and flooded[429] > 0
    claim_route = frozenset({("route", "/v1/operations/{operation_id}/claim")})
    assert found[("effect_ledger_rate_limited_total", claim_route)] == flooded[429]
    assert 0 < found[("effect_ledger_rate_limit_paced_total", frozenset())] < flooded[429]
    shed = sum(v for (name, _), v in found.items() if name == "effect_ledger_db_pool_shed_total")
    assert shed == 0
