"""prometheus_client's multiprocess values keyed by a process ID read once and again after each fork, and
written to their files by publish_values (http.metrics.choose_value_class): a forked worker writes its
own value file, never its parent's, and neither the parent's unwritten changes nor its own are lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import os, sys
    from prometheus_client import CollectorRegistry, Counter
    from effect_ledger.http.metrics import choose_value_class, publish_values

    choose_value_class()  # PROMETHEUS_MULTIPROC_DIR is set: per-process files, written by publish_values
    registry = CollectorRegistry()
    counter = Counter("forked", "test", ["who", "when"], registry=registry)
    counter.labels("parent", "written").inc(3)
    publish_values()
    counter.labels("parent", "unwritten").inc(7)  # still only in the parent's memory at the fork
    pid = os.fork()
    if pid == 0:
        # series the parent made first (a new series would reload every value, as a fork check does)
        counter.labels("parent", "unwritten").inc(2)  # the child's 2, not the parent's 7 again
        counter.labels("parent", "written").inc(0)  # the parent's series, from the child: the child's file
        counter.labels("child", "written").inc(5)
        publish_values()
        os._exit(0)
    os.waitpid(pid, 0)
    counter.labels("parent", "written").inc(1)
    publish_values()
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
    # the parent's 3 + 1 and the child's 0 (summed), the child's 5, the parent's 7 and the child's 2:
    # nothing counted twice, nothing lost
    assert 'forked_total{when="written",who="parent"} 4.0' in text
    assert 'forked_total{when="written",who="child"} 5.0' in text
    assert 'forked_total{when="unwritten",who="parent"} 9.0' in text


IDLE = textwrap.dedent(
    """
    import asyncio, os
    from effect_ledger.http.metrics import Metrics, choose_value_class

    choose_value_class()
    metrics = Metrics()
    metrics.log_refused("root_mismatch", "t1")  # the log process's refusal: no request, no scrape

    async def main():
        task = asyncio.create_task(metrics.publish_loop())
        await asyncio.sleep(0.5)  # five passes
        task.cancel()
        print(os.getpid())
        os._exit(0)  # no close(): only the loop wrote

    asyncio.run(main())
    """
)


def test_an_idle_process_publishes_its_values_from_its_loop(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    def scraped() -> str:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
        return generate_latest(registry).decode()

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", IDLE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'effect_ledger_log_refusals_total{reason="root_mismatch"} 1.0' in scraped()
