"""The service under test: `effect-ledger serve --workers N` as a subprocess, production-style."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from effect_ledger_bench.neighbour import rate_limit_env
from effect_ledger_bench.procs import log_process_cpu_seconds, tree_cpu_seconds, worker_rss_mb


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# serve under another interpreter (`repeat --variant EFFECT_LEDGER_BENCH_PYTHON=/other/venv/bin/python`):
# the interpreter's build is a lever of its own (docs/performance.md, round 33). Read from a
# ServiceProcess's extra environment only (a variant's), never from the bench's own, so that every row of
# `effect-ledger bench` runs serve on the interpreter its title names; not passed on to serve.
SERVE_PYTHON = "EFFECT_LEDGER_BENCH_PYTHON"


def serve_command(python: str | None = None) -> list[str]:
    """The installed `effect-ledger` script beside `python` (this interpreter by default), else the
    same CLI through -m."""
    interpreter = python or sys.executable
    script = Path(interpreter).parent / "effect-ledger"
    if script.exists():
        return [str(script)]
    found = None if python else shutil.which("effect-ledger")
    return [found] if found else [interpreter, "-m", "effect_ledger.cli"]


class ServiceProcess:
    """A running `serve` on a free port, its database from EFFECT_LEDGER_DATABASE_URL."""

    def __init__(
        self,
        database_url: str,
        jwt_secret: str,
        workers: int,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.workers = workers
        self.log_path = workdir / f"serve-{self.port}.log"
        extra = dict(extra_env or {})
        self.python = extra.pop(SERVE_PYTHON, None)  # None: serve beside this interpreter
        self._env = {
            **os.environ,
            "EFFECT_LEDGER_DATABASE_URL": database_url,
            "EFFECT_LEDGER_JWT_SECRET": jwt_secret,
            "EFFECT_LEDGER_JWT_ALGORITHM": "HS256",
            "EFFECT_LEDGER_DATA_DIR": str(workdir / "serve-data"),
            **rate_limit_env(),  # one principal drives every throughput row: no limit but the flooder's
            **extra,
        }
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        """The serve process (the supervisor when there are several workers)."""
        assert self._proc is not None
        return self._proc.pid

    def command(self) -> list[str]:
        """serve's command line: the script beside the chosen interpreter, this server's port."""
        return [
            *serve_command(self.python),
            "serve",
            "--workers",
            str(self.workers),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    async def start(self, within: float = 90.0) -> None:
        """Start serving and wait until /readyz answers 200."""
        with self.log_path.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(),
                env=self._env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(base_url=f"http://{self.host}:{self.port}", timeout=2) as client:
            while time.monotonic() < deadline:
                if self._proc.returncode is not None:
                    break
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                await asyncio.sleep(0.2)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        await self.stop()
        raise RuntimeError(f"effect-ledger serve did not become ready:\n{tail}")

    def rss_mb(self, *, log_process: bool = False) -> list[float]:
        """Resident memory of each worker (or of the log process), in MiB."""
        return worker_rss_mb(self.pid, log_process=log_process)

    def cpu_seconds(self) -> float:
        """CPU seconds of the whole server (supervisor and workers)."""
        return tree_cpu_seconds(self.pid)

    def log_cpu_seconds(self) -> float | None:
        """CPU seconds of the server's log process; None when it has none (the log off)."""
        return log_process_cpu_seconds(self.pid)

    async def stop(self, within: float = 30.0) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL of its own process group if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), within)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session made its pid the group id
            await proc.wait()
