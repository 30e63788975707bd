"""One process of the Python load generator: a share of the executors, each on its own keep-alive connection.

Run as `python -m effect_ledger_bench.loadgen` with a JSON spec on stdin; prints a JSON result. Every
process is given the same wall-clock window, so the parent adds their counts up.
"""

from __future__ import annotations

import asyncio
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from effect_ledger_bench.httpclient import HttpConnection
from effect_ledger_bench.workload import claim_body, claim_path, complete_body, submit_body


@dataclass
class Spec:
    """What the parent asks of one generator process."""

    mode: str  # cycle | replay | contention | flood
    host: str
    port: int
    tokens: list[str]  # one per executor of this process
    first_executor: int  # global index of this process's first executor (for unique op IDs)
    start_at: float  # wall clock: warm-up begins
    warmup: float
    duration: float
    prefix: str
    ids: list[str] = field(default_factory=list)  # replay: committed IDs; contention: the hot IDs


@dataclass
class Tally:
    """What this process counted inside the window."""

    window_start: float
    window_end: float
    cycles: int = 0
    requests: int = 0
    calls: dict[str, list[float]] = field(default_factory=lambda: {"claim": [], "submit": [], "complete": []})
    errors: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)

    def inside(self, at: float) -> bool:
        return self.window_start <= at < self.window_end

    def record(self, call: str, status: int, started: float, expected: int) -> bool:
        """Count an answer that arrived inside the window; whether it was the expected one."""
        now = time.time()
        if self.inside(now):
            self.requests += 1
            self.calls[call].append((time.perf_counter() - started) * 1000)
            if status != expected:
                key = f"{call} {status}"
                self.errors[key] = self.errors.get(key, 0) + 1
        return status == expected


async def _post(conn: HttpConnection, path: str, body: dict[str, Any]) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    try:
        status, payload = await conn.request("POST", path, msgspec.json.encode(body))
    except (OSError, EOFError, ValueError, asyncio.LimitOverrunError):
        await asyncio.sleep(0.01)  # counted as status 0; the connection reopens on the next call
        return 0, b"", started
    return status, payload, started


async def _cycles(spec: Spec, tally: Tally, index: int, conn: HttpConnection) -> None:
    executor = spec.first_executor + index
    nonce = f"bench-nonce-{spec.prefix}-{executor:04d}"
    n = 0
    while time.time() < tally.window_end:
        n += 1
        op_id = f"{spec.prefix}-{executor}-{n}"
        status, payload, started = await _post(conn, claim_path(op_id, "claim"), claim_body(op_id, nonce))
        if not tally.record("claim", status, started, 201):
            continue
        token = msgspec.json.decode(payload)["claim"]["token"]
        status, _, started = await _post(conn, claim_path(op_id, "submit"), submit_body(token, op_id))
        if not tally.record("submit", status, started, 200):
            continue
        status, _, started = await _post(conn, claim_path(op_id, "complete"), complete_body(token, op_id))
        if tally.record("complete", status, started, 200) and tally.inside(time.time()):
            tally.cycles += 1


async def _replays(spec: Spec, tally: Tally, index: int, conn: HttpConnection) -> None:
    chooser = random.Random(spec.first_executor + index)  # noqa: S311  # load shape, not security
    nonce = f"bench-nonce-{spec.prefix}-replay"
    while time.time() < tally.window_end:
        op_id = chooser.choice(spec.ids)
        status, _, started = await _post(conn, claim_path(op_id, "claim"), claim_body(op_id, nonce))
        tally.record("claim", status, started, 200)


async def _contend(spec: Spec, tally: Tally, index: int, conn: HttpConnection) -> None:
    nonce = f"bench-nonce-{spec.prefix}-{spec.first_executor + index:04d}"
    for op_id in spec.ids:
        status, _, started = await _post(conn, claim_path(op_id, "claim"), claim_body(op_id, nonce))
        tally.requests += 1
        tally.calls["claim"].append((time.perf_counter() - started) * 1000)
        counts = tally.outcomes.setdefault(op_id, {})
        counts[str(status)] = counts.get(str(status), 0) + 1


async def _flood(spec: Spec, tally: Tally, index: int, conn: HttpConnection) -> None:
    """Claims of new IDs back to back, no pause whatever the answer (the noisy neighbour's flood)."""
    body = {"tool": "bench.flood", "tool_version": "1", "intent": {"flood": True}, "lease_seconds": 30}
    counts = tally.outcomes.setdefault("flood", {})
    n = 0
    while time.time() < tally.window_end:
        n += 1
        status, _, _ = await _post(
            conn, claim_path(f"{spec.prefix}-{spec.first_executor + index}-{n}", "claim"), body
        )
        counts[str(status)] = counts.get(str(status), 0) + 1
        tally.requests += 1


MODES = {"cycle": _cycles, "replay": _replays, "contention": _contend, "flood": _flood}


async def _executor(spec: Spec, tally: Tally, index: int) -> None:
    conn = HttpConnection(spec.host, spec.port, f"Bearer {spec.tokens[index]}")
    try:
        await asyncio.sleep(max(0.0, spec.start_at - time.time()))
        await MODES[spec.mode](spec, tally, index, conn)
    finally:
        await conn.close()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _window_cpu(start: float, end: float) -> tuple[float, float]:
    """CPU seconds of this process between two wall-clock instants."""
    await asyncio.sleep(max(0.0, start - time.time()))
    first = _cpu()
    await asyncio.sleep(max(0.0, end - time.time()))
    return first, _cpu()


async def run(spec: Spec) -> dict[str, Any]:
    """Run this process's executors and report what happened inside the window."""
    start = spec.start_at + spec.warmup
    tally = Tally(start, start + spec.duration)
    if spec.mode == "contention":
        tally.window_start, tally.window_end = spec.start_at, float("inf")
        cpu_before = _cpu()
        await asyncio.gather(*(_executor(spec, tally, i) for i in range(len(spec.tokens))))
        cpu, window = _cpu() - cpu_before, time.time() - spec.start_at
    else:
        meter = asyncio.create_task(_window_cpu(tally.window_start, tally.window_end))
        await asyncio.gather(*(_executor(spec, tally, i) for i in range(len(spec.tokens))))
        first, last = await meter
        cpu, window = last - first, spec.duration
    return {
        "window": window,
        "cycles": tally.cycles,
        "requests": tally.requests,
        "calls": tally.calls,
        "errors": tally.errors,
        "generator_cpu": cpu,
        "outcomes": tally.outcomes,
    }


def main() -> None:
    """Read the spec from stdin, run, write the result to stdout."""
    spec = msgspec.json.decode(sys.stdin.buffer.read(), type=Spec)
    try:
        import uvloop  # installed with uvicorn[standard]; a cheaper event loop for the generator

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(run(spec))
    sys.stdout.buffer.write(msgspec.json.encode(result))


if __name__ == "__main__":
    main()
