"""A worker that starts while its database is unreachable (a failover in progress, a server still
starting) waits for it, up to DATABASE_STARTUP_WAIT_SECONDS, and then serves (issue 24); with no wait
it gives up at once; and a database that does not exist is never waited for.

The database sits behind a loopback TCP proxy (support/dbproxy.py) not listening yet when the service
starts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

import pytest

from effect_ledger.db.urls import READER_ROLE, RUNTIME_ROLE
from effect_ledger.http import app as app_module
from effect_ledger.settings import Settings
from support.dbproxy import DatabaseProxy
from support.ledger import CLAIM, claim
from support.server import Service


def through(proxy: DatabaseProxy, settings: Settings, wait: int) -> Settings:
    """The service's pools (runtime, audit, reader) through the proxy, waiting up to `wait` s at start."""
    return replace(
        settings,
        runtime_database_url=proxy.role_url(RUNTIME_ROLE),
        reader_database_url=proxy.role_url(READER_ROLE),
        database_startup_wait_seconds=wait,
    )


def retries_of(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The start-up retries the app logs (`_startup_retry`, called once before each wait), by failure kind."""
    seen: list[str] = []
    monkeypatch.setattr(
        app_module, "_startup_retry", lambda failure, delay: seen.append(type(failure).__name__)
    )
    return seen


async def test_a_worker_started_before_its_database_is_reachable_waits_then_serves(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = DatabaseProxy(db_url)  # not listening yet
    retried = retries_of(monkeypatch)
    waiting = through(proxy, settings, 30)
    started = asyncio.get_running_loop().create_future()

    async def run() -> None:
        async with Service(waiting) as running, running.client() as client:
            started.set_result(time.monotonic())
            r = await claim(client, "op-late", CLAIM)
            assert r.status_code == 201, r.text
            await asyncio.sleep(0)

    task = asyncio.create_task(run())
    try:
        for _ in range(600):  # until the worker met a refused connection and said it retries (30 s at most)
            if retried or task.done():
                break
            await asyncio.sleep(0.05)
        assert not started.done() and not task.done(), "the worker neither waited nor failed"
        assert retried and set(retried) == {"ConnectionRefusedError"}  # each refused attempt retried
        opened = time.monotonic()
        await proxy.up()
        await asyncio.wait_for(task, 30)
        assert started.result() >= opened  # it came up only once the database could be reached
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        with contextlib.suppress(AssertionError):
            await proxy.down()


async def test_with_no_wait_a_worker_gives_up_at_once(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    impatient = through(DatabaseProxy(db_url), settings, 0)  # never listening
    retried = retries_of(monkeypatch)
    with pytest.raises(RuntimeError, match="ConnectionRefusedError"):  # the lifespan's startup failed
        async with Service(impatient):
            pass
    assert retried == []  # one attempt, no wait (counted, not timed: a busy machine slows the attempt)


async def test_a_missing_database_is_not_waited_for(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = urlsplit(db_url)
    missing = urlunsplit(where._replace(path="/el_no_such_database"))
    retried = retries_of(monkeypatch)
    with pytest.raises(RuntimeError, match="InvalidCatalogNameError"):
        async with Service(replace(settings, database_url=missing, database_startup_wait_seconds=30)):
            pass
    assert retried == []  # refused at once, not retried for 30 s


async def test_a_started_worker_has_settled_its_start_up_heap(settings: Settings) -> None:
    """After start-up the objects alive then sit in the collector's permanent generation (app.settled_heap),
    so its full passes never walk them on a request's path."""
    async with Service(settings) as running, running.client() as client:
        assert (await client.get("/livez")).status_code == 200
        assert app_module._HEAP_SETTLED
        assert gc.get_freeze_count() > 10_000  # the modules, the app and its routes: tens of thousands
