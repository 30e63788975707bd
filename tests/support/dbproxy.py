"""A loopback TCP proxy in front of the tests' database (tests/integration/test_health.py,
test_startup_wait.py)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from effect_ledger.db.urls import derived_password
from support.server import free_port


class DatabaseProxy:
    """A loopback TCP proxy in front of the test database: it can start listening late (`up()`), and be
    cut (`down()`) as a database restart or an outage would."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.StreamWriter] = set()

    def _unix_socket(self) -> str:
        parts = urlsplit(self.db_url)
        socket_dir = Path(parse_qs(parts.query)["host"][0])
        [socket] = [s for s in socket_dir.glob(f".s.PGSQL.{parts.port or '*'}") if s.suffix != ".lock"]
        return str(socket)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        parts = urlsplit(self.db_url)
        if parts.hostname:
            return await asyncio.open_connection(parts.hostname, parts.port or 5432)
        return await asyncio.open_unix_connection(self._unix_socket())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._open_upstream()
        self.pipes |= {writer, up_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def up(self) -> None:
        """Accept connections (again)."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def down(self) -> None:
        """Refuse new connections and cut every open one."""
        assert self.server is not None
        self.server.close()
        for pipe in self.pipes:
            pipe.close()
        self.pipes.clear()
        await self.server.wait_closed()

    def role_url(self, role: str) -> str:
        """The role's URL through the proxy, with the password `migrate` derived for it."""
        database = urlsplit(self.db_url).path
        password = derived_password(self.db_url, role)
        return f"postgresql://{role}:{password}@127.0.0.1:{self.port}{database}"
