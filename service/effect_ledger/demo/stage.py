"""The demo's stage: a fresh migrated database and the service running in-process on a loopback port."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import uvicorn

from effect_ledger.db.embedded import start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.demo.approval_step import POLICY as APPROVAL_POLICY
from effect_ledger.http.app import create_app
from effect_ledger.settings import Settings


@dataclass(frozen=True)
class Database:
    """The demo's own database: its owner URL and where it lives, in words."""

    url: str
    where: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _named(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def demo_database(settings: Settings) -> Iterator[Database]:
    """A fresh database, migrated: on the configured server (dropped afterwards) or an embedded one."""
    if settings.database_url:
        # The configured server may hold real data: the demo works only in a database of its own.
        # The name is generated here from hex digits, so quoting it is enough.
        name = f"effect_ledger_demo_{secrets.token_hex(6)}"
        asyncio.run(_admin(settings.database_url, f'CREATE DATABASE "{name}"'))
        try:
            url = _named(settings.database_url, name)
            asyncio.run(migrate(Settings(database_url=url)))
            yield Database(url, f"fresh database {name} on EFFECT_LEDGER_DATABASE_URL (dropped afterwards)")
        finally:
            asyncio.run(_admin(settings.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        return
    data_dir = Path(tempfile.mkdtemp(prefix="effect-ledger-demo-"))
    server, url = start_embedded(data_dir)
    try:
        asyncio.run(migrate(Settings(database_url=url)))
        yield Database(url, f"embedded PostgreSQL in {data_dir} (removed afterwards)")
    finally:
        stop_embedded(server)
        shutil.rmtree(data_dir, ignore_errors=True)


@asynccontextmanager
async def running_service(database_url: str, jwt_secret: str) -> AsyncIterator[str]:
    """The service on a free loopback port in this event loop; yields its base URL."""
    settings = Settings(
        database_url=database_url,
        jwt_secret=jwt_secret,
        jwt_algorithm="HS256",
        background_sweep=False,  # the demo shows the executor's own unknown report, not the sweeper's
        log_level="warning",  # the timeline is the demo's output; request logs would drown it
        approval_policy=json.dumps(APPROVAL_POLICY),  # charges need a yes (demo/approval_step.py)
    )
    port = _free_port()
    config = uvicorn.Config(
        create_app(settings, jwt_secret=jwt_secret),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # it failed to start: raise why
                raise RuntimeError("the service stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
