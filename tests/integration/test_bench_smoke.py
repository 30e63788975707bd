"""`effect-ledger bench --smoke` runs every measurement and prints every row; wrk's Lua drives real cycles."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import asyncpg
import pytest

from effect_ledger.settings import Settings
from effect_ledger_bench.inprocess import Driver
from effect_ledger_bench.inprocess import cycles as full_cycles
from effect_ledger_bench.workload import PRINCIPAL, SCOPE, TENANT
from effect_ledger_bench.wrk import wrk_load, wrk_path
from support.auth import token
from support.server import Service

PER_CYCLE = (
    r"per cycle: PostgreSQL ([\d.]+ ms|n/a), (Python [\d.]+ ms|no Python), WAL [\d,]+ B, [\d.]+ write xacts"
)
# a service row with the receipts log on: serve's Python, and its log process's part of it
LOG_ON_CYCLE = (
    r"per cycle: PostgreSQL ([\d.]+ ms|n/a), Python [\d.]+ ms \(the log process [\d.]+ ms\), WAL [\d,]+ B, "
    r"[\d.]+ write xacts"
)
ROWS = [
    rf"1 +lean yardstick: minimal schema, pgbench, 16 clients +[\d,]+ cycles/s +{PER_CYCLE}.*0 failed",
    rf"1 +yardstick on our tables, pgbench, 16 clients +[\d,]+ cycles/s +{PER_CYCLE}.*0 failed",
    rf"1 +our SQL \(function calls\), pgbench, 16 clients +[\d,]+ cycles/s +{PER_CYCLE}.*0 failed",
    rf"1 +asyncpg alone, same statements, 1 process +[\d,]+ cycles/s +{PER_CYCLE}",
    rf"1 +ASGI app in process \(no HTTP server\), 1 process +[\d,]+ cycles/s +{PER_CYCLE}.*"
    r"[\d.]+ ms Python per request \((?:uvloop|asyncio)\); a 429 before routing \d+ us \(\d+ refused\); 0 errors",
    # the Python HTTP floor (a bare server on the lean statements): every cycle answered, no error
    rf"1 +Python HTTP floor: lean statements over HTTP, 1 process +[\d,]+ cycles/s +{PER_CYCLE}"
    r".*Python x\d processes, 0 errors; claim p99 [\d.]+ ms",
    rf"1 +full service: serve --workers 1, 16 executors over HTTP +[\d,]+ cycles/s +{LOG_ON_CYCLE}.*0 errors"
    r"; log caught up and signed in [\d.]+ s first",
    rf"1 +lean yardstick again after the service, pgbench, 16 clients +[\d,]+ cycles/s +{PER_CYCLE}.*0 failed",
    rf"1 +full service, natural batching off \(WRITE_BATCH_MAX=1\), 16 executors +[\d,]+ cycles/s +{LOG_ON_CYCLE}"
    r".*0 errors; claim p99 [\d.]+ ms",
    rf"1 +full service, receipts log off \(LOG_ENABLED=false\), 16 executors +[\d,]+ cycles/s +{PER_CYCLE}"
    r".*0 errors; claim p99 [\d.]+ ms",
    rf"1 +full service, receipts log on again \(LOG_ENABLED=true\), 16 executors +[\d,]+ cycles/s +{LOG_ON_CYCLE}"
    r".*0 errors; claim p99 [\d.]+ ms; log caught up and signed in [\d.]+ s first",
    rf"1 +full service, receipts log on, third row \(LOG_ENABLED=true\), 16 executors +[\d,]+ cycles/s "
    rf"+{LOG_ON_CYCLE}.*0 errors; claim p99 [\d.]+ ms; log caught up and signed in [\d.]+ s first",
    rf"1 +full service, receipts log off again \(LOG_ENABLED=false\), 16 executors +[\d,]+ cycles/s "
    rf"+{PER_CYCLE}.*0 errors; claim p99 [\d.]+ ms",
    r"2 +service: claim +[\d,]+ calls/s .*p99 <= 10 ms: (PASS|MISS)",
    r"2 +service: submit +[\d,]+ calls/s",
    r"2 +service: complete +[\d,]+ calls/s",
    r"2 +service: load generator CPU +\d+% of \d+ cores +Python x\d processes",
    r"2 +service: RSS per worker +\d+ MiB +<= 150 MiB: (PASS|MISS)",
    r"3 +replay: claims of committed IDs +[\d,]+ req/s .*, 0 errors",
    r"3 +contention: 8 executors, 10 hot IDs .*1 winner per ID: correct +10/10 IDs with exactly one 201",
    r"4 +neighbour: quiet tenant alone, 4 executors, claim +[\d,]+ cycles/s .* 0 errors",
    r"4 +neighbour: quiet tenant beside a flood, claim +[\d,]+ cycles/s .*p99 <= 2 x alone: (PASS|MISS) "
    r"\([\d.]+x\) +0 errors; flood \(64 connections, limit 10/s burst 20\): 201: [\d,]+",
    r"5 +growth: 0 rows, claim +[\d,]+ cycles/s .*operations \d+ MiB \+ indexes",
    r"5 +growth: 2,000 rows, claim +[\d,]+ cycles/s .*p50 <= 1.25 x empty: (PASS|MISS)",
    r"6 +journal: appends, 5-record batches, 16 writers +[\d,]+ appends/s .*, 0 unexpected answers",
    r"6 +journal: PostgreSQL alone, same inserts +[\d,]+ appends/s .*, 0 unexpected answers",
    r"6 +journal: projections, 60-record sessions +[\d,]+ reads/s .*, 0 unexpected answers",
    r"6 +journal: PostgreSQL alone, same reads +[\d,]+ reads/s .*, 0 unexpected answers",
    # on a busy machine (a test run) the ratios are withheld, never printed as if they meant something
    r"7 +service / lean yardstick, cycles/s +([\d.]+ +>= 0.50: (PASS|MISS)|not reported +>= 0.50: NOT MEASURED)",
    r"7 +PostgreSQL CPU per cycle, service / lean +([\d.]+|nan|not reported) +<= 1.5: (PASS|MISS|NOT MEASURED)",
    r"7 +Python HTTP floor / lean yardstick, cycles/s +([\d.]+ +room for >= 0.50: (PASS|MISS) +[\d,]+ / [\d,]+ "
    r"cycles/s; service / floor [\d.]+|not reported +room for >= 0.50: NOT MEASURED)",
    r"7 +natural batching: service on / off, cycles/s +([\d.]+ +> 1 keeps it: (PASS|MISS)|not reported +> 1 "
    r"keeps it: NOT MEASURED)",
    r"7 +receipts log: service on / off, cycles/s +([\d.]+ +>= 0.95: (PASS|MISS)|not reported +>= 0.95: "
    r"NOT MEASURED)",
    r"7 +receipts log: integration lag p99 under load, s +[\d.]+ +<= 2: (PASS|MISS) +p50 [\d.]+ s over",
    r"7 +claim p99 at 16 executors, ms +[\d.]+ +<= 10: (PASS|MISS)",
    r"7 +noisy neighbour: quiet p99 beside the flood / alone +[\d.]+ +<= 2: (PASS|MISS)",
    r"7 +Python CPU per request \(service\), ms +[\d.]+ +<= 0.3: (PASS|MISS) +every serve process",
    r"7 +ratios reported +(yes|no) +.*rule: ratios only when the load average at the start <= 1",
]


def test_smoke_run_prints_every_row_in_order(pg_admin_url: str) -> None:
    bench_source = str(Path(__file__).resolve().parents[2] / "bench")  # its own distribution, from source
    # a checkpoint a second at most: each row with the log on first waits for one over the receipts before
    env = {
        **os.environ,
        "EFFECT_LEDGER_DATABASE_URL": pg_admin_url,
        "PYTHONPATH": bench_source,
        "EFFECT_LEDGER_LOG_CHECKPOINT_SECONDS": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "effect_ledger.cli", "bench", "--smoke", "--generator", "python"],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("effect-ledger bench: ") and "PostgreSQL " in lines[1]
    assert lines[2].startswith(
        f"serve on Python {platform.python_version()} ({os.path.realpath(sys.executable)}, "
    )
    assert re.match(r"load average: [\d.]+ before, [\d.]+ after", lines[3])
    table = [line for line in lines if re.match(r"\d  ", line)]
    assert len(table) == len(ROWS), run.stdout
    for pattern, line in zip(ROWS, table, strict=True):
        assert re.match(pattern, line), f"{line!r} does not match {pattern!r}"


@pytest.mark.skipif(wrk_path() is None, reason="wrk is not installed (Debian package wrk)")
async def test_wrk_script_runs_full_cycles_then_replays_them(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    async with Service(replace(settings, rate_limit_per_second=0)) as service:  # as the bench's serve
        await wrk_cycles_then_replays(service, db_url, tmp_path)


async def wrk_cycles_then_replays(service: Service, db_url: str, tmp_path: Path) -> None:
    tokens = [token(TENANT, PRINCIPAL, SCOPE) for _ in range(4)]
    # one full cycle per wrk connection first, through the same app in process (the bench's own
    # cycles): a cold service's first claims (new pool connections, prepared statements, type
    # introspection) took 1.3 s under a suite's load, longer than wrk's window, which then had no cycle
    warmed = await full_cycles(Driver(service.app), tokens, len(tokens), len(tokens), "warm")
    assert warmed == {"claim 201": 4, "submit 200": 4, "complete 200": 4}
    cycles = await wrk_load("cycle", service.base_url, tmp_path, tokens, 4, 1.0, "wrk")
    assert cycles.generator == "wrk" and cycles.errors == {}
    assert cycles.cycles >= 1 and len(cycles.calls["complete"]) == cycles.cycles
    conn = await asyncpg.connect(db_url)
    try:
        statuses = dict(
            await conn.fetch(
                "SELECT status, count(*) FROM ledger.operations WHERE tenant_id = $1 GROUP BY status", TENANT
            )
        )
        committed = [
            r["operation_id"]
            for r in await conn.fetch("SELECT operation_id FROM ledger.operations WHERE status = 'committed'")
        ]
        events = await conn.fetchval(
            "SELECT count(*) FROM ledger.events WHERE operation_id = ANY($1)", committed
        )
    finally:
        await conn.close()
    # wrk stops mid-cycle, so up to one operation per connection may be left pending or submitted
    assert statuses["committed"] >= cycles.cycles
    assert set(statuses) <= {"committed", "pending", "submitted"}
    assert statuses.get("pending", 0) + statuses.get("submitted", 0) <= 4
    assert events == 3 * len(committed)  # claimed, submitted, completed

    replays = await wrk_load("replay", service.base_url, tmp_path, tokens, 4, 1.0, "rep", committed)
    assert replays.errors == {} and replays.requests >= 1
    assert len(replays.calls["claim"]) >= 1 and replays.cycles == 0
