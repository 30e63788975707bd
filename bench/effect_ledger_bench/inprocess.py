"""The ASGI app in process: full effect cycles through the real app (auth, routing, telemetry, the
database), with no socket and no HTTP server, and the CPU this process spent per request.

The driver calls the app's ASGI callable directly with prepared scopes and bodies, so what is counted
is the service's own Python (Litestar, the handlers, the log line, the histogram, asyncpg's client
side) plus a few microseconds of driver. The figure is CPU time (`time.process_time`), not wall time:
on a busy machine it is the steadier of the two, and `instructions` (from `perf_event_open` through
`perf stat`, when the kernel allows it) steadier still.

Run alone it is also the measuring tool of issue 20 item 3:

    python -m effect_ledger_bench.inprocess --requests 3000   # on $EFFECT_LEDGER_DATABASE_URL or embedded
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import sys
import tempfile
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field, replace
from typing import Any

from effect_ledger.http.auth import mint_token
from effect_ledger.settings import Settings
from effect_ledger_bench.workload import (
    PRINCIPAL,
    SCOPE,
    TENANT,
    claim_body,
    claim_path,
    complete_body,
    submit_body,
)

CALLS = ("claim", "submit", "complete")


@dataclass
class InProcessResult:
    """Cycles driven through the app in this process and the CPU they cost it."""

    cycles: int
    seconds: float
    cpu_seconds: float
    statuses: dict[str, int] = field(default_factory=dict)
    refusals: int = 0
    refusal_cpu_seconds: float = 0.0

    @property
    def requests(self) -> int:
        """Three requests per cycle."""
        return 3 * self.cycles

    @property
    def cpu_per_request_ms(self) -> float:
        """Python CPU per executor request, milliseconds."""
        return self.cpu_seconds / max(self.requests, 1) * 1000

    @property
    def refusal_cpu_us(self) -> float:
        """Python CPU per refused request (429 from the verified-token cache), microseconds."""
        return self.refusal_cpu_seconds / max(self.refusals, 1) * 1e6


class Driver:
    """Sends one request to an ASGI app and collects the answer, with nothing in between."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path` with a bearer token; the status and the body of the answer."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"authorization", b"Bearer " + token.encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)  # a disconnect never comes while the answer is written
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


class Lifespan:
    """The app's start-up and shut-down, as a server runs them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lifespan:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self.task = asyncio.create_task(self.app(scope, self.inbox.get, self.outbox.put))
        await self.inbox.put({"type": "lifespan.startup"})
        answer = await self.outbox.get()
        if answer["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {answer}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.outbox.get()
        if self.task is not None:
            await self.task


async def cycles(
    driver: Driver, tokens: list[str], count: int, concurrency: int, prefix: str, until: float | None = None
) -> dict[str, int]:
    """`count` full cycles (or as many as fit before monotonic time `until`) by `concurrency` executors;
    the answers' statuses counted by call ("claim 201": n)."""
    statuses: dict[str, int] = {}
    ids = itertools.count()

    def more() -> int | None:
        n = next(ids)
        if until is not None:
            return n if time.monotonic() < until else None
        return n if n < count else None

    async def executor(token: str) -> None:
        while (n := more()) is not None:
            op = f"{prefix}-{n}"
            claim = _json(claim_body(op, f"nonce-{op}-0123456789"))  # client nonces are >= 16 characters
            status, answer = await driver.post(claim_path(op, "claim"), claim, token)
            _count(statuses, "claim", status)
            if status != 201:
                continue
            claim_token = json.loads(answer)["claim"]["token"]
            for call, body in (("submit", submit_body), ("complete", complete_body)):
                status, _ = await driver.post(claim_path(op, call), _json(body(claim_token, op)), token)
                _count(statuses, call, status)

    await asyncio.gather(*(executor(tokens[i % len(tokens)]) for i in range(concurrency)))
    return statuses


async def refusals(driver: Driver, token: str, count: int) -> tuple[int, float]:
    """`count` claims of a caller over its rate limit, one after another: (how many were 429, CPU)."""
    body = _json(claim_body("refused", "nonce-refused-0123456789"))
    refused = 0
    started = time.process_time()
    for n in range(count):
        status, _ = await driver.post(claim_path(f"refused-{n}", "claim"), body, token)
        refused += status == 429
    return refused, time.process_time() - started


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _count(statuses: dict[str, int], call: str, status: int) -> None:
    key = f"{call} {status}"
    statuses[key] = statuses.get(key, 0) + 1


FLOOD_TENANT = "bench-inproc-flood"
FLOOD_PRINCIPAL = "bench-inproc-flooder"


async def run_in_process(
    url: str,
    requests: int,
    concurrency: int = 16,
    warmup: int = 300,
    prefix: str | None = None,
    duration: float | None = None,
    window: Any = None,
    data_dir: str | None = None,
) -> InProcessResult:
    """Warm up, then drive `requests` executor requests (whole cycles; or cycles for `duration` seconds)
    and `requests // 3` refusals (at least 300). `window` (counters.Window) is opened and closed around
    the measured cycles. `data_dir`: the app's (its receipts-log signer keeps its state there, per
    database name: a fresh database under an old name would read as a restored, older copy)."""
    from effect_ledger.http.app import create_app

    secret = secrets.token_urlsafe(48)
    overrides = json.dumps({FLOOD_TENANT: {"per_second": 1, "burst": 1}})
    # The refusals run one after another: paced, each would wait a second (http.pacing). The row
    # measures the CPU of a 429 decided and answered at once, which a held one costs too.
    environ = {
        "EFFECT_LEDGER_DATABASE_URL": url,
        "EFFECT_LEDGER_RATE_LIMIT_PER_SECOND": "0",
        "EFFECT_LEDGER_RATE_LIMIT_PACE_MS": "0",
        **({"EFFECT_LEDGER_DATA_DIR": data_dir} if data_dir else {}),
    }
    settings = replace(Settings.from_env(environ, rate_limit_overrides=overrides), database_url=url)
    tokens = [mint_token(secret, TENANT, PRINCIPAL, SCOPE, settings, 3600) for _ in range(concurrency)]
    flooder = mint_token(secret, FLOOD_TENANT, FLOOD_PRINCIPAL, SCOPE, settings, 3600)
    prefix = prefix or f"inproc-{secrets.token_hex(4)}"
    # log lines are written, as in production, but to nowhere (opening /dev/null does not block)
    with open(os.devnull, "w") as sink, redirect_stdout(sink):  # noqa: ASYNC230
        app = create_app(settings, jwt_secret=secret)
        driver = Driver(app)
        async with Lifespan(app):
            await cycles(driver, tokens, max(warmup // 3, 1), concurrency, prefix + "w")
            await refusals(driver, flooder, 50)
            count = max(requests // 3, 1)
            if window is not None:
                await window.open()
            wall, cpu = time.perf_counter(), time.process_time()
            until = None if duration is None else time.monotonic() + duration
            statuses = await cycles(driver, tokens, count, concurrency, prefix, until)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if window is not None:
                await window.close()
            refused, refusal_cpu = await refusals(driver, flooder, max(requests // 3, 300))
    done = statuses.get("complete 200", 0)
    return InProcessResult(done, wall, cpu, statuses, refused, refusal_cpu)


async def run_in_process_as_served(*args: Any, **kwargs: Any) -> InProcessResult:
    """run_in_process on the event loop `serve` gives the app: uvloop where it is installed (granian's
    loop 'auto' picks it, and it is a dependency of the service), in a thread of its own so that this
    process's loop is left as it is; asyncio's loop (this one) otherwise. The figure is this process's
    CPU, so the thread hop costs nothing measured: this loop only waits meanwhile."""
    try:
        import uvloop  # optional: the loop serve runs on, where installed
    except ImportError:
        return await run_in_process(*args, **kwargs)
    result: InProcessResult = await asyncio.to_thread(uvloop.run, run_in_process(*args, **kwargs))
    return result


def event_loop_name() -> str:
    """The loop run_in_process_as_served runs on."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def main(argv: list[str] | None = None) -> int:
    """Print CPU per request of N in-process requests (the embedded PostgreSQL unless a URL is set)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--loop", choices=("served", "asyncio"), default="served", help="served: uvloop where installed"
    )
    args = parser.parse_args(argv)
    driven = run_in_process_as_served if args.loop == "served" else run_in_process

    async def run() -> None:
        from effect_ledger_bench.database import Cluster

        cluster = await Cluster.open(os.environ.get("EFFECT_LEDGER_DATABASE_URL"))
        try:
            url = await cluster.create("effect_ledger_bench_inprocess")
            data_dir = tempfile.mkdtemp(prefix="effect-ledger-inprocess-")  # a fresh signer state
            for _ in range(args.repeat):
                r = await driven(url, args.requests, args.concurrency, data_dir=data_dir)
                per_request = r.cpu_per_request_ms * 1000
                print(
                    f"{r.requests} requests in {r.seconds:.2f} s: {per_request:.0f} us CPU/request; "
                    f"{r.refusals} refusals at {r.refusal_cpu_us:.0f} us CPU each; {r.statuses}",
                    flush=True,
                )
        finally:
            await cluster.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
