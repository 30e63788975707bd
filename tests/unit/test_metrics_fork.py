"""prometheus_client's multiprocess values keyed by a process ID read once and again after each fork, and
written straight through without a fork check on every change (http.metrics.choose_value_class): a
forked worker writes its own value file, never its parent's, from its first change on."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import os, sys
    from prometheus_client import CollectorRegistry, Counter
    from effect_ledger.http.metrics import choose_value_class

    choose_value_class()  # PROMETHEUS_MULTIPROC_DIR is set: per-process files, written through
    registry = CollectorRegistry()
    counter = Counter("forked", "test", ["who"], registry=registry)
    counter.labels("parent").inc(3)
    pid = os.fork()
    if pid == 0:
        # a series the parent made first (a new series would reload every value, as a fork check does)
        counter.labels("parent").inc(2)  # the child's 2, in the child's file, not the parent's
        counter.labels("child").inc(5)
        os._exit(0)  # nothing flushed, nothing closed
    os.waitpid(pid, 0)
    counter.labels("parent").inc(1)
    print(os.getpid(), pid)
    """
)


def test_a_forked_process_writes_its_own_value_file(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parent, child = done.stdout.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{parent}.db", f"counter_{child}.db"]
    )

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    # the parent's 3 + 1 and the child's 2 (summed), the child's 5: nothing counted twice, nothing lost,
    # nothing written into another process's file
    assert 'forked_total{who="parent"} 6.0' in text
    assert 'forked_total{who="child"} 5.0' in text


POOLS = textwrap.dedent(
    """
    import asyncio
    from effect_ledger.http.metrics import Metrics, choose_value_class

    class Pool:  # what the gauges read of an asyncpg pool
        idle = 3
        def get_size(self): return 4
        def get_idle_size(self): return self.idle
        def get_max_size(self): return 4

    choose_value_class()
    metrics = Metrics()
    pool = Pool()
    metrics.watch_pools(runtime=pool)  # published once, at once: 1 in use
    pool.idle = 1  # 3 in use now; no request, no scrape

    async def main():
        task = asyncio.create_task(metrics.pools_loop())
        await asyncio.sleep(0.5)  # several passes
        task.cancel()

    asyncio.run(main())
    """
)


def test_a_workers_pools_are_published_by_its_loop_alone(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", POOLS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    assert 'effect_ledger_db_pool_connections{pool="runtime",state="in_use"} 3.0' in text
    assert 'effect_ledger_db_pool_connections{pool="runtime",state="idle"} 1.0' in text


def test_without_the_multiprocess_directory_the_pools_loop_returns_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from effect_ledger.http.metrics import Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    asyncio.run(asyncio.wait_for(Metrics().pools_loop(), timeout=5))  # a loop would time out
