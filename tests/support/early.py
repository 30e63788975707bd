"""Work that only waits on child processes, started when the run starts so it overlaps the other tests.

mypy and the packaging module's wheels and venvs (tests/support/prepare_packaging.py) cost a minute or
more of wall time, nearly all of it in child processes that the test merely waits for. Once collection
has selected a test that needs one, tests/conftest.py starts it at the lowest CPU priority (`nice 19`):
it takes the CPU the other tests leave idle (sleeps, sockets, PostgreSQL round trips) and yields it the
moment they want it; when its test comes and waits for it, it is put back at normal priority. The test
calls `finished(name, command)` and gets the `CompletedProcess` it would have run itself: every
assertion stays the test's own, on the same output. Nothing started early: `finished` runs it then.

Once per run, not once per process: under pytest-xdist the controller starts each job (it sees every
worker's collection) and the worker that runs the test waits for it. A job lives in a directory of the
run's own (`run_directory()`, shared with the workers through the environment): its command, output,
process ID and, when it ends, its exit status, so any process of the run can wait for it, hurry it or
kill it. The process that made the directory removes it at the end.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
MYPY = [str(Path(sys.executable).parent / "mypy")]  # strict, on service/ (pyproject.toml [tool.mypy])
ENV = "EFFECT_LEDGER_TEST_RUN_DIR"  # the run's directory, inherited by xdist's workers
_OWNED: list[Path] = []  # the run directory, when this process made it
_STARTED: dict[str, subprocess.Popen[bytes]] = {}  # jobs this process started (it reaps them)


def open_run() -> Path:
    """The run's directory: made by the first process of the run (the controller, or the only one)."""
    if ENV not in os.environ:
        made = Path(tempfile.mkdtemp(prefix="effect-ledger-test-run-"))
        _OWNED.append(made)
        os.environ[ENV] = str(made)
    return Path(os.environ[ENV])


def close_run() -> None:
    """Kill what is still running (a run cut short, a test deselected after the start) and remove the
    run's directory, in the process that made it."""
    for process in _STARTED.values():
        if process.poll() is None:
            _kill(process.pid)
            process.wait()
    _STARTED.clear()
    for made in _OWNED:
        shutil.rmtree(made, ignore_errors=True)
        if os.environ.get(ENV) == str(made):
            del os.environ[ENV]
    _OWNED.clear()


def _job(name: str) -> Path:
    return open_run() / "early" / name


def start(name: str, command: list[str], *, cwd: Path = ROOT) -> bool:
    """Start `command` now (once per name and run), niced, for a test that will ask `finished(name)`.
    False when it had been started already."""
    job = _job(name)
    job.parent.mkdir(parents=True, exist_ok=True)
    try:
        job.mkdir()  # the claim: exactly one process of the run starts it
    except FileExistsError:
        return False
    (job / "command.json").write_text(json.dumps(command), "utf-8")
    # the exit status is written last, through a rename: once `status` exists, the output is complete
    script = f'{shlex.join(command)} >"$0/out" 2>"$0/err"; echo $? >"$0/status.tmp"; mv "$0/status.tmp" "$0/status"'
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []  # no preexec_fn: pytest has threads
    process = subprocess.Popen([*nice, "sh", "-c", script, str(job)], cwd=cwd, stdin=subprocess.DEVNULL)
    (job / "pid").write_text(str(process.pid), "utf-8")
    _STARTED[name] = process
    return True


def finished(
    name: str, command: list[str], *, cwd: Path = ROOT, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """The finished run of `command`: the early one when the run started it, else one started now."""
    start(name, command, cwd=cwd)
    job = _job(name)
    assert json.loads((job / "command.json").read_text("utf-8")) == command
    status = job / "status"
    deadline = time.monotonic() + timeout
    pid = _pid(job, deadline)
    _hurry(pid)
    while not status.exists():
        if name in _STARTED:
            _STARTED[name].poll()  # reap it when this process started it
        if time.monotonic() > deadline:
            _kill(pid)
            raise subprocess.TimeoutExpired(command, timeout)
        time.sleep(0.1)
    code = int(status.read_text("utf-8"))
    out, err = ((job / part).read_text("utf-8", errors="replace") for part in ("out", "err"))
    return subprocess.CompletedProcess(command, code, out, err)


def _pid(job: Path, deadline: float) -> int:
    """The job's process ID (its starter writes it right after the start)."""
    while not (job / "pid").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job} was claimed but never started")
        time.sleep(0.05)
    return int((job / "pid").read_text("utf-8"))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return []


def _hurry(pid: int) -> None:
    """Back to normal priority: a test now waits for it (root may lower niceness; others keep 19)."""
    for process in _tree(pid):
        try:
            process.nice(0)  # children it starts from now on inherit 0
        except (psutil.Error, OSError):
            pass


def _kill(pid: int) -> None:
    for process in reversed(_tree(pid)):
        try:
            process.kill()
        except psutil.Error:
            pass
