"""What a flood costs the service: serve's CPU under the noisy-neighbour flood, pacing on and off.

`python -m effect_ledger_bench.floodcpu [--seconds 8] [--rounds 2] [--pace-ms 1000]` starts
`serve --workers 2` on one fresh database (embedded, or EFFECT_LEDGER_DATABASE_URL's server) once per
setting, alternating the order every round, and floods it exactly as bench row 4 does (64 keep-alive
connections, no pause, tenant `bench-flood` limited to 10/s burst 20). Per run it prints the flood's
rate and answers, the serve processes' CPU in cores (the idle CPU of the same processes just before,
beside it) and the CPU per flood request. CPU time, not throughput: a rough guide on a shared
machine, comparable between the alternating runs of one sitting. Not part of `effect-ledger bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.database import Cluster
from effect_ledger_bench.generator import START_MARGIN, Generator
from effect_ledger_bench.neighbour import FLOOD_PRINCIPAL, FLOOD_TASKS, FLOOD_TENANT
from effect_ledger_bench.service import ServiceProcess

IDLE_SECONDS = 2.0
SETTLE_SECONDS = 1.5


async def one_run(url: str, secret: str, workdir: Path, pace_ms: int, seconds: float) -> str:
    """One serve, idle then flooded; the printed line."""
    os.environ["EFFECT_LEDGER_RATE_LIMIT_PACE_MS"] = str(pace_ms)  # ServiceProcess copies the environment
    service = ServiceProcess(url, secret, 2, workdir)
    await service.start()
    try:
        token = mint_token(secret, FLOOD_TENANT, FLOOD_PRINCIPAL, "ledger:execute", Settings.from_env(), 3600)
        gen = Generator(service.host, service.port, [token], workdir, "python")
        before = service.cpu_seconds()
        await asyncio.sleep(IDLE_SECONDS)
        idle = (service.cpu_seconds() - before) / IDLE_SECONDS
        prefix = f"fc{pace_ms}-{time.time_ns()}"
        flooding = asyncio.create_task(gen.flood([token], FLOOD_TASKS, seconds + SETTLE_SECONDS, prefix))
        await asyncio.sleep(START_MARGIN + SETTLE_SECONDS)
        first, started = service.cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds - 1.0)
        cores = (service.cpu_seconds() - first) / (time.monotonic() - started)
        flooded = await flooding
    finally:
        await service.stop()
    rate = flooded.request_rate
    answers = ", ".join(f"{s}: {n:,}" for s, n in sorted(flooded.outcomes.get("flood", {}).items()))
    per_request = (cores - idle) / rate * 1e6 if rate else float("nan")
    return (
        f"pace {pace_ms:>4} ms: flood {rate:,.0f} req/s ({answers}); serve {cores:.3f} cores "
        f"(idle {idle:.3f}); {per_request:.0f} us of serve CPU per flood request; "
        f"load average {os.getloadavg()[0]:.2f}"
    )


async def main(seconds: float, rounds: int, pace_ms: int) -> None:
    """Alternate pacing on and off on one database, `rounds` times."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-floodcpu-"))
    cluster = await Cluster.open(os.environ.get("EFFECT_LEDGER_DATABASE_URL"))
    try:
        url = await cluster.create("effect_ledger_floodcpu")
        secret = secrets.token_urlsafe(48)
        print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
        for n in range(rounds):
            for pace in (pace_ms, 0) if n % 2 == 0 else (0, pace_ms):
                print(await one_run(url, secret, workdir, pace, seconds), flush=True)
    finally:
        await cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (paced, unpaced)")
    parser.add_argument("--pace-ms", type=int, default=1000, help="RATE_LIMIT_PACE_MS of the paced runs")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds, args.pace_ms))
