"""Shared fixtures: one real PostgreSQL per run, a migrated template, a clean database per test.

`db_url` is the previous test's database emptied (a fresh clone only after a test that changed more
than rows: support/databases.py); `module_db_url` is one clone shared by a module's tests. How to write
a fast test: tests/README.md. Everything else the tests share is in the `support` package (tests/support/).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from itertools import count
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from effect_ledger.db.embedded import start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.settings import Settings
from support import citus_cluster, early, prepare_packaging, signatures, tls
from support.auth import TEST_SECRET
from support.database import trade_durability_for_speed, with_database
from support.databases import Databases, catalogue
from support.server import Service

signatures.install()  # each handler's signature parsed once per run, not once per test's app
tls.install()  # one default TLS context per test process, not one per HTTP client

# The suite's processes write bytecode, whatever the machine exports: with PYTHONDONTWRITEBYTECODE=1 (as
# on the CI machines) every xdist worker re-ran pytest's assertion rewriting of every test module and
# plugin on each collection (13 s of CPU instead of 6) and every child process (serve, the CLI, the
# packaging venvs' commands) compiled the package from source again. Set before xdist starts its workers,
# who inherit the environment; __pycache__/ is git-ignored.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """The owner URL of the server under test: EFFECT_LEDGER_DATABASE_URL, or an embedded PostgreSQL."""
    configured = os.environ.get("EFFECT_LEDGER_DATABASE_URL")
    if configured:
        yield configured
        return
    data_dir = Path(tempfile.mkdtemp(prefix="effect-ledger-tests-"))
    server, url = start_embedded(data_dir)
    try:
        trade_durability_for_speed(url)
        yield url
    finally:
        stop_embedded(server)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
async def on_citus(pg_admin_url: str) -> bool:
    """Whether the server under test is a Citus coordinator (the Citus lane of .ci/run)."""
    return await citus_cluster.is_citus(pg_admin_url)


@pytest.fixture(scope="session")
async def template_url(pg_admin_url: str, on_citus: bool) -> AsyncIterator[str]:
    """A database migrated once by Alembic, cloned by every test that needs one (on Citus: shared)."""
    name = f"el_template_{os.getpid()}"
    admin = await asyncpg.connect(pg_admin_url)
    if on_citus:
        url = await citus_cluster.create_database(pg_admin_url, name)
    else:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = with_database(pg_admin_url, name)
    await asyncio.to_thread(lambda: asyncio.run(migrate(Settings(database_url=url))))
    try:
        yield url
    finally:
        if on_citus:
            await citus_cluster.drop_database(pg_admin_url, name)
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def empty_db(pg_admin_url: str) -> AsyncIterator[str]:
    """A new, empty database, not cloned from the migrated template: for tests that migrate it themselves
    (to an older revision, then on)."""
    name = f"el_empty_{os.getpid()}_{next(_EMPTY_NAMES)}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield with_database(pg_admin_url, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
async def databases(pg_admin_url: str, template_url: str, on_citus: bool) -> AsyncIterator[Databases | None]:
    """The clean databases handed to tests (plain PostgreSQL only: on Citus, None)."""
    if on_citus:
        yield None
        return
    template = urlsplit(template_url).path.lstrip("/")
    kept = Databases(pg_admin_url, template, await catalogue(template_url))
    _DATABASES.append(kept)
    try:
        yield kept
    finally:
        await kept.close()


_DATABASES: list[Databases] = []
_EMPTY_NAMES = count()  # empty_db: a new name each time


def pytest_configure(config: pytest.Config) -> None:
    """The run's directory (support/early.py), made before xdist starts its workers, who inherit it."""
    if not hasattr(config, "workerinput"):
        early.open_run()


def _start_early(node_ids: list[str]) -> None:
    """Start the selected tests' child-process-only work now, niced, beside the other tests
    (support/early.py): mypy, and the packaging module's wheels and venvs. Once per run."""
    files = {Path(node_id.split("::", 1)[0]) for node_id in node_ids}
    if any(node_id.endswith("::test_mypy_strict") for node_id in node_ids):
        early.start("mypy", early.MYPY)
    if any(path.parent.name == "packaging" for path in files):
        early.start("packaging", prepare_packaging.command(), cwd=early.ROOT / "tests")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist, this process runs the tests: it starts the early work itself."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    _start_early([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under xdist, the controller starts the early work once, when the first worker has collected
    (every worker collects the same tests); the worker that runs the test waits for it."""
    _start_early(ids)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The process that made the run's directory stops any early job a shortened run left behind and
    removes the directory (the packaging module's wheels and venvs with it)."""
    if not hasattr(session.config, "workerinput"):
        early.close_run()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many tests got an emptied database and how many a fresh clone (the clones are the cost)."""
    for kept in _DATABASES:
        terminalreporter.write_line(
            f"test databases: {kept.reuses} reused emptied, {kept.clones} cloned from the template"
            f" (each clone follows a test that changed more than rows: support/databases.py)"
        )


@pytest.fixture
async def db_url(databases: Databases | None, template_url: str) -> AsyncIterator[str]:
    """A clean migrated database for one test: as if cloned from the template (on Citus: the template,
    wiped). The test may change anything in it; only its rows are cheap to undo (support/databases.py)."""
    if databases is None:
        await citus_cluster.wipe(template_url)
        yield template_url
        return
    url = await databases.take()
    try:
        yield url
    finally:
        await databases.give_back(url)


@pytest.fixture(scope="module")
async def module_db_url(databases: Databases | None, template_url: str) -> AsyncIterator[str]:
    """One clone for all the tests of a module: for a large seed that its tests only read."""
    if databases is None:
        await citus_cluster.wipe(template_url)
        yield template_url
        return
    name = await databases.clone()
    try:
        yield with_database(databases.admin_url, name)
    finally:
        await databases.drop(name)


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Settings for a service on the test's database, with the test secret and no background sweep."""
    return Settings(
        database_url=db_url, jwt_secret=TEST_SECRET, background_sweep=False, pool_size=20, log_enabled=False
    )


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    """The service over real HTTP on the test's own database."""
    async with Service(settings) as running:
        yield running


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the running service."""
    async with service.client() as http:
        yield http
