"""One bench run: the limit, the floors, the service, replay, contention and growth, in that order."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.database import Cluster, Endpoint
from effect_ledger_bench.floor import run_floor
from effect_ledger_bench.generator import START_MARGIN, Generator
from effect_ledger_bench.growth import load_history, table_sizes
from effect_ledger_bench.journal import JournalConfig, run_journal
from effect_ledger_bench.limit import KINDS, run_pgbench
from effect_ledger_bench.neighbour import (
    FLOOD_PRINCIPAL,
    FLOOD_TASKS,
    FLOOD_TENANT,
    QUIET_EXECUTORS,
    neighbour_rows,
)
from effect_ledger_bench.procs import machine, tree_cpu_seconds
from effect_ledger_bench.report import (
    CLAIM_P99_MS,
    GROWTH_P50_FACTOR,
    RSS_PER_WORKER_MB,
    SERVICE_CPU_PER_CYCLE_MS,
    SERVICE_TO_LIMIT,
    Row,
    mib,
    render,
    verdict,
)
from effect_ledger_bench.service import ServiceProcess
from effect_ledger_bench.stats import CALLS, LoadResult
from effect_ledger_bench.workload import PRINCIPAL, SCOPE, TENANT


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and durations of one run (the full run by default; `smoke()` for the test suite)."""

    duration: float = 20.0
    warmup: float = 5.0
    concurrency: int = 16
    growth_sizes: tuple[int, ...] = (0, 1_000_000, 5_000_000)
    growth_duration: float = 10.0
    replay_duration: float = 10.0
    contention_executors: int = 64
    hot_ids: int = 100
    workers: int = 2
    generator: str = "auto"
    database_url: str | None = None
    journal_duration: float = 10.0
    journal_records: int = 1000  # records per projected journal session
    journal_sessions: int = 16

    @classmethod
    def smoke(cls) -> BenchConfig:
        """Tiny sizes: proves every row runs, in seconds; its figures mean nothing."""
        return cls(
            duration=1.0,
            warmup=0.0,
            growth_sizes=(0, 2000),
            growth_duration=1.0,
            replay_duration=1.0,
            contention_executors=8,
            hot_ids=10,
            workers=1,
            journal_duration=1.0,
            journal_records=60,
            journal_sessions=2,
        )


@dataclass
class Probe:
    """CPU of the server and of PostgreSQL, and worker memory, across one measured window."""

    service: ServiceProcess
    postmaster: int | None
    started: float = 0.0
    service_cpu: float = 0.0
    postgres_cpu: float | None = None
    rss: list[float] = field(default_factory=list)

    def begin(self) -> None:
        """The window opens."""
        self.started = time.monotonic()
        self.service_cpu = -self.service.cpu_seconds()
        self.postgres_cpu = -tree_cpu_seconds(self.postmaster) if self.postmaster else None

    def end(self) -> None:
        """The window closes (memory is read now, at steady load)."""
        self.rss = self.service.rss_mb()
        self.service_cpu += self.service.cpu_seconds()
        if self.postmaster and self.postgres_cpu is not None:
            self.postgres_cpu += tree_cpu_seconds(self.postmaster)


def progress(message: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def errors_note(result: LoadResult) -> str:
    """Unexpected answers, or that there were none."""
    if not result.errors:
        return "0 errors"
    return "errors " + ", ".join(f"{k}: {v}" for k, v in sorted(result.errors.items()))


class Bench:
    """State shared by the phases of one run."""

    def __init__(self, config: BenchConfig, cluster: Cluster, workdir: Path) -> None:
        self.config = config
        self.cluster = cluster
        self.workdir = workdir
        self.cores = os.cpu_count() or 1
        self.secret = secrets.token_urlsafe(48)
        settings = Settings.from_env()
        executors = max(config.concurrency, config.contention_executors)
        self.tokens = [
            mint_token(self.secret, TENANT, PRINCIPAL, SCOPE, settings, 6 * 3600) for _ in range(executors)
        ]
        self.rows: list[Row] = []
        self.deferred: list[Row] = []
        self.limit_rate = self.previous_limit_rate = self.floor_rate = self.service_rate = 0.0
        self.service_cpu_per_cycle_ms = float("nan")
        self.generator_name = "n/a"

    def add(self, row: Row) -> None:
        """Keep a row for the table, and show its figure now."""
        self.rows.append(row)
        lat = f" p50 {row.latency.p50:.1f} ms p99 {row.latency.p99:.1f} ms" if row.latency else ""
        progress(f"  {row.name}: {row.rate}{lat} {row.target}".rstrip())

    def generator(self, service: ServiceProcess) -> Generator:
        """A load generator aimed at `service`."""
        gen = Generator(service.host, service.port, self.tokens, self.workdir, self.config.generator)
        self.generator_name = "wrk (Lua)" if gen.uses_wrk else f"Python x{gen.processes} processes"
        return gen

    async def measured_cycles(
        self, gen: Generator, probe: Probe, warmup: float, duration: float, prefix: str
    ) -> LoadResult:
        """Cycles by the configured executors, with the probe around the measured window."""
        if gen.uses_wrk:
            if warmup > 0:
                await gen.cycles(self.config.concurrency, 0.0, warmup, f"{prefix}w")
            probe.begin()
            result = await gen.cycles(self.config.concurrency, 0.0, duration, prefix)
            probe.end()
            return result

        async def watch() -> None:
            await asyncio.sleep(warmup + START_MARGIN)  # the generator processes start, then warm up
            probe.begin()
            await asyncio.sleep(duration)
            probe.end()

        watcher = asyncio.create_task(watch())
        result = await gen.cycles(self.config.concurrency, warmup, duration, prefix)
        await watcher
        return result

    async def limit(self, url: str) -> None:
        """1. pgbench: the one-statement yardstick (the limit), the service's SQL, the previous SQL."""
        c = self.config
        endpoint = Endpoint.runtime(url)
        names = {
            "yardstick": "limit: pgbench, one statement per call",
            "service": "pgbench, the service's SQL (1 function call per call)",
            "previous": "old limit: pgbench, previous SQL (4-5 statements per call)",
        }
        for number, kind in enumerate(KINDS):
            progress(f"{names[kind]}: {c.concurrency} clients, {c.warmup:g} s warm-up + {c.duration:g} s")
            base = 10 * (number + 1)  # op IDs unique per script and run
            if c.warmup >= 1:
                await run_pgbench(endpoint, self.workdir, c.concurrency, c.warmup, base + 1, None, kind)
            r = await run_pgbench(
                endpoint, self.workdir, c.concurrency, c.duration, base + 2, self.cluster.postmaster, kind
            )
            if kind == "yardstick":
                self.limit_rate = r.cycles_per_second
            if kind == "previous":
                self.previous_limit_rate = r.cycles_per_second
            pg = "" if r.postgres_cpu is None else f", PostgreSQL {r.postgres_cpu / r.seconds:.2f} cores"
            cycles = max(r.cycles_per_second * r.seconds, 1)
            per_cycle = "" if r.postgres_cpu is None else f", {r.postgres_cpu / cycles * 1000:.2f} ms/cycle"
            self.add(
                Row(
                    "1",
                    f"{names[kind]}, {c.concurrency} clients",
                    f"{r.cycles_per_second:,.0f} cycles/s",
                    notes=f"mean {r.latency_ms:.1f} ms/cycle, {r.failed} failed, "
                    f"pgbench {r.pgbench_cpu / r.seconds:.2f} cores{pg}{per_cycle}",
                )
            )

    async def floors(self, url: str) -> None:
        """2. asyncpg in one process: the bare statements, then the repository functions."""
        c = self.config
        for kind, name in (
            ("statements", "floor: asyncpg, same statements"),
            ("repository", "floor: asyncpg + repository/domain"),
        ):
            progress(f"{name}, {c.concurrency} tasks")
            r = await run_floor(url, kind, c.concurrency, c.warmup, c.duration, f"floor-{kind}")
            if kind == "statements":
                self.floor_rate = r.cycle_rate
            self.add(
                Row(
                    "2",
                    f"{name}, 1 process",
                    f"{r.cycle_rate:,.0f} cycles/s",
                    r.latency("cycle"),
                    notes="latency per cycle (3 transactions), no HTTP",
                )
            )

    async def service_phase(self, url: str) -> None:
        """3-5. The service over HTTP: cycles, replays, contention."""
        c = self.config
        service = ServiceProcess(url, self.secret, c.workers, self.workdir)
        progress(f"service: serve --workers {c.workers}")
        await service.start()
        try:
            gen = self.generator(service)
            probe = Probe(service, self.cluster.postmaster)
            progress(
                f"service: {c.concurrency} executors via {self.generator_name}, {c.warmup:g} s warm-up"
                f" + {c.duration:g} s"
            )
            r = await self.measured_cycles(gen, probe, c.warmup, c.duration, "cyc")
            self.service_rate = r.cycle_rate
            self._service_rows(r, probe)
            await self.replay(gen, url)
            await self.contention(gen)
            await self.neighbour(gen)
            await self.journal(service, url)
        finally:
            await service.stop()

    def _service_rows(self, r: LoadResult, probe: Probe) -> None:
        c = self.config
        window = max(r.window, 1e-9)
        self.add(
            Row(
                "3",
                f"service: full cycles, {c.concurrency} executors",
                f"{r.cycle_rate:,.0f} cycles/s",
                notes=f"serve --workers {c.workers}, {c.duration:g} s after {c.warmup:g} s warm-up, "
                f"{errors_note(r)}",
            )
        )
        for call in CALLS:
            lat = r.latency(call)
            target = ""
            if call == "claim":
                target = f"p99 <= {CLAIM_P99_MS:g} ms: {verdict(lat.p99 <= CLAIM_P99_MS)}"
            self.add(Row("3", f"service: {call}", f"{lat.count / window:,.0f} calls/s", lat, target=target))
        share = r.generator_cpu / (window * self.cores)
        self.add(
            Row(
                "3",
                "service: load generator CPU",
                f"{share:.0%} of {self.cores} cores",
                notes=self.generator_name,
            )
        )
        cycles = max(r.cycles, 1)
        pg_cpu = probe.postgres_cpu
        pg = "n/a" if pg_cpu is None else f"{pg_cpu / cycles * 1000:.2f} ms"
        pg_cores = "" if pg_cpu is None else f", PostgreSQL {pg_cpu / window:.2f} cores"
        self.service_cpu_per_cycle_ms = probe.service_cpu / cycles * 1000
        ok = self.service_cpu_per_cycle_ms <= SERVICE_CPU_PER_CYCLE_MS
        self.add(
            Row(
                "3",
                "service: CPU per cycle",
                f"service {self.service_cpu_per_cycle_ms:.2f} ms",
                target=f"<= {SERVICE_CPU_PER_CYCLE_MS:g} ms: {verdict(ok)}",
                notes=f"PostgreSQL {pg}; service {probe.service_cpu / window:.2f} cores{pg_cores}",
            )
        )
        worst = max(probe.rss, default=float("nan"))
        self.add(
            Row(
                "3",
                "service: RSS per worker",
                " / ".join(f"{m:.0f} MiB" for m in probe.rss),
                target=f"<= {RSS_PER_WORKER_MB:g} MiB: {verdict(worst <= RSS_PER_WORKER_MB)}",
                notes="at the end of the measured window",
            )
        )

    async def replay(self, gen: Generator, url: str) -> None:
        """4. Claims of committed IDs: answered with the stored receipt."""
        c = self.config
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                await conn.fetchrow(sql("tenant_context"), TENANT)
                rows = await conn.fetch(sql("bench_committed_ids"), TENANT, "cyc-", 20000)
                ids = [r["operation_id"] for r in rows]
        finally:
            await conn.close()
        progress(f"replay: {c.concurrency} executors, {len(ids):,} committed IDs, {c.replay_duration:g} s")
        r = await gen.replays(c.concurrency, c.replay_duration, "rep", ids)
        self.add(
            Row(
                "4",
                "replay: claims of committed IDs",
                f"{r.request_rate:,.0f} req/s",
                r.latency("claim"),
                notes=f"200 reuse_receipt expected, {errors_note(r)}",
            )
        )

    async def contention(self, gen: Generator) -> None:
        """5. Many executors racing for few IDs: exactly one 201 per ID, every other answer 409."""
        c = self.config
        hot = [f"hot-{secrets.token_hex(4)}-{i}" for i in range(c.hot_ids)]
        progress(f"contention: {c.contention_executors} executors racing on {c.hot_ids} IDs")
        r = await gen.contention(c.contention_executors, hot)
        exact = sum(
            1
            for op in hot
            if r.outcomes.get(op, {}).get("201") == 1
            and r.outcomes[op].get("409", 0) == c.contention_executors - 1
        )
        ok = exact == len(hot)
        self.add(
            Row(
                "5",
                f"contention: {c.contention_executors} executors, {c.hot_ids} hot IDs",
                f"{r.request_rate:,.0f} req/s",
                r.latency("claim"),
                target=f"1 winner per ID: {'correct' if ok else 'INCORRECT'}",
                notes=f"{exact}/{len(hot)} IDs with exactly one 201 and {c.contention_executors - 1} x 409",
            )
        )

    async def neighbour(self, gen: Generator) -> None:
        """8. The quiet tenant's claim p99 alone and beside a tenant flooding far above its limit."""
        c = self.config
        progress(
            f"neighbour: {QUIET_EXECUTORS} quiet executors alone, then beside a flood of "
            f"{FLOOD_TASKS} connections, {c.replay_duration:g} s each"
        )
        token = mint_token(self.secret, FLOOD_TENANT, FLOOD_PRINCIPAL, SCOPE, Settings.from_env(), 6 * 3600)
        for row in await neighbour_rows(gen, token, min(c.warmup, 2.0), c.replay_duration):
            self.add(row)

    async def journal(self, service: ServiceProcess, url: str) -> None:
        """9. The run journal: appends and projections, over HTTP and on asyncpg alone."""
        c = self.config
        settings = Settings.from_env()
        journal = JournalConfig(
            c.concurrency, c.concurrency, c.warmup, c.journal_duration, c.journal_records, c.journal_sessions
        )

        def token_for(tenant: str, sub: str, scope: str) -> str:
            return mint_token(self.secret, tenant, sub, scope, settings, 6 * 3600)

        base_url = f"http://{service.host}:{service.port}"
        # measured while this service runs, printed after the ratios (row 9 follows 7)
        self.deferred = await run_journal(url, base_url, token_for, journal, progress)

    async def growth(self) -> None:
        """6. The claim with 0, 1M, 5M operations already in the table (a fresh database)."""
        c = self.config
        url = await self.cluster.create("effect_ledger_bench_growth")
        service = ServiceProcess(url, self.secret, c.workers, self.workdir)
        await service.start()
        have, empty_p50 = 0, None
        smallest = min(c.growth_sizes)
        baseline = "empty" if smallest == 0 else f"{smallest:,} rows"
        try:
            gen = self.generator(service)
            for size in sorted(set(c.growth_sizes)):
                if size > have:
                    progress(f"growth: COPY-loading history up to {size:,} operations")
                    seconds = await load_history(url, have, size)
                    progress(f"growth: loaded and analysed in {seconds:.0f} s")
                    have = size
                progress(f"growth: {size:,} rows, {c.growth_duration:g} s of cycles")
                probe = Probe(service, None)
                r = await self.measured_cycles(gen, probe, min(c.warmup, 2.0), c.growth_duration, f"g{size}")
                claim = r.latency("claim")
                empty_p50 = claim.p50 if empty_p50 is None else empty_p50
                sizes = "; ".join(
                    f"{t.name} {mib(t.heap_bytes)} + indexes {mib(t.index_bytes)}"
                    for t in await table_sizes(url)
                )
                target = ""
                if size == max(c.growth_sizes) and size > 0:
                    factor = claim.p50 / empty_p50
                    ok = verdict(factor <= GROWTH_P50_FACTOR)
                    target = f"p50 <= {GROWTH_P50_FACTOR:g} x {baseline}: {ok} ({factor:.2f}x)"
                self.add(
                    Row(
                        "6",
                        f"growth: {size:,} rows, claim",
                        f"{r.cycle_rate:,.0f} cycles/s",
                        claim,
                        target=target,
                        notes=sizes,
                    )
                )
        finally:
            await service.stop()

    def ratios(self) -> None:
        """7. Service over limit and over floor, last."""
        to_limit = self.service_rate / self.limit_rate if self.limit_rate else float("nan")
        previous = self.previous_limit_rate
        to_previous = self.service_rate / previous if previous else float("nan")
        to_floor = self.service_rate / self.floor_rate if self.floor_rate else float("nan")
        self.add(
            Row(
                "7",
                "ratio service/limit",
                f"{to_limit:.2f}",
                target=f">= {SERVICE_TO_LIMIT:.2f}: {verdict(to_limit >= SERVICE_TO_LIMIT)}",
                notes="limit = one statement per call",
            )
        )
        self.add(
            Row(
                "7",
                "ratio service/old limit",
                f"{to_previous:.2f}",
                notes="old limit = previous SQL, 4-5 statements per call",
            )
        )
        self.add(Row("7", "ratio service/floor", f"{to_floor:.2f}", notes="floor = asyncpg, same statements"))
        for row in self.deferred:
            self.add(row)

    def title(self) -> list[str]:
        """Lines above the table: machine, server, shape of the run."""
        c = self.config
        where = "embedded" if self.cluster.postmaster and not c.database_url else "EFFECT_LEDGER_DATABASE_URL"
        return [
            f"effect-ledger bench: {machine().describe()}",
            f"PostgreSQL {self.cluster.version} ({where}); serve --workers {c.workers}; "
            f"{c.concurrency} executors; load generator {self.generator_name}",
        ]


async def run_bench(config: BenchConfig) -> str:
    """Run every measurement once and return the printed report."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-bench-run-"))
    cluster = await Cluster.open(config.database_url)
    try:
        bench = Bench(config, cluster, workdir)
        url = await cluster.create("effect_ledger_bench")
        phases: list[Callable[[], Awaitable[None]]] = [
            lambda: bench.limit(url),
            lambda: bench.floors(url),
            lambda: bench.service_phase(url),
            bench.growth,
        ]
        for phase in phases:
            await phase()
        bench.ratios()
        return render(bench.title(), bench.rows)
    finally:
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
