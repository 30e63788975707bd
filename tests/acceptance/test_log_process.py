"""`serve` under its own server runs the receipts log in one process of its own (LOG_OWN_PROCESS).

The log process is the supervisor's child at LOG_NICE (how these tests tell it from the workers); it
integrates and signs while the workers serve; killed, it is replaced without touching the workers and
the log goes on; SIGTERM stops it with the rest. With the setting off, the workers run the log."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest

from support.ledger import committed, wait_for_size
from support.serve_process import alive, kill_quietly, spawned_workers, start_serve
from support.waiting import until

pytestmark = pytest.mark.slow

FAST_LOG = {"log_checkpoint_seconds": "1", "log_integrate_interval_ms": "50", "background_sweep": "false"}


async def test_the_log_runs_in_one_process_of_its_own_that_is_replaced_when_it_dies(tmp_path: Path) -> None:
    served = await start_serve(tmp_path, "--workers", "2", http_server="ledger", **FAST_LOG)
    try:
        workers = sorted(spawned_workers(served.proc.pid))
        first = spawned_workers(served.proc.pid, log_process=True)
        assert len(workers) == 2 and len(first) == 1 and first[0] not in workers
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as http:
            await committed(http, "lp-1")
            await wait_for_size(http, 1)
            os.kill(first[0], signal.SIGKILL)
            replaced = await until(
                lambda: asyncio.to_thread(spawned_workers, served.proc.pid, log_process=True),
                "a new log process in the dead one's place",
                holds=lambda pids: len(pids) == 1 and pids[0] != first[0],
                within=30,
            )
            assert sorted(spawned_workers(served.proc.pid)) == workers  # the workers were left alone
            await committed(http, "lp-2")
            await wait_for_size(http, 2)
        text = served.log().replace(" ", "")
        assert text.count('"event":"log_process_started"') == 2
        assert '"role":"log"' in text and '"event":"worker_died"' in text
        served.proc.send_signal(signal.SIGTERM)
        assert await served.wait() == 0, served.log()[-3000:]
        assert not any(alive(pid) for pid in [*workers, *replaced])
    finally:
        await kill_quietly(served)


async def test_with_the_setting_off_the_workers_run_the_log(tmp_path: Path) -> None:
    served = await start_serve(
        tmp_path, "--workers", "2", http_server="ledger", log_own_process="false", **FAST_LOG
    )
    try:
        assert spawned_workers(served.proc.pid, log_process=True) == []
        assert len(spawned_workers(served.proc.pid)) == 2
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as http:
            await committed(http, "lp-1")
            await wait_for_size(http, 1)
        assert '"event":"log_process_started"' not in served.log().replace(" ", "")
    finally:
        await kill_quietly(served)
