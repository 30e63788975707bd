"""A worker that starts while its database is unreachable (a failover in progress, a server still
starting) waits for it, up to DATABASE_STARTUP_WAIT_SECONDS, and then serves (issue 24); with no wait
it gives up at once; and a database that does not exist is never waited for.

The database sits behind a loopback TCP proxy that is not listening yet when the service starts."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from effect_ledger.settings import Settings
from support.ledger import CLAIM, claim
from support.server import Service, free_port


class LateProxy:
    """A TCP port for the service to dial; it forwards to the test's database once `open()`ed."""

    def __init__(self, db_url: str) -> None:
        self.port = free_port()
        where = urlsplit(db_url)
        query = dict(parse_qsl(where.query))
        self.socket_dir = query.pop("host", None)  # the embedded server's socket directory
        self.upstream_port = where.port or 5432
        self.upstream_host = where.hostname or "127.0.0.1"
        netloc = f"{where.netloc.rpartition('@')[0]}@127.0.0.1:{self.port}"
        self.url = urlunsplit((where.scheme, netloc, where.path, urlencode(query), ""))
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket_dir:
            return await asyncio.open_unix_connection(f"{self.socket_dir}/.s.PGSQL.{self.upstream_port}")
        return await asyncio.open_connection(self.upstream_host, self.upstream_port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._connect()

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        pumps = [asyncio.create_task(pump(reader, up_writer)), asyncio.create_task(pump(up_reader, writer))]
        self.tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_a_worker_started_before_its_database_is_reachable_waits_then_serves(
    settings: Settings, db_url: str
) -> None:
    proxy = LateProxy(db_url)
    waiting = replace(settings, database_url=proxy.url, database_startup_wait_seconds=30)
    started = asyncio.get_running_loop().create_future()

    async def run() -> None:
        async with Service(waiting) as running, running.client() as client:
            started.set_result(time.monotonic())
            r = await claim(client, "op-late", CLAIM)
            assert r.status_code == 201, r.text
            await asyncio.sleep(0)

    task = asyncio.create_task(run())
    try:
        await asyncio.sleep(1.5)  # the worker has met a refused connection several times by now
        assert not started.done() and not task.done(), "the worker neither waited nor failed"
        opened = time.monotonic()
        await proxy.open()
        await asyncio.wait_for(task, 30)
        assert started.result() >= opened  # it came up only once the database could be reached
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await proxy.close()


async def test_with_no_wait_a_worker_gives_up_at_once(settings: Settings, db_url: str) -> None:
    proxy = LateProxy(db_url)
    impatient = replace(settings, database_url=proxy.url, database_startup_wait_seconds=0)
    begun = time.monotonic()
    with pytest.raises(RuntimeError, match="ConnectionRefusedError"):  # the lifespan's startup failed
        async with Service(impatient):
            pass
    assert time.monotonic() - begun < 10


async def test_a_missing_database_is_not_waited_for(settings: Settings, db_url: str) -> None:
    where = urlsplit(db_url)
    missing = urlunsplit(where._replace(path="/el_no_such_database"))
    begun = time.monotonic()
    with pytest.raises(RuntimeError, match="InvalidCatalogNameError"):
        async with Service(replace(settings, database_url=missing, database_startup_wait_seconds=30)):
            pass
    assert time.monotonic() - begun < 10  # refused at once, not retried for 30 s
