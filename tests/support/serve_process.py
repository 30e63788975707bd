"""`effect-ledger serve` as a subprocess on an embedded PostgreSQL, and a superuser connection to it."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from effect_ledger.http.prefork import LOG_NICE
from support.auth import TEST_SECRET
from support.server import free_port

SERVE_READY_SECONDS = 90


def effect_ledger_command() -> list[str]:
    """The installed console script beside this interpreter, else the module."""
    script = Path(sys.executable).with_name("effect-ledger")
    return [str(script)] if script.exists() else [sys.executable, "-m", "effect_ledger.cli"]


def serve_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """Only what docs/api.md section 11 says outside programs set, plus the given EFFECT_LEDGER_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EFFECT_LEDGER_", "PROMETHEUS_"))}
    env.update(
        EFFECT_LEDGER_DATA_DIR=str(data_dir),
        EFFECT_LEDGER_JWT_SECRET=TEST_SECRET,
        EFFECT_LEDGER_JWT_ALGORITHM="HS256",
    )
    env.update({"EFFECT_LEDGER_" + name.upper(): value for name, value in settings.items()})
    return env


def postmaster(data_dir: Path) -> tuple[int, int, str] | None:
    """(pid, port, socket directory) of the embedded PostgreSQL from postmaster.pid; None when stopped."""
    try:
        lines = (data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    return int(lines[0]), int(lines[3]), lines[4]


def alive(pid: int) -> bool:
    """Whether a process with this pid runs (an exited one not yet reaped by its parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@dataclass
class Served:
    """A running `serve` process."""

    proc: asyncio.subprocess.Process
    port: int
    data_dir: Path
    output: Path

    @property
    def base_url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    async def owner(self) -> asyncpg.Connection:
        """A superuser connection to the embedded database (bypasses row-level security)."""
        found = postmaster(self.data_dir)
        assert found is not None
        _, port, socket_dir = found
        return await asyncpg.connect(host=socket_dir, port=port, user="postgres", database="postgres")

    async def wait(self, within: float = 60) -> int:
        """The exit code, waiting at most `within` seconds."""
        return await asyncio.wait_for(self.proc.wait(), within)

    def log(self) -> str:
        """What the process wrote to stdout and stderr."""
        return self.output.read_text(errors="replace")


async def migrated_pgdata() -> Path:
    """An embedded PostgreSQL's pgdata, migrated to head and stopped, made once per run (in the run's
    directory, removed with it; the first xdist worker that needs it makes it under a lock).

    `start_serve` copies it into a serve's data directory: that start then does what a restart of an
    existing deployment does (the database at head, so only the role passwords are set) and skips
    initdb and the migrations, 1.9 of a fresh start's 3 s of CPU (round 26: 10 starts a run). The
    first start on an empty data directory stays tested where it is the point: the packaging tests'
    installed `serve`, the README's walkthrough and the demo."""
    from support import early

    run = early.open_run()
    seed = run / "migrated-pgdata"

    def make() -> None:
        from effect_ledger.db.embedded import start_embedded, stop_embedded
        from effect_ledger.db.migrate import migrate
        from effect_ledger.settings import Settings

        with (run / "migrated-pgdata.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (seed / "made").exists():
                return
            server, url = start_embedded(seed)
            try:
                asyncio.run(migrate(Settings(database_url=url)))
            finally:
                stop_embedded(server)
            (seed / "made").touch()

    await asyncio.to_thread(make)
    return seed / "pgdata"


async def start_serve(
    tmp_path: Path, *args: str, command: Sequence[str] | None = None, **settings: str
) -> Served:
    """Start `serve --port N` (of this environment, or `command`) and wait until /readyz answers 200.

    Our own `serve` on its embedded database starts on a copy of `migrated_pgdata()` (`cp -a`: the
    files stay the embedded server's user's); an installed `command` on an empty data directory.

    The port is free when chosen, not reserved: when another process takes it before serve listens,
    serve exits saying so, and it starts again on another (up to three times)."""
    pgdata = tmp_path / "data" / "pgdata"
    if command is None and "database_url" not in settings and not pgdata.exists():
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        copied = await asyncio.create_subprocess_exec("cp", "-a", str(await migrated_pgdata()), str(pgdata))
        assert await copied.wait() == 0
    for _ in range(3):
        try:
            return await _start_serve(tmp_path, free_port(), args, command, settings)
        except PortTaken:
            continue
    raise AssertionError("serve found its port taken three times in a row")


class PortTaken(Exception):
    """serve could not listen: another process took the free port between the choice and serve's bind."""


async def _start_serve(
    tmp_path: Path, port: int, args: Sequence[str], command: Sequence[str] | None, settings: dict[str, str]
) -> Served:
    data_dir = tmp_path / "data"
    output = tmp_path / "serve.log"
    with output.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *(command or effect_ledger_command()),
            "serve",
            "--port",
            str(port),
            *args,
            env=serve_env(data_dir, **settings),
            stdout=sink,
            stderr=sink,
        )
    served = Served(proc, port, data_dir, output)
    deadline = time.monotonic() + SERVE_READY_SECONDS
    async with httpx.AsyncClient(base_url=served.base_url, timeout=2) as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                if f":{port}: [Errno 98]" in served.log():  # prefork.py: cannot listen on HOST:PORT
                    output.replace(output.with_name(f"serve.port-{port}-taken.log"))  # kept, aside
                    raise PortTaken(port)
                raise AssertionError(f"serve exited with {proc.returncode}:\n{served.log()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/readyz")).status_code == 200:
                    return served
            await asyncio.sleep(0.2)
    proc.kill()
    await proc.wait()
    raise AssertionError(f"serve was not ready within {SERVE_READY_SECONDS} s:\n{served.log()[-3000:]}")


async def kill_quietly(served: Served) -> None:
    """Make sure a failed test leaves no server (or embedded PostgreSQL) behind."""
    if served.proc.returncode is None:
        served.proc.terminate()
        try:
            await served.wait(60)
        except TimeoutError:
            served.proc.kill()
            await served.proc.wait()


def _nice(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[16])


def spawned_workers(parent: int, *, log_process: bool = False) -> list[int]:
    """The server's worker processes: children of `parent` that uvicorn started by multiprocessing's
    spawn, or that granian or our own server forked (they keep the parent's command line). Our own
    server's log process is told apart by its nice value (LOG_NICE): `log_process` answers it instead."""
    found = []
    own = (Path("/proc") / str(parent) / "cmdline").read_bytes().replace(b"\0", b" ")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # from the state on: ppid is the 2nd, nice the 17th
        ppid, nice = int(fields[1]), int(fields[16])
        is_log = nice == min(19, _nice(parent) + LOG_NICE)
        if ppid == parent and (b"spawn_main" in cmdline or cmdline == own) and is_log == log_process:
            found.append(int(entry.name))
    return found
