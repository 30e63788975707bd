"""Bring a database up for the service: the configured server, or the embedded one, migrated."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from effect_ledger.db.embedded import dev_jwt_secret, dev_state_key, start_embedded, stop_embedded
from effect_ledger.db.migrate import migrate
from effect_ledger.http.ratelimit import create_shared_store
from effect_ledger.settings import Settings


@contextmanager
def database(settings: Settings, *, run_migrations: bool) -> Iterator[Settings]:
    """Settings with a database URL: the configured one, or an embedded PostgreSQL stopped on exit."""
    server: Any = None
    if not settings.database_url:
        server, url = start_embedded(settings.data_path)
        settings = settings.with_database(url)
    try:
        if run_migrations:
            asyncio.run(migrate(settings))
        yield settings
    finally:
        if server is not None:
            stop_embedded(server)


def with_jwt_secret(settings: Settings) -> Settings:
    """HS256 without a configured secret uses (and creates) the development secret in the data dir."""
    if settings.jwt_algorithm == "HS256" and not settings.jwt_secret:
        return replace(settings, jwt_secret=dev_jwt_secret(settings.data_path))
    return settings


def with_state_key(settings: Settings) -> Settings:
    """Without JOURNAL_STATE_KEY_FILE, `serve` uses (and creates) a key ring in the data directory, as it
    does the development JWT secret: every worker of this machine shares it; the database never sees it.
    Production sets the file (docs/journal.md: several machines need the same ring)."""
    if settings.journal_state_key_file:
        return settings
    return replace(settings, journal_state_key_file=str(dev_state_key(settings.data_path)))


def export_settings(settings: Settings) -> None:
    """Put the resolved settings into the environment, where server workers read them."""
    for name, value in vars(settings).items():
        if value is not None:
            os.environ["EFFECT_LEDGER_" + name.upper()] = str(value)


@contextmanager
def shared_rate_limits(settings: Settings) -> Iterator[Settings]:
    """With several workers: one bucket file for all of them (created, or emptied, before they start)."""
    if settings.workers <= 1 and not settings.rate_limit_store:
        yield settings
        return
    if settings.rate_limit_store:
        create_shared_store(Path(settings.rate_limit_store))
        yield settings
        return
    directory = Path(tempfile.mkdtemp(prefix="effect-ledger-limits-"))
    store = directory / "buckets"
    create_shared_store(store)
    try:
        yield replace(settings, rate_limit_store=str(store))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
