"""The cost of Citus's extra hop, measured (not a test): `python tests/citus_cost.py COORDINATOR_URL`.

Creates two databases on the coordinator's PostgreSQL and migrates both: `el_cost_citus`, distributed
over the cluster's workers, and `el_cost_plain`, the same server without the extension (same binaries,
same machine). Then, alternating rounds: (1) one client's median latency of the write path's calls in
autocommit (claim, submit, complete), (2) effect cycles (claim -> submit -> complete) through the
service over HTTP with 16 concurrent executors for 15 s. Figures in docs/citus.md.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from urllib.parse import urlsplit

import asyncpg
import httpx

from effect_ledger.db.catalogue import sql
from effect_ledger.db.migrate import migrate
from effect_ledger.settings import Settings
from support import citus_cluster
from support.auth import TEST_SECRET, auth
from support.database import runtime_connection
from support.server import Service

DIGEST = "sha256:" + "a" * 64
TOKEN_HASH = b"\x01" * 32
CLAIM = {"tool": "t", "tool_version": "1", "intent": {"a": 1}, "lease_seconds": 30}


async def databases(admin_url: str) -> dict[str, str]:
    citus = await citus_cluster.create_database(admin_url, "el_cost_citus")
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute("DROP DATABASE IF EXISTS el_cost_plain WITH (FORCE)")
        await admin.execute("CREATE DATABASE el_cost_plain")
    finally:
        await admin.close()
    parts = urlsplit(admin_url)
    plain = citus_cluster.node_url(admin_url, parts.hostname or "", parts.port or 5432, "el_cost_plain")
    for url in (citus, plain):
        await asyncio.to_thread(lambda u=url: asyncio.run(migrate(Settings(database_url=u))))
    return {"plain": plain, "citus": citus}


async def call_latency(url: str, label: str, n: int = 200) -> dict[str, float]:
    conn = await runtime_connection(url)
    spent: dict[str, list[float]] = {"claim": [], "submit": [], "complete": []}
    try:
        for i in range(n):
            tenant, op = f"tenant-{i % 8}", f"calls-{label}-{time.monotonic_ns()}"
            calls = (
                (
                    "claim",
                    "run_claim",
                    (tenant, op, "e", "t", "1", DIGEST, 30, None, TOKEN_HASH, None, False, None),
                ),
                ("submit", "run_submit", (tenant, op, TOKEN_HASH, "ref", None)),
                (
                    "complete",
                    "run_complete",
                    (tenant, op, "e", TOKEN_HASH, "committed", '{"external_ref":"r"}', None, None),
                ),
            )
            for name, query, args in calls:
                start = time.perf_counter()
                await conn.fetchrow(sql(query), *args)
                spent[name].append(time.perf_counter() - start)
    finally:
        await conn.close()
    return {name: statistics.median(values) * 1000 for name, values in spent.items()}


async def service_cycles(
    url: str, label: str, seconds: float = 15, executors: int = 16
) -> tuple[float, float]:
    settings = Settings(database_url=url, jwt_secret=TEST_SECRET, background_sweep=False, pool_size=20)
    spent: list[float] = []
    limits = httpx.Limits(max_connections=executors)
    async with Service(settings) as service, service.client(limits=limits) as http:
        stop = time.monotonic() + seconds

        async def executor(n: int) -> None:
            headers = auth(tenant=f"tenant-{n % 8}")
            while time.monotonic() < stop:
                op = f"cycle-{label}-{n}-{time.monotonic_ns()}"
                start = time.perf_counter()
                r = await http.post(f"/v1/operations/{op}/claim", json=CLAIM, headers=headers)
                token = r.json()["claim"]["token"]
                await http.post(
                    f"/v1/operations/{op}/submit", json={"token": token, "effect_ref": "x"}, headers=headers
                )
                body = {"token": token, "outcome": "committed", "receipt": {"external_ref": "r"}}
                r = await http.post(f"/v1/operations/{op}/complete", json=body, headers=headers)
                assert r.status_code == 200, r.text
                spent.append(time.perf_counter() - start)

        await asyncio.gather(*(executor(n) for n in range(executors)))
    return len(spent) / seconds, statistics.median(spent) * 1000


async def main(admin_url: str) -> None:
    urls = await databases(admin_url)
    for round_ in range(2):
        for label, url in urls.items():
            calls = await call_latency(url, label)
            rate, median = await service_cycles(url, label)
            print(
                f"round {round_} {label:5s}: calls median ms claim {calls['claim']:.1f} submit {calls['submit']:.1f}"
                f" complete {calls['complete']:.1f}; service {rate:.1f} cycles/s, cycle median {median:.0f} ms",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
