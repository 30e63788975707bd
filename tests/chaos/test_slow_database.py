"""Scenario 8: a slow database. Another session holds row or table locks while the pool is exhausted:
every request is answered within a bound (503 with Retry-After when it cannot be served), none hangs."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import httpx
import pytest

from support.harness import bearer, chaos_settings, check_ledger, read_state, scale, scenario, timeout
from support.recording import History, check_answers
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(120, 900)]

OPERATIONS = 12
ROUNDS = scale(3, 20)  # bursts per lock
BURST = 40  # concurrent requests per burst, against a pool of 3
HEADERS = bearer("t1", "exec-1", "ledger:execute ledger:reconcile")
HOLDS = {
    # what the other session holds, and the settings that must bound the wait for it
    "row_locks": (
        "SELECT 1 FROM ledger.operations WHERE tenant_id = 't1' FOR UPDATE",
        {"lock_timeout_ms": 300, "statement_timeout_ms": 5000},
    ),
    "table_lock": (
        "LOCK TABLE ledger.operations IN ACCESS EXCLUSIVE MODE",
        {"lock_timeout_ms": 5000, "statement_timeout_ms": 400},
    ),
}
# Every answer within this: the pool's acquire timeout (300 ms) + the lock or statement timeout (300 /
# 400 ms) + a loaded 2-core machine's slack (3.19 s was seen beside the rest of the suite in CI; the
# batching regression this caught answered in up to 7.9 and 11.7 s, docs/reliability.md). A hang is
# told apart from a slow answer by construction, not by this bound: the other session keeps its locks
# until every answer of the burst is in, so a request waiting on them without a timeout never returns
# and the client's own timeout (CLIENT_TIMEOUT_SECONDS) records it as inf.
BOUND_SECONDS = 4.5
CLIENT_TIMEOUT_SECONDS = 15


async def _burst(http: httpx.AsyncClient, tokens: dict[str, str], rng: random.Random) -> list[float]:
    """Heartbeats on locked rows, reads, and claims of new IDs, all at once."""

    async def one(n: int) -> float:
        op = rng.choice(list(tokens))
        roll = rng.random()
        started = asyncio.get_running_loop().time()
        try:
            if roll < 0.5:
                beat = {"token": tokens[op], "lease_seconds": 600}
                await http.post(f"/v1/operations/{op}/heartbeat", json=beat, headers=HEADERS)
            elif roll < 0.8:
                await http.get(f"/v1/operations/{op}", headers=HEADERS)
            else:
                body = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}
                await http.post(f"/v1/operations/new-{rng.random()}/claim", json=body, headers=HEADERS)
        except httpx.TimeoutException:
            return float("inf")  # hung: a violation
        return asyncio.get_running_loop().time() - started

    return list(await asyncio.gather(*(one(n) for n in range(BURST))))


async def _hold_and_burst(
    db_url: str, name: str, hold: str, settings: dict[str, Any], history: History, rng: random.Random
) -> tuple[list[float], dict[int, int]]:
    config = chaos_settings(db_url, pool_size=3, pool_acquire_timeout_ms=300, **settings)
    latencies: list[float] = []
    async with (
        Service(config) as service,
        httpx.AsyncClient(
            base_url=service.base_url, transport=history.transport(), timeout=CLIENT_TIMEOUT_SECONDS
        ) as http,
    ):
        tokens = {}
        for n in range(OPERATIONS):
            body = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}
            r = await http.post(f"/v1/operations/{name}-{n}/claim", json=body, headers=HEADERS)
            assert r.status_code == 201, r.text
            tokens[f"{name}-{n}"] = r.json()["claim"]["token"]
        mark = len(history.calls)
        owner = await asyncpg.connect(db_url)
        try:
            for _ in range(ROUNDS):
                async with owner.transaction():
                    await owner.execute(hold)
                    latencies += await _burst(http, tokens, rng)
            # locks gone: the same service serves every row again
            for op, token in tokens.items():
                beat = {"token": token, "lease_seconds": 600}
                r = await http.post(f"/v1/operations/{op}/heartbeat", json=beat, headers=HEADERS)
                assert r.status_code == 200, r.text
        finally:
            await owner.close()
        statuses: dict[int, int] = {}
        for call in history.calls[mark:]:
            if call.status is not None:
                statuses[call.status] = statuses.get(call.status, 0) + 1
    return latencies, statuses


async def test_slow_database_answers_within_a_bound(request: pytest.FixtureRequest, db_url: str) -> None:
    history = History()
    rng = random.Random(23)
    with scenario(request, "slow_database") as figures:
        per_hold = {}
        for name, (hold, settings) in HOLDS.items():
            latencies, statuses = await _hold_and_burst(db_url, name, hold, settings, history, rng)
            per_hold[name] = (latencies, statuses)
            slow = [t for t in latencies if t > BOUND_SECONDS]
            if slow:
                figures.violations.append(
                    f"{name}: {len(slow)} answers slower than {BOUND_SECONDS}s "
                    f"(max {max(slow):.2f}s; inf = hung)"
                )
            if not statuses.get(503):
                figures.violations.append(f"{name}: no 503 while the database was held")
        state = await read_state(db_url)
        figures.operations = len(history.calls)
        figures.faults = len(HOLDS) * ROUNDS
        figures.extra = {
            f"{name}_{key}": value
            for name, (latencies, statuses) in per_hold.items()
            for key, value in (
                ("max_s", round(max(latencies), 2)),
                ("503", statuses.get(503, 0)),
                ("2xx", sum(n for s, n in statuses.items() if s < 300)),
            )
        }
        figures.check(check_answers(history))
        figures.check(check_ledger(state))
    figures.assert_clean()
