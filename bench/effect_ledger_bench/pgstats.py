"""Where PostgreSQL's time goes in one effect cycle: pg_stat_statements and track_functions per cycle.

Run against a server started with `shared_preload_libraries = 'pg_stat_statements'`,
`pg_stat_statements.track = all` and `track_functions = all` (docs/performance.md, "Where
PostgreSQL's time goes"). One pgbench client runs `cycles` effect cycles of one script kind
(limit.KINDS, or `lean`: the yardstick on a minimal schema of its own, see LEAN_SCHEMA) and the
report gives, per cycle: every statement (nested ones too) with its calls, execution time and shared
buffers, every function with its calls and self time, the WAL bytes and records, and the CPU seconds
of the server's processes. Counts (statements, buffers, WAL) do not depend on the machine's load;
times do, so the load average is printed beside them.

    python -m effect_ledger_bench.pgstats --url postgresql://owner@host:port/db --kind service
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from effect_ledger_bench.database import Endpoint
from effect_ledger_bench.limit import pgbench_path, script, variables
from effect_ledger_bench.workload import TENANT

# The lean yardstick's schema (issue 20): the cycle's durable work on the least a ledger needs, one
# operation row with its primary key and three secondary indexes, and its chained event rows. No
# checks, foreign key, trigger or row-level security. Same column names as ledger.operations, so the
# yardstick's statements (bench/queries.sql, bench_yardstick_*) run on it unchanged.
LEAN_SCHEMA = r"""
DROP SCHEMA IF EXISTS ledger CASCADE;
CREATE SCHEMA ledger;
CREATE TABLE ledger.operations (
    tenant_id text NOT NULL, operation_id text NOT NULL, principal text NOT NULL, tool text NOT NULL,
    tool_version text NOT NULL, intent_digest text NOT NULL, status text NOT NULL, attempt integer NOT NULL,
    claim_token_hash bytea NOT NULL, client_nonce_hash bytea, sealed_token bytea,
    lease_seconds integer NOT NULL, lease_expires_at timestamptz, effect_ref text, receipt jsonb,
    not_applied_reason jsonb, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
    submitted_at timestamptz, resolved_at timestamptz, resolved_by text,
    chain_seq integer NOT NULL, chain_hash text NOT NULL,
    PRIMARY KEY (tenant_id, operation_id)
);
CREATE INDEX operations_by_status ON ledger.operations (tenant_id, status, created_at, operation_id);
CREATE INDEX operations_by_created ON ledger.operations (tenant_id, created_at, operation_id);
CREATE INDEX operations_submitted_lease ON ledger.operations (lease_expires_at) WHERE status = 'submitted';
CREATE TABLE ledger.events (
    tenant_id text NOT NULL, operation_id text NOT NULL, seq integer NOT NULL, at timestamptz NOT NULL,
    kind text NOT NULL, actor text NOT NULL, from_status text, to_status text, attempt integer NOT NULL,
    data jsonb NOT NULL, prev_hash text NOT NULL, hash text NOT NULL,
    PRIMARY KEY (tenant_id, operation_id, seq)
);
"""

APPLICATION = "effect-ledger-pgstats"
STATEMENTS = """
SELECT toplevel, calls, total_exec_time, shared_blks_hit, shared_blks_read, shared_blks_dirtied,
       shared_blks_written, wal_records, wal_bytes, regexp_replace(query, '\\s+', ' ', 'g')
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query !~* 'pg_stat|pg_current_wal' ORDER BY total_exec_time DESC
"""
FUNCTIONS = """
SELECT schemaname || '.' || funcname, calls, total_time, self_time FROM pg_stat_user_functions
ORDER BY self_time DESC
"""
TABLES = """
SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE n_tup_ins + n_tup_upd > 0 ORDER BY relname
"""


@dataclass(frozen=True)
class Report:
    """What one measured run printed, kept for the figures a caller compares."""

    kind: str
    cycles: int
    wal_bytes_per_cycle: float
    buffers_per_cycle: float  # shared buffers hit + read by top-level statements
    statements_per_cycle: float  # every statement executed, nested ones included
    postgres_cpu_ms_per_cycle: float | None
    text: str


def _reset(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_stat_statements_reset()")
    conn.execute("SELECT pg_stat_reset()")
    conn.execute("SELECT pg_stat_reset_shared('wal')")


def _lsn(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def measure(owner_url: str, kind: str, cycles: int, run: int = 1) -> Report:
    """Run `cycles` cycles of `kind` on one pgbench client and read the statistics per cycle."""
    endpoint = Endpoint.runtime(owner_url)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if kind == "lean":
            conn.execute(LEAN_SCHEMA)
            conn.execute("GRANT USAGE ON SCHEMA ledger TO effect_ledger_runtime")
            conn.execute(
                "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA ledger TO effect_ledger_runtime"
            )
        _reset(conn)
        start = _lsn(conn)
        load_before = os.getloadavg()
        script_kind = "yardstick" if kind == "lean" else kind
        cpu = _backend_cpu_while(owner_url, lambda: _pgbench(endpoint, cycles, run, script_kind))
        load_after = os.getloadavg()
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (start,)
        ).fetchone()
        assert row is not None
        wal = float(row[0]) / cycles
        statements = conn.execute(STATEMENTS).fetchall()
        functions = conn.execute(FUNCTIONS).fetchall()
        tables = conn.execute(TABLES).fetchall()
    lines = [
        f"== {kind}: {cycles} cycles, 1 client;"
        f" load average before {load_before[0]:.2f}, after {load_after[0]:.2f}",
        f"WAL bytes per cycle (insert LSN): {wal:.0f}",
    ]
    if cpu is not None:
        lines.append(
            f"PostgreSQL CPU per cycle: {cpu / cycles * 1000:.3f} ms (its backend; a guide: load-dependent)"
        )
    lines.append("per cycle:  calls   exec_ms  buf_hit  buf_read dirtied  wal_rec  wal_bytes  top  statement")
    top_buffers = 0.0
    executed = 0.0
    for toplevel, calls, ms, hit, read, dirtied, _written, wal_rec, wal_b, query in statements:
        executed += calls / cycles
        if toplevel:
            top_buffers += (hit + read) / cycles
        lines.append(
            f"  {calls / cycles:9.2f} {ms / cycles:9.4f} {hit / cycles:8.1f} {read / cycles:8.1f}"
            f" {dirtied / cycles:7.2f} {wal_rec / cycles:8.1f} {float(wal_b) / cycles:10.0f}"
            f"  {'T' if toplevel else ' '}    {query[:110]}"
        )
    lines.append(
        f"statements executed per cycle (nested included): {executed:.1f};"
        f" shared buffers per cycle (top level): {top_buffers:.1f}"
    )
    lines.append("functions per cycle:  calls  total_ms  self_ms")
    for name, calls, total, self_time in functions:
        lines.append(f"  {calls / cycles:8.2f} {total / cycles:9.4f} {self_time / cycles:8.4f}  {name}")
    lines.append("tables: inserted, updated, HOT-updated (whole run)")
    for name, ins, upd, hot in tables:
        lines.append(f"  {name}: {ins} {upd} {hot}")
    per_cycle = None if cpu is None else cpu / cycles * 1000
    return Report(kind, cycles, wal, top_buffers, executed, per_cycle, "\n".join(lines))


def _backend_cpu_while(owner_url: str, work: Callable[[], None]) -> float | None:
    """CPU seconds of the pgbench client's backend while `work` runs: its /proc schedstat (ns on CPU),
    sampled every 5 ms until it ends (a server on this machine only; None otherwise)."""
    seen: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(owner_url, autocommit=True) as watcher:
            while not done.is_set():
                for (pid,) in watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION,)
                ).fetchall():
                    try:
                        seen[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
                    except (FileNotFoundError, ProcessLookupError):
                        pass
                time.sleep(0.005)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        work()
    finally:
        done.set()
        watcher.join(timeout=10)
    return sum(seen.values()) / 1e9 if seen else None


def _pgbench(endpoint: Endpoint, cycles: int, run: int, kind: str) -> None:
    """`cycles` transactions of the `kind` script on one client (prepared, like asyncpg)."""
    binary = pgbench_path()
    if binary is None:
        raise RuntimeError("pgbench not found")
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / f"cycle-{kind}.pgbench"
        path.write_text(script(kind))
        argv = [
            binary,
            "-n",
            "-M",
            "prepared",
            "-c",
            "1",
            "-t",
            str(cycles),
            "-f",
            str(path),
            "-U",
            endpoint.user,
        ]
        if endpoint.host:
            argv += ["-h", endpoint.host]
        if endpoint.port:
            argv += ["-p", str(endpoint.port)]
        for name, value in variables(run).items():
            argv += ["-D", f"{name}={value}"]
        argv.append(endpoint.dbname)
        env = {
            **os.environ,
            "PGPASSWORD": endpoint.password,
            "PGOPTIONS": f"-c effect_ledger.tenant={TENANT}",
            "PGAPPNAME": APPLICATION,
        }
        # argv is built here from pgbench_path() and our own values, never from outside input
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)  # noqa: S603
        if done.returncode != 0 or "number of failed transactions: 0" not in done.stdout:
            raise RuntimeError(
                f"pgbench failed ({done.returncode}):\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
            )


def main() -> None:
    """Print one report per --kind given, in order (alternate them to compare on one server)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the owner URL of a migrated database")
    parser.add_argument("--kind", action="append", required=True, help="service | yardstick | lean")
    parser.add_argument("--cycles", type=int, default=2000)
    args = parser.parse_args()
    for n, kind in enumerate(args.kind, start=1):
        print(measure(args.url, kind, args.cycles, run=n + os.getpid() % 1000 * 10).text, flush=True)


if __name__ == "__main__":
    main()
