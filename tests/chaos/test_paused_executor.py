"""Scenario 6: an executor process is SIGSTOPped after its claims, its leases expire, another executor
reclaims and finishes; SIGCONT: the first one's stale tokens are refused, and the sink shows one
execution per operation."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support.auth import token
from support.harness import Sink, chaos_settings, read_state, scale, scenario, timeout
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(120, 900)]

ROUNDS = scale(2, 6)
OPERATIONS_PER_ROUND = scale(8, 40)
LEASE_SECONDS = 1
SCRIPT = Path(__file__).with_name("executor_proc.py")


def _spawn(base_url: str, sink_url: str, name: str, pause: str, ids: list[str]) -> subprocess.Popen[str]:
    env = {
        "EFFECT_LEDGER_CHAOS_TOKEN": token("t1", "exec-1", "ledger:execute", ttl=3600),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), base_url, sink_url, name, str(LEASE_SECONDS), str(pause), *ids],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def _wait_for_line(process: subprocess.Popen[str], wanted: str, seconds: float) -> None:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), seconds)
    assert line.strip() == wanted, f"executor said {line!r}"


async def _results(process: subprocess.Popen[str], line: str = "") -> list[dict[str, Any]]:
    """Its JSON lines, once it exited (`line` goes to its stdin first; closing stdin lets it go on too)."""
    out, err = await asyncio.to_thread(process.communicate, line, timeout=60)
    assert process.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_paused_executor_is_fenced_off(request: pytest.FixtureRequest, db_url: str) -> None:
    settings = chaos_settings(db_url)
    paused: list[dict[str, Any]] = []
    finished: list[dict[str, Any]] = []
    with scenario(request, "paused_executor") as figures:
        async with Sink() as sink, Service(settings) as service:
            for round_number in range(ROUNDS):
                ids = [f"pause-{round_number}-{n}" for n in range(OPERATIONS_PER_ROUND)]
                # it waits for a line on stdin before submitting: stopped, continued, then told to go on
                first = _spawn(service.base_url, sink.url, "stopped", "stdin", ids)
                await _wait_for_line(first, "ALL_CLAIMED", 60)
                first.send_signal(signal.SIGSTOP)
                figures.faults += 1
                try:
                    await asyncio.sleep(LEASE_SECONDS + 0.3)  # every lease of the stopped executor runs out
                    second = _spawn(service.base_url, sink.url, "second", "0", ids)
                    finished += await _results(second)
                finally:
                    first.send_signal(signal.SIGCONT)
                paused += await _results(first, "go\n")
            state = await read_state(db_url)
        figures.operations = ROUNDS * OPERATIONS_PER_ROUND
        outcomes = Counter(f"paused_{r['outcome']}" for r in paused)
        figures.extra = {"rounds": ROUNDS, "executed": sink.total, **outcomes}
        for result in paused:
            if result["outcome"] != "stale_claim" or result["sink_called"]:
                figures.violations.append(f"paused executor was not fenced off: {result}")
        for result in finished:
            if result["outcome"] != "committed" or result.get("attempt") != 2:
                figures.violations.append(f"the second executor did not finish as attempt 2: {result}")
        figures.check_run(None, state, sink)  # the executors are other processes: no history here
    figures.assert_clean()
    assert len(paused) == len(finished) == sink.total == ROUNDS * OPERATIONS_PER_ROUND
    assert {e.executor for runs in sink.executions.values() for e in runs} == {"second"}
