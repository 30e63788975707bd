"""On a real Citus cluster (the Citus lane of .ci/run): distribution, isolation on the workers, routing.

Skipped on plain PostgreSQL. The session's database was migrated from empty to head by conftest on a
coordinator and its workers (tests/support/citus_cluster.py).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import psycopg
import pytest

from effect_ledger.db.catalogue import sql
from effect_ledger.db.migrate import (
    distribute_by_tenant,
    distribute_functions,
    head_revision,
    reference_tables,
)
from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE, derived_password
from support import citus_cluster
from support.auth import auth
from support.database import runtime_connection
from support.ledger import committed

pytestmark = [pytest.mark.storage, pytest.mark.citus]


@pytest.fixture(autouse=True)
def only_on_citus(on_citus: bool) -> None:
    if not on_citus:
        pytest.skip("needs a Citus coordinator as EFFECT_LEDGER_DATABASE_URL (the Citus lane of .ci/run)")


async def test_every_table_is_distributed_by_tenant_and_colocated(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT version_num FROM alembic_version") == head_revision()
        tables = await conn.fetch(
            "SELECT c.oid::regclass::text AS name, p.partmethod::text, p.colocationid,"
            " column_to_column_name(p.logicalrelid, p.partkey) AS column"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'citus', 'citus_internal', 'public')"
            " AND n.nspname NOT LIKE 'pg_%' AND c.relkind IN ('r', 'p')"
        )
    finally:
        await conn.close()
    assert {"ledger.operations", "ledger.events", "diagnostics.incidents", "diagnostics.access_log"} <= {
        t["name"] for t in tables
    }
    # every table of the service's schemas: hash-distributed by tenant_id, all in one co-location group
    assert {(t["partmethod"], t["column"]) for t in tables} == {("h", "tenant_id")}, tables
    assert len({t["colocationid"] for t in tables}) == 1


async def _operations_for(service: Any, tenant: str, count: int) -> None:
    async with service.client() as http:
        for n in range(count):
            await committed(http, f"{tenant}-op-{n}", tenant=tenant)


async def _bind(conn: asyncpg.Connection, tenant: str) -> None:
    await conn.fetchrow(sql("tenant_context"), tenant)


async def test_a_worker_and_the_coordinator_show_the_runtime_role_nothing_foreign(
    service: Any, db_url: str
) -> None:
    await _operations_for(service, "acme", 6)
    await _operations_for(service, "globex", 6)
    _, workers = await citus_cluster.nodes(db_url)
    conn = await asyncpg.connect(db_url)
    try:
        shards = await conn.fetch(
            "SELECT s.logicalrelid::regclass::text AS rel, shard_name(s.logicalrelid, s.shardid) AS shard,"
            " p.nodename, p.nodeport FROM pg_dist_shard s JOIN pg_dist_placement pl USING (shardid)"
            " JOIN pg_dist_node p ON p.groupid = pl.groupid"
            " WHERE s.logicalrelid IN ('ledger.operations'::regclass, 'ledger.events'::regclass)"
        )
    finally:
        await conn.close()
    seen: dict[str, set[str]] = {}
    for host, port in workers:
        url = citus_cluster.node_url(db_url, host, port)
        worker = await runtime_connection(url)
        try:
            assert await worker.fetchval("SELECT current_user") == RUNTIME_ROLE
            # no tenant bound: nothing, through the distributed table and through the shards themselves
            assert await worker.fetchval("SELECT count(*) FROM ledger.operations") == 0
            local = [s for s in shards if (s["nodename"], s["nodeport"]) == (host, port)]
            assert local, "every worker holds shards"
            for s in local:
                assert await worker.fetchval(f"SELECT count(*) FROM {s['shard']}") == 0
            async with worker.transaction():
                await _bind(worker, "globex")
                tenants = {r[0] for r in await worker.fetch("SELECT tenant_id FROM ledger.operations")}
                tenants |= {r[0] for r in await worker.fetch("SELECT tenant_id FROM ledger.events")}
                for s in local:
                    tenants |= {
                        r[0] for r in await worker.fetch(f"SELECT DISTINCT tenant_id FROM {s['shard']}")
                    }
                assert tenants <= {"globex"}
                # and the worker refuses to write a foreign row
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with worker.transaction():
                        await worker.execute(
                            "INSERT INTO ledger.events (tenant_id, operation_id, seq, at, kind, actor,"
                            " attempt, data, prev_hash, hash) VALUES ('acme', 'acme-op-0', 99, now(),"
                            " 'x', 'x', 1, '{}', repeat('0', 64), repeat('0', 64))"
                        )
            async with worker.transaction():
                await _bind(worker, "acme")
                seen[f"{host}:{port}"] = {
                    r[0] for r in await worker.fetch("SELECT operation_id FROM ledger.operations")
                }
        finally:
            await worker.close()
    # the rows are there, on the workers: the tenant bound on the worker sees exactly its own
    assert set().union(*seen.values()) == {f"acme-op-{n}" for n in range(6)}
    coordinator = await runtime_connection(db_url)
    try:
        async with coordinator.transaction():
            await _bind(coordinator, "globex")
            assert (
                await coordinator.fetchval("SELECT count(*) FROM ledger.operations WHERE tenant_id = 'acme'")
                == 0
            )
            assert (
                await coordinator.fetchval("SELECT count(*) FROM ledger.events WHERE tenant_id = 'acme'") == 0
            )
            assert {r[0] for r in await coordinator.fetch("SELECT tenant_id FROM ledger.operations")} == {
                "globex"
            }
    finally:
        await coordinator.close()
    async with service.client() as http:
        foreign = await http.get("/v1/operations/acme-op-0", headers=auth(tenant="globex"))
        assert foreign.status_code == 404


async def test_the_reader_role_sees_nothing_foreign_on_a_worker(db_url: str) -> None:
    _, workers = await citus_cluster.nodes(db_url)
    runtime = await runtime_connection(db_url)
    try:
        async with runtime.transaction():
            await _bind(runtime, "acme")
            await runtime.execute(sql("insert_incident"), *EXECUTOR_STATEMENTS["insert_incident"])
    finally:
        await runtime.close()
    for host, port in workers:
        url = citus_cluster.node_url(db_url, host, port)
        reader = await asyncpg.connect(url, user=READER_ROLE, password=derived_password(db_url, READER_ROLE))
        try:
            assert await reader.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
            async with reader.transaction():
                await _bind(reader, "globex")
                assert await reader.fetchval("SELECT count(*) FROM diagnostics.incidents") == 0
            async with reader.transaction():
                await _bind(reader, "acme")
                assert await reader.fetchval("SELECT count(*) FROM diagnostics.incidents") == 1
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await reader.fetchval("SELECT count(*) FROM ledger.operations")
        finally:
            await reader.close()


# --- routing: every executor statement is a single-shard (router) statement --------------------

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64
HASH = "0" * 64
TOKEN_HASH = b"\x01" * 32
RECEIPT_JCS = '{"external_ref":"r-1"}'
# The write path's calls (migration 0005's functions, delegated to the tenant's worker by 0008), with
# sample arguments, in the order an executor makes them.
WRITE_CALLS: dict[str, tuple[Any, ...]] = {
    "run_claim": ("acme", "op-1", "exec-1", "t", "1", DIGEST, 30, None, TOKEN_HASH, None, False, None, None),
    "run_submit": ("acme", "op-1", TOKEN_HASH, "ref-1", None),
    "run_heartbeat": ("acme", "op-1", TOKEN_HASH, 30),
    "run_complete": ("acme", "op-1", "exec-1", TOKEN_HASH, "committed", RECEIPT_JCS, None, None),
    "run_resolve": ("acme", "op-1", "rec-1", "committed", RECEIPT_JCS, None, '{"source":"x"}'),
}
# Sample arguments for every other statement an executor's call runs (reads of its own operation,
# diagnostics it writes and reads), and the write calls themselves.
EXECUTOR_STATEMENTS: dict[str, tuple[Any, ...]] = {
    **WRITE_CALLS,
    "read_operation": ("acme", "op-1"),
    "list_events": ("acme", "op-1"),
    "operation_chain": ("acme", "op-1"),
    "insert_incident": (
        "acme",
        "inc_" + "a" * 24,
        "outcome",
        "exec-1",
        "op-1",
        1,
        "complete",
        "unknown",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        NOW,
    ),
    "outcome_incident_reference": ("acme", "op-1", 1),
    "read_incident": ("acme", "inc_" + "a" * 24),
    "append_access_log": ("acme", "acc-1", NOW, "inc_" + "a" * 24, "aud-1", "test"),
}


def _literal_sql(statement: str) -> str:
    """The statement with $n as psycopg placeholders, so that EXPLAIN sees the values (custom plan)."""
    return re.sub(r"\$(\d+)", r"%(p\1)s", statement.replace("%", "%%"))


def _explain(url: str, tenant: str, name: str, args: tuple[Any, ...]) -> str:
    """EXPLAIN as the service runs the statement: a write call alone in autocommit (it binds its tenant
    itself), any other statement in a transaction bound to the tenant."""
    write_call = name in WRITE_CALLS
    with psycopg.connect(url, autocommit=write_call) as conn, psycopg.ClientCursor(conn) as cur:
        if not write_call:
            cur.execute("SELECT tenancy.bind_setting('effect_ledger.tenant', %s)", (tenant,))
        params = {f"p{i}": psycopg.types.json.Jsonb({}) if v == "{}" else v for i, v in enumerate(args, 1)}
        cur.execute("EXPLAIN (COSTS OFF) " + _literal_sql(sql(name)), params)
        plan = "\n".join(row[0] for row in cur.fetchall())
        if not write_call:
            conn.rollback()
    return plan


@pytest.mark.parametrize("name", sorted(EXECUTOR_STATEMENTS))
async def test_executor_statement_is_routed_to_one_shard(db_url: str, name: str) -> None:
    plan = _explain(db_url, "acme", name, EXECUTOR_STATEMENTS[name])
    assert "Custom Scan (Citus Adaptive)" in plan, plan
    assert re.findall(r"Task Count: (\d+)", plan) == ["1"], plan
    assert "Citus INSERT ... SELECT" not in plan and "Subplan" not in plan, plan


@pytest.fixture
async def remote_log(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    """A runtime connection that reports every command the coordinator sends to a worker."""
    conn = await runtime_connection(db_url)
    messages: list[str] = []
    conn.add_log_listener(lambda _c, m: messages.append(f"{m.message} {m.detail or ''}"))
    await conn.execute("SET citus.log_remote_commands = on")
    try:
        yield conn, messages
    finally:
        await conn.close()


def _servers(messages: list[str]) -> set[str]:
    return {m for msg in messages for m in re.findall(r"on server \S+@(\S+) connectionId", msg)}


TENANT_BATCHES: dict[str, list[tuple[Any, ...]]] = {
    "claim": [
        (k, "acme", f"batch-{k}", "exec-1", "t", "1", DIGEST, 30, None, TOKEN_HASH, None, False, None, None)
        for k in range(3)
    ],
    "submit": [(k, "acme", f"batch-{k}", TOKEN_HASH, "ref-1", None) for k in range(3)],
    "heartbeat": [(k, "acme", f"batch-{k}", TOKEN_HASH, 30) for k in range(3)],
    "complete": [
        (k, "acme", f"batch-{k}", "exec-1", TOKEN_HASH, "committed", RECEIPT_JCS, None, None)
        for k in range(3)
    ],
}
CALL_OUTCOMES = {"claim": "created", "submit": "submitted", "heartbeat": "extended", "complete": "completed"}


async def _outcomes(conn: asyncpg.Connection, call: str, batched: bool) -> list[str]:
    """The outcomes of one write call (autocommit, as the service calls), alone or as a tenant batch of
    three (natural batching on Citus, migration 0025: the batcher's statement)."""
    if not batched:
        return [(await conn.fetchrow(sql(f"run_{call}"), *WRITE_CALLS[f"run_{call}"]))["outcome"]]
    rows = await conn.fetch(sql(f"run_{call}_tenant_batch"), "acme", "50ms", TENANT_BATCHES[call])
    assert sorted(r["i"] for r in rows) == [0, 1, 2], rows
    return [r["outcome"] for r in rows]


@pytest.mark.parametrize(("batched", "operation_id"), [(False, "op-1"), (True, "batch-2")])
async def test_each_write_call_is_one_command_to_one_worker(
    remote_log: tuple[asyncpg.Connection, list[str]], batched: bool, operation_id: str
) -> None:
    conn, messages = remote_log
    for call, outcome in CALL_OUTCOMES.items():
        messages.clear()
        assert set(await _outcomes(conn, call, batched)) == {outcome}, call
        sent = [m for m in messages if "issuing" in m]
        # the function call itself, sent whole to the worker that holds the tenant's shards; a tenant
        # batch too, as one call of the function distributed by its tenant
        assert len(sent) == 1 and "FROM ledger." in sent[0], sent
        assert ("_tenant_batch(" in sent[0]) is batched, sent
        assert len(_servers(sent)) == 1, sent
    async with conn.transaction():
        await _bind(conn, "acme")
        kinds = [r["kind"] for r in await conn.fetch(sql("list_events"), "acme", operation_id)]
    assert kinds == ["claimed", "submitted", "completed"]  # a heartbeat appends no event


# --- the helpers later migrations call -------------------------------------------------------------

SCRATCH = """
CREATE SCHEMA scratch;
CREATE TABLE scratch.notes (tenant_id text NOT NULL, id integer NOT NULL, PRIMARY KEY (tenant_id, id));
CREATE TABLE scratch.kinds (kind text PRIMARY KEY);
CREATE FUNCTION scratch.count_notes(p_tenant text) RETURNS bigint LANGUAGE sql
    AS $$ SELECT count(*) FROM scratch.notes WHERE tenant_id = p_tenant $$;
"""


def _helpers() -> None:
    distribute_by_tenant("scratch.notes")
    reference_tables("scratch.kinds")
    distribute_functions("scratch.count_notes(text)", tenant_argument="p_tenant", force_delegation=True)


async def test_migration_helpers_distribute_tables_and_functions_by_tenant(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(SCRATCH)
        citus_cluster.in_migration(db_url, _helpers)
        citus_cluster.in_migration(db_url, _helpers)  # a second run changes nothing
        operations = await conn.fetchval(
            "SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'ledger.operations'::regclass"
        )
        tables = await conn.fetch(
            "SELECT logicalrelid::text AS name, partmethod::text, colocationid,"
            " column_to_column_name(logicalrelid, partkey) AS column FROM pg_dist_partition"
            " WHERE logicalrelid::text LIKE 'scratch.%' ORDER BY 1"
        )
        function = await conn.fetchrow(
            "SELECT distribution_argument_index, colocationid, force_delegation FROM pg_dist_object"
            " WHERE objid = 'scratch.count_notes(text)'::regprocedure"
        )
    finally:
        await conn.execute("DROP SCHEMA scratch CASCADE")
        await conn.close()
    assert [tuple(t) for t in tables] == [
        ("scratch.kinds", "n", tables[0]["colocationid"], None),
        ("scratch.notes", "h", operations, "tenant_id"),
    ]
    assert tuple(function) == (0, operations, True)
