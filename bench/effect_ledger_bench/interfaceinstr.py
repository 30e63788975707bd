"""Instructions per executor request in serve's worker, per HTTP server: a figure load does not move.

`python -m effect_ledger_bench.interfaceinstr [--cycles 40] [--executors 4] [--interfaces ledger,rsgi,asgi]
[--variant NAME=VAR=value,...]`
(the variants of interfacecpu: `ledger` serve's own server, `rsgi` and `asgi` granian's interfaces;
not `uvicorn`, whose single worker is serve's own process)
runs `serve --workers 1` under valgrind's callgrind (the embedded PostgreSQL untraced, the server's
forked worker traced from its fork to its exit, where it writes its counts), once with `--cycles`
full effect cycles (claim -> submit -> complete, from `--executors` concurrent httpx clients) and
once with three times as many; the difference of the worker's instructions over the difference of
requests is what one request costs, start-up and shutdown cancelling out (the idle timers of the
longer run add a little to both interfaces alike). Needs valgrind; slow (~50x). Not part of
`effect-ledger bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.interfacecpu import VARIANTS, variant
from effect_ledger_bench.service import free_port
from effect_ledger_bench.workload import (
    PRINCIPAL,
    SCOPE,
    TENANT,
    claim_body,
    claim_path,
    complete_body,
    submit_body,
)

READY_SECONDS = 600.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


async def _cycles(base: str, tokens: list[str], cycles: int, prefix: str) -> int:
    """`cycles` full cycles spread over one client per token; the number of requests answered."""
    answered = 0

    async def executor(n: int, token: str) -> None:
        nonlocal answered
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:
            for i in range(n, cycles, len(tokens)):
                op = f"{prefix}-{i}"
                claimed = await http.post(claim_path(op, "claim"), json=claim_body(op, secrets.token_hex(8)))
                assert claimed.status_code == 201, claimed.text
                lease = claimed.json()["claim"]["token"]
                submitted = await http.post(claim_path(op, "submit"), json=submit_body(lease, op))
                assert submitted.status_code == 200, submitted.text
                done = await http.post(claim_path(op, "complete"), json=complete_body(lease, op))
                assert done.status_code == 200, done.text
                answered += 3

    await asyncio.gather(*(executor(n, token) for n, token in enumerate(tokens)))
    return answered


def _total(path: Path) -> int:
    """The instructions a callgrind output file counted."""
    found = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no total in {path}")
    return int(found.group(1))


async def one_run(interface: str, environ: dict[str, str], cycles: int, executors: int) -> tuple[int, int]:
    """(requests, the worker's instructions from its fork to its exit) for one serve under callgrind,
    with `environ` (the variant's settings) over the run's own."""
    workdir = Path(tempfile.mkdtemp(prefix="effect-ledger-instr-"))
    secret = secrets.token_urlsafe(48)
    port = free_port()
    env = {
        **os.environ,
        "EFFECT_LEDGER_DATA_DIR": str(workdir / "data"),
        "EFFECT_LEDGER_JWT_SECRET": secret,
        **environ,
        "EFFECT_LEDGER_RATE_LIMIT_PER_SECOND": "0",
        "EFFECT_LEDGER_SHUTDOWN_TIMEOUT_SECONDS": "300",  # the worker must exit by itself to write its counts
    }
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--vgdb=no",
        "--trace-children=no",  # the embedded PostgreSQL runs untraced; granian's fork stays traced
        f"--callgrind-out-file={workdir}/callgrind.out.%p",
        sys.executable,
        "-m",
        "effect_ledger.cli",
        "serve",
        "--port",
        str(port),
    ]
    log = (workdir / "serve.log").open("wb")
    # Popen, not asyncio's: the process is only waited for at the end (ASYNC220); argv is ours (S603)
    proc = subprocess.Popen(  # noqa: ASYNC220, S603
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_SECONDS
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            while True:
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((workdir / "serve.log").read_text(errors="replace")[-3000:])
                await asyncio.sleep(1)
        worker = _children(proc.pid)
        settings = Settings.from_env()
        tokens = [mint_token(secret, TENANT, PRINCIPAL, SCOPE, settings, 3600) for _ in range(executors)]
        requests = await _cycles(base, tokens, cycles, f"{interface}-{time.time_ns()}")
        proc.terminate()
        proc.wait(600)
        outputs = [workdir / f"callgrind.out.{pid}" for pid in worker]
        counted = [_total(path) for path in sorted(outputs, key=lambda p: int(p.suffix[1:])) if path.exists()]
        keep = os.environ.get("INTERFACEINSTR_KEEP")  # a directory: keep the worker's callgrind output
        if keep:
            for path in outputs:
                if path.exists():
                    shutil.copy(path, Path(keep) / f"callgrind.{interface}.{requests}.out")
        # with the receipts log on, serve forks its log process before the worker (http/prefork.py):
        # the lower pid; its count is the log's, not the requests'
        if len(counted) == 2:
            print(f"  (the log process: {counted[0]:,} instructions, not counted)", flush=True)
            counted = counted[1:]
        if len(counted) != 1:
            raise RuntimeError(f"one worker expected, counts {counted}: {sorted(os.listdir(workdir))}")
        return requests, counted[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def main(cycles: int, executors: int, rounds: int, variants: dict[str, dict[str, str]]) -> None:
    """Per round and interface, a serve with `cycles` and one with 3 * `cycles` cycles; the difference."""
    print(f"load average {os.getloadavg()[0]:.2f} at the start (instructions ignore it)", flush=True)
    for n in range(rounds):
        names = list(variants)
        for interface in names if n % 2 == 0 else names[::-1]:
            few, few_instr = await one_run(interface, variants[interface], cycles, executors)
            many, many_instr = await one_run(interface, variants[interface], 3 * cycles, executors)
            per_request = (many_instr - few_instr) / (many - few)
            print(
                f"{interface}: {few} requests {few_instr:,} instructions, {many} requests {many_instr:,};"
                f" {per_request:,.0f} instructions per request",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100, help="cycles per measured round")
    parser.add_argument("--executors", type=int, default=4, help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the interfaces")
    parser.add_argument("--interfaces", default="ledger,rsgi,asgi", help="comma-separated variants, in order")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=VAR=value,VAR=value: serve's environment for one more variant (as interfacecpu's),"
        " e.g. logoff=EFFECT_LEDGER_LOG_ENABLED=false",
    )
    args = parser.parse_args()
    chosen = {name: VARIANTS[name] for name in args.interfaces.split(",") if name}
    chosen.update(variant(text) for text in args.variant)
    asyncio.run(main(args.cycles, args.executors, args.rounds, chosen))
