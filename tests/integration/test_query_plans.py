"""The reconciler list, the receipts feed and the access log keep their indexes: EXPLAIN (FORMAT JSON)
as the runtime role (row-level security on), custom and generic plans, no Seq Scan of the table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from effect_ledger.db.catalogue import sql
from support.ledger import Seed, owner, runtime, seed

TENANTS = 20
PER_TENANT = 1000
START = datetime(2026, 10, 1, tzinfo=UTC)
NOW = datetime.now(UTC)
MIDDLE = START + timedelta(seconds=PER_TENANT // 2)
STATUSES = ("pending", "submitted", "unknown", "committed", "committed", "not_applied")

# (query, parameters, index it must use); parameters follow the catalogue's numbering.
CASES: list[tuple[str, tuple[Any, ...], str]] = [
    ("list_operations", ("t3", START - timedelta(days=1), "", None, None, NOW, 101), "operations_by_status"),
    ("list_operations", ("t3", MIDDLE, "op-00500", "measure", NOW, NOW, 101), "operations_by_status"),
    (
        "list_operations_by_status",
        ("t3", START - timedelta(days=1), "", None, None, NOW, 101, "pending"),
        "operations_by_status",
    ),
    (
        "list_operations_by_status",
        ("t3", MIDDLE, "op-00500", None, None, NOW, 101, "submitted"),
        "operations_by_status",
    ),
    (
        "list_unknown_operations",
        ("t3", START - timedelta(days=1), "", None, None, NOW, 101),
        "operations_by_status",
    ),
    (
        "list_unknown_operations",
        ("t3", MIDDLE, "op-00500", "measure", None, NOW, 101),
        "operations_by_status",
    ),
    ("list_receipts", ("t3", 0, START - timedelta(days=1), NOW, None, None, 101), "feed_pkey"),
    (
        "list_receipts",
        ("t3", 80, START, MIDDLE + timedelta(hours=1), "measure", "exec-1", 101),
        "feed_pkey",
    ),
    # the sequencer takes the commits still without a position in resolution order from their own table
    ("feed_assign", ("t3", 10**6, 1000), "feed_pending_pkey"),
    # a few hundred rows per tenant: any index will do (the planner may sort 300 rows), never a Seq Scan
    ("list_access_log", ("t3", START - timedelta(days=1), "", START - timedelta(days=1), 101), ""),
]
SCANNED = {"operations", "access_log", "feed", "feed_pending"}
POSITIONED = 900  # a tenant's committed operations created before this one have their feed positions


def literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text.replace("'", "''") + "'"


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def check(plan_json: Any, index: str) -> None:
    plan = (json.loads(plan_json) if isinstance(plan_json, str) else plan_json)[0]["Plan"]
    found = list(nodes(plan))
    seq_scans = [n for n in found if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in SCANNED]
    assert not seq_scans, json.dumps(plan, indent=1)
    indexes = {n.get("Index Name") for n in found} - {None}
    assert (index in indexes) if index else indexes, json.dumps(plan, indent=1)


def lease(i: int) -> datetime | None:
    """Submitted rows alternate between an expired and a live lease."""
    if STATUSES[i % len(STATUSES)] != "submitted":
        return None
    return START if (i // len(STATUSES)) % 2 else NOW + timedelta(days=1)


@pytest.fixture(scope="module")
async def populated(module_db_url: str) -> str:
    """The seed, written once for the module: its tests only read (EXPLAIN and the pages)."""
    db_url = module_db_url
    rows = [
        Seed(
            f"t{t}",
            f"op-{i:05d}",
            STATUSES[i % len(STATUSES)],
            START + timedelta(seconds=i),
            lease(i),
            tool=("measure", "probe")[i % 7 == 0],
        )
        for t in range(TENANTS)
        for i in range(PER_TENANT)
    ]
    async with owner(db_url) as conn:
        await seed(conn, rows)
        await conn.executemany(
            "INSERT INTO diagnostics.access_log (tenant_id, access_id, at, incident_id, principal, purpose)"
            " VALUES ($1, $2, $3, 'inc_0123456789abcdef', 'ops-1', 'audit')",
            [
                (f"t{t}", f"acc_{i:05d}", START + timedelta(seconds=i))
                for t in range(TENANTS)
                for i in range(300)
            ],
        )
        # what the feed's sequencer would have handed out: positions in resolution order per tenant to
        # the commits of the first POSITIONED seconds; the later ones still wait for theirs
        cutoff = START + timedelta(seconds=POSITIONED)
        await conn.execute(
            "INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)"
            " SELECT tenant_id, row_number() OVER (PARTITION BY tenant_id ORDER BY resolved_at, operation_id),"
            " operation_id FROM ledger.operations WHERE status = 'committed' AND created_at < $1",
            cutoff,
        )
        await conn.execute(
            "INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id)"
            " SELECT tenant_id, resolved_at, operation_id FROM ledger.operations"
            " WHERE status = 'committed' AND created_at >= $1",
            cutoff,
        )
        await conn.execute(
            "INSERT INTO ledger.feed_counters SELECT tenant_id, max(feed_position) FROM ledger.feed GROUP BY tenant_id"
        )
        for table in ("ledger.operations", "ledger.feed", "ledger.feed_pending"):
            await conn.execute(f"ANALYZE {table}")
        await conn.execute("ANALYZE diagnostics.access_log")
    return db_url


@pytest.mark.parametrize(
    ("query", "params", "index"), CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)]
)
async def test_paged_reads_use_their_index(
    populated: str, query: str, params: tuple[Any, ...], index: str
) -> None:
    conn = await runtime(populated)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('effect_ledger.tenant', 't3', true)")
            check(await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql(query), *params), index)
            # the plan a long-lived prepared statement settles on (asyncpg caches statements)
            types = ", ".join(t.name for t in (await conn.prepare(sql(query))).get_parameters())
            await conn.execute(f"PREPARE paged ({types}) AS {sql(query)}")
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            # EXECUTE takes no bind parameters under EXPLAIN: the test's own constants, as literals
            arguments = ", ".join(literal(p) for p in params)
            check(await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE paged ({arguments})"), index)
            rows = await conn.fetch(sql(query), *params)
            assert 0 < len(rows) <= 101
    finally:
        await conn.close()


async def test_list_pages_need_no_sort_of_the_tenant(populated: str) -> None:
    """Where a page is small against the matching set, an ordered index scan feeds LIMIT directly, so a
    deep page costs what the first page costs (for small sets the planner may rightly sort instead)."""
    conn = await runtime(populated)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('effect_ledger.tenant', 't3', true)")
            for query, params, _ in CASES:
                if query in ("list_operations", "list_operations_by_status", "list_receipts"):
                    small_page = (
                        (*params[:6], 20, *params[7:]) if query != "list_receipts" else (*params[:6], 20)
                    )
                    plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql(query), *small_page))
                    assert "Sort" not in {n["Node Type"] for n in nodes(plan[0]["Plan"])}, (query, params)
    finally:
        await conn.close()


# The write path's lookups by (tenant, operation ID): each function's own, and the one an RI trigger
# writes (the events -> operations foreign key's until migration 0016 dropped it; kept: any key lookup
# in that form must stay on the primary key). Generic plans, as PL/pgSQL caches them.
LOOKUPS = [
    "SELECT * FROM ledger.operations AS t WHERE t.tenant_id = $1 AND t.operation_id = $2 FOR UPDATE",
    # a lookup that names a status too (the bench's one-statement yardstick): still the primary key
    "UPDATE ledger.operations AS t SET updated_at = now() WHERE t.tenant_id = $1 AND t.operation_id = $2"
    " AND t.status = 'pending'",
    'SELECT 1 FROM ONLY "ledger"."operations" x WHERE "tenant_id" OPERATOR(pg_catalog.=) $1'
    ' AND "operation_id"::pg_catalog.text OPERATOR(pg_catalog.=) $2 FOR KEY SHARE OF x',
]


@pytest.mark.parametrize("lookup", LOOKUPS, ids=["function", "with-status", "foreign-key"])
async def test_the_write_path_uses_the_primary_key_on_an_empty_table(db_url: str, lookup: str) -> None:
    """On a new or emptied table every index estimates one row; a lookup whose generic plan is cached
    then must still be the primary key's, not a range scan of the tenant in another index (0013)."""
    conn = await runtime(db_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('effect_ledger.tenant', 't1', true)")
            await conn.execute(f"PREPARE lookup (text, text) AS {lookup}")
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) EXECUTE lookup ('t1', 'op-1')"))
            scans = {n.get("Index Name") for n in nodes(plan[0]["Plan"])} - {None}
            assert scans == {"operations_pkey"}, json.dumps(plan, indent=1)
    finally:
        await conn.close()


# The maintenance sweeps, across tenants as the owner with the maintenance scope on: the purge's
# candidates read operations_purgeable, the tombstone sweep's operations_tombstones (one index over
# both would make the purge walk every tombstone first: they keep their old updated_at), the lease
# sweep operations_submitted_lease; never a Seq Scan of the table, custom or generic plan.
SWEEPS: list[tuple[str, tuple[Any, ...], str]] = [
    ("purge_candidates", (30, 500), "operations_purgeable"),
    ("tombstone_candidates", (400, 500), "operations_tombstones"),
    ("sweep_candidates", (500,), "operations_submitted_lease"),
]


@pytest.mark.parametrize(("query", "params", "index"), SWEEPS, ids=[s[0] for s in SWEEPS])
async def test_the_sweeps_use_their_index(
    populated: str, query: str, params: tuple[Any, ...], index: str
) -> None:
    async with owner(populated) as conn, conn.transaction():
        await conn.fetchval(sql("maintenance_scope"), "on")
        check(await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql(query), *params), index)
        types = ", ".join(t.name for t in (await conn.prepare(sql(query))).get_parameters())
        await conn.execute(f"PREPARE sweep ({types}) AS {sql(query)}")
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        arguments = ", ".join(literal(p) for p in params)
        check(await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE sweep ({arguments})"), index)


# The lookups of a list of operation IDs (the checkpointer's receipt recheck, the integrator's chains,
# the journal's pending calls): one primary-key probe per ID, even when the statistics still describe
# the tenant as it was when it was small, or nothing at all (a new deployment, before autovacuum's first
# analyse: the planner then guesses ~60 rows for the tenant).
# Written as `operation_id = ANY($2)`, the checkpointer's recheck scanned the tenant's whole key range
# for every 64-ID slice and filtered the array instead (round 14: 5.3 ms a slice at 7,700 operations).
ARRAY_LOOKUPS = ["log_receipts_of", "log_rows_changed", "log_batch_chains", "journal_effects"]
# Arguments after the IDs (log_rows_changed, round 31: a row version and a feed position each; none of
# these rows is that version, so every one is answered).
EXTRA_ARGS = {"log_rows_changed": lambda n: ([1] * n, list(range(1, n + 1)))}


async def probes_by_key(
    db_url: str, tenant: str, query: str, table: str, wanted: list[str], rows: int, *extra: Any
) -> list[Any]:
    """`query` for `wanted` IDs of `tenant`, planned custom and generic: every scan of `table` looks its
    rows up by the whole key (operation_id in its index condition), so together they read exactly `rows`
    rows (the array form read 180 index entries of operations here, and 7,587 of a tenant of 7,700 in the
    bench's never-analysed table). Answers what the query returns."""
    conn = await runtime(db_url)
    try:
        async with conn.transaction():
            await conn.execute(f"SELECT set_config('effect_ledger.tenant', '{tenant}', true)")
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = json.loads(
                    await conn.fetchval(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + sql(query), tenant, wanted, *extra
                    )
                )
                shown = json.dumps(plan, indent=1)
                leaves = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Index Scan")
                scans = [
                    n
                    for n in nodes(plan[0]["Plan"])
                    if n["Node Type"] in leaves
                    and (n.get("Relation Name") == table or n.get("Index Name", "").startswith(table))
                ]
                assert scans, shown
                for scan in scans:
                    assert "operation_id" in scan.get("Index Cond", ""), shown
                assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == rows, shown
            return list(await conn.fetch(sql(query), tenant, wanted, *extra))
    finally:
        await conn.close()


@pytest.mark.parametrize("query", ARRAY_LOOKUPS)
async def test_array_lookups_probe_the_key_per_id_whatever_the_statistics(db_url: str, query: str) -> None:
    tenant, grown = "t-array", 8000
    async with owner(db_url) as conn:  # a new deployment's first minute: never analysed yet
        ops = [Seed(tenant, f"op-{i:05d}", "pending", START + timedelta(seconds=i)) for i in range(grown)]
        await seed(conn, ops)
        # each row written three times, as claim, submit and complete do (dead versions, grown indexes)
        for status in ("submitted", "committed"):
            await conn.execute(
                "UPDATE ledger.operations SET status = $1 WHERE tenant_id = $2", status, tenant
            )
        analysed = "SELECT last_analyze FROM pg_stat_user_tables WHERE relid = 'ledger.operations'::regclass"
        assert await conn.fetchval(analysed) is None
    wanted = [f"op-{i:05d}" for i in range(0, grown, grown // 64)][:64]
    extra = EXTRA_ARGS[query](len(wanted)) if query in EXTRA_ARGS else ()
    found = await probes_by_key(db_url, tenant, query, "operations", wanted, len(wanted), *extra)
    assert {r["operation_id"] for r in found} == set(wanted)


async def test_the_feed_sequencer_reads_each_pending_row_once_whatever_the_statistics(db_url: str) -> None:
    """feed_assign on a table no analyse has seen yet (a new deployment's first receipts, one tenant's
    backlog): every plan node runs once, so a batch costs what its rows cost. A join of the batch back
    to ledger.feed_pending was planned here as a nested loop over a Materialize of the whole batch,
    rescanned for each of its rows: 400 x 400 rows read for a batch of 400. The batches hand out
    positions in resolution order after the given one; the last takes nothing of another tenant."""
    tenant, batch, backlog = "t-seq", 400, 1000
    pending = [(tenant, START + timedelta(seconds=i), f"op-{i:05d}") for i in range(backlog)]
    columns = ["tenant_id", "resolved_at", "operation_id"]
    analysed = "SELECT last_analyze FROM pg_stat_user_tables WHERE relid = 'ledger.feed_pending'::regclass"
    async with owner(db_url) as conn:
        await conn.copy_records_to_table(
            "feed_pending", schema_name="ledger", records=pending[::-1], columns=columns
        )
        assert await conn.fetchval(analysed) is None
    conn = await runtime(db_url)
    try:
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), tenant)
            assert await conn.fetchval(sql("feed_lock"), tenant) == 0
            for n, mode in enumerate(("force_custom_plan", "force_generic_plan")):
                await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = json.loads(
                    await conn.fetchval(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + sql("feed_assign"), tenant, n * batch, batch
                    )
                )
                found = list(nodes(plan[0]["Plan"]))
                rescanned = [(x["Node Type"], x["Actual Loops"]) for x in found if x["Actual Loops"] > 1]
                assert rescanned == [], json.dumps(plan, indent=1)
                deleted = [x["Actual Rows"] for x in found if x.get("Operation") == "Delete"]
                assert deleted == [batch], json.dumps(plan, indent=1)
        # another tenant's rows at the same times, sorting between the tenant's: the last batch (the
        # rest of the backlog, under the limit) leaves them
        others = [("t-other", START + timedelta(seconds=i), f"op-{i:05d}") for i in range(0, backlog, 50)]
        async with owner(db_url) as other:
            await other.copy_records_to_table(
                "feed_pending", schema_name="ledger", records=others, columns=columns
            )
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), tenant)
            last = await conn.fetchval(sql("feed_lock"), tenant)
            assert last == 2 * batch
            assert await conn.fetchval(sql("feed_assign"), tenant, last, batch) == backlog - 2 * batch
    finally:
        await conn.close()
    async with owner(db_url) as conn:
        rows = await conn.fetch(
            "SELECT feed_position, operation_id FROM ledger.feed WHERE tenant_id = $1 ORDER BY feed_position",
            tenant,
        )
        assert [(r["feed_position"], r["operation_id"]) for r in rows] == [
            (i + 1, f"op-{i:05d}") for i in range(backlog)
        ]
        counter = "SELECT last_position FROM ledger.feed_counters WHERE tenant_id = $1"
        assert await conn.fetchval(counter, tenant) == backlog
        left = await conn.fetch(
            "SELECT tenant_id, operation_id FROM ledger.feed_pending ORDER BY operation_id"
        )
        assert [(r["tenant_id"], r["operation_id"]) for r in left] == [("t-other", o) for _, _, o in others]


async def test_the_integrators_batch_probes_only_the_operations_it_takes_whatever_the_statistics(
    db_url: str,
) -> None:
    """log_batch with a backlog on the feed (a log re-enabled after auditors' reads positioned its
    receipts, a restart after a long stop): the batch's limit is taken on the feed, so a pass probes
    the operations of its batch and no others, and reads each one's head event and no other event (one
    backward probe of the events' primary key: round 34, the heads read with the rows), on tables no
    analyse has seen, in both plan modes. With the limit after the join (until round 32) the custom plan
    here read every position after the log's size, probed each one's operation and sorted them: 2,000
    probes for a batch of 100."""
    tenant, backlog, batch = "t-batch", 3000, 100
    ops = [Seed(tenant, f"op-{i:05d}", "committed", START + timedelta(seconds=i)) for i in range(backlog)]
    async with owner(db_url) as conn:
        await seed(conn, ops)
        await conn.execute(
            "INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)"
            " SELECT $1, i + 1, 'op-' || lpad(i::text, 5, '0') FROM generate_series(0, $2 - 1) AS i",
            tenant,
            backlog,
        )
        await conn.execute(  # three events an operation, as a committed cycle leaves
            """
            INSERT INTO ledger.events (tenant_id, operation_id, seq, at, kind, actor, from_status, to_status,
                                       attempt, data, prev_hash, hash)
            SELECT $1, 'op-' || lpad(i::text, 5, '0'), s, $2, 'claimed', 'p', NULL, 'pending', 1, '{}',
                   repeat('0', 64), repeat('a', 64)
            FROM generate_series(0, $3 - 1) AS i, generate_series(1, 3) AS s
            """,
            tenant,
            START,
            backlog,
        )
        for table in ("operations", "feed", "events"):
            analysed = (
                f"SELECT last_analyze FROM pg_stat_user_tables WHERE relid = 'ledger.{table}'::regclass"
            )
            assert await conn.fetchval(analysed) is None
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), tenant)
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = json.loads(
                    await conn.fetchval(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + sql("log_batch"), tenant, 1000, batch
                    )
                )
                shown = json.dumps(plan, indent=1)
                for table in ("operations", "events"):
                    probes = [
                        n
                        for n in nodes(plan[0]["Plan"])
                        if n.get("Relation Name") == table or n.get("Index Name", "").startswith(table)
                    ]
                    assert probes, shown
                    for probe in probes:
                        assert "operation_id" in probe.get("Index Cond", ""), shown
                    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in probes) == batch, shown
            rows = await conn.fetch(sql("log_batch"), tenant, 1000, batch)
    assert [(r["feed_position"], r["operation_id"], r["seq"]) for r in rows] == [
        (1001 + i, f"op-{1000 + i:05d}", 3) for i in range(batch)
    ]
