"""What one measured window cost, in counts that do not depend on load: CPU seconds of PostgreSQL, of
the Python under test and of everything else on the machine, WAL bytes and commits.

A `Window` is opened and closed around each layer's measurement. PostgreSQL's CPU is its process tree
(tree_cpu_seconds); the Python under test is the service's process tree, or this process when the
layer runs in it (asyncpg alone, the ASGI app); clients (pgbench, wrk, generator processes) are this
process's reaped children. `other_cores` is the rest of the machine's busy time (from /proc/stat): the
CPU that nobody in this run spent, i.e. how busy the machine was with something else. The kernel's own
share is kept apart, as `kernel_cores`: interrupt and softirq time (which Linux charges to no process)
and the kernel threads' CPU (kworkers completing the WAL's flushes, ksoftirqd). That work grows with
the run's own rate of commits and packets, and the quiet rule used to read it as another process's
load (docs/performance.md, round 15). It is printed beside every row, and not judged.

WAL bytes come from pg_current_wal_lsn(), and write transactions from the next transaction ID
(pg_snapshot_xmax of the current snapshot, which assigns none itself): every transaction that writes
gets one ID when it commits its first change, so the delta counts the cycle's commits. It is exact
at once, where pg_stat_database.xact_commit lags under load (a busy backend reports its counts up to
a minute late); a subtransaction that writes (a PL/pgSQL EXCEPTION block) takes an ID of its own and
shows here as more than one per commit, which is worth seeing too. The server-wide figures include
other databases: run the bench alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from effect_ledger_bench.procs import (
    TICKS,
    children_cpu_seconds,
    self_cpu_seconds,
    stat_fields,
    tree_cpu_seconds,
)

COUNTERS = """
SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS lsn,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid
"""


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has been busy since boot (not idle, not iowait)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    v = [int(x) for x in first[1:8]]  # user nice system idle iowait irq softirq (steal: not this VM's)
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / TICKS


PF_KTHREAD = 0x00200000  # a kernel thread (include/linux/sched.h), in /proc/PID/stat's flags


@dataclass(frozen=True)
class KernelSample:
    """The kernel's own CPU at one moment: interrupt and softirq ticks (charged to no process) and
    each kernel thread's utime + stime ticks, by (pid, start time): a pid can be reused."""

    interrupts: int
    threads: dict[tuple[int, int], int]


def kernel_sample() -> KernelSample:
    """Read the kernel's own CPU now (/proc/stat, then every kernel thread's /proc/PID/stat)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    threads: dict[tuple[int, int], int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(Path(entry.path, "stat").read_text())
        except OSError:
            continue  # it ended meanwhile
        ticks = kernel_thread_ticks(fields)
        if ticks is not None:
            threads[(int(entry.name), int(fields[19]))] = ticks  # starttime, the 22nd field
    return KernelSample(int(first[6]) + int(first[7]), threads)


def kernel_seconds(before: KernelSample, after: KernelSample) -> float:
    """The kernel's own CPU seconds between two samples: the interrupts' and softirqs' growth, each
    kernel thread's growth, and the whole time of one that started in between. One that ended in
    between counts nothing: its ticks left with it. Until round 20 the bench summed the threads alive
    at each end and subtracted: a kworker that exited during a layer (the kernel retires idle ones)
    took its whole lifetime's ticks out of the kernel's share, which read negative (-0.36 cores), and
    the same amount went to "other load" and withheld a run that had nothing else running."""
    ticks = after.interrupts - before.interrupts
    for key, now in after.threads.items():
        ticks += now - before.threads.get(key, 0)
    return ticks / TICKS


def kernel_thread_ticks(fields: list[str]) -> int | None:
    """A /proc/PID/stat line's utime + stime in clock ticks (its fields after the command, stat_fields)
    when it is a kernel thread's, else None."""
    if int(fields[6]) & PF_KTHREAD:  # flags, the 9th field of the whole line
        return int(fields[11]) + int(fields[12])  # utime, stime (the 14th and 15th)
    return None


def load_average() -> float:
    """The one-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass
class Window:
    """Counters at the start of a measurement, then the deltas once it is closed."""

    url: str
    postmaster: int | None
    python: Callable[[], float] = self_cpu_seconds  # the Python under test (default: this process)
    python_in_self: bool = True  # the Python under test is this process (do not count it twice)
    log_process: Callable[[], float | None] | None = None  # the part of `python` that is serve's log
    # process (None from it: the server has none)
    seconds: float = 0.0
    postgres_cpu: float | None = None
    python_cpu: float | None = 0.0  # None: no Python in this layer (pgbench)
    log_cpu: float | None = None  # of python_cpu, the log process's (a service row with the log on)
    client_cpu: float = 0.0
    other_cores: float = 0.0  # other processes' (the quiet rule judges this)
    kernel_cores: float = 0.0  # the kernel's own work, much of it the run's (printed, not judged)
    wal_bytes: int = 0
    commits: int = 0
    _start: dict[str, float] = field(default_factory=dict)
    _kernel_start: KernelSample | None = None
    _log_start: float | None = None  # None: no log process (or nothing asked for it)

    async def _counters(self) -> tuple[int, int]:
        conn = await asyncpg.connect(self.url)
        try:
            row = await conn.fetchrow(COUNTERS)
        finally:
            await conn.close()
        return int(row["lsn"]), int(row["next_xid"])

    async def open(self) -> None:
        """Read every counter now."""
        lsn, commits = await self._counters()
        self._start = {
            "wall": time.monotonic(),
            "pg": tree_cpu_seconds(self.postmaster) if self.postmaster else 0.0,
            "python": self.python(),
            "self": self_cpu_seconds(),
            "clients": children_cpu_seconds(),
            "busy": machine_busy_seconds(),
            "lsn": float(lsn),
            "commits": float(commits),
        }
        self._kernel_start = kernel_sample()
        self._log_start = self.log_process() if self.log_process is not None else None

    async def close(self) -> None:
        """Deltas since open()."""
        s = self._start
        self.seconds = time.monotonic() - s["wall"]
        pg = tree_cpu_seconds(self.postmaster) - s["pg"] if self.postmaster else None
        self.postgres_cpu = pg
        python = self.python() - s["python"]
        self.python_cpu = python
        log_now = self.log_process() if self.log_process is not None else None
        self.log_cpu = None if log_now is None or self._log_start is None else log_now - self._log_start
        own = self_cpu_seconds() - s["self"]
        self.client_cpu = children_cpu_seconds() - s["clients"]
        busy = machine_busy_seconds() - s["busy"]
        assert self._kernel_start is not None, "close() before open()"
        kernel = kernel_seconds(self._kernel_start, kernel_sample())
        ours = (pg or 0.0) + self.client_cpu + own + (0.0 if self.python_in_self else python)
        self.kernel_cores = kernel / max(self.seconds, 1e-9)
        self.other_cores = max(busy - ours - kernel, 0.0) / max(self.seconds, 1e-9)
        lsn, commits = await self._counters()
        self.wal_bytes = lsn - int(s["lsn"])
        self.commits = commits - int(s["commits"])

    def per_cycle(self, cycles: int) -> str:
        """PostgreSQL and Python CPU, WAL bytes and commits per cycle, and the machine's other load."""
        n = max(cycles, 1)
        pg_cpu = self.postgres_cpu
        pg = "PostgreSQL n/a" if pg_cpu is None else f"PostgreSQL {pg_cpu / n * 1000:.2f} ms"
        python = "no Python" if self.python_cpu is None else f"Python {self.python_cpu / n * 1000:.2f} ms"
        if self.python_cpu is not None and self.log_cpu is not None:  # serve's log process: its share
            python += f" (the log process {self.log_cpu / n * 1000:.3f} ms)"
        return (
            f"per cycle: {pg}, {python}, WAL {self.wal_bytes / n:,.0f} B, "
            f"{self.commits / n:.2f} write xacts; "
            f"other load {self.other_cores:.2f} cores (kernel {self.kernel_cores:.2f})"
        )
