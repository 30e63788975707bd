"""One bench run: the limit, the floors, the service, replay, contention and growth, in that order."""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.catalogue import lean_queries, sql
from effect_ledger_bench.counters import Window, load_average
from effect_ledger_bench.database import Cluster, Endpoint
from effect_ledger_bench.floor import run_floor
from effect_ledger_bench.generator import START_MARGIN, Generator
from effect_ledger_bench.growth import load_history, table_sizes
from effect_ledger_bench.httpfloor import FloorProcess
from effect_ledger_bench.inprocess import event_loop_name, run_in_process_as_served
from effect_ledger_bench.journal import JournalConfig, run_journal
from effect_ledger_bench.limit import run_pgbench
from effect_ledger_bench.loglag import LagSampler, settled_note
from effect_ledger_bench.neighbour import (
    FLOOD_PRINCIPAL,
    FLOOD_TASKS,
    FLOOD_TENANT,
    NEIGHBOUR_P99_FACTOR,
    QUIET_EXECUTORS,
    neighbour_rows,
)
from effect_ledger_bench.procs import interpreter, machine
from effect_ledger_bench.report import (
    CLAIM_P99_MS,
    GROWTH_P50_FACTOR,
    LEAN_DRIFT,
    LOG_LAG_P99_S,
    LOG_ON_TO_OFF,
    PG_CPU_TO_LEAN,
    PYTHON_CPU_PER_REQUEST_MS,
    QUIET_LOAD,
    QUIET_OTHER_CORES,
    QUIET_RULE,
    RSS_PER_WORKER_MB,
    SERVICE_TO_LIMIT,
    Row,
    mib,
    ms,
    render,
    verdict,
)
from effect_ledger_bench.service import ServiceProcess
from effect_ledger_bench.stats import CALLS, LoadResult
from effect_ledger_bench.workload import PRINCIPAL, SCOPE, TENANT

# The receipts log's on / off rows, run in this order after the batching-off row: off, on, on, off.
LOG_OFF = {"EFFECT_LEDGER_LOG_ENABLED": "false"}
LOG_ON = {"EFFECT_LEDGER_LOG_ENABLED": "true"}
LOG_ON_ROWS = ("log_on_again", "log_on_third")
LOG_OFF_ROWS = ("log_off", "log_off_again")


def _apart(values: list[float]) -> float:
    """How far apart positive figures of the same measurement are: the largest over the smallest."""
    return max(values) / min(values)


def _rates(layers: list[Layer]) -> str:
    """Rows' cycles/s, `a and b`."""
    return " and ".join(f"{x.rate:,.0f}" for x in layers) or "none"


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and durations of one run (the full run by default; `smoke()` for the test suite).

    The default run measures the layers, the service's calls, replay, contention and the noisy
    neighbour in about five minutes; growth (`--growth-sizes`) and the journal (`--journal`) are
    measured when asked for, since preloading millions of rows takes minutes of its own."""

    duration: float = 10.0
    warmup: float = 3.0
    concurrency: int = 16
    growth_sizes: tuple[int, ...] = ()
    growth_duration: float = 10.0
    replay_duration: float = 6.0
    neighbour_duration: float = 10.0
    contention_executors: int = 64
    hot_ids: int = 100
    # serve's own default: on 2 cores, one worker beside PostgreSQL beat two in the same sitting (723 against
    # 504 cycles/s; docs/performance.md, round 5): one queue makes bigger natural batches
    workers: int = 1
    generator: str = "auto"
    database_url: str | None = None
    journal: bool = False
    journal_duration: float = 10.0
    journal_records: int = 1000  # records per projected journal session
    journal_sessions: int = 16

    @classmethod
    def smoke(cls) -> BenchConfig:
        """Tiny sizes: proves every row runs (0.3 s windows; pgbench's are 1 s), its figures mean nothing."""
        return cls(
            duration=0.3,
            warmup=0.0,
            growth_sizes=(0, 2000),
            growth_duration=0.3,
            replay_duration=0.3,
            neighbour_duration=0.3,
            contention_executors=8,
            hot_ids=10,
            workers=1,
            journal=True,
            journal_duration=0.3,
            journal_records=60,
            journal_sessions=2,
        )


@dataclass
class Layer:
    """One layer's measurement: its rate and what a cycle cost (see counters.Window)."""

    name: str
    cycles: int
    window: Window

    @property
    def rate(self) -> float:
        """Cycles per second."""
        return self.cycles / self.window.seconds if self.window.seconds > 0 else 0.0

    def wal_per_cycle(self) -> float:
        """WAL bytes per cycle."""
        return self.window.wal_bytes / max(self.cycles, 1)

    def pg_ms(self) -> float:
        """PostgreSQL CPU per cycle, ms (NaN when PostgreSQL runs elsewhere)."""
        pg = self.window.postgres_cpu
        return float("nan") if pg is None else pg / max(self.cycles, 1) * 1000


def progress(message: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


async def fresh_lean_tables(url: str) -> None:
    """The lean yardstick's minimal schema, dropped and created empty."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(lean_queries()["lean_schema"])
    finally:
        await conn.close()


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
        self.layers: dict[str, Layer] = {}
        self.neighbour_factor = float("nan")
        self.claim_p99 = float("nan")
        self.log_lags: list[float] = []
        self.service_cpu_per_request_ms = float("nan")
        self.generator_name = "n/a"
        self.load_before = load_average()
        self.load_after = float("nan")

    def add(self, row: Row) -> None:
        """Keep a row for the table, and show its figure now."""
        self.rows.append(row)
        lat = f" p50 {row.latency.p50:.1f} ms p99 {row.latency.p99:.1f} ms" if row.latency else ""
        progress(f"  {row.name}: {row.rate}{lat} {row.target}".rstrip())

    def generator(self, service: ServiceProcess | FloorProcess) -> Generator:
        """A load generator aimed at `service` (or the HTTP floor)."""
        gen = Generator(service.host, service.port, self.tokens, self.workdir, self.config.generator)
        self.generator_name = "wrk (Lua)" if gen.uses_wrk else f"Python x{gen.processes} processes"
        return gen

    async def measured_cycles(
        self, gen: Generator, window: Window, warmup: float, duration: float, prefix: str
    ) -> LoadResult:
        """Cycles by the configured executors, with the window around the measured part."""
        await self.settle()
        if gen.uses_wrk:
            if warmup > 0:
                await gen.cycles(self.config.concurrency, 0.0, warmup, f"{prefix}w")
                await self.analyze()
            await window.open()
            result = await gen.cycles(self.config.concurrency, 0.0, duration, prefix)
            await window.close()  # wrk was reaped inside the window: its CPU is the client's
            return result

        async def watch() -> None:
            await asyncio.sleep(warmup + START_MARGIN)  # the generator processes start, then warm up
            await window.open()
            await asyncio.sleep(duration)
            await window.close()

        watcher = asyncio.create_task(watch())
        result = await gen.cycles(self.config.concurrency, warmup, duration, prefix)
        await watcher
        # the generator processes were still running when the window closed: their CPU inside it is
        # the client's, not the machine's other load
        window.client_cpu += result.generator_cpu
        window.other_cores = max(window.other_cores - result.generator_cpu / max(window.seconds, 1e-9), 0.0)
        return result

    async def analyze(self) -> None:
        """After a layer's warm-up: the tables it changed analysed (Cluster.analyze)."""
        progress(f"  {await self.cluster.analyze()}")

    async def settle(self) -> None:
        """Before each layer's warm-up: changed tables vacuumed, no autovacuum running, a checkpoint."""
        progress(f"  settled: {await self.cluster.settle()}")

    def window(
        self,
        url: str,
        python: Callable[[], float] | None = None,
        log_process: Callable[[], float | None] | None = None,
    ) -> Window:
        """Counters around one measurement; `python`: the CPU of the Python under test (default: ours);
        `log_process`: the part of it that is serve's log process (printed apart)."""
        if python is None:
            return Window(url, self.cluster.postmaster)
        return Window(url, self.cluster.postmaster, python, python_in_self=False, log_process=log_process)

    def layer(self, key: str, name: str, cycles: int, window: Window, extra: str = "") -> None:
        """Keep one layer's figures and print its row."""
        self.layers[key] = layer = Layer(name, cycles, window)
        notes = window.per_cycle(cycles) + (f"; {extra}" if extra else "")
        self.add(Row("1", name, f"{layer.rate:,.0f} cycles/s", notes=notes))

    async def limit(self, url: str) -> None:
        """1a-c. pgbench, 16 clients, one statement per call: the lean yardstick, the yardstick on our
        tables, our SQL (one write-path function call per call)."""
        await fresh_lean_tables(url)
        rows = (
            ("lean", "lean", "lean yardstick: minimal schema, pgbench"),
            ("ours", "yardstick", "yardstick on our tables, pgbench"),
            ("sql", "service", "our SQL (function calls), pgbench"),
        )
        for number, (key, kind, name) in enumerate(rows):
            await self.pgbench_row(url, key, kind, name, 10 * (number + 1))

    async def lean_again(self, url: str) -> None:
        """1f'. The lean yardstick once more, after the full service: the ratios use the mean of both.
        On fresh lean tables, as the first one ran: the two rows then differ by the machine's drift alone.
        (Before each layer the databases are also vacuumed and checkpointed: Cluster.settle.)"""
        await fresh_lean_tables(url)
        await self.pgbench_row(
            url, "lean_again", "lean", "lean yardstick again after the service, pgbench", 40
        )

    async def pgbench_row(self, url: str, key: str, kind: str, name: str, base: int) -> None:
        """One pgbench layer (`base`: keeps op IDs unique per script and run)."""
        c = self.config
        endpoint = Endpoint.runtime(url)
        progress(f"{name}: {c.concurrency} clients, {c.warmup:g} s warm-up + {c.duration:g} s")
        await self.settle()
        if c.warmup >= 1:
            await run_pgbench(endpoint, self.workdir, c.concurrency, c.warmup, base + 1, None, kind)
            await self.analyze()
        window = self.window(url)
        await window.open()
        r = await run_pgbench(
            endpoint, self.workdir, c.concurrency, c.duration, base + 2, self.cluster.postmaster, kind
        )
        await window.close()
        cycles = round(r.cycles_per_second * r.seconds)
        window.python_cpu = None  # no Python in this layer; pgbench's own CPU is the client's
        self.layer(
            key,
            f"{name}, {c.concurrency} clients",
            cycles,
            window,
            f"pgbench {r.pgbench_cpu / max(cycles, 1) * 1000:.2f} ms/cycle, {r.failed} failed",
        )

    async def floors(self, sql_url: str, url: str) -> None:
        """1d-e. In this process: asyncpg alone (the same statements, on the pgbench rows' database),
        then the ASGI app (no socket) on the service's database."""
        c = self.config
        progress(f"asyncpg alone: {c.concurrency} tasks, {c.warmup:g} s warm-up + {c.duration:g} s")
        await self.settle()
        if c.warmup > 0:
            await run_floor(sql_url, "statements", c.concurrency, 0.0, c.warmup, "floor-warm")
            await self.analyze()
        window = self.window(sql_url)
        await window.open()
        r = await run_floor(sql_url, "statements", c.concurrency, 0.0, c.duration, "floor")
        await window.close()
        self.layer("asyncpg", "asyncpg alone, same statements, 1 process", r.cycles, window)
        progress(f"ASGI app in process: {c.concurrency} executors, {c.duration:g} s, {event_loop_name()}")
        await self.settle()
        window = self.window(url)
        warm = max(int(c.warmup * 300), 30)
        app = await run_in_process_as_served(
            url, 900, c.concurrency, warm, "asgi", c.duration, window, str(self.workdir / "serve-data")
        )
        unexpected = {k: v for k, v in app.statuses.items() if not k.endswith((" 200", " 201"))}
        self.layer(
            "asgi",
            "ASGI app in process (no HTTP server), 1 process",
            app.cycles,
            window,
            f"{app.cpu_per_request_ms:.3f} ms Python per request ({event_loop_name()}); a 429 before routing "
            f"{app.refusal_cpu_us:.0f} us ({app.refusals} refused); "
            + (f"unexpected {unexpected}" if unexpected else "0 errors"),
        )
        self.asgi_refusal_us = app.refusal_cpu_us

    async def http_floor(self, sql_url: str) -> None:
        """1e'. The Python HTTP floor (httpfloor.py: a bare HTTP server sending the lean yardstick's
        statements, one process) under the same load as the service, on fresh lean tables."""
        c = self.config
        await fresh_lean_tables(sql_url)
        floor = FloorProcess(sql_url, c.concurrency)
        progress(f"Python HTTP floor: {c.concurrency} executors, {c.warmup:g} s warm-up + {c.duration:g} s")
        await floor.start()
        try:
            gen = self.generator(floor)
            window = self.window(sql_url, floor.cpu_seconds)
            r = await self.measured_cycles(gen, window, c.warmup, c.duration, "flr")
            self.layer(
                "http_floor",
                "Python HTTP floor: lean statements over HTTP, 1 process",
                r.cycles,
                window,
                f"{self.generator_name}, {errors_note(r)}; claim p99 {ms(r.latency('claim').p99)} ms",
            )
        finally:
            await floor.stop()

    async def service_phase(self, url: str) -> None:
        """1f, 2-5. The service over HTTP: full cycles (the last layer), its calls, replays, contention,
        the noisy neighbour, and (asked for) the journal."""
        c = self.config
        service = ServiceProcess(url, self.secret, c.workers, self.workdir)
        progress(f"service: serve --workers {c.workers}")
        await service.start()
        try:
            # the ASGI row's last receipts first, so that this row's window does not integrate them
            caught_up = await settled_note(url, TENANT)
            gen = self.generator(service)
            window = self.window(url, service.cpu_seconds, service.log_cpu_seconds)
            progress(
                f"service: {c.concurrency} executors via {self.generator_name}, {c.warmup:g} s warm-up"
                f" + {c.duration:g} s"
            )
            lag = LagSampler(url, TENANT)
            await lag.start()
            r = await self.measured_cycles(gen, window, c.warmup, c.duration, "cyc")
            rss, log_rss = service.rss_mb(), service.rss_mb(log_process=True)
            self.log_lags = await lag.finish()
            self._service_rows(r, window, rss, log_rss, caught_up)
            await self.replay(gen, url)
            await self.contention(gen)
            await self.neighbour(gen)
            if c.journal:
                await self.journal(service, url)
        finally:
            await service.stop()

    async def variant_phase(
        self, url: str, key: str, name: str, env: dict[str, str], prefix: str, settled: bool = False
    ) -> None:
        """1g-h. The full service again with one setting changed (natural batching off, the receipts
        log off), in the same run, measured after the main row on the same tables. `settled`: first wait
        until the receipts log has caught up on the receipts committed while it was off, and signed them
        (the log-on-again row: otherwise its window pays the log-off row's integration and checkpoint,
        counted as the log's cost; loglag.settle)."""
        c = self.config
        service = ServiceProcess(url, self.secret, c.workers, self.workdir, env)
        progress(f"service, {name}: serve with {' '.join(f'{k}={v}' for k, v in env.items())}")
        await service.start()
        try:
            caught_up = await settled_note(url, TENANT) if settled else ""
            gen = self.generator(service)
            window = self.window(url, service.cpu_seconds, service.log_cpu_seconds)
            r = await self.measured_cycles(gen, window, c.warmup, c.duration, prefix)
            self.layer(
                key,
                f"full service, {name}, {c.concurrency} executors",
                r.cycles,
                window,
                f"{self.generator_name}, {errors_note(r)}; claim p99 {ms(r.latency('claim').p99)} ms"
                + caught_up,
            )
        finally:
            await service.stop()

    def _service_rows(
        self, r: LoadResult, window: Window, rss: list[float], log_rss: list[float], caught_up: str
    ) -> None:
        c = self.config
        self.layer(
            "service",
            f"full service: serve --workers {c.workers}, {c.concurrency} executors over HTTP",
            r.cycles,
            window,
            f"{self.generator_name}, {errors_note(r)}{caught_up}",
        )
        cycles = max(r.cycles, 1)
        self.service_cpu_per_request_ms = (window.python_cpu or 0.0) / (3 * cycles) * 1000
        for call in CALLS:
            lat = r.latency(call)
            target = ""
            if call == "claim":
                self.claim_p99 = lat.p99
                target = f"p99 <= {CLAIM_P99_MS:g} ms: {verdict(lat.p99 <= CLAIM_P99_MS)}"
            rate = f"{lat.count / max(r.window, 1e-9):,.0f} calls/s"
            self.add(Row("2", f"service: {call}", rate, lat, target=target))
        share = r.generator_cpu / (max(r.window, 1e-9) * self.cores)
        self.add(
            Row(
                "2",
                "service: load generator CPU",
                f"{share:.0%} of {self.cores} cores",
                notes=self.generator_name,
            )
        )
        worst = max(rss, default=float("nan"))
        self.add(
            Row(
                "2",
                "service: RSS per worker",
                " / ".join(f"{m:.0f} MiB" for m in rss),
                target=f"<= {RSS_PER_WORKER_MB:g} MiB: {verdict(worst <= RSS_PER_WORKER_MB)}",
                notes="at the end of the measured window"
                + "".join(f"; the log process {m:.0f} MiB" for m in log_rss),
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
        if not ids:  # the service rows committed nothing (a machine far too busy): say so, do not crash
            self.add(Row("3", "replay: claims of committed IDs", "not measured", notes="no committed IDs"))
            return
        r = await gen.replays(c.concurrency, c.replay_duration, "rep", ids)
        self.add(
            Row(
                "3",
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
                "3",
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
            f"{FLOOD_TASKS} connections, {c.neighbour_duration:g} s each"
        )
        token = mint_token(self.secret, FLOOD_TENANT, FLOOD_PRINCIPAL, SCOPE, Settings.from_env(), 6 * 3600)
        rows, self.neighbour_factor = await neighbour_rows(
            gen, token, min(c.warmup, 2.0), c.neighbour_duration
        )
        for row in rows:
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
                window = self.window(url, service.cpu_seconds, service.log_cpu_seconds)
                r = await self.measured_cycles(gen, window, min(c.warmup, 2.0), c.growth_duration, f"g{size}")
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
                        "5",
                        f"growth: {size:,} rows, claim",
                        f"{r.cycle_rate:,.0f} cycles/s",
                        claim,
                        target=target,
                        notes=sizes,
                    )
                )
        finally:
            await service.stop()

    def quiet(self) -> tuple[bool, str]:
        """Whether ratios between rows may be reported: the machine was quiet (see QUIET_RULE)."""
        busiest = max((layer.window.other_cores for layer in self.layers.values()), default=0.0)
        if self.load_before > QUIET_LOAD:
            return False, f"load average {self.load_before:.2f} > {QUIET_LOAD:g} at the start"
        if busiest > QUIET_OTHER_CORES:
            return False, f"other processes used {busiest:.2f} cores during a layer (> {QUIET_OTHER_CORES:g})"
        drift = self.lean_drift()
        if drift > LEAN_DRIFT:
            return False, f"the lean yardstick rows (before, after) differ {drift:.2f} x (> {LEAN_DRIFT:g})"
        return True, (
            f"load average {self.load_before:.2f} at the start, other load <= {busiest:.2f} cores, "
            f"lean yardstick rows within {drift:.2f} x"
        )

    def lean_pair(self) -> list[Layer]:
        """The lean yardstick rows that finished cycles: before the service, and after it."""
        return [x for x in (self.layers.get("lean"), self.layers.get("lean_again")) if x and x.cycles > 0]

    def lean_drift(self) -> float:
        """How far apart the two lean rows are (the larger over the smaller, of cycles/s and of
        PostgreSQL CPU per cycle); 1.0 with fewer than two, or PostgreSQL's CPU unseen."""
        pair = self.lean_pair()
        if len(pair) < 2:
            return 1.0
        (a, b) = pair
        drifts = [_apart([a.rate, b.rate])]
        if a.pg_ms() > 0 and b.pg_ms() > 0:  # NaN (a server elsewhere) compares false
            drifts.append(_apart([a.pg_ms(), b.pg_ms()]))
        return max(drifts)

    def lean_figures(self) -> tuple[float, float, str]:
        """The lean yardstick's cycles/s and PostgreSQL CPU per cycle for the ratios (the mean of the
        rows before and after the service), and how they were formed."""
        pair = self.lean_pair()
        lean = self.layers.get("lean")
        if not pair:
            return (0.0, lean.pg_ms() if lean else float("nan"), "")
        rate = sum(x.rate for x in pair) / len(pair)
        pg = sum(x.pg_ms() for x in pair) / len(pair)
        if len(pair) == 1:
            return rate, pg, ""
        return (
            rate,
            pg,
            (
                f" (mean of {pair[0].rate:,.0f} before and {pair[1].rate:,.0f} after; "
                f"{pair[0].pg_ms():.2f} and {pair[1].pg_ms():.2f} ms)"
            ),
        )

    def targets(self) -> None:
        """7. PASS/MISS per target of issue 20; ratios between rows only when the machine was quiet."""
        for row in self.deferred:  # the journal's rows (6), measured while the service ran
            self.add(row)
        quiet, why = self.quiet()
        lean, service = self.layers.get("lean"), self.layers.get("service")

        def ratio_row(
            name: str,
            top: float,
            bottom: float,
            goal: str,
            ok: bool,
            notes: str,
            row: str,
            withheld: str | None = None,
        ) -> None:
            """top / bottom against `goal`. Every ratio row is printed: on a busy machine, when its
            denominator (`row`) finished no cycle (a short window under load), or when the rows it
            compares say the sitting changed speed between them (`withheld`, the reason), it says why
            instead of vanishing from the table."""
            if not quiet:
                reason: str | None = f"busy: {why}"
            elif withheld is not None:
                reason = withheld
            elif math.isnan(bottom):
                reason = "not measured: PostgreSQL runs elsewhere, its CPU is not seen"
            elif not bottom > 0:
                reason = f"not measured: the {row} row finished no cycle"
            else:
                reason = None
            if reason is not None:
                self.add(Row("7", name, "not reported", target=f"{goal}: NOT MEASURED", notes=reason))
            else:
                self.add(Row("7", name, f"{top / bottom:.2f}", target=f"{goal}: {verdict(ok)}", notes=notes))

        if lean and service:
            lean_rate, lean_pg, how = self.lean_figures()
            ratio_row(
                "service / lean yardstick, cycles/s",
                service.rate,
                lean_rate,
                f">= {SERVICE_TO_LIMIT:.2f}",
                service.rate >= SERVICE_TO_LIMIT * lean_rate,
                f"{service.rate:,.0f} / {lean_rate:,.0f} cycles/s{how}",
                "lean yardstick",
            )
            ratio_row(
                "PostgreSQL CPU per cycle, service / lean",
                service.pg_ms(),
                lean_pg,
                f"<= {PG_CPU_TO_LEAN:.1f}",
                service.pg_ms() <= PG_CPU_TO_LEAN * lean_pg,
                f"{service.pg_ms():.2f} / {lean_pg:.2f} ms",
                "lean yardstick",
            )
        floor = self.layers.get("http_floor")
        if lean and floor:
            # no target of its own: how far the target above is reachable in Python on this machine
            lean_rate = self.lean_figures()[0]
            beside = ""
            if service and floor.rate > 0:
                beside = f"; service / floor {service.rate / floor.rate:.2f}"
            ratio_row(
                "Python HTTP floor / lean yardstick, cycles/s",
                floor.rate,
                lean_rate,
                f"room for >= {SERVICE_TO_LIMIT:.2f}",
                floor.rate >= SERVICE_TO_LIMIT * lean_rate,
                f"{floor.rate:,.0f} / {lean_rate:,.0f} cycles/s{beside}",
                "lean yardstick",
            )
        unbatched = self.layers.get("unbatched")
        if service and unbatched:
            ratio_row(
                "natural batching: service on / off, cycles/s",
                service.rate,
                unbatched.rate,
                "> 1 keeps it",
                service.rate > unbatched.rate,
                f"{service.rate:,.0f} / {unbatched.rate:,.0f} cycles/s; PostgreSQL "
                f"{service.pg_ms():.2f} / {unbatched.pg_ms():.2f} ms per cycle",
                "batching-off",
            )
        on_rows = [x for k in LOG_ON_ROWS if (x := self.layers.get(k))] or ([service] if service else [])
        log_off_rows = [x for k in LOG_OFF_ROWS if (x := self.layers.get(k))]
        if on_rows and log_off_rows:
            # off, on, on, off (ABBA): the two rows of each kind sit symmetrically in time, so a sitting
            # that speeds up or slows down steadily, and the tables' growth from row to row, weigh on
            # both means alike instead of counting as the log's cost or gain (until round 15: on, off,
            # on again, with the main service row as the first "on", four rows before the "off" one).
            # An "on" row without cycles counts as 0 (the log stopped the service: MISS); an "off" row
            # without cycles leaves nothing to compare with (ratio_row: not measured).
            # The two "off" rows bracket the "on" ones in time: when they disagree by more than the
            # lean rows may (LEAN_DRIFT), the sitting changed speed within these four rows and their
            # ratio is that change as much as the log's cost (round 34: off 1,487 then 1,159 cycles/s
            # in a run whose lean rows agreed within 1.08 x; that run printed 0.95, PASS).
            on = sum(x.rate for x in on_rows) / len(on_rows)
            rates = [x.rate for x in log_off_rows]
            off = sum(rates) / len(rates) if all(rates) else 0.0
            drift = _apart(rates) if all(rates) else 1.0
            order = f"off {_rates(log_off_rows[:1])}, on {_rates(on_rows)}, off {_rates(log_off_rows[1:])}"
            drifted = (
                f"the log-off rows before and after the log-on rows differ {drift:.2f} x "
                f"(> {LEAN_DRIFT:g}; rows: {order}): the sitting changed speed within them; alternating "
                "rounds tell (python -m effect_ledger_bench.repeat --variant EFFECT_LEDGER_LOG_ENABLED=false)"
            )
            ratio_row(
                "receipts log: service on / off, cycles/s",
                on,
                off,
                f">= {LOG_ON_TO_OFF:.2f}",
                on >= LOG_ON_TO_OFF * off,
                f"{on:,.0f} / {off:,.0f} cycles/s (rows: {order}); WAL {on_rows[0].wal_per_cycle():,.0f} / "
                f"{log_off_rows[0].wal_per_cycle():,.0f} B per cycle",
                "log-off",
                withheld=drifted if drift > LEAN_DRIFT else None,
            )
        if self.log_lags:
            ordered = sorted(self.log_lags)
            p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            self.add(
                Row(
                    "7",
                    "receipts log: integration lag p99 under load, s",
                    f"{p99:.2f}",
                    target=f"<= {LOG_LAG_P99_S:g}: {verdict(p99 <= LOG_LAG_P99_S)}",
                    notes=f"p50 {p50:.2f} s over {len(ordered):,} receipts of the full-service row, "
                    "commit to leaf, sampled every 0.1 s",
                )
            )
        self.add(
            Row(
                "7",
                "claim p99 at 16 executors, ms",
                ms(self.claim_p99),
                target=f"<= {CLAIM_P99_MS:g}: {verdict(self.claim_p99 <= CLAIM_P99_MS)}",
                notes="row 2, service: claim",
            )
        )
        fair = self.neighbour_factor <= NEIGHBOUR_P99_FACTOR
        self.add(
            Row(
                "7",
                "noisy neighbour: quiet p99 beside the flood / alone",
                f"{self.neighbour_factor:.2f}",
                target=f"<= {NEIGHBOUR_P99_FACTOR:g}: {verdict(fair)}",
                notes="row 4",
            )
        )
        per_request = self.service_cpu_per_request_ms
        lean_enough = per_request <= PYTHON_CPU_PER_REQUEST_MS
        asgi = self.layers.get("asgi")
        in_process = (
            ""
            if asgi is None
            else f"; in process {(asgi.window.python_cpu or 0.0) / max(3 * asgi.cycles, 1) * 1000:.3f} ms"
        )
        self.add(
            Row(
                "7",
                "Python CPU per request (service), ms",
                f"{per_request:.3f}",
                target=f"<= {PYTHON_CPU_PER_REQUEST_MS:g}: {verdict(lean_enough)}",
                notes=f"every serve process, HTTP server included{in_process}",
            )
        )
        self.add(Row("7", "ratios reported", "yes" if quiet else "no", notes=f"{why}; rule: {QUIET_RULE}"))

    def title(self) -> list[str]:
        """Lines above the table: machine, server, shape of the run."""
        c = self.config
        where = "embedded" if self.cluster.postmaster and not c.database_url else "EFFECT_LEDGER_DATABASE_URL"
        return [
            f"effect-ledger bench: {machine().describe()}",
            f"PostgreSQL {self.cluster.version} ({where}); serve --workers {c.workers} "
            f"(HTTP server {Settings.from_env().http_server}); "
            f"{c.concurrency} executors; load generator {self.generator_name}",
            f"serve on {interpreter()}",
            f"load average: {self.load_before:.2f} before, {self.load_after:.2f} after (one minute; the run "
            f"itself keeps the cores busy, so 'after' is high on a quiet machine too)",
        ]


async def run_bench(config: BenchConfig) -> str:
    """Run every measurement once and return the printed report."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-bench-run-"))
    cluster = await Cluster.open(config.database_url)
    try:
        bench = Bench(config, cluster, workdir)
        url = await cluster.create("effect_ledger_bench")
        # pgbench's and asyncpg's rows in a database of their own: the yardstick's events carry a fixed
        # hash (not a chain), so in the service's database the receipts log would refuse them again on
        # every pass, and the service would be measured while its integrator catches up on them
        sql_url = await cluster.create("effect_ledger_bench_sql")
        phases: list[Callable[[], Awaitable[None]]] = [
            lambda: bench.limit(sql_url),
            lambda: bench.floors(sql_url, url),
            lambda: bench.http_floor(sql_url),
            lambda: bench.service_phase(url),
            lambda: bench.lean_again(sql_url),
            lambda: bench.variant_phase(
                url,
                "unbatched",
                "natural batching off (WRITE_BATCH_MAX=1)",
                {"EFFECT_LEDGER_WRITE_BATCH_MAX": "1"},
                "unb",
            ),
            lambda: bench.variant_phase(
                url, "log_off", "receipts log off (LOG_ENABLED=false)", LOG_OFF, "nol"
            ),
            lambda: bench.variant_phase(
                url, "log_on_again", "receipts log on again (LOG_ENABLED=true)", LOG_ON, "lon", settled=True
            ),
            lambda: bench.variant_phase(
                url,
                "log_on_third",
                "receipts log on, third row (LOG_ENABLED=true)",
                LOG_ON,
                "lo3",
                settled=True,
            ),
            lambda: bench.variant_phase(
                url, "log_off_again", "receipts log off again (LOG_ENABLED=false)", LOG_OFF, "nl2"
            ),
        ]
        if config.growth_sizes:
            phases.append(bench.growth)
        started = time.monotonic()
        for phase in phases:
            await phase()
        bench.load_after = load_average()
        bench.targets()
        progress(f"done in {time.monotonic() - started:.0f} s")
        return render(bench.title(), bench.rows)
    finally:
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
