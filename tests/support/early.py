"""Work that only waits on child processes, started when the run starts so it overlaps the other tests.

mypy and the packaging module's wheels and venvs (tests/support/prepare_packaging.py) cost a minute or
more of wall time, nearly all of it in child processes that the test merely waits for. Once collection
has selected a test that needs one, tests/conftest.py starts it at the lowest CPU priority (`nice 19`):
it takes the CPU the other tests leave idle (sleeps, sockets, PostgreSQL round trips) and yields it the
moment they want it; when its test comes and waits for it, it is put back at normal priority. The test
calls `finished(name, command)` and gets the `CompletedProcess` it would have run itself: every
assertion stays the test's own, on the same output. Nothing started early: `finished` runs it then.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

ROOT = Path(__file__).resolve().parents[2]
MYPY = [str(Path(sys.executable).parent / "mypy")]  # strict, on service/ (pyproject.toml [tool.mypy])


def _spool() -> IO[str]:
    return tempfile.TemporaryFile("w+")


@dataclass
class Job:
    """One command started early, its output spooled to files (pipes could fill and block it)."""

    command: list[str]
    cwd: Path
    timeout: float
    started: float = field(default_factory=time.monotonic)
    out: IO[str] = field(default_factory=_spool)
    err: IO[str] = field(default_factory=_spool)
    process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []  # no preexec_fn: pytest has threads
        self.process = subprocess.Popen(
            [*nice, *self.command],
            cwd=self.cwd,
            stdout=self.out,
            stderr=self.err,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def wait(self) -> subprocess.CompletedProcess[str]:
        assert self.process is not None
        self.hurry()
        left = max(1.0, self.timeout - (time.monotonic() - self.started))
        try:
            code = self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        texts = []
        for spool in (self.out, self.err):
            spool.seek(0)
            texts.append(spool.read())
            spool.close()
        return subprocess.CompletedProcess(self.command, code, texts[0], texts[1])

    def hurry(self) -> None:
        """Back to normal priority: a test now waits for it (root may lower niceness; others keep 19)."""
        assert self.process is not None
        try:
            parent = psutil.Process(self.process.pid)
            for process in (parent, *parent.children(recursive=True)):
                process.nice(0)  # children it starts from now on inherit 0
        except (psutil.Error, OSError):
            pass


_JOBS: dict[str, Job] = {}
_RESULTS: dict[str, subprocess.CompletedProcess[str]] = {}


def start(name: str, command: list[str], *, cwd: Path = ROOT, timeout: float = 600) -> None:
    """Start `command` now (once per name), niced, for a test that will ask `finished(name)`."""
    if name in _JOBS:
        return
    job = Job(command, cwd, timeout)
    job.start()
    _JOBS[name] = job


def finished(
    name: str, command: list[str], *, cwd: Path = ROOT, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """The finished run of `command`: the early one when conftest started it, else one run now."""
    if name in _RESULTS:
        return _RESULTS[name]
    if name not in _JOBS:
        start(name, command, cwd=cwd, timeout=timeout)
    job = _JOBS[name]
    assert job.command == command, (job.command, command)
    _RESULTS[name] = job.wait()
    return _RESULTS[name]


def stop_all() -> None:
    """Kill what is still running (a run cut short, or a test deselected after the start)."""
    for job in _JOBS.values():
        if job.process is not None and job.process.poll() is None:
            job.process.kill()
            job.process.wait()
