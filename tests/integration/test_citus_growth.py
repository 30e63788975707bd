"""Growth across nodes: a third worker joins a running cluster and the shards rebalance onto it while
executors keep claiming, submitting and completing. Afterwards every acknowledged transition is there, no
operation ran twice, and every chain verifies.

Runs in the Citus lane (it needs the coordinator as EFFECT_LEDGER_DATABASE_URL, root, and
../shared/citus/cluster.sh to start the extra node). On its own database, so the extra node never
becomes part of the database the other tests share.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.db.migrate import migrate
from effect_ledger.settings import Settings
from support import citus_cluster
from support.auth import TEST_SECRET, auth
from support.ledger import AUDITOR, CLAIM
from support.server import Service, free_port

pytestmark = [pytest.mark.storage, pytest.mark.citus, pytest.mark.slow]

TENANTS = [f"grow-{n}" for n in range(8)]  # spread over the shards
RECEIPT = {"external_ref": "rcpt", "result": {"ok": True}}
REBALANCE_SECONDS = 90


@pytest.fixture
async def growing_cluster(pg_admin_url: str, on_citus: bool) -> AsyncIterator[tuple[str, tuple[str, int]]]:
    """A migrated database of its own on the cluster, and a started (not yet added) spare node."""
    if not on_citus:
        pytest.skip("needs a Citus coordinator as EFFECT_LEDGER_DATABASE_URL (the Citus lane of .ci/run)")
    if citus_cluster.scripts_dir() is None or os.geteuid() != 0:
        pytest.skip("starting another Citus node needs ../shared/citus/cluster.sh and root")
    name = f"el_growth_{os.getpid()}"
    url = await citus_cluster.create_database(pg_admin_url, name)
    await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
    port = int(os.environ.get("EFFECT_LEDGER_CITUS_SPARE_PORT") or free_port())
    data = Path(tempfile.mkdtemp(prefix="effect-ledger-spare-"))
    try:
        await asyncio.to_thread(citus_cluster.start_node, data / "node", port)
        await citus_cluster.create_on_node(url, "127.0.0.1", port, name)
        yield url, ("127.0.0.1", port)
    finally:
        await citus_cluster.drop_database(pg_admin_url, name)  # the nodes of the shared database
        await asyncio.to_thread(citus_cluster.stop_node, data / "node")
        shutil.rmtree(data, ignore_errors=True)


class Executors:
    """Executors running full cycles (claim, submit, complete) on fresh IDs; what was acknowledged."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.acked: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.stop = asyncio.Event()
        self.refused: dict[int, int] = defaultdict(int)
        self.progress = asyncio.Condition()

    def count(self) -> int:
        """Acknowledged steps so far."""
        return sum(len(steps) for steps in self.acked.values())

    async def until(self, count: int) -> None:
        """Wait until `count` steps have been acknowledged."""
        async with self.progress:
            await self.progress.wait_for(lambda: self.count() >= count)

    async def _step(self, tenant: str, op: str, name: str, body: dict[str, Any]) -> httpx.Response | None:
        r = await self.http.post(f"/v1/operations/{op}/{name}", json=body, headers=auth(tenant=tenant))
        if r.status_code in (200, 201):
            self.acked[(tenant, op)].append(name)
            async with self.progress:
                self.progress.notify_all()
            return r
        self.refused[r.status_code] += 1
        return None

    async def run(self, n: int) -> None:
        tenant = TENANTS[n % len(TENANTS)]
        i = 0
        while not self.stop.is_set():
            i += 1
            op = f"exec{n}-op{i}"
            claimed = await self._step(tenant, op, "claim", CLAIM)
            if claimed is None:
                continue
            token = claimed.json()["claim"]["token"]
            if await self._step(tenant, op, "submit", {"token": token, "effect_ref": f"ref-{op}"}) is None:
                continue
            await self._step(
                tenant, op, "complete", {"token": token, "outcome": "committed", "receipt": RECEIPT}
            )


async def _placements(url: str) -> dict[int, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT nodeport, count(*) AS shards FROM citus_shards"
            " WHERE table_name = 'ledger.operations'::regclass GROUP BY nodeport"
        )
    finally:
        await conn.close()
    return {r["nodeport"]: r["shards"] for r in rows}


async def test_a_third_worker_joins_and_shards_move_while_executors_claim(
    growing_cluster: tuple[str, tuple[str, int]],
) -> None:
    url, (host, port) = growing_cluster
    assert port not in await _placements(url)
    settings = Settings(database_url=url, jwt_secret=TEST_SECRET, background_sweep=False, pool_size=20)
    limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
    async with Service(settings) as service, service.client(limits=limits) as http:
        executors = Executors(http)
        tasks = [asyncio.create_task(executors.run(n)) for n in range(8)]
        try:
            await executors.until(40)  # executors under way before the node joins
            admin = await asyncpg.connect(url)
            try:
                await admin.fetchval("SELECT citus_add_node($1, $2)", host, port)
                # no wal_level = logical on these nodes: moves block writes to the moving shards meanwhile
                await admin.fetchval("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
                # bounded: a move that never finishes fails here, with the background tasks' state
                try:
                    await asyncio.wait_for(admin.fetchval("SELECT citus_rebalance_wait()"), REBALANCE_SECONDS)
                except TimeoutError:
                    tasks_state = await admin.fetch(
                        "SELECT task_id, status, retry_count, message FROM pg_dist_background_task"
                    )
                    pytest.fail(f"the rebalance did not finish in {REBALANCE_SECONDS} s: {tasks_state}")
                during = executors.count()
                jobs = await admin.fetch("SELECT state FROM pg_dist_background_job")
            finally:
                await admin.close()
            await executors.until(during + 40)  # and they keep going on the grown cluster
        finally:
            executors.stop.set()
            await asyncio.gather(*tasks)
        assert [j["state"] for j in jobs] == ["finished"]
        placements = await _placements(url)
        assert placements.get(port, 0) >= 1, placements
        assert len(placements) == 3

        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(
                "SELECT o.tenant_id, o.operation_id, o.status, o.attempt,"
                " array_agg(e.kind ORDER BY e.seq) AS kinds, array_agg(e.attempt ORDER BY e.seq) AS attempts"
                " FROM ledger.operations o JOIN ledger.events e USING (tenant_id, operation_id)"
                " GROUP BY 1, 2, 3, 4"
            )
        finally:
            await conn.close()
        stored = {(r["tenant_id"], r["operation_id"]): r for r in rows}
        expected_status = {"claim": "pending", "submit": "submitted", "complete": "committed"}
        expected_kinds = {
            "claim": ["claimed"],
            "submit": ["claimed", "submitted"],
            "complete": ["claimed", "submitted", "completed"],
        }
        for key, steps in executors.acked.items():
            row = stored.get(key)
            assert row is not None, f"acknowledged claim of {key} is missing"
            # every acknowledged step is there, once; nothing ran a second attempt
            assert row["status"] == expected_status[steps[-1]], (key, steps, row)
            assert list(row["kinds"]) == expected_kinds[steps[-1]], (key, steps, row)
            assert row["attempt"] == 1 and set(row["attempts"]) == {1}, (key, row)
        # rows without an acknowledged claim: the answer was lost (a 503 during a move), still one attempt
        for key, row in stored.items():
            assert row["attempt"] == 1 and list(row["kinds"]).count("claimed") == 1, (key, row)
        assert sum(s[-1] == "complete" for s in executors.acked.values()) >= 20
        for tenant in TENANTS:
            r = await http.get("/v1/audit/verify", headers=auth(tenant=tenant, **AUDITOR))
            assert r.status_code == 200 and r.json()["ok"] is True, r.text
            assert r.json()["checked"] == sum(
                len(row["kinds"]) for k, row in stored.items() if k[0] == tenant
            )
