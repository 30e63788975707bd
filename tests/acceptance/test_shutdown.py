"""SIGTERM during a request: the request completes, new connections are refused, serve exits 0 and
the embedded PostgreSQL stops. And `serve --workers 2` on the embedded database."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import asyncpg
import httpx
import pytest

from support.auth import auth
from support.metrics import metric, scraped
from support.serve_process import Served, alive, kill_quietly, postmaster, spawned_workers, start_serve
from support.waiting import until

pytestmark = pytest.mark.slow

CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "lease_seconds": 60}


async def wait_for_lock_waiter(owner: asyncpg.Connection, within: float = 20) -> None:
    """Until one of the service's connections waits for a row lock."""
    await until(
        lambda: owner.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'effect-ledger' AND wait_event_type = 'Lock'"
        ),
        "a request of the service waiting for the row lock",
        within=within,
    )


async def test_sigterm_lets_the_in_flight_request_finish(tmp_path: Path) -> None:
    # lock_timeout above the time the row stays locked, so the request waits rather than answers 503
    served = await start_serve(tmp_path, lock_timeout_ms="15000", background_sweep="false")
    try:
        await sigterm_during_a_request(served)
    finally:
        await kill_quietly(served)


async def sigterm_during_a_request(served: Served) -> None:
    pg = postmaster(served.data_dir)
    assert pg is not None and alive(pg[0])
    async with httpx.AsyncClient(base_url=served.base_url, timeout=60, headers=auth()) as http:
        claimed = await http.post("/v1/operations/op-term/claim", json=CLAIM)
        assert claimed.status_code == 201
        token = claimed.json()["claim"]["token"]

        owner = await served.owner()
        try:
            lock = owner.transaction()
            await lock.start()
            await owner.execute(
                "SELECT 1 FROM ledger.operations"
                " WHERE tenant_id = 't1' AND operation_id = 'op-term' FOR UPDATE"
            )
            submit = asyncio.create_task(http.post("/v1/operations/op-term/submit", json={"token": token}))
            await wait_for_lock_waiter(owner)

            served.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.5)
            assert served.proc.returncode is None, "serve must wait for the in-flight request"
            assert not submit.done()
            with pytest.raises(httpx.ConnectError):  # draining: no new connections
                async with httpx.AsyncClient(base_url=served.base_url, timeout=2) as fresh:
                    await fresh.get("/livez")

            await lock.rollback()
            answer = await submit
        finally:
            await owner.close()

    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "submitted"
    assert await served.wait() == 0, served.log()[-3000:]
    assert postmaster(served.data_dir) is None, "the embedded PostgreSQL must be stopped"
    assert not alive(pg[0])


async def test_two_workers_share_the_embedded_database_and_their_metrics(tmp_path: Path) -> None:
    served = await start_serve(tmp_path, "--workers", "2", pool_size="3", background_sweep="false")
    try:
        await two_workers(served)
    finally:
        await kill_quietly(served)


async def two_workers(served: Served) -> None:
    workers = spawned_workers(served.proc.pid)
    assert len(workers) == 2
    pg = postmaster(served.data_dir)
    assert pg is not None
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=60, limits=limits, headers=auth()) as http:
        # both workers are up once the summed pool capacity counts two pools of 3
        await until(
            lambda: scraped(http, "effect_ledger_db_pool_max_connections", pool="runtime"),
            "the second worker's pool published",
            holds=lambda capacity: capacity == 6,
            every=0.2,
        )

        claims = [f"/v1/operations/w-{n}/claim" for n in range(40)]
        answers = await asyncio.gather(*(http.post(path, json=CLAIM) for path in claims))
        assert [a.status_code for a in answers] == [201] * 40
        again = await asyncio.gather(*(http.post(path, json=CLAIM) for path in claims))
        assert {a.json()["code"] for a in again} == {"operation_in_progress"}

        # whichever worker answers the scrape, the counts are the sum over both
        for _ in range(5):
            text = (await http.get("/metrics")).text
            assert metric(text, "effect_ledger_claims_total", result="granted") == 40
            assert metric(text, "effect_ledger_claims_total", result="in_progress") == 40

    owner = await served.owner()
    try:
        connections = await owner.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'effect-ledger'"
        )
    finally:
        await owner.close()
    assert connections >= 4  # each worker has its own runtime and reader pools
    assert alive(pg[0]) and all(alive(pid) for pid in workers)

    served.proc.send_signal(signal.SIGTERM)
    assert await served.wait() == 0, served.log()[-3000:]
    assert not any(alive(pid) for pid in workers)
    assert postmaster(served.data_dir) is None and not alive(pg[0])
