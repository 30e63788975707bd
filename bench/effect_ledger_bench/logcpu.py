"""What the receipts log costs per receipt: the integrator's and the checkpointer's Python, and the CPU of
the PostgreSQL backend serving them.

    python -m effect_ledger_bench.logcpu --receipts 3000 [--rounds 5] [--batch 1000]

Each round, on a fresh database (embedded, or EFFECT_LEDGER_DATABASE_URL's server): `--warmup` receipts
are committed through the app in process (inprocess.cycles, 16 executors, the log off), integrated and
signed (the connection's statements prepared, the signer's key made); then `--receipts` more are
committed, and measured: their feed positions handed out (`sequence`, the first step of an integrator's
pass, here apart), the integrator's passes (`integrate`, `--batch` receipts a pass, until caught
up), then one checkpointer pass (`checkpoint`, the in-process signer; it also audits the warm-up's
entries, as every checkpoint audits up to AUDIT_BUNDLES bundles of the signed log). Printed per round
and as medians: Python CPU per receipt (`time.process_time` of this process, which does nothing else
meanwhile) and the backend's CPU per receipt (procs.tree_cpu_seconds of pg_backend_pid(), so only
on a server of this machine), for integrating and checkpointing apart, and the load average.

CPU time is steadier than wall time on a shared machine, not steady: compare the medians of several
rounds taken in one sitting. Not part of `effect-ledger bench`; it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import tempfile
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, fields, replace
from pathlib import Path

import asyncpg

from effect_ledger.db import receipt_log
from effect_ledger.db.maintenance import owner_connection
from effect_ledger.db.receipt_log import FEED_BATCH
from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger.signer import signer_from_settings
from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.database import Cluster
from effect_ledger_bench.inprocess import Driver, Lifespan, cycles
from effect_ledger_bench.procs import tree_cpu_seconds  # a backend has no children: its own CPU
from effect_ledger_bench.workload import PRINCIPAL, SCOPE, TENANT

CONCURRENCY = 16  # executors committing, as the bench's load: their events interleave in the tables


@dataclass(frozen=True)
class Round:
    """One round's figures, microseconds of CPU per receipt."""

    sequence_py: float
    sequence_pg: float
    integrate_py: float
    integrate_pg: float
    checkpoint_py: float
    checkpoint_pg: float
    load: float

    def line(self, n: int) -> str:
        """The printed line of round n."""
        return (
            f"round {n}: sequence {self.sequence_py:.1f} us Python + {self.sequence_pg:.1f} us PostgreSQL;"
            f" integrate {self.integrate_py:.1f} us Python + {self.integrate_pg:.1f} us PostgreSQL"
            f" per receipt; checkpoint {self.checkpoint_py:.1f} us Python + {self.checkpoint_pg:.1f} us"
            f" PostgreSQL per receipt; load average {self.load:.2f}"
        )


async def commit(settings: Settings, secret: str, count: int, prefix: str) -> None:
    """`count` receipts of TENANT committed through the app in process (the log off)."""
    from effect_ledger.http.app import create_app

    tokens = [mint_token(secret, TENANT, PRINCIPAL, SCOPE, settings, 3600) for _ in range(CONCURRENCY)]
    with open(os.devnull, "w") as sink, redirect_stdout(sink):  # noqa: ASYNC230 - the app's log lines
        app = create_app(settings, jwt_secret=secret)
        async with Lifespan(app):
            statuses = await cycles(Driver(app), tokens, count, CONCURRENCY, prefix)
    if statuses.get("complete 200") != count:
        raise RuntimeError(f"not every cycle committed: {statuses}")


async def sequence(conn: asyncpg.Connection) -> None:
    """Feed positions for every receipt of TENANT that has none, FEED_BATCH a transaction (what the
    integrator's pass does first, before it reads the batch to log)."""
    while True:
        async with conn.transaction():
            await conn.fetchrow(sql("tenant_context"), TENANT)
            last = await conn.fetchval(sql("feed_lock"), TENANT)
            if await conn.fetchval(sql("feed_assign"), TENANT, last, FEED_BATCH) < FEED_BATCH:
                return


async def log_all(
    conn: asyncpg.Connection, settings: Settings, config: receipt_log.LogConfig, guard: receipt_log.LogGuard
) -> tuple[float, float, float, float, float, float, int]:
    """Sequence, integrate until caught up, then one checkpoint: (Python s, backend s) of each, then the
    signed size. The backend's CPU is read outside the Python window: psutil's scan of the process
    table costs ~1.5 ms of this process's CPU (until round 17 the first read fell inside it)."""
    pid = int((await conn.fetchrow(sql("bench_server")))["backend_pid"])
    signer = signer_from_settings(settings)
    pg, py = tree_cpu_seconds(pid), time.process_time()
    await sequence(conn)
    sequence_py = time.process_time() - py
    sequence_pg = tree_cpu_seconds(pid) - pg
    pg, py = tree_cpu_seconds(pid), time.process_time()
    while await receipt_log.integrate(conn, settings.log_batch_size, guard) == "full":
        pass
    integrate_py = time.process_time() - py
    integrate_pg = tree_cpu_seconds(pid) - pg
    pg, py = tree_cpu_seconds(pid), time.process_time()
    signed = await receipt_log.checkpoint(conn, signer, config, guard)
    checkpoint_py = time.process_time() - py
    checkpoint_pg = tree_cpu_seconds(pid) - pg
    if guard.tainted or len(signed) != 1:
        raise RuntimeError(f"the checkpoint was refused: {guard.tainted}, signed {signed}")
    return sequence_py, sequence_pg, integrate_py, integrate_pg, checkpoint_py, checkpoint_pg, signed[0][1]


async def one_round(cluster: Cluster, n: int, receipts: int, warmup: int, batch: int, workdir: Path) -> Round:
    """A fresh database: the warm-up logged and signed, then `receipts` more measured."""
    url = await cluster.create(f"effect_ledger_bench_logcpu_{n}")
    environ = {
        "EFFECT_LEDGER_DATABASE_URL": url,
        "EFFECT_LEDGER_LOG_ENABLED": "false",
        "EFFECT_LEDGER_RATE_LIMIT_PER_SECOND": "0",
        "EFFECT_LEDGER_DATA_DIR": str(workdir / f"data-{n}"),  # a fresh signer state per database
    }
    settings = replace(Settings.from_env(environ), database_url=url, log_batch_size=batch)
    secret = secrets.token_urlsafe(48)
    # checkpoint_seconds 0: the measured checkpoint follows the warm-up's at once
    config = receipt_log.LogConfig(settings.log_origin, 0)
    guard = receipt_log.LogGuard()
    await commit(settings, secret, warmup, f"lc{n}w")
    conn = await owner_connection(settings)
    try:
        await log_all(conn, settings, config, guard)
        await commit(settings, secret, receipts, f"lc{n}")
        load = os.getloadavg()[0]
        spy, spg, ipy, ipg, cpy, cpg, size = await log_all(conn, settings, config, guard)
    finally:
        await conn.close()
    if size != warmup + receipts:
        raise RuntimeError(f"signed {size} receipts, expected {warmup + receipts}")
    per = 1e6 / receipts
    cpu = (spy * per, spg * per, ipy * per, ipg * per, cpy * per, cpg * per)
    return Round(*cpu, max(load, os.getloadavg()[0]))


async def main(receipts: int, rounds: int, warmup: int, batch: int) -> None:
    """`rounds` rounds, each line printed as it ends, then the medians."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-logcpu-"))
    cluster = await Cluster.open(os.environ.get("EFFECT_LEDGER_DATABASE_URL"))
    try:
        print(
            f"{receipts} receipts a round, batch {batch}, warm-up {warmup}; PostgreSQL {cluster.version};"
            f" {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; load average"
            f" {os.getloadavg()[0]:.2f} at the start",
            flush=True,
        )
        done = []
        for n in range(rounds):
            done.append(await one_round(cluster, n, receipts, warmup, batch, workdir))
            print(done[-1].line(n), flush=True)
        medians = Round(*(statistics.median(getattr(r, f.name) for r in done) for f in fields(Round)))
        print(medians.line(rounds).replace(f"round {rounds}", f"median of {rounds}"), flush=True)
    finally:
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=3000, help="receipts measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=300, help="receipts logged and signed before")
    parser.add_argument("--batch", type=int, default=1000, help="LOG_BATCH_SIZE of the integrator's passes")
    args = parser.parse_args()
    asyncio.run(main(args.receipts, args.rounds, args.warmup, args.batch))
