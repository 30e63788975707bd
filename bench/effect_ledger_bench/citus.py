"""A database on a Citus cluster: created on the coordinator and on every worker, with the citus
extension and the workers registered; dropped from every node.

The bench's Cluster makes its databases this way when EFFECT_LEDGER_DATABASE_URL is a Citus coordinator
(a cluster such as ../shared/citus/cluster.sh starts; `repeat` then measures the service on it), and
the tests' Citus lane its own (tests/support/citus_cluster.py). A Citus database cannot be made with a
plain CREATE DATABASE: every node holds part of it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg


def node_url(url: str, host: str, port: int, database: str | None = None) -> str:
    """The same login on another node (and optionally another database)."""
    parts = urlsplit(url)
    user = parts.username or "postgres"
    path = "/" + database if database is not None else parts.path
    return urlunsplit((parts.scheme, f"{user}@{host}:{port}", path, parts.query, parts.fragment))


async def is_citus(url: str) -> bool:
    """Whether the database at url has the citus extension (then it is a coordinator)."""
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'citus'"))
    finally:
        await conn.close()


async def nodes(url: str) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    """(coordinator, workers) as registered in the database at url."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT groupid, nodename, nodeport FROM pg_dist_node ORDER BY nodeid")
    finally:
        await conn.close()
    coordinator = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] == 0]
    workers = [(r["nodename"], r["nodeport"]) for r in rows if r["groupid"] != 0]
    return (
        coordinator[0] if coordinator else (urlsplit(url).hostname or "", urlsplit(url).port or 5432)
    ), workers


async def create_on_node(admin_url: str, host: str, port: int, name: str) -> None:
    """A new database called name on one node, with the citus extension."""
    conn = await asyncpg.connect(node_url(admin_url, host, port, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(node_url(admin_url, host, port, name))
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
    finally:
        await conn.close()


async def create_database(admin_url: str, name: str, shard_count: int | None = None) -> str:
    """An empty Citus database called name on the coordinator and every worker of admin_url's cluster
    (with `shard_count`, its tables' shards; Citus's default, 32, otherwise)."""
    (chost, cport), workers = await nodes(admin_url)
    for host, port in [(chost, cport), *workers]:
        await create_on_node(admin_url, host, port, name)
    url = node_url(admin_url, chost, cport, name)
    conn = await asyncpg.connect(url)
    try:
        if shard_count is not None:
            await conn.execute(f'ALTER DATABASE "{name}" SET citus.shard_count = {int(shard_count)}')
        await conn.fetchval("SELECT citus_set_coordinator_host($1, $2)", chost, cport)
        for host, port in workers:
            await conn.fetchval("SELECT citus_add_node($1, $2)", host, port)
    finally:
        await conn.close()
    return url


async def drop_database(admin_url: str, name: str) -> None:
    """Drop name on every node of the cluster (workers first)."""
    (chost, cport), workers = await nodes(admin_url)
    for host, port in [*workers, (chost, cport)]:
        conn = await asyncpg.connect(node_url(admin_url, host, port, "postgres"))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
