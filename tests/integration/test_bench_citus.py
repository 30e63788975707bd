"""The bench on a Citus coordinator (EFFECT_LEDGER_DATABASE_URL): its databases made on every node of the
cluster (effect_ledger_bench.citus, as the Citus lane's own), migrated as the service's migrations
distribute them there, and dropped from every node; so `repeat` measures the service on Citus (round 35:
natural batching per tenant on and off). On plain PostgreSQL the bench keeps CREATE DATABASE."""

from __future__ import annotations

import asyncpg
import pytest

from effect_ledger_bench import citus
from effect_ledger_bench.database import Cluster

NAME = "effect_ledger_bench_citus_test"


async def _databases_named(admin_url: str) -> list[bool]:
    """Whether each node (the coordinator first) holds a database called NAME."""
    (coordinator, workers) = await citus.nodes(admin_url)
    found = []
    for host, port in [coordinator, *workers]:
        conn = await asyncpg.connect(citus.node_url(admin_url, host, port, "postgres"))
        try:
            found.append(
                bool(await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", NAME))
            )
        finally:
            await conn.close()
    return found


@pytest.mark.storage
async def test_the_bench_makes_its_database_on_every_node_of_a_citus_cluster(
    pg_admin_url: str, on_citus: bool
) -> None:
    cluster = await Cluster.open(pg_admin_url)
    assert cluster.citus is on_citus
    if not on_citus:
        return  # plain PostgreSQL: the bench's CREATE DATABASE, which every bench test runs
    try:
        url = await cluster.create(NAME)
        conn = await asyncpg.connect(url)
        try:
            distributed = await conn.fetchval(
                "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'ledger.operations'::regclass"
            )
            workers = await conn.fetchval("SELECT count(*) FROM pg_dist_node WHERE groupid <> 0")
        finally:
            await conn.close()
        assert distributed == 1 and workers >= 1
        assert await _databases_named(pg_admin_url) == [True] * (1 + workers)
    finally:
        await cluster.close()
    assert not any(await _databases_named(pg_admin_url))
